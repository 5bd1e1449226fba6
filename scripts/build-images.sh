#!/usr/bin/env bash
# Builds the project's container images on this machine without any container registry, and
# caches each one as a tar under ~/.cache/monarch-spmd/images named by a hash of its inputs, so a
# machine builds an image again only when something it is made from changed.
#
#   debian        monarch-spmd.local/debian:bookworm       debootstrap --variant=minbase bookworm
#                                                           from Debian's mirror, `docker import`
#   python        monarch-spmd.local/python:3.11-bookworm  images/local/python.Dockerfile (the
#                                                           stand-in for python:3.11-slim-bookworm)
#   operator      monarch-spmd/operator:<version>          images/operator.Dockerfile
#   worker-cpu    monarch-spmd/worker-cpu:<version>        images/worker-cpu.Dockerfile
#   debian-torch  monarch-spmd.local/debian-torch:bookworm images/local/debian-torch.Dockerfile
#   pause         monarch-spmd.local/pause:3.10            images/local/pause.c, static
#
# The two product Dockerfiles get BASE_IMAGE=<the python image>. This machine's CA bundle is
# copied into the Debian root file system (pip and apt inside builds go through a TLS proxy that
# it signs). Builds run in a private Docker daemon (Debian's docker.io; data in
# ~/.cache/monarch-spmd/docker, kept for its layer cache, so changing the project's sources
# rebuilds only the layers that copy them) started only when something has to be built.
#
# Usage: bash scripts/build-images.sh [NAME...]   (default: all). Prints NAME REF TAR per image,
# tab-separated, on stdout; progress goes to stderr.
#
# The worker image's torch and its wheels (about 3 GB) are not downloaded again inside the build:
# they are in the wheel folder that scripts/pip-install.sh fills (~/.cache/monarch-spmd/wheels;
# what it lacks is fetched there by this machine's pip), and a local HTTP server serves that
# folder to the build as its package index (http://127.0.0.1:$WHEEL_PORT/simple/), so the image
# gets the same files TORCH_INDEX_URL has. Only where this machine's Python (PYTHON, default
# python3) is not the image's 3.11 does the build download them itself.
#
# Environment:
#   TORCH_INDEX_URL  the worker image's torch index. Default https://pypi.org/simple: the
#                    Dockerfile's own default, the CPU-only index download.pytorch.org/whl/cpu, is
#                    unreachable on the machines this runs on, so PyPI's torch (the CUDA build,
#                    about 5 GB with its nvidia-* wheels) goes in; it runs on CPU all the same.
#   WHEEL_PORT       the local index's port (default 47391; Docker's layer cache keys the torch
#                    layer by this URL, so a fixed port keeps that layer across builds).
#   DEBIAN_MIRROR    default http://deb.debian.org/debian
#   MONARCH_SPMD_CACHE  default ~/.cache/monarch-spmd
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${MONARCH_SPMD_CACHE:-$HOME/.cache/monarch-spmd}"
OUT="$CACHE/images"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://pypi.org/simple}"
WHEEL_PORT="${WHEEL_PORT:-47391}"
HOST_PYTHON="${PYTHON:-python3}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")"
RECIPE=1  # bump to rebuild every image on every machine
ALL=(debian python operator debian-torch pause worker-cpu)  # the worker last: it may wait for the wheels
WANT=("${@:-${ALL[@]}}")

log() { echo "build-images: $*" >&2; }
hash_text() { sha256sum | cut -c1-16; }
hash_files() { (cd "$ROOT" && sha256sum "$@") | hash_text; }

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
DOCKER=/usr/bin/docker  # Debian's client, matched to its daemon
[ -x "$DOCKER" ] || DOCKER=docker

# --- what each image is made from ----------------------------------------------------------------
project_files() {  # the build context of the product images: tracked and untracked, not ignored
  (cd "$ROOT" && { git ls-files -co --exclude-standard -- pyproject.toml README.md monarch_spmd operator 2>/dev/null \
    || find pyproject.toml README.md monarch_spmd operator -type f ! -path '*/__pycache__/*'; } | LC_ALL=C sort)
}
declare -A KEY REF
KEY[debian]="$({ echo "$RECIPE $DEBIAN_MIRROR"; cat "$CA_BUNDLE"; } | hash_text)"
KEY[python]="$({ echo "${KEY[debian]}"; cat "$ROOT/images/local/python.Dockerfile"; } | hash_text)"
KEY[debian-torch]="$({ echo "${KEY[debian]}"; cat "$ROOT/images/local/debian-torch.Dockerfile"; } | hash_text)"
mapfile -t CONTEXT < <(project_files)
context_key="$(hash_files "${CONTEXT[@]}")"
KEY[operator]="$({ echo "${KEY[python]} $context_key"; cat "$ROOT/images/operator.Dockerfile"; } | hash_text)"
KEY[worker-cpu]="$({ echo "${KEY[python]} $context_key $TORCH_INDEX_URL"; cat "$ROOT/images/worker-cpu.Dockerfile"; } | hash_text)"
KEY[pause]="$({ echo "$RECIPE"; gcc --version | head -1; cat "$ROOT/images/local/pause.c"; } | hash_text)"
REF[debian]=monarch-spmd.local/debian:bookworm
REF[python]=monarch-spmd.local/python:3.11-bookworm
REF[operator]="monarch-spmd/operator:$VERSION"
REF[worker-cpu]="monarch-spmd/worker-cpu:$VERSION"
REF[debian-torch]=monarch-spmd.local/debian-torch:bookworm
REF[pause]=monarch-spmd.local/pause:3.10
declare -A DEPS=([python]=debian [operator]=python [worker-cpu]=python [debian-torch]=debian)
tar_of() { echo "$OUT/$1-${KEY[$1]}.tar"; }

for name in "${WANT[@]}"; do
  [ -n "${REF[$name]:-}" ] || { log "unknown image $name (one of ${ALL[*]})"; exit 2; }
done
print_if_cached() {  # exits when every wanted tar is there
  local name
  for name in "${WANT[@]}"; do [ -s "$(tar_of "$name")" ] || return 0; done
  for name in "${WANT[@]}"; do printf '%s\t%s\t%s\n' "$name" "${REF[$name]}" "$(tar_of "$name")"; done
  exit 0
}
print_if_cached

# --- a private Docker daemon, only while building ------------------------------------------------
mkdir -p "$OUT" "$CACHE/docker"
exec 9>"$CACHE/images.lock"
flock 9
print_if_cached  # another build may have made them while this one waited
# The daemon's sockets and state, one folder per cache: builds into two caches never share a daemon.
RUNDIR="/run/monarch-spmd-docker-$(printf '%s' "$CACHE" | hash_text | cut -c1-8)"
export DOCKER_HOST="unix://$RUNDIR/docker.sock"
WORK="$(mktemp -d "$CACHE/images-build.XXXXXX")"
DOCKERD_PID=
WHEELS_PID=
cleanup() {
  if [ -n "$WHEELS_PID" ]; then kill "$WHEELS_PID" 2>/dev/null || true; wait "$WHEELS_PID" 2>/dev/null || true; fi
  if [ -n "$DOCKERD_PID" ]; then
    kill "$DOCKERD_PID" 2>/dev/null || true
    wait "$DOCKERD_PID" 2>/dev/null || true
    umount "$RUNDIR/exec/netns/default" 2>/dev/null || true  # dockerd leaves this mount behind
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
start_docker() {
  [ -z "$DOCKERD_PID" ] || return 0
  mkdir -p "$RUNDIR"
  log "starting a private dockerd (log $CACHE/dockerd.log)"
  # No bridge and no iptables rules: every build and run uses --network=host.
  dockerd --data-root "$CACHE/docker" --exec-root "$RUNDIR/exec" --pidfile "$RUNDIR/dockerd.pid" \
    -H "$DOCKER_HOST" --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
    >"$CACHE/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 300); do
    "$DOCKER" info >/dev/null 2>&1 && return 0
    kill -0 "$DOCKERD_PID" 2>/dev/null || { log "dockerd exited; see $CACHE/dockerd.log"; exit 1; }
    sleep 0.2
  done
  log "dockerd did not come up; see $CACHE/dockerd.log"
  exit 1
}
# The image in the daemon, loaded from its tar or built: after this `REF` names the current one.
in_daemon() {
  [ "$("$DOCKER" image inspect -f '{{index .Config.Labels "dev.monarch-spmd.key"}}' "${REF[$1]}" 2>/dev/null)" = "${KEY[$1]}" ]
}
save() {  # the daemon's image -> its tar, replacing older tars of the same image
  local name="$1" tar
  tar="$(tar_of "$name")"
  # The older tars go first: the worker's is 6 GB, and two of it side by side filled the disk
  # of a machine whose other caches were warm. The daemon holds the image until the new tar is.
  find "$OUT" -maxdepth 1 \( -name "$name-????????????????.tar" -o -name "$name-*.tar.tmp" \) \
    ! -name "$(basename "$tar")" -delete
  "$DOCKER" save -o "$tar.tmp" "${REF[$name]}"
  mv "$tar.tmp" "$tar"
}
build() {
  local name="$1" began tar
  tar="$(tar_of "$name")"
  if [ -n "${DEPS[$name]:-}" ]; then ensure "${DEPS[$name]}"; fi
  start_docker
  if in_daemon "$name"; then
    [ -s "$tar" ] || save "$name"
    return 0
  fi
  if [ -s "$tar" ]; then "$DOCKER" load -q -i "$tar" >&2; in_daemon "$name" && return 0; fi
  began=$(date +%s)
  log "building $name (${REF[$name]})"
  "build_$name"
  save "$name"
  log "built $name in $(( $(date +%s) - began ))s: $tar ($(du -h "$tar" | cut -f1))"
}
declare -A DONE
ensure() { [ -n "${DONE[$1]:-}" ] || { build "$1"; DONE[$1]=1; }; }
label() { echo "dev.monarch-spmd.key=${KEY[$1]}"; }

build_debian() {
  local rootfs="$WORK/rootfs"
  debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" "$DEBIAN_MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
  # This machine's CA bundle, so pip and apt inside builds trust the TLS proxy in front of them;
  # kept across update-ca-certificates as a local certificate.
  cp "$CA_BUNDLE" "$rootfs/usr/local/share/ca-certificates/monarch-spmd-build-host.crt"
  chroot "$rootfs" update-ca-certificates >/dev/null 2>&1 || cp "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$DEBIAN_MIRROR" "$DEBIAN_MIRROR" >"$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  tar -C "$rootfs" -c . | "$DOCKER" import -c "LABEL $(label debian)" -c 'CMD ["bash"]' - "${REF[debian]}" >&2
}
docker_build() {  # NAME DOCKERFILE CONTEXT [build args...]
  local name="$1" dockerfile="$2" context="$3"
  shift 3
  DOCKER_BUILDKIT=0 "$DOCKER" build -q --network=host --label "$(label "$name")" -t "${REF[$name]}" \
    -f "$dockerfile" "$@" "$context" >&2
}
build_python() {
  mkdir -p "$WORK/empty"
  docker_build python "$ROOT/images/local/python.Dockerfile" "$WORK/empty" --build-arg "DEBIAN_IMAGE=${REF[debian]}"
}
build_debian-torch() {
  mkdir -p "$WORK/empty"
  docker_build debian-torch "$ROOT/images/local/debian-torch.Dockerfile" "$WORK/empty" --build-arg "DEBIAN_IMAGE=${REF[debian]}"
}
project_context() {  # only the files the Dockerfiles copy, nothing ignored
  if [ ! -d "$WORK/context" ]; then
    mkdir -p "$WORK/context"
    (cd "$ROOT" && cp --parents -t "$WORK/context" "${CONTEXT[@]}")
  fi
  echo "$WORK/context"
}
build_operator() {
  docker_build operator "$ROOT/images/operator.Dockerfile" "$(project_context)" --build-arg "BASE_IMAGE=${REF[python]}"
}
# The wheel folder scripts/pip-install.sh keeps ($CACHE/wheels), with the pins given (torch's,
# torchft's) and their dependencies added where missing (fetched from TORCH_INDEX_URL by this machine's pip), laid out
# also as a PEP 503 index (simple/<project>/<wheel>, hard links). Prints the folder; fails where
# this machine's Python is not the image's (3.11 on Linux x86_64), whose wheels could differ.
torch_wheelhouse() {
  local dir="$CACHE/wheels" file project
  "$HOST_PYTHON" -c 'import platform, sys; sys.exit(sys.version_info[:2] != (3, 11) or platform.machine() != "x86_64")' \
    2>/dev/null || return 1
  mkdir -p "$dir"
  exec 7>"$CACHE/wheels.lock"  # this function runs in a subshell: the lock ends with it
  flock 7
  if ! "$HOST_PYTHON" -m pip wheel -q --disable-pip-version-check --no-index --find-links "$dir" -w "$dir" "$@" >/dev/null 2>&1; then
    log "fetching $* and their wheels into $dir"
    "$HOST_PYTHON" -m pip wheel -q --disable-pip-version-check --index-url "$TORCH_INDEX_URL" \
      --find-links "$dir" -w "$dir" "$@" >&2 || return 1
  fi
  rm -rf "$dir/simple"
  for file in "$dir"/*.whl; do
    project="$(basename "$file" | cut -d- -f1 | sed 's/[_.]/-/g' | tr 'A-Z' 'a-z')"
    mkdir -p "$dir/simple/$project"
    ln "$file" "$dir/simple/$project/"
  done
  echo "$dir"
}
INDEX=
serve_wheels() {  # DIR: serves it until this script exits; INDEX becomes its URL
  local dir="$1" port="$WHEEL_PORT"
  if ! "$HOST_PYTHON" -c 'import socket, sys; s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; then
    port="$("$HOST_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    log "port $WHEEL_PORT is taken; serving the wheels on $port (Docker rebuilds the torch layer)"
  fi
  "$HOST_PYTHON" -m http.server "$port" --bind 127.0.0.1 --directory "$dir" >"$WORK/wheels.log" 2>&1 &
  WHEELS_PID=$!
  for _ in $(seq 100); do
    "$HOST_PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
      "http://127.0.0.1:$port/simple/torch/" 2>/dev/null && { INDEX="http://127.0.0.1:$port/simple/"; return 0; }
    kill -0 "$WHEELS_PID" 2>/dev/null || break
    sleep 0.2
  done
  log "the local wheel index did not come up; see $WORK/wheels.log"
  return 1
}
build_worker-cpu() {
  local pins wheels
  # Every pinned `RUN pip install X==V --index-url` of the Dockerfile: torch, torchft.
  mapfile -t pins < <(sed -n 's/^RUN pip install \([a-z]*==[^ ]*\) --index-url .*/\1/p' "$ROOT/images/worker-cpu.Dockerfile")
  if [ "${#pins[@]}" -gt 0 ] && wheels="$(torch_wheelhouse "${pins[@]}")" && serve_wheels "$wheels"; then
    log "the worker image takes ${pins[*]} from $wheels"
  else
    INDEX="$TORCH_INDEX_URL"
    log "the worker image downloads torch from $TORCH_INDEX_URL itself"
  fi
  docker_build worker-cpu "$ROOT/images/worker-cpu.Dockerfile" "$(project_context)" \
    --build-arg "BASE_IMAGE=${REF[python]}" --build-arg "TORCH_INDEX_URL=$INDEX" --build-arg "TORCHFT_INDEX_URL=$INDEX"
}
build_pause() {
  mkdir -p "$WORK/pause"
  gcc -static -Os -o "$WORK/pause/pause" "$ROOT/images/local/pause.c"
  strip "$WORK/pause/pause"
  tar -C "$WORK/pause" -c pause | "$DOCKER" import -c "LABEL $(label pause)" -c 'ENTRYPOINT ["/pause"]' - "${REF[pause]}" >&2
}

for name in "${WANT[@]}"; do ensure "$name"; done
"$DOCKER" image prune -f >/dev/null 2>&1 || true  # layers of images replaced by this build
for name in "${WANT[@]}"; do printf '%s\t%s\t%s\n' "$name" "${REF[$name]}" "$(tar_of "$name")"; done
