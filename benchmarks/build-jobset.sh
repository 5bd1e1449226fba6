#!/usr/bin/env bash
# Builds JobSet's controller manager (sigs.k8s.io/jobset, the module root's main package) from the
# Go module proxy into a versioned cache outside the repository, once per machine, and copies the
# JobSet CRD and webhook configurations from the same module zip beside it. The operator-scale
# benchmark runs it beside the SPMDJob operator (benchmarks/cluster.py: JobSetOperator).
# Prints the cache folder on its last line:
#   <dir>/bin/jobset-manager       the controller manager
#   <dir>/crds/*.yaml              config/components/crd/bases of that version
#   <dir>/webhooks.yaml            config/components/webhook/manifests.yaml
#   <dir>/webhook-patches.yaml     the kustomize patches that give the pod webhooks their
#                                  objectSelector (only pods of a JobSet go through them)
#
# Usage: bash benchmarks/build-jobset.sh
# Env: JOBSET_VERSION (default v0.12.0), MONARCH_SPMD_CACHE (default ~/.cache/monarch-spmd).
# Same Go settings as devcluster/build-binaries.sh, so Go's module and build caches are shared.
set -euo pipefail

VERSION="${JOBSET_VERSION:-v0.12.0}"
CACHE="${MONARCH_SPMD_CACHE:-$HOME/.cache/monarch-spmd}"
DIR="$CACHE/jobset-$VERSION"
MODULE="sigs.k8s.io/jobset"

log() { echo "build-jobset: $*" >&2; }
have() { [ -x "$DIR/bin/jobset-manager" ] && [ -s "$DIR/crds/jobset.x-k8s.io_jobsets.yaml" ] && [ -s "$DIR/webhooks.yaml" ]; }
if have; then echo "$DIR"; exit 0; fi

command -v go >/dev/null || { log "Go is required (https://go.dev); none on PATH"; exit 1; }
mkdir -p "$CACHE"
# One build at a time per machine (the smoke test and a full benchmark run may both ask).
exec 9>"$CACHE/build-jobset.lock"
flock 9
if have; then echo "$DIR"; exit 0; fi
WORK="$(mktemp -d "$CACHE/build-jobset.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export GOFLAGS="${GOFLAGS:-} -mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local

began=$(date +%s)
log "building JobSet $VERSION (first run on this machine: minutes)"
src="$(go mod download -json "$MODULE@$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
# A wrapper module keeps the build's go.mod and go.sum out of the module cache; JobSet's own
# go.mod has no replace directives, so requiring it pins every dependency as released.
mkdir -p "$WORK/build" && cd "$WORK/build"
{
  echo "module monarchspmd.local/jobsetbuild"
  grep -E '^go [0-9]' "$src/go.mod"
  grep -E '^godebug ' "$src/go.mod" || true
  echo "require $MODULE $VERSION"
} > go.mod
printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$MODULE" > tools.go
go get "$MODULE@$VERSION" >&2
ld="-s -w -X $MODULE/pkg/version.GitVersion=$VERSION -X $MODULE/pkg/version.GitCommit=module-proxy"
mkdir -p "$WORK/out/bin" "$WORK/out/crds"
go build -p 2 -trimpath -ldflags "$ld" -o "$WORK/out/bin/jobset-manager" "$MODULE" >&2
cp "$src"/config/components/crd/bases/*.yaml "$WORK/out/crds/"
cp "$src/config/components/webhook/manifests.yaml" "$WORK/out/webhooks.yaml"
cat "$src"/config/components/webhook/patches/*.yaml > "$WORK/out/webhook-patches.yaml"
chmod -R u+w "$WORK/out"
rm -rf "$DIR" && mv "$WORK/out" "$DIR"
log "JobSet $VERSION built in $(( $(date +%s) - began ))s"

have || { log "the binary or the CRDs are missing from $DIR"; exit 1; }
echo "$DIR"
