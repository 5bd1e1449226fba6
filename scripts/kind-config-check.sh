#!/usr/bin/env bash
# Checks kind cluster configs (kind-config.yaml) with kind's own loader and validation, on machines
# where kind itself cannot run: the same code `kind create cluster --config FILE` runs before it
# creates anything (strict decoding, so an unknown or misspelt field fails; defaults; Validate()).
#
#   bash scripts/kind-config-check.sh kind-config.yaml [more.yaml ...]
#
# The checker is a small main package added to a copy of the sigs.k8s.io/kind module taken from
# the Go module proxy (it calls kind's internal encoding.Load, which only code under the module's
# pkg/ folder may import), built once per machine into ~/.cache/monarch-spmd/kind-<version>/bin.
set -euo pipefail

KIND_VERSION="${KIND_VERSION:-v0.33.0}"
CACHE="${MONARCH_SPMD_CACHE:-$HOME/.cache/monarch-spmd}"
BIN="$CACHE/kind-$KIND_VERSION/bin/kind-config-check"

if [ ! -x "$BIN" ]; then
  command -v go >/dev/null || { echo "kind-config-check: Go is required" >&2; exit 1; }
  mkdir -p "$(dirname "$BIN")"
  WORK="$(mktemp -d "$CACHE/kind-build.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
  export GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local
  src="$(cd "$WORK" && go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  cp -r "$src" "$WORK/kind" && chmod -R u+w "$WORK/kind"
  mkdir -p "$WORK/kind/pkg/kind-config-check"
  cat > "$WORK/kind/pkg/kind-config-check/main.go" <<'GO'
// kind-config-check loads each file as `kind create cluster --config` does and validates it.
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/kind/pkg/internal/apis/config/encoding"
)

func main() {
	status := 0
	for _, path := range os.Args[1:] {
		cfg, err := encoding.Load(path)
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			status = 1
			continue
		}
		roles := []string{}
		for _, n := range cfg.Nodes {
			roles = append(roles, string(n.Role))
		}
		fmt.Printf("%s: ok: cluster %q, nodes %v\n", path, cfg.Name, roles)
	}
	os.Exit(status)
}
GO
  (cd "$WORK/kind" && go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" ./pkg/kind-config-check) >&2
  mv "$BIN.tmp" "$BIN"
  rm -rf "$WORK"  # exec below skips the EXIT trap
  trap - EXIT
fi
exec "$BIN" "$@"
