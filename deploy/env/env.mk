# deploy/env/env.mk — included from the top-level Makefile.
#   make env        build build/env/{vmlinuz,initramfs,DIGESTS} (kernel .deb cached in build/cache/)
#   make env-check  build twice and compare digests (reproducibility)
ENV_OUT ?= build/env

.PHONY: env env-check
env: ## Build the in-RAM environment: build/env/{vmlinuz,initramfs,DIGESTS}
	KILN_ENV_OUT=$(abspath $(ENV_OUT)) deploy/env/build.sh

env-check: env ## Build the environment twice and require identical digests
	cp $(ENV_OUT)/DIGESTS $(ENV_OUT)/DIGESTS.prev
	KILN_ENV_OUT=$(abspath $(ENV_OUT)) deploy/env/build.sh >/dev/null
	cmp $(ENV_OUT)/DIGESTS $(ENV_OUT)/DIGESTS.prev && echo "env: reproducible"
