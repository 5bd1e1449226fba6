#!/usr/bin/env bash
# Copies the SPMDJob CRD (crds/, generated from the table in monarch_spmd/spec.py by
# scripts/gen-crd.sh, which runs this) into the Helm chart's crds/ folder, which Helm installs on
# `helm install` (and never upgrades). tests/helm/test_helm_chart.py fails when the two copies differ.
#   scripts/sync-crd.sh          copy
#   scripts/sync-crd.sh --check  exit 1 if the copies differ
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/crds/spmd.monarch.dev_spmdjobs.yaml"
DST="$ROOT/helm/monarch-spmd/crds/spmd.monarch.dev_spmdjobs.yaml"
[ -f "$SRC" ] || { echo "sync-crd: $SRC does not exist" >&2; exit 1; }
if [ "${1:-}" = "--check" ]; then
  if cmp -s "$SRC" "$DST"; then echo "sync-crd: in sync"; exit 0; fi
  echo "sync-crd: $DST differs from $SRC; run scripts/sync-crd.sh" >&2
  exit 1
fi
mkdir -p "$(dirname "$DST")"
cp "$SRC" "$DST"
echo "sync-crd: copied $SRC -> $DST"
