#!/usr/bin/env bash
# Installs this project, editable, with an extra (default `test`) into PYTHON's environment from a
# folder of wheels kept in the project's cache, adding to that folder only what it lacks.
#
# Why a folder of our own: pip's cache keeps a download only when the server says it may be
# cached, and the proxy in front of PyPI on the machines this runs on sends no caching headers,
# so pip's cache stays empty and every fresh virtualenv would download torch and its CUDA wheels
# (about 3 GB) again. Here the first install downloads them once (`pip wheel`, which also turns
# any sdist into a wheel); every later one, a fresh virtualenv included, installs offline
# (--no-index) from the folder. scripts/build-images.sh serves the same folder to the worker
# image's build, so its torch is not downloaded again either.
#
# Usage: bash scripts/pip-install.sh [EXTRA]
# Env: PYTHON (default python3), MONARCH_SPMD_CACHE (default ~/.cache/monarch-spmd); the wheels
# are in $MONARCH_SPMD_CACHE/wheels.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
CACHE="${MONARCH_SPMD_CACHE:-$HOME/.cache/monarch-spmd}"
WHEELS="$CACHE/wheels"
EXTRA="${1:-test}"
log() { echo "pip-install: $*" >&2; }
pip() { "$PY" -m pip --disable-pip-version-check "$@"; }
install() {
  pip install -q --root-user-action=ignore --no-index --find-links "$WHEELS" -e ".[$EXTRA]"
}

mkdir -p "$WHEELS"
# One writer at a time: a second install waits, then finds the wheels.
exec 7>"$CACHE/wheels.lock"
flock 7
err="$(mktemp)"
trap 'rm -f "$err"' EXIT
if install 2>"$err"; then exit 0; fi

# What the folder lacks: every requirement of the extra (through the project's references to its
# own extras) and of the build system (the editable build runs offline too), fetched as wheels.
mapfile -t reqs < <("$PY" - "$EXTRA" <<'PY'
import re, sys, tomllib
data = tomllib.loads(open("pyproject.toml", encoding="utf-8").read())
project, groups = data["project"], data["project"].get("optional-dependencies", {})
own = re.sub(r"[-_.]+", "-", project["name"]).lower()
out, seen, todo = [], set(), [None, sys.argv[1]]
while todo:
    extra = todo.pop()
    if extra in seen:
        continue
    seen.add(extra)
    for spec in project.get("dependencies", []) if extra is None else groups[extra]:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", spec)
        if re.sub(r"[-_.]+", "-", m.group(1)).lower() == own:
            todo.extend(e.strip() for e in (m.group(2) or "").split(",") if e.strip())
        else:
            out.append(spec)
out.extend(data.get("build-system", {}).get("requires", []))
print("\n".join(out))
PY
)
log "fetching into $WHEELS what it lacks (the first time: torch and its CUDA wheels, about 3 GB)"
began=$(date +%s)
pip wheel -q --find-links "$WHEELS" -w "$WHEELS" "${reqs[@]}"
log "fetched in $(( $(date +%s) - began ))s ($(du -sh "$WHEELS" | cut -f1) in $WHEELS)"
install
