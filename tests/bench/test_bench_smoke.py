"""Smoke runs of every benchmark at its smallest size (benchmarks/; full figures in RESULTS.md).

Nothing here asserts a time: the machine is shared and noisy. The tests check that each benchmark
runs end to end as a user runs it (``python -m benchmarks.<name>``), that every launcher or
controller completed its job, and that the JSON it writes has the expected keys and positive
numbers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_PYTORCHJOB = REPO / "benchmarks" / "build-pytorchjob.sh"


def run_benchmark(module: str, *args: str, env: dict[str, str] | None = None,
                  timeout: float = 900) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env or dict(os.environ),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"{module} {' '.join(args)} exited {result.returncode}\n--- stdout\n{result.stdout[-5000:]}"
        f"\n--- stderr\n{result.stderr[-5000:]}")
    return result


def positive(x: object) -> bool:
    return isinstance(x, (int, float)) and x > 0


def check_machine(data: dict) -> None:
    m = data["machine"]
    assert positive(m["cpus"]) and positive(m["mem_gib"])
    assert m["date"] and m["python"]
    assert data["command"].startswith("python -m benchmarks.")


@pytest.mark.monarch
def test_launch_overhead_smoke(tmp_path: Path) -> None:
    from benchmarks.launch_overhead import LAUNCHERS

    out = tmp_path / "launch.json"
    result = run_benchmark("benchmarks.launch_overhead", "--procs", "2", "--reps", "1",
                           "--json", str(out), timeout=600)
    assert "vs torchrun" in result.stdout and f"os.cpu_count() = {os.cpu_count()}" in result.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "launch_overhead"
    check_machine(data)
    rows = {r["launcher"]: r for r in data["results"]}
    assert set(rows) == set(LAUNCHERS)
    for name, row in rows.items():
        assert row["procs"] == 2 and row["reps"] == 1
        assert row["ok"] == 1, f"{name}: {row['errors']}"
        assert positive(row["median_s"]) and positive(row["median_exit_s"])
        assert positive(row["ratio_vs_torchrun"])
    assert rows["torchrun"]["ratio_vs_torchrun"] == pytest.approx(1.0)
    for run in data["runs"]:
        assert run["ok"] and run["ranks_done"] == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def bench_env(cluster) -> Iterator[dict[str, str]]:
    """The test cluster's environment, with no other SPMDJob operator running meanwhile (the
    benchmarks start their own, one per job, and two operators would both act on a job)."""
    proc = cluster.operator_process
    was_running = proc is not None and proc.poll() is None
    if was_running:
        cluster.stop_operator()
    env = dict(cluster.env, MONARCH_SPMD_K8S_BIN=str(cluster.bin_dir))
    try:
        yield env
    finally:
        if was_running:
            cluster.start_operator("--liveness", f"http://127.0.0.1:{_free_port()}/healthz")


@pytest.fixture(scope="session")
def pytorchjob_build() -> Path:
    """Kubeflow's training-operator, built once per machine (cached; minutes the first time)."""
    result = subprocess.run(["bash", str(BUILD_PYTORCHJOB)], capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, f"build-pytorchjob.sh failed:\n{result.stderr[-5000:]}"
    home = Path(result.stdout.strip().splitlines()[-1])
    assert (home / "bin" / "training-operator.v1").exists()
    assert (home / "crds" / "kubeflow.org_pytorchjobs.yaml").exists()
    return home


@pytest.mark.cluster
def test_operator_scale_smoke(cluster, bench_env, pytorchjob_build, tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    result = run_benchmark(
        "benchmarks.operator_scale", "--sizes", "8", "--actors", "floor", "spmdjob", "pytorchjob",
        "--kubeconfig", str(cluster.kubeconfig), "--state-dir", str(tmp_path / "state"),
        "--trial-timeout", "300", "--json", str(out), env=bench_env)
    assert "all Running s" in result.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "operator_scale"
    check_machine(data)
    rows = {r["actor"]: r for r in data["results"]}
    assert set(rows) == {"floor", "spmdjob", "pytorchjob"}
    for actor, row in rows.items():
        assert row["procs"] == 8
        assert row["ok"], f"{actor}: {row.get('error')}"
        assert positive(row["created_s"]) and positive(row["running_s"]), row
        assert row["running_s"] >= row["created_s"]
        assert positive(row["api_requests"]), row
    # The floor makes exactly one request per pod: the request counter is exact.
    assert rows["floor"]["api_requests"] == 8
    for actor in ("spmdjob", "pytorchjob"):
        row = rows[actor]
        assert positive(row["phase_running_s"]) and positive(row["peak_rss_mib"]), row
        for key in ("created_vs_floor", "running_vs_floor", "phase_running_vs_floor", "requests_vs_floor"):
            assert positive(row[key]), (actor, key, row)


@pytest.mark.cluster
def test_gang_restart_smoke(cluster, bench_env, tmp_path: Path) -> None:
    out = tmp_path / "restart.json"
    result = run_benchmark(
        "benchmarks.gang_restart", "--procs", "4", "--reps", "1",
        "--kubeconfig", str(cluster.kubeconfig), "--state-dir", str(tmp_path / "state"),
        "--timeout", "180", "--json", str(out), env=bench_env)
    assert "all new pods Running s" in result.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "gang_restart"
    check_machine(data)
    assert "error" not in data["runs"], data["runs"].get("traceback")
    s = data["summary"]
    assert s["procs"] == 4 and s["reps"] == 1 and s["ok"] == 1
    for key in ("median_all_created_s", "median_all_running_s", "median_phase_running_s"):
        assert positive(s[key]), (key, s)
    (rep,) = data["runs"]["reps"]
    assert rep["ok"] and 0 <= rep["rank"] < 4
    assert rep["all_running_s"] >= rep["all_created_s"]
