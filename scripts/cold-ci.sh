#!/usr/bin/env bash
# Times CI from nothing: a clean clone of a commit (default: this checkout's HEAD) runs .ci/run
# with every cache pointed at a new empty folder (the project's cache with its images and
# virtualenv, Go's module and build caches, pip's cache), as on a fresh machine whose Debian
# packages are already installed. Prints each step's time and the total at the end, and removes
# the folders afterwards (--keep keeps them).
#
# Needs about 45 GB free on the folder's disk (torch in the virtualenv, pip's cache and the worker
# image; Go's caches; the images' tars and Docker's layers). Run it with nothing else building.
#
# Usage: bash scripts/cold-ci.sh [--keep] [--dir DIR] [REV]   (DIR default /root/cold-ci)
set -euo pipefail

keep=0
dir=/root/cold-ci
rev=HEAD
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --dir) dir="$2"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "cold-ci: unknown option $1 (--keep, --dir DIR)" >&2; exit 2 ;;
    *) rev="$1" ;;
  esac
  shift
done
repo="$(cd "$(dirname "$0")/.." && pwd)"
commit="$(git -C "$repo" rev-parse --verify "$rev^{commit}")"
if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
  echo "cold-ci: $dir is not empty; remove it or pass --dir" >&2
  exit 2
fi
echo "cold-ci: $(df -h --output=avail "$(dirname "$dir")" | tail -n 1 | tr -d ' ') free on $(dirname "$dir")"

mkdir -p "$dir"/{cache,gomod,gocache,pip}
cleanup() {
  if [ "$keep" -eq 0 ]; then
    chmod -R u+w "$dir" 2>/dev/null || true  # Go's module cache is read-only
    rm -rf "$dir"
  fi
}
trap cleanup EXIT
git clone -q --no-hardlinks "$repo" "$dir/clone"
git -C "$dir/clone" checkout -q "$commit"
echo "cold-ci: $commit in $dir/clone; caches under $dir"

began=$(date +%s)
set +e
(
  cd "$dir/clone"
  CI=true MONARCH_SPMD_CACHE="$dir/cache" GOMODCACHE="$dir/gomod" GOCACHE="$dir/gocache" \
    PIP_CACHE_DIR="$dir/pip" bash .ci/run </dev/null
) 2>&1 | tee "$dir.log"
rc=${PIPESTATUS[0]}
set -e
echo
echo "cold-ci: steps (full log: $dir.log)"
grep -E '^(test\.sh|\.ci/run|pip-install|build-[a-z]+): .*([0-9]+s|\([0-9]+s\))|^test\.sh: total|^=+ .* in [0-9.]+s' "$dir.log" \
  | sed 's/^/  /' || true
echo "cold-ci: exit $rc, $(( $(date +%s) - began ))s from an empty cache"
exit "$rc"
