#!/bin/bash
# comment: notacommand here
set -euo pipefail
f() { sort -u "$1"; }
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/x" <<'END'
heredoccmd should not count
END
for x in a b; do f "$x"; done
case "${1:-}" in
  --list|-l) printf '%s\n' a ;;
  *) ls | xargs -r kill -9 ;;
esac
find . -name '*.o' -exec touch {} +
[ -e /etc/x ] || { echo no; exit 1; }
V=1 gzip -n x 2>/dev/null
echo "$(uname -r)" `hostname`
if command -v zstd >/dev/null; then :; fi
"$DYN" arg

((i++)) || true
