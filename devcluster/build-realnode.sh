#!/usr/bin/env bash
# Builds what the test cluster's real nodes (devcluster/realnode.py) need beside build-binaries.sh's
# binaries, once per machine, into a versioned cache outside the repository:
#   kubelet   k8s.io/kubernetes/cmd/kubelet, the same version and wrapper module as the control
#             plane (build-binaries.sh), so Go's module and build caches are shared with it;
#   coredns   github.com/coredns/coredns with the plugins the cluster DNS uses (kubernetes, bind,
#             ready, errors, log, cache), as a small main package of our own.
# and installs Debian's containerd, runc and CNI plugins when missing. Prints the bin folder on its
# last line. MONARCH_SPMD_REALNODE_BIN names a folder that already holds both binaries.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
CACHE="${MONARCH_SPMD_CACHE:-$HOME/.cache/monarch-spmd}"
BIN="$CACHE/realnode-k8s-$K8S_VERSION-coredns-$COREDNS_VERSION/bin"
NEEDED=(kubelet coredns)

log() { echo "build-realnode: $*" >&2; }
have_all() { local d="$1" b; for b in "${NEEDED[@]}"; do [ -x "$d/$b" ] || return 1; done; }

need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v nsenter >/dev/null || need+=(util-linux)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ -n "${MONARCH_SPMD_REALNODE_BIN:-}" ] && have_all "$MONARCH_SPMD_REALNODE_BIN"; then
  echo "$MONARCH_SPMD_REALNODE_BIN"; exit 0
fi
if have_all "$BIN"; then echo "$BIN"; exit 0; fi

command -v go >/dev/null || { log "Go is required; none on PATH"; exit 1; }
mkdir -p "$BIN"
exec 9>"$CACHE/build-realnode.lock"
flock 9
if have_all "$BIN"; then echo "$BIN"; exit 0; fi
WORK="$(mktemp -d "$CACHE/build-realnode.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# The same settings as build-binaries.sh: Go reuses what that build compiled.
export GOFLAGS="${GOFLAGS:-} -mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local
minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
staging_version="v0.${K8S_VERSION#v1.}"

if [ ! -x "$BIN/kubelet" ]; then
  log "building kubelet $K8S_VERSION"
  began=$(date +%s)
  modfile="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  mkdir -p "$WORK/k8s" && cd "$WORK/k8s"
  {
    echo "module monarchspmd.local/k8sbuild"
    grep -E '^go [0-9]' "$modfile"
    grep -E '^godebug ' "$modfile" || true
    echo "require k8s.io/kubernetes $K8S_VERSION"
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9.-]*\) => ./staging/src/.*#replace \1 => \1 '"$staging_version"'#p' "$modfile"
  } > go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' > tools.go
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes@$K8S_VERSION" >&2
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  go build -p 2 -tags selinux,notest -trimpath -ldflags "$ld" -o "$BIN/kubelet" k8s.io/kubernetes/cmd/kubelet >&2
  log "kubelet built in $(( $(date +%s) - began ))s"
fi

if [ ! -x "$BIN/coredns" ]; then
  log "building coredns $COREDNS_VERSION"
  began=$(date +%s)
  mkdir -p "$WORK/coredns" && cd "$WORK/coredns"
  modfile="$(go mod download -json "github.com/coredns/coredns@$COREDNS_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  # A require line, not `go get github.com/coredns/coredns@...`: go get loads the module's root
  # package, which imports every plugin, and so downloads the cloud SDKs (Azure, AWS, Google,
  # Datadog: hundreds of MB) that the plugins below never import. `go mod tidy` fetches only
  # the modules of the packages main.go imports.
  {
    echo "module monarchspmd.local/corednsbuild"
    grep -E '^go [0-9]' "$modfile"
    echo "require github.com/coredns/coredns $COREDNS_VERSION"
  } > go.mod
  # Only the plugins the cluster's Corefile uses (devcluster/realnode.py), not the cloud ones.
  cat > main.go <<'GO'
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
GO
  go mod tidy >&2
  go build -p 2 -trimpath -ldflags "-s -w" -o "$BIN/coredns" . >&2
  log "coredns built in $(( $(date +%s) - began ))s"
fi

have_all "$BIN" || { log "some binaries are missing from $BIN"; exit 1; }
echo "$BIN"
