"""On a machine with CUDA GPUs: `--nproc-per-node gpu` and `auto` count the visible devices as
torchrun does, and an NCCL job runs through the local runner's PerHost worker.

Not part of the CPU suite (tests/conftest.py leaves this folder out unless
MONARCH_SPMD_GPU_TESTS=1): run it where GPUs are,

    MONARCH_SPMD_GPU_TESTS=1 python -m pytest tests/gpu -q -p no:cacheprovider
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.lib.test_torchrun_parity import SCRIPT, compare, free_port

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_there_are_gpus_here():
    assert _cuda_devices() > 0, "this folder is for machines with CUDA GPUs"


@pytest.mark.parametrize("nproc", ["gpu", "auto"])
def test_nproc_per_node_gpu_counts_visible_cuda_devices_as_torchrun_does(nproc):
    env = compare(["--nproc-per-node", nproc, "--master-port", str(free_port()), SCRIPT, "--gloo"])
    assert len(env) == _cuda_devices()


def test_a_per_host_job_runs_nccl_on_every_gpu():
    n = _cuda_devices()
    result = subprocess.run([sys.executable, "-m", "monarch_spmd.cli", "run", "--mesh", f"hosts=1,gpus={n}",
                             "--pod-layout", "PerHost", "--", "-m", "tests.programs.nccl_allreduce"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("nccl rank") == n
