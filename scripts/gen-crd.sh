#!/usr/bin/env bash
# Generates the SPMDJob CRD from its sources, the table in monarch_spmd/spec.py and, under
# spec.template, Kubernetes' own PodTemplateSpec schema (monarch_spmd/podtemplate.py, from the
# committed subset of Kubernetes' OpenAPI in monarch_spmd/podspec_openapi.py), into crds/, and
# copies it into the Helm chart (scripts/sync-crd.sh). tests/unit/test_crd.py fails when the
# committed file differs from what they generate, so run this after every change there.
#   scripts/gen-crd.sh          write crds/spmd.monarch.dev_spmdjobs.yaml and the chart's copy
#   scripts/gen-crd.sh --check  exit 1 if either file is out of date
#   scripts/gen-crd.sh --openapi FILE VERSION
#                               first take the pod template's schemas from FILE, Kubernetes
#                               VERSION's api/openapi-spec/v3/api__v1_openapi.json (e.g. from the Go
#                               module cache: $(go env GOMODCACHE)/k8s.io/kubernetes@VERSION/...)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
OUT="$ROOT/crds/spmd.monarch.dev_spmdjobs.yaml"
cd "$ROOT"
if [ "${1:-}" = "--check" ]; then
  "$PY" -m monarch_spmd.crd --check "$OUT"
  exec bash "$ROOT/scripts/sync-crd.sh" --check
fi
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
if [ "${1:-}" = "--openapi" ]; then
  [ $# -eq 3 ] || { echo "usage: scripts/gen-crd.sh --openapi FILE VERSION" >&2; exit 2; }
  "$PY" -m monarch_spmd.podtemplate extract "$2" "$3" >"$tmp"
  cat "$tmp" >"$ROOT/monarch_spmd/podspec_openapi.py"
  echo "gen-crd: wrote monarch_spmd/podspec_openapi.py from $2 (Kubernetes $3)"
fi
"$PY" -m monarch_spmd.crd >"$tmp"   # a failing generator leaves the file as it was
cat "$tmp" >"$OUT"
echo "gen-crd: wrote $OUT from monarch_spmd/spec.py and monarch_spmd/podspec_openapi.py"
bash "$ROOT/scripts/sync-crd.sh"
