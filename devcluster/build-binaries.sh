#!/usr/bin/env bash
# Builds the test cluster's binaries from the Go module proxy into a versioned cache outside the
# repository, once per machine: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, kwok and helm. Prints the bin folder on its last line.
#
# Skipped entirely when KUBEBUILDER_ASSETS (the envtest convention) or MONARCH_SPMD_K8S_BIN names
# a folder that already holds the binaries; see devcluster/README.md.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
CACHE="${MONARCH_SPMD_CACHE:-$HOME/.cache/monarch-spmd}"
BIN="$CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION/bin"
NEEDED=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm)

have_all() { local d="$1" b; for b in "${NEEDED[@]}"; do [ -x "$d/$b" ] || return 1; done; }

for d in "${MONARCH_SPMD_K8S_BIN:-}" "${KUBEBUILDER_ASSETS:-}"; do
  if [ -n "$d" ] && have_all "$d"; then echo "$d"; exit 0; fi
done
if have_all "$BIN"; then echo "$BIN"; exit 0; fi

command -v go >/dev/null || { echo "build-binaries: Go is required (https://go.dev); none on PATH" >&2; exit 1; }
mkdir -p "$BIN"
# One build at a time per machine: a second caller waits, then finds the binaries.
exec 9>"$CACHE/build.lock"
flock 9
if have_all "$BIN"; then echo "$BIN"; exit 0; fi
WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export GOFLAGS="${GOFLAGS:-} -mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local
minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
staging_version="v0.${K8S_VERSION#v1.}"

log() { echo "build-binaries: $*" >&2; }

# --- Kubernetes: a wrapper module replacing every staging module with its published version.
if ! { [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/kubectl" ]; }; then
  log "building Kubernetes $K8S_VERSION (first run on this machine: tens of minutes)"
  modfile="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  mkdir -p "$WORK/k8s" && cd "$WORK/k8s"
  {
    echo "module monarchspmd.local/k8sbuild"
    grep -E '^go [0-9]' "$modfile"
    grep -E '^godebug ' "$modfile" || true
    echo "require k8s.io/kubernetes $K8S_VERSION"
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9.-]*\) => ./staging/src/.*#replace \1 => \1 '"$staging_version"'#p' "$modfile"
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes@$K8S_VERSION" >&2
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  go build -p 2 -tags selinux,notest -trimpath -ldflags "$ld" -o "$BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl >&2
fi

# --- etcd: a wrapper module requiring the server module only.
if [ ! -x "$BIN/etcd" ]; then
  log "building etcd $ETCD_VERSION"
  mkdir -p "$WORK/etcd" && cd "$WORK/etcd"
  printf 'module monarchspmd.local/etcdbuild\n\ngo 1.24\n' > go.mod
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3 >&2
fi

# --- kwok and helm install as they are.
if [ ! -x "$BIN/kwok" ]; then
  log "building kwok $KWOK_VERSION"
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
fi
if [ ! -x "$BIN/helm" ]; then
  log "building helm $HELM_VERSION"
  # Stamp the Kubernetes version helm assumes offline (`helm template`, `helm lint`), else 1.20.
  kv="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  kv="$kv -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION $kv" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
fi

have_all "$BIN" || { echo "build-binaries: some binaries are missing from $BIN" >&2; exit 1; }
echo "$BIN"
