#!/usr/bin/env bash
# Installs the Debian packages Kiln's scripts, build, tests, benchmarks and lab need: every package
# named in deploy/scripts/packages.tsv, the one table of the commands and paths the repository uses
# (`make deps-check` proves it covers them). Idempotent: packages already present are skipped, and
# apt runs only when something is missing.
# Usage: deploy/scripts/install-deps.sh           install what is missing (as root; otherwise name it and exit 1)
#        deploy/scripts/install-deps.sh --list    print the packages it installs, one a line, and exit
set -euo pipefail
table="$(dirname "$0")/packages.tsv"
mapfile -t pkgs < <(awk -F'\t' '!/^#/ && NF >= 2 && $2 != "-" {print $2}' "$table" | sort -u)
[ ${#pkgs[@]} -gt 0 ] || { echo "install-deps: no packages in $table" >&2; exit 1; }

case "${1:-}" in
  --list) printf '%s\n' "${pkgs[@]}"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--list]" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "$(id -u)" != 0 ]; then
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: missing packages: ${missing[*]}" >&2
    echo "install-deps: run as root (sudo $0) to install them" >&2
    exit 1
  fi
  exit 0
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Services from these packages (kea, nginx, prometheus) must not start on the host:
  # the tests start their own instances inside network namespaces.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all ${#pkgs[@]} packages present"
