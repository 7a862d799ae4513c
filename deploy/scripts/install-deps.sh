#!/usr/bin/env bash
# Installs the Debian packages Kiln's tests, benchmarks and lab need. Idempotent:
# packages already present are skipped, and apt runs only when something is missing.
# Usage: deploy/scripts/install-deps.sh [--bench]
set -euo pipefail

pkgs=(
  # the lab: firmware, VMs, BMC
  qemu-system-x86 qemu-utils ipxe-qemu ovmf seabios openipmi ipmitool
  # real protocol clients and tools
  isc-dhcp-client udhcpc iproute2 tcpdump curl atftp tftp-hpa dnsmasq
  busybox-static bc openssl python3 radvd
  # disks and images (agent tests, env build)
  e2fsprogs dosfstools mtools fdisk gdisk util-linux zstd gzip cpio xz-utils kmod
  # peers measured in benchmarks and perfdhcp used by DHCP tests
  kea-dhcp4-server kea-admin nginx
)

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
  # Services from these packages (kea, nginx, dnsmasq) must not start on the host:
  # the tests start their own instances inside network namespaces.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all ${#pkgs[@]} packages present"
