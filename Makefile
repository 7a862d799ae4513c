# Kiln — site-local bare-metal provisioning appliance.
# `make help` lists the targets.

SHELL     := /bin/bash
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
GOTEST    := $(GO) test -race -count=1
# Timeouts: unit and protocol tests are quick; VM tests run under TCG.
TEST_TIMEOUT ?= 30m
E2E_TIMEOUT  ?= 20m
FW           ?= bios
IMAGE        ?= release
FUZZTIME     ?= 10s
# Under KILN_REQUIRE_ALL=1 a test that would skip for want of root or a host
# tool fails instead (deploy/lab/testreq): what `make test` and CI run is run.
# A developer without them can run `make unit KILN_REQUIRE_ALL=0`.
KILN_REQUIRE_ALL ?= 1

.PHONY: help build test unit capi-test capi-e2e capi-gen capi-components e2e e2e-ha bench fleet leasecheck fuzz lint depcheck deps-check ci env demo demo-down deps clean

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## Build bin/kiln (appliance + CLI) and bin/kiln-agent (static)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/kiln ./cmd/kiln
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w -buildid=' -o $(BIN)/kiln-agent ./cmd/kiln-agent
	$(GO) build -o $(BIN)/vbmc ./deploy/lab/vbmc

-include deploy/env/env.mk

unit: ## Unit, protocol (netns) and VM component tests, with -race
	KILN_REQUIRE_ALL=$(KILN_REQUIRE_ALL) KILN_ENV_DIR=$(abspath build/env) $(GOTEST) -timeout $(TEST_TIMEOUT) ./...

test: lint build env unit capi-test e2e capi-e2e e2e-ha ## Everything CI runs: lint, all tests (the env first, for VM tests), the Cluster API provider's, the end-to-end VM runs

# The Cluster API provider (cmd/kiln-capi, its own Go module).
CAPI       := cmd/kiln-capi
CAPI_GEN    = $(GO) tool controller-gen object paths=./api/... && $(GO) tool controller-gen crd rbac:roleName=kiln-capi-manager paths=./... output:crd:dir=$(1)/crd output:rbac:dir=$(1)/rbac

capi-gen: ## Regenerate the Cluster API provider's deepcopy code, CRDs and role from its Go types (controller-gen)
	cd $(CAPI) && $(call CAPI_GEN,config)

capi-test: ## Cluster API provider: generated files current, vet, bin/kiln-capi, envtest tests on a real kube-apiserver (deploy/capi/kube/build.sh builds it once per machine, ~11 min cold)
	@cd $(CAPI) && tmp=$$(mktemp -d) && $(call CAPI_GEN,$$tmp) && diff -r $$tmp/crd config/crd && diff -r $$tmp/rbac config/rbac && rm -rf $$tmp && git diff --exit-code -- api/ || { echo "capi-test: generated files are stale: run make capi-gen and commit"; exit 1; }
	cd $(CAPI) && $(GO) vet ./... && $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(abspath $(BIN))/kiln-capi .
	set -o pipefail; assets=$$(deploy/capi/kube/build.sh) && cd $(CAPI) && KUBEBUILDER_ASSETS=$$assets KILN_REQUIRE_ALL=$(KILN_REQUIRE_ALL) $(GOTEST) -timeout 15m -v ./... 2>&1 | tee $(abspath capi.log) | grep -E '^(--- |ok|FAIL|PASS|panic)|_test.go'

capi-e2e: build env ## Cluster API end to end: a KilnMachine claims the lab's VM, Kiln builds it, the VM boots its disk (prints one e2e: capi line)
	set -o pipefail; assets=$$(deploy/capi/kube/build.sh) && cd $(CAPI) && KUBEBUILDER_ASSETS=$$assets KILN_E2E=1 KILN_REQUIRE_ALL=$(KILN_REQUIRE_ALL) $(GO) test -count=1 -timeout $(E2E_TIMEOUT) -v -run 'TestE2ECAPI$$' ./controllers/ 2>&1 | tee $(abspath capi-e2e.log) | grep -E '^(e2e:|--- |=== RUN|ok|FAIL|PASS|panic)'; rc=$$?; if grep -qE '^(--- FAIL|FAIL)' $(abspath capi-e2e.log); then echo "capi-e2e failed; the end of capi-e2e.log:"; tail -n 200 $(abspath capi-e2e.log); exit 1; fi; exit $$rc

capi-components: ## build/capi/infrastructure-components.yaml: the provider's CRDs, role and manager in one file (IMAGE_REF=… names the manager image)
	mkdir -p build/capi && { for f in $(CAPI)/config/crd/*.yaml $(CAPI)/config/rbac/role.yaml $(CAPI)/config/manager/manager.yaml; do echo '---'; cat $$f; done; } | sed 's#image: IMAGE#image: $(or $(IMAGE_REF),kiln-capi:$(VERSION))#' > build/capi/infrastructure-components.yaml && cp $(CAPI)/metadata.yaml build/capi/

e2e: build env ## End to end: real VMs PXE-boot from Kiln to provisioned (BIOS and UEFI)
	set -o pipefail; KILN_E2E=1 KILN_REQUIRE_ALL=$(KILN_REQUIRE_ALL) $(GO) test -count=1 -timeout $(E2E_TIMEOUT) -v -run 'TestE2E' -skip 'TestE2EHA' ./deploy/lab/e2e/ 2>&1 | tee e2e.log | grep -E '^(e2e:|--- |=== RUN|ok|FAIL|PASS|panic)'; rc=$$?; if grep -qE '^(--- FAIL|FAIL)' e2e.log; then echo "e2e failed; the end of e2e.log:"; tail -n 300 e2e.log; exit 1; fi; exit $$rc

e2e-ha: build env ## HA end to end: 3 nodes, 4 VMs; leader SIGKILL mid-build, a restart, a 30 s partition (prints one e2e-ha: line)
	set -o pipefail; KILN_E2E=1 KILN_REQUIRE_ALL=$(KILN_REQUIRE_ALL) $(GO) test -count=1 -timeout $(E2E_TIMEOUT) -v -run 'TestE2EHA$$' ./deploy/lab/e2e/ 2>&1 | tee e2e-ha.log | grep -E '^(e2e-ha:|--- |=== RUN|ok|FAIL|PASS|panic)'; rc=$$?; if grep -qE '^(--- FAIL|FAIL)' e2e-ha.log; then echo "e2e-ha failed; the end of e2e-ha.log (node and serial logs):"; tail -n 400 e2e-ha.log; exit 1; fi; exit $$rc

bench: build env ## Benchmarks (bench: lines, a peer measured in the same run or "(no peer)"), one package at a time
	set -o pipefail; KILN_BENCH=1 KILN_ENV_DIR=$(abspath $(ENV_OUT)) $(GO) test -p 1 -count=1 -timeout 30m -v -run 'TestBench' ./... 2>&1 | tee bench.log | grep -E '^(bench:|--- FAIL|FAIL)'
	@! grep -qE '^(--- FAIL|FAIL)' bench.log

N ?= 50
DAY2 ?=
fleet: build env ## Fleet simulator: N simulated machines (default 50) booted and provisioned by a real kiln serve (root); DAY2=1 adds the day-2 failures; FLEET_ARGS="-nodes 3 -kill-leader-at 40s" a 3-node storm with the leader killed
	$(GO) run ./deploy/lab/fleetsim/cmd/fleetsim -n $(N) -kiln $(abspath $(BIN)/kiln) -env $(abspath $(ENV_OUT)) $(if $(DAY2),-day2) $(FLEET_ARGS)

LEASECHECK_DURATION ?= 5m
LEASECHECK_CLIENTS  ?= 2000
leasecheck: build ## Lease safety (root): 3 kiln serve nodes, LEASECHECK_CLIENTS DHCP clients (2000), random leader kills, partitions, restarts for LEASECHECK_DURATION (5m)
	set -o pipefail; KILN_BIN=$(abspath $(BIN)/kiln) KILN_LEASECHECK_DURATION=$(LEASECHECK_DURATION) KILN_LEASECHECK_CLIENTS=$(LEASECHECK_CLIENTS) KILN_REQUIRE_ALL=$(KILN_REQUIRE_ALL) $(GO) test -count=1 -timeout 90m -v -run 'TestLeaseCheck$$' ./deploy/lab/leasecheck/ 2>&1 | tee leasecheck.log | grep -E '^(leasecheck:|--- |ok|FAIL|panic)|leasecheck_test.go'
	@! grep -qE '^(--- FAIL|FAIL)' leasecheck.log

fuzz: ## Run every Go fuzz target for FUZZTIME each (default 10s); failing inputs land in testdata/fuzz/
	FUZZTIME=$(FUZZTIME) GO=$(GO) deploy/scripts/fuzz.sh

lint: depcheck ## gofmt, go vet, import direction
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: run gofmt -w on the files above"; exit 1; }
	$(GO) vet ./...

depcheck: ## Imports point one way: the table in deploy/scripts/depcheck/rules.go (top-level DESIGN.md "Parts and folders")
	$(GO) run ./deploy/scripts/depcheck

ci: ## What CI runs: deps-check, install dependencies, then the README's test command
	.ci/run

demo: deps build env ## The README's first command: a VM PXE-boots from Kiln to provisioned
	$(GO) run ./deploy/lab/demo -firmware $(FW) -image $(IMAGE)

demo-down: ## Tear down the lab the demo left running
	-for ns in kln-srv kln-lan; do ip netns pids $$ns 2>/dev/null | xargs -r kill -9; ip netns del $$ns 2>/dev/null; done; true

deps: ## Install the Debian packages Kiln's tests and lab need (idempotent; root)
	deploy/scripts/install-deps.sh

deps-check: ## Every command the scripts, build and tests call: on a fresh machine or from install-deps
	$(GO) run ./deploy/scripts/pkgcheck

clean: ## Remove build outputs
	rm -rf $(BIN) build e2e.log e2e-ha.log bench.log leasecheck.log capi.log capi-e2e.log
