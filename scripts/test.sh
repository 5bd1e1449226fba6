#!/usr/bin/env bash
# The project's one test command (README.md, .ci/run): installs what the suite needs on a fresh
# machine, builds the test cluster's binaries once per machine (cached under ~/.cache), then runs
# every test: unit, real processes with gloo, the real Monarch runtime, the real Kubernetes control
# plane with the operator, Helm, real nodes running the project's images in containers, and the
# benchmarks' smoke runs.
#
# The builds run in three lanes at once, since one waits on the CPUs and the others mostly on the
# network and the disk:
#   Go lane       cluster binaries, real-node binaries, Kueue, JobSet, PyTorchJob's operator:
#                 compiled from the Go module proxy (CPU-bound, both cores);
#   pip lane      pip install -e ".[test]" (scripts/pip-install.sh), then the import check;
#   images lane   the container images (debootstrap, apt and pip inside builds, docker save).
# All at the same CPU priority: the lanes' work adds up to about the same whichever goes first,
# and the two I/O lanes keep the network and the disk busy only while their short CPU bursts
# are served at once.
# Each step prints "test.sh: ... (Ns)" when it ends, and the run ends with the total.
#
# Usage: bash scripts/test.sh [pytest args...]
# Env: PYTHON (default python3): the interpreter to install into and test with (.ci/run passes a
# fresh virtualenv's); MONARCH_SPMD_CACHE, GOMODCACHE, GOCACHE, PIP_CACHE_DIR: where the caches are.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
BEGAN=$(date +%s)
since() { echo $(( $(date +%s) - $1 )); }
say() { echo "test.sh: $*"; }
BUILDS=
TESTS=
total() { say "total $(since "$BEGAN")s${BUILDS:+ (builds ${BUILDS}s${TESTS:+, pytest ${TESTS}s})}"; }
trap total EXIT

# System tools: the test node (network namespaces, bridges), TLS, Go, the real nodes' runtime
# (build-realnode.sh) and the image builder (build-images.sh), in one apt run before the lanes
# start (two apt-gets at once would wait on each other's lock).
start=$(date +%s)
need_apt=()
command -v ip >/dev/null || need_apt+=(iproute2)
command -v openssl >/dev/null || need_apt+=(openssl)
command -v go >/dev/null || need_apt+=(golang-go)
command -v containerd >/dev/null || need_apt+=(containerd)
command -v runc >/dev/null || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
{ command -v nsenter >/dev/null && command -v flock >/dev/null; } || need_apt+=(util-linux)
command -v dockerd >/dev/null || need_apt+=(docker.io)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v gcc >/dev/null || need_apt+=(gcc libc6-dev)
if [ "${#need_apt[@]}" -gt 0 ]; then
  say "installing ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
say "system packages ($(since "$start")s)"

OUT="$(mktemp -d "${TMPDIR:-/tmp}/monarch-spmd-test.XXXXXX")"
LANES=()
stop_lanes() {
  local pid
  for pid in "${LANES[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
}
trap 'stop_lanes; rm -rf "$OUT"; total' EXIT

# step NAME COMMAND...: runs it, keeps the last line of its stdout in $OUT/NAME, says how long.
step() {
  local name="$1" start
  shift
  start=$(date +%s)
  "$@" >"$OUT/$name.out"
  tail -n 1 "$OUT/$name.out" >"$OUT/$name"
  echo "$(since "$start")" >"$OUT/$name.s"
}

go_lane() {
  step k8s bash devcluster/build-binaries.sh
  say "cluster binaries in $(cat "$OUT/k8s") ($(cat "$OUT/k8s.s")s)"
  # Real nodes (tests/realnode): kubelet (the same wrapper module as the control plane, so Go's
  # caches are shared) and CoreDNS; containerd, runc and CNI are Debian's (installed above).
  step realnode bash devcluster/build-realnode.sh
  say "real-node binaries in $(cat "$OUT/realnode") ($(cat "$OUT/realnode.s")s)"
  # Kueue's manager, CRDs and webhooks (tests/scheduling).
  step kueue bash devcluster/build-kueue.sh
  say "Kueue in $(cat "$OUT/kueue") ($(cat "$OUT/kueue.s")s)"
  # JobSet's and Kubeflow's PyTorchJob controllers: the operator-scale benchmark's peers,
  # smoke-run in tests/bench (which would otherwise build them inside a test).
  step jobset bash benchmarks/build-jobset.sh
  say "JobSet ready ($(cat "$OUT/jobset.s")s)"
  step pytorchjob bash benchmarks/build-pytorchjob.sh
  say "PyTorchJob's operator ready ($(cat "$OUT/pytorchjob.s")s)"
}

pip_lane() {
  # pip install -e ".[test]" from a wheel folder in the cache: only a fresh machine downloads
  # torch, once; a fresh virtualenv on a warm machine installs offline.
  say "checking Python dependencies (a fresh machine downloads torch once)"
  step pip bash scripts/pip-install.sh test
  say "Python dependencies ($(cat "$OUT/pip.s")s)"
  # Every third-party import of the tree comes from a distribution an extra declares (a module
  # that only a machine-wide Python has would fail the suite on a fresh machine).
  step imports "$PY" scripts/check-imports.py
  say "every import declared ($(cat "$OUT/imports.s")s)"
}

images_lane() {
  # The container images, built from Debian's packages (Docker from Debian, run only while
  # building). The worker image, built last, takes torch from the wheel folder the pip lane
  # fills (it waits for that lane's lock on the folder).
  step images bash scripts/build-images.sh
  say "container images ready ($(cat "$OUT/images.s")s)"
}

start=$(date +%s)
trap 'exit 130' INT
trap 'exit 143' TERM
export PYTHON="$PY"
set -m  # each lane in a process group of its own, so a failure stops the others whole
go_lane &
LANES+=($!)
pip_lane &
LANES+=($!)
images_lane &
LANES+=($!)
set +m
for _ in "${LANES[@]}"; do
  if ! wait -n; then
    say "a build failed (above); stopping the others"
    exit 1
  fi
done
LANES=()
BUILDS=$(since "$start")
say "builds (${BUILDS}s)"

MONARCH_SPMD_K8S_BIN="$(cat "$OUT/k8s")"
MONARCH_SPMD_REALNODE_BIN="$(cat "$OUT/realnode")"
MONARCH_SPMD_KUEUE_DIR="$(cat "$OUT/kueue")"
export MONARCH_SPMD_K8S_BIN MONARCH_SPMD_REALNODE_BIN MONARCH_SPMD_KUEUE_DIR

# Two workers (pytest-xdist): most tests of the clusters wait on the API server, the process tests
# on the CPUs, so side by side they take about half the time on 2 cores. Each session cluster's
# tests stay together (tests/conftest.py, cluster_group); MONARCH_SPMD_TEST_WORKERS=0 runs the
# suite in this one process, as plain pytest does.
WORKERS="${MONARCH_SPMD_TEST_WORKERS:-2}"
XDIST=()
if [ "$WORKERS" != 0 ]; then
  XDIST=(-n "$WORKERS" --dist loadgroup)
fi
start=$(date +%s)
set +e
# The 30 slowest tests are listed at the end: where the suite's time goes.
"$PY" -m pytest -p no:cacheprovider --durations=30 "${XDIST[@]}" "$@"
rc=$?
set -e
TESTS=$(since "$start")
say "pytest (${TESTS}s)"
if [ "$rc" -eq 5 ]; then
  say "pytest collected no tests; that is a failure of the suite" >&2
  exit 1
fi
exit "$rc"
