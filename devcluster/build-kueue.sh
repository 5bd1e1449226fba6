#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) from the Go module proxy into a versioned
# cache outside the repository, once per machine, and extracts Kueue's CRDs from the same module
# zip (config/components/crd/bases/*.yaml) beside it. Prints the folder on its last line:
#   <folder>/kueue          the manager binary
#   <folder>/crds/*.yaml    the CustomResourceDefinitions of that version
#   <folder>/webhooks.yaml  Kueue's webhook configurations (config/components/webhook/manifests.yaml),
#                           which kueue.py rewrites to point at the local process
# devcluster/kueue.py runs it against the test cluster. Same Go settings as build-binaries.sh, so
# Go's module and build caches are shared (client-go, apimachinery ... compile once).
#
# MONARCH_SPMD_KUEUE_DIR names a folder that already holds all three, and skips the build.
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
CACHE="${MONARCH_SPMD_CACHE:-$HOME/.cache/monarch-spmd}"
OUT="$CACHE/kueue-$KUEUE_VERSION"

log() { echo "build-kueue: $*" >&2; }
have_all() { [ -x "$1/kueue" ] && [ -s "$1/crds/kueue.x-k8s.io_workloads.yaml" ] && [ -s "$1/webhooks.yaml" ]; }

if [ -n "${MONARCH_SPMD_KUEUE_DIR:-}" ] && have_all "$MONARCH_SPMD_KUEUE_DIR"; then
  echo "$MONARCH_SPMD_KUEUE_DIR"; exit 0
fi
if have_all "$OUT"; then echo "$OUT"; exit 0; fi

command -v go >/dev/null || { log "Go is required (https://go.dev); none on PATH"; exit 1; }
mkdir -p "$CACHE"
# One build at a time per machine: a second caller waits, then finds the binary.
exec 9>"$CACHE/build-kueue.lock"
flock 9
if have_all "$OUT"; then echo "$OUT"; exit 0; fi
WORK="$(mktemp -d "$CACHE/build-kueue.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export GOFLAGS="${GOFLAGS:-} -mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local

began=$(date +%s)
log "building Kueue $KUEUE_VERSION (first run on this machine: minutes)"
# Kueue's go.mod has no replace directives; a wrapper module still keeps the build's go.mod and
# go.sum out of the module cache and lets the same flags as the Kubernetes build apply.
dir="$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
mkdir -p "$WORK/kueue" && cd "$WORK/kueue"
{
  echo "module monarchspmd.local/kueuebuild"
  grep -E '^go [0-9]' "$dir/go.mod"
  grep -E '^godebug ' "$dir/go.mod" || true
  echo "require sigs.k8s.io/kueue $KUEUE_VERSION"
} > go.mod
printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/kueue/cmd/kueue"\n' > tools.go
go get "sigs.k8s.io/kueue@$KUEUE_VERSION" >&2
ld="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION -X sigs.k8s.io/kueue/pkg/version.GitCommit=module-proxy"
mkdir -p "$WORK/out/crds"
go build -p 2 -trimpath -ldflags "$ld" -o "$WORK/out/kueue" sigs.k8s.io/kueue/cmd/kueue >&2
cp "$dir"/config/components/crd/bases/*.yaml "$WORK/out/crds/"
cp "$dir/config/components/webhook/manifests.yaml" "$WORK/out/webhooks.yaml"
chmod -R u+w "$WORK/out"
rm -rf "$OUT" && mv "$WORK/out" "$OUT"
log "Kueue $KUEUE_VERSION built in $(( $(date +%s) - began ))s"

have_all "$OUT" || { log "the binary or the CRDs are missing from $OUT"; exit 1; }
echo "$OUT"
