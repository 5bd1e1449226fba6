"""Smoke run of benchmarks/monarch_iteration.py (full figures in benchmarks/RESULTS.md): one run on
each side, on the session's test cluster with the operator running.

As in test_bench_smoke.py, no time is asserted (the machine is shared and noisy): the benchmark
runs as a user runs it, both sides complete (the Monarch-mode job's SPMDActor.main and a new
Program-mode SPMDJob each all-reduce over 4 ranks, which the benchmark checks), and the JSON has
the expected keys and positive numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def with_operator(cluster) -> Iterator[dict[str, str]]:
    """The cluster's environment with the SPMDJob operator running (as it was found, after)."""
    proc = cluster.operator_process
    was_running = proc is not None and proc.poll() is None
    if not was_running:
        cluster.start_operator("--resync-seconds", "10")
    try:
        yield dict(cluster.env)
    finally:
        if not was_running:
            cluster.stop_operator()


@pytest.mark.cluster
@pytest.mark.monarch
def test_monarch_iteration_smoke(cluster, with_operator, tmp_path: Path) -> None:
    out = tmp_path / "iteration.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.monarch_iteration", "--runs", "1",
                             "--kubeconfig", str(cluster.kubeconfig), "--json", str(out)],
                            cwd=REPO, env={**os.environ, **with_operator}, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"--- stdout\n{result.stdout[-5000:]}\n--- stderr\n{result.stderr[-5000:]}"
    assert "new job / Monarch" in result.stdout and "| median" in result.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "monarch_iteration" and data["runs"] == 1
    assert data["command"].startswith("python -m benchmarks.monarch_iteration")
    assert data["machine"]["cpus"] > 0
    assert data["setup"]["job_running_s"] > 0 and data["setup"]["proc_mesh_s"] > 0
    assert sorted(s["mode"] for s in data["samples"]) == ["Monarch", "Program"]
    for sample in data["samples"]:
        assert 0 < sample["allreduce_s"] <= sample["done_s"], sample
