#!/bin/bash
# deploy/env/build.sh — build Kiln's in-RAM provisioning environment.
#
# Output (default build/env/ under the repository root, override with KILN_ENV_OUT):
#   vmlinuz    the kernel of Debian's linux-image-* package that linux-image-amd64 depends on
#              (fetched with `apt-get download`, unpacked with `dpkg -x`, never installed)
#   initramfs  gzip'ed newc cpio: /init (busybox sh), /bin/busybox (static), /bin/kiln-agent
#              (CGO_ENABLED=0, -trimpath -ldflags=-buildid=), /sbin/veritysetup and
#              /sbin/mkfs.ext4 (WANT_PROGRAMS, with the libraries ldd lists; /etc/mke2fs.conf),
#              and only the kernel modules listed in WANT_MODULES plus their dependencies
#              (/lib/modules/order)
#   DIGESTS    sha256 of the kernel .deb, vmlinuz and initramfs (sha256sum format)
#
# The .deb and its unpacked tree are cached in build/cache/ (KILN_ENV_CACHE) so reruns do not
# download. The build is reproducible: sorted cpio entries, mtime 0, uid/gid 0, fixed inode
# numbers (GNU cpio --reproducible) and `gzip -n` (no name, no timestamp).
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
OUT=${KILN_ENV_OUT:-$ROOT/build/env}
CACHE=${KILN_ENV_CACHE:-$ROOT/build/cache}
GO=${GO:-go}
# virtio (qemu, most clouds), e1000/igb/ixgbe/bnxt/mlx5 are left out on purpose: add NIC drivers here.
# dm_mod, dm_verity, crc32c_generic (ext4's softdep), ext4: the agent checks the base root's dm-verity tree and writes the ext4 node layer.
WANT_MODULES=${WANT_MODULES:-"virtio_pci virtio_net virtio_blk virtio_scsi sd_mod nvme ahci e1000 e1000e af_packet ipmi_si ipmi_devintf dm_mod dm_verity crc32c_generic ext4"}
# Host programs the agent runs (issue 15), copied with the shared libraries ldd lists: veritysetup
# (verify step: the base root's hash tree) and mkfs.ext4 (the per-node layer, mkfs.ext4 -d).
WANT_PROGRAMS=${WANT_PROGRAMS:-"/usr/sbin/veritysetup /usr/sbin/mkfs.ext4"}
mkdir -p "$CACHE"

# One build at a time per cache (tests may build concurrently).
exec 9>"$CACHE/.lock"
flock 9

kpkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
KPKG=$(kpkg)
if [ -z "$KPKG" ] && [ "$(id -u)" = 0 ]; then
  apt-get update -qq   # a machine whose package lists were never fetched
  KPKG=$(kpkg)
fi
[ -n "$KPKG" ] || { echo "build.sh: cannot resolve the kernel package of linux-image-amd64 (run apt-get update as root)" >&2; exit 1; }
DEB=$(ls "$CACHE/${KPKG}"_*.deb 2>/dev/null | head -1 || true)
if [ -z "$DEB" ]; then
  if ! (cd "$CACHE" && apt-get download "$KPKG"); then
    [ "$(id -u)" = 0 ] && apt-get update -qq
    (cd "$CACHE" && apt-get download "$KPKG")
  fi
  DEB=$(ls "$CACHE/${KPKG}"_*.deb | head -1)
fi
KTREE="$CACHE/$(basename "$DEB" .deb).x"
if [ ! -d "$KTREE/boot" ]; then
  rm -rf "$KTREE.tmp"; dpkg -x "$DEB" "$KTREE.tmp"; mv "$KTREE.tmp" "$KTREE"
fi
# KILN_ENV_KERNEL_ONLY=1: fetch and unpack the kernel .deb (cached), print its unpacked tree and stop
# (deploy/lab/labos builds the lab OS from the same kernel).
if [ "${KILN_ENV_KERNEL_ONLY:-}" = 1 ]; then echo "$KTREE"; exit 0; fi
mkdir -p "$OUT"
KVER=$(ls "$KTREE/lib/modules" | head -1)
MODDIR="$KTREE/lib/modules/$KVER"

WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
R="$WORK/root"
mkdir -p "$R"/{bin,dev,proc,sys,tmp,run,lib/modules}
cp /bin/busybox "$R/bin/busybox"
ln -s busybox "$R/bin/sh"
(cd "$ROOT" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags=-buildid= -o "$R/bin/kiln-agent" ./cmd/kiln-agent)
install -m 0755 "$ROOT/deploy/env/init" "$R/init"
# Each program at /sbin/NAME, each library at the path ldd names (the dynamic loader included).
for p in $WANT_PROGRAMS; do
  [ -x "$p" ] || { echo "build.sh: $p missing (deploy/scripts/install-deps.sh)" >&2; exit 1; }
  install -D -m 0755 "$p" "$R/sbin/$(basename "$p")"
  for lib in $(ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    install -D -m 0755 "$(readlink -f "$lib")" "$R$lib"
  done
done
install -D -m 0644 /etc/mke2fs.conf "$R/etc/mke2fs.conf"
install -m 0755 "$ROOT/deploy/env/udhcpc.script" "$R/bin/udhcpc.script"

# Modules with their dependencies, in load order (dependencies first). Built-in ones are skipped.
order=""
resolve() {
  local m=${1//-/_} f deps d                        # dm-mod and dm_mod are one module
  f=$(find "$MODDIR" -name "$m.ko" -o -name "${m//_/-}.ko" | head -1)
  [ -n "$f" ] || return 0                         # built in (modules.builtin) or not built
  deps=$(/sbin/modinfo -F depends "$f" | tr ',' ' ')
  for d in $deps; do resolve "$d"; done
  case " $order " in *" $m "*) ;; *) order="$order $m"; cp "$f" "$R/lib/modules/$m.ko" ;; esac
}
for m in $WANT_MODULES; do resolve "$m"; done
echo "$order" | tr ' ' '\n' | sed '/^$/d' > "$R/lib/modules/order"
echo "$KVER" > "$R/lib/modules/version"

# Reproducible archive.
find "$R" -exec touch -h -d @0 {} +
(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc --reproducible -R 0:0) | gzip -n -9 > "$WORK/initramfs"
cp "$KTREE/boot/vmlinuz-$KVER" "$WORK/vmlinuz"
mv "$WORK/initramfs" "$OUT/initramfs"; mv "$WORK/vmlinuz" "$OUT/vmlinuz"
(cd "$CACHE" && sha256sum "$(basename "$DEB")") > "$WORK/DIGESTS"
(cd "$OUT" && sha256sum vmlinuz initramfs) >> "$WORK/DIGESTS"
mv "$WORK/DIGESTS" "$OUT/DIGESTS"
echo "build.sh: kernel $KVER modules:$(tr '\n' ' ' < "$R/lib/modules/order")"
cat "$OUT/DIGESTS"
