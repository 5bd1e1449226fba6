#!/usr/bin/env bash
# The project's one test command (README.md, .ci/run): installs what the suite needs on a fresh
# machine, builds the test cluster's binaries once per machine (cached under ~/.cache), then runs
# every test: unit, real processes with gloo, the real Monarch runtime, the real Kubernetes control
# plane with the operator, Helm, real nodes running the project's images in containers, and the
# benchmarks' smoke runs.
#
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"

# System tools the test node needs (network namespaces, bridges) and TLS.
need_apt=()
command -v ip >/dev/null || need_apt+=(iproute2)
command -v openssl >/dev/null || need_apt+=(openssl)
command -v go >/dev/null || need_apt+=(golang-go)
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "test.sh: installing ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Python dependencies: pip's cache keeps torch, so only a fresh machine downloads it; on a warm
# machine this only checks that the installed versions satisfy pyproject.toml.
echo "test.sh: checking Python dependencies (a fresh machine downloads torch once)"
"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore -e ".[test]"

# Kubernetes, etcd, kwok and helm binaries, built from the Go module proxy once per machine.
start=$(date +%s)
MONARCH_SPMD_K8S_BIN="$(bash devcluster/build-binaries.sh | tail -n 1)"
export MONARCH_SPMD_K8S_BIN
echo "test.sh: cluster binaries in $MONARCH_SPMD_K8S_BIN ($(( $(date +%s) - start ))s)"

# Real nodes (tests/realnode): kubelet and CoreDNS from the Go module proxy (sharing the Go caches
# above), containerd, runc and the CNI plugins from Debian, and the container images built here
# from Debian's packages (Docker from Debian, run only while building); each cached per machine.
start=$(date +%s)
MONARCH_SPMD_REALNODE_BIN="$(bash devcluster/build-realnode.sh | tail -n 1)"
export MONARCH_SPMD_REALNODE_BIN
echo "test.sh: real-node binaries in $MONARCH_SPMD_REALNODE_BIN ($(( $(date +%s) - start ))s)"
start=$(date +%s)
bash scripts/build-images.sh >/dev/null
echo "test.sh: container images ready ($(( $(date +%s) - start ))s)"

# Kueue's manager, CRDs and webhooks (tests/scheduling), from the Go module proxy (build-kueue.sh,
# sharing the Go caches above), cached per machine.
start=$(date +%s)
MONARCH_SPMD_KUEUE_DIR="$(bash devcluster/build-kueue.sh | tail -n 1)"
export MONARCH_SPMD_KUEUE_DIR
echo "test.sh: Kueue in $MONARCH_SPMD_KUEUE_DIR ($(( $(date +%s) - start ))s)"

# JobSet's controller, CRD and webhooks (the operator-scale benchmark's third peer, smoke-run in
# tests/bench), from the Go module proxy (build-jobset.sh, about 4 minutes cold), cached per machine.
start=$(date +%s)
bash benchmarks/build-jobset.sh >/dev/null
echo "test.sh: JobSet ready ($(( $(date +%s) - start ))s)"

set +e
"$PY" -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure of the suite" >&2
  exit 1
fi
exit "$rc"
