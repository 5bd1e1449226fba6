#!/usr/bin/env bash
# Builds Kubeflow's training-operator v1 controller (the PyTorchJob operator) from its Go module
# into a versioned cache outside the repository, once per machine, and copies the PyTorchJob CRD
# from the same module. The operator-scale benchmark runs it beside the SPMDJob operator.
# Prints the cache folder on its last line: <dir>/bin/training-operator.v1 and
# <dir>/crds/kubeflow.org_pytorchjobs.yaml.
#
# Usage: bash benchmarks/build-pytorchjob.sh
# Env: PYTORCHJOB_VERSION (default v1.9.3), MONARCH_SPMD_CACHE (default ~/.cache/monarch-spmd).
set -euo pipefail

VERSION="${PYTORCHJOB_VERSION:-v1.9.3}"
CACHE="${MONARCH_SPMD_CACHE:-$HOME/.cache/monarch-spmd}"
DIR="$CACHE/pytorchjob-$VERSION"
MODULE="github.com/kubeflow/training-operator"
BINARY="$DIR/bin/training-operator.v1"
CRD="$DIR/crds/kubeflow.org_pytorchjobs.yaml"

have() { [ -x "$BINARY" ] && [ -s "$CRD" ]; }
if have; then echo "$DIR"; exit 0; fi

command -v go >/dev/null || { echo "build-pytorchjob: Go is required (https://go.dev); none on PATH" >&2; exit 1; }
mkdir -p "$DIR/bin" "$DIR/crds"
# One build at a time per machine (the smoke test and a full benchmark run may both ask).
exec 9>"$DIR/.lock"
flock 9
if have; then echo "$DIR"; exit 0; fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -mod=mod"
echo "build-pytorchjob: building $MODULE/cmd/training-operator.v1@$VERSION (first run: minutes)" >&2
# v1.9.3 has no replace directives, so `go install pkg@version` builds it exactly as released.
GOBIN="$DIR/bin" go install -trimpath -ldflags "-s -w" "$MODULE/cmd/training-operator.v1@$VERSION" >&2

src="$(go mod download -json "$MODULE@$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
cp "$src/manifests/base/crds/kubeflow.org_pytorchjobs.yaml" "$CRD.tmp"
chmod u+w "$CRD.tmp"
mv "$CRD.tmp" "$CRD"

have || { echo "build-pytorchjob: $BINARY or $CRD is missing after the build" >&2; exit 1; }
echo "$DIR"
