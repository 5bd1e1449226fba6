#!/usr/bin/env bash
# A PerHost job on the GPUs of this machine with NCCL, through the local runner (the same worker
# and layout as a pod): one proc per GPU, each with set_device(LOCAL_RANK) and an NCCL all_reduce.
# Needs a CUDA build of torch. Prints what the machine has, then the job's output.
#   bash scripts/gpu-smoke.sh [GPUS]      (default: every GPU nvidia-smi lists)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || { echo "gpu-smoke: no nvidia-smi"; exit 1; }
gpus="${1:-$(nvidia-smi --list-gpus | wc -l)}"
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())' || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
time "$PY" -m monarch_spmd.cli run --mesh "hosts=1,gpus=$gpus" --pod-layout PerHost -- -m tests.programs.nccl_allreduce
