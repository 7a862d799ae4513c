#!/usr/bin/env bash
# deploy/scripts/fuzz.sh — run every native Go fuzz target of the repository for a bounded
# time each (`go test -fuzz` takes one target per run). Targets are found, not listed: every
# `func FuzzX(f *testing.F)` in a tracked *_test.go file.
#
#   FUZZTIME   time per target (default 10s; anything -fuzztime takes, e.g. 5s or 2000x)
#   FUZZ       optional regexp: only targets whose name matches
#   GO         the go command (default go)
#
# An input that makes a target fail is written by go test to the package's
# testdata/fuzz/FuzzX/ directory: commit it with the fix, and it is replayed by every
# plain `go test` from then on. Exits 1 when any target failed, naming them.
set -euo pipefail
cd "$(dirname "$0")/../.."
FUZZTIME=${FUZZTIME:-10s}
GO=${GO:-go}
# "DIR NAME" per target, e.g. "dhcp FuzzHandle" (a target in the module root: ". NAME").
mapfile -t targets < <(git grep -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' -- '*_test.go' |
  sed -E 's#^([^:]*/)?[^/:]+_test\.go:func (Fuzz[A-Za-z0-9_]*)\(.*#\1 \2#; s#^/? #. #; s#/ # #' | sort)
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }
failed=()
n=0
start=$(date +%s)
for t in "${targets[@]}"; do
  dir=${t% *} name=${t#* }
  if [ -n "${FUZZ:-}" ] && ! [[ $name =~ $FUZZ ]]; then continue; fi
  n=$((n + 1))
  echo "fuzz: $name in ./$dir for $FUZZTIME"
  if ! "$GO" test -run='^$' -fuzz="^${name}\$" -fuzztime="$FUZZTIME" "./$dir" 2>&1 | sed 's/^/  /'; then
    failed+=("./$dir $name")
  fi
done
echo "fuzz: $n targets, $(( $(date +%s) - start )) s"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'fuzz: FAILED %s\n' "${failed[@]}"
  exit 1
fi
