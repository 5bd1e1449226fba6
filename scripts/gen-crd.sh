#!/usr/bin/env bash
# Generates the SPMDJob CRD from its one source, the table in monarch_spmd/spec.py, into crds/, and
# copies it into the Helm chart (scripts/sync-crd.sh). tests/unit/test_crd.py fails when the
# committed file differs from what the table generates, so run this after every change there.
#   scripts/gen-crd.sh          write crds/spmd.monarch.dev_spmdjobs.yaml and the chart's copy
#   scripts/gen-crd.sh --check  exit 1 if either file is out of date
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
"$PY" -m monarch_spmd.crd >"$tmp"   # a failing generator leaves the file as it was
cat "$tmp" >"$OUT"
echo "gen-crd: wrote $OUT from monarch_spmd/spec.py"
bash "$ROOT/scripts/sync-crd.sh"
