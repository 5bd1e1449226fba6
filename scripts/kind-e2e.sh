#!/usr/bin/env bash
# The end-to-end path on a kind cluster, for machines with Docker: create the cluster from
# kind-config.yaml, build and load the operator and CPU worker images, install the Helm chart,
# run examples/hello-gloo.yaml to Succeeded and print every rank's log.
#
#   scripts/kind-e2e.sh             run it (reuses the cluster if it exists)
#   scripts/kind-e2e.sh --cleanup   run it, then delete the cluster
#   scripts/kind-e2e.sh --delete    only delete the cluster
#
# Needs: docker, kind, kubectl, helm on PATH, and `pip install -e '.[cli]'` for `monarch-spmd logs`.
# Environment: CLUSTER (default monarch-spmd), NAMESPACE (default default), TIMEOUT (default 10m).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="${CLUSTER:-monarch-spmd}"
NAMESPACE="${NAMESPACE:-default}"
TIMEOUT="${TIMEOUT:-10m}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")"
OPERATOR_IMAGE="monarch-spmd/operator:$VERSION"
WORKER_IMAGE="monarch-spmd/worker-cpu:$VERSION"
JOB=hello-gloo
CLEANUP=0

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
log() { echo "kind-e2e: $*" >&2; }
delete_cluster() { log "deleting kind cluster $CLUSTER"; kind delete cluster --name "$CLUSTER"; }

case "${1:-}" in
  "") ;;
  --cleanup) CLEANUP=1 ;;
  --delete) delete_cluster; exit 0 ;;
  -h|--help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac

for tool in docker kind kubectl helm monarch-spmd; do
  command -v "$tool" >/dev/null || { log "$tool is required on PATH"; exit 1; }
done
[ "$CLEANUP" = 1 ] && trap delete_cluster EXIT

cd "$ROOT"
if kind get clusters | grep -qx "$CLUSTER"; then
  log "reusing kind cluster $CLUSTER"
else
  kind create cluster --name "$CLUSTER" --config kind-config.yaml --wait 120s
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null

log "building $OPERATOR_IMAGE and $WORKER_IMAGE"
docker build -f images/operator.Dockerfile -t "$OPERATOR_IMAGE" .
docker build -f images/worker-cpu.Dockerfile -t "$WORKER_IMAGE" .
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$WORKER_IMAGE"

log "installing the chart"
helm upgrade --install spmd helm/monarch-spmd \
  --namespace monarch-spmd --create-namespace \
  --set image.tag="$VERSION" --set tests.image.tag="$VERSION" \
  --wait --timeout 5m
# Helm never upgrades crds/: keep a reused cluster's CRD current.
kubectl apply --server-side -f helm/monarch-spmd/crds/

log "running examples/$JOB.yaml"
kubectl -n "$NAMESPACE" delete spmdjob "$JOB" --ignore-not-found --wait
kubectl -n "$NAMESPACE" apply -f "examples/$JOB.yaml"
if ! kubectl -n "$NAMESPACE" wait "spmdjob/$JOB" --for=jsonpath='{.status.phase}'=Succeeded --timeout="$TIMEOUT"; then
  log "spmdjob/$JOB did not succeed"
  kubectl -n "$NAMESPACE" get spmdjob "$JOB" -o yaml || true
  kubectl -n "$NAMESPACE" get pods -l "spmd.monarch.dev/job=$JOB" -o wide || true
  monarch-spmd logs "$JOB" -n "$NAMESPACE" || true
  exit 1
fi
kubectl -n "$NAMESPACE" get spmdjob "$JOB"
monarch-spmd logs "$JOB" -n "$NAMESPACE"

log "running helm test"
helm test spmd --namespace monarch-spmd --logs --timeout 10m
log "done"
