#!/usr/bin/env bash
# Builds kube-apiserver from k8s.io/kubernetes (this directory's go.mod) once per machine and
# caches it under KILN_KUBE_CACHE (default ~/.cache/kiln/kube-<hash of go.sum>): the Cluster
# API provider's envtest tests run on it. A cold build takes about 11 minutes and 2.4 GB on
# 2 cores; later calls print the cached directory at once. etcd comes from Debian's
# etcd-server (deploy/scripts/packages.tsv) and is linked beside it, so the directory is a
# complete KUBEBUILDER_ASSETS. Prints the directory on stdout; progress goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
key="$(sha256sum "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)"
out="${KILN_KUBE_CACHE:-${HOME:-/root}/.cache/kiln/kube-$key}"
if [[ -x "$out/kube-apiserver" && -x "$out/etcd" ]]; then
  echo "$out"; exit 0
fi
etcd_bin="$(command -v etcd || true)"
[[ -n "$etcd_bin" ]] || { echo "build.sh: etcd not found: run deploy/scripts/install-deps.sh (Debian package etcd-server)" >&2; exit 1; }
mkdir -p "$out"
echo "build.sh: building kube-apiserver v1.37.2 into $out (cold: about 11 minutes on 2 cores)" >&2
start=$(date +%s)
( cd "$here" && go build -trimpath -ldflags '-s -w' -o "$out/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver )
mv "$out/kube-apiserver.tmp" "$out/kube-apiserver"
ln -sf "$etcd_bin" "$out/etcd"
echo "build.sh: kube-apiserver built in $(( $(date +%s) - start )) s" >&2
echo "$out"
