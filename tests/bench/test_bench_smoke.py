"""Smoke runs of every benchmark at its smallest size (benchmarks/; full figures in RESULTS.md).

Launch: P = 2 once, with and without pre-init work; scale: N = 8 with all four actors; restart:
N = 4 once per podReplacementPolicy; and the fork-server prototype's fork-safety check.

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
BUILD_JOBSET = REPO / "benchmarks" / "build-jobset.sh"


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
    result = run_benchmark("benchmarks.launch_overhead", "--procs", "2", "--reps", "1", "--preinit", "0", "1",
                           "--json", str(out), timeout=900)
    assert "vs torchrun" in result.stdout and f"os.cpu_count() = {os.cpu_count()}" in result.stdout
    assert "skew s" in result.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "launch_overhead"
    check_machine(data)
    for preinit in (0.0, 1.0):
        rows = {r["launcher"]: r for r in data["results"] if r["preinit_s"] == preinit}
        assert set(rows) == set(LAUNCHERS)
        for name, row in rows.items():
            assert row["procs"] == 2 and row["reps"] == 1
            assert row["ok"] == 1, f"{name}: {row['errors']}"
            assert positive(row["median_s"]) and positive(row["median_exit_s"])
            assert positive(row["ratio_vs_torchrun"])
            assert row["median_skew_s"] is not None and row["median_skew_s"] >= 0
        assert rows["torchrun"]["ratio_vs_torchrun"] == pytest.approx(1.0)
    for run in data["runs"]:
        assert run["ok"] and run["ranks_done"] == 2
        assert run["first_start_s"] <= run["last_start_s"] <= run["latency_s"]
        if run["preinit_s"]:
            # Every rank worked its pre-init second before the all_reduce could happen.
            assert run["latency_s"] - run["last_start_s"] >= 1.0


def test_fork_launcher_forks_a_single_threaded_parent(tmp_path: Path) -> None:
    """The fork-server prototype imports torch, stays single-threaded, and its ranks' gloo works."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.fork_launcher", "--procs", "2", "--mode", "fork", "--check",
         "--", "-m", "benchmarks.first_allreduce", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "after 1" in result.stderr, result.stderr
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["env_rank"] for r in ranks] == ["0", "1"]
    assert all(r["sum"] == 2.0 and r["world_size"] == 2 for r in ranks)
    assert ranks[0]["pid"] != ranks[1]["pid"]


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


def _built(script: Path, *expected: str) -> Path:
    """Runs a build script (cached per machine; minutes the first time); returns the folder it
    printed last, after checking that ``expected`` files are in it."""
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, f"{script.name} failed:\n{result.stderr[-5000:]}"
    home = Path(result.stdout.strip().splitlines()[-1])
    for path in expected:
        assert (home / path).exists(), f"{script.name} did not leave {path} in {home}"
    return home


@pytest.fixture(scope="session")
def pytorchjob_build() -> Path:
    """Kubeflow's training-operator."""
    return _built(BUILD_PYTORCHJOB, "bin/training-operator.v1", "crds/kubeflow.org_pytorchjobs.yaml")


@pytest.fixture(scope="session")
def jobset_build() -> Path:
    """JobSet's controller manager."""
    return _built(BUILD_JOBSET, "bin/jobset-manager", "crds/jobset.x-k8s.io_jobsets.yaml")


@pytest.mark.cluster
def test_operator_scale_smoke(cluster, bench_env, pytorchjob_build, jobset_build, tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    result = run_benchmark(
        # One trial per actor (the benchmark's median of 3 is for figures; this checks what a trial measures).
        "benchmarks.operator_scale", "--sizes", "8", "--actors", "floor", "spmdjob", "pytorchjob", "jobset",
        "--reps", "1", "--kubeconfig", str(cluster.kubeconfig), "--state-dir", str(tmp_path / "state"),
        "--trial-timeout", "300", "--json", str(out), env=bench_env)
    assert "all Running s" in result.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "operator_scale"
    check_machine(data)
    rows = {r["actor"]: r for r in data["results"]}
    assert set(rows) == {"floor", "spmdjob", "pytorchjob", "jobset"}
    for actor, row in rows.items():
        assert row["procs"] == 8
        assert row["ok"], f"{actor}: {row.get('error')}"
        assert positive(row["created_s"]) and positive(row["running_s"]), row
        assert row["running_s"] >= row["created_s"]
        assert positive(row["api_requests"]), row
    # The floor makes exactly one request per pod: the request counter is exact.
    assert rows["floor"]["api_requests"] == 8
    # On the suite's cluster the Job controller making JobSet's pods is the cluster's own.
    assert rows["jobset"]["job_controller_counted"] is False
    for actor in ("spmdjob", "pytorchjob", "jobset"):
        row = rows[actor]
        assert positive(row["phase_running_s"]) and positive(row["peak_rss_mib"]), row
        for key in ("created_vs_floor", "running_vs_floor", "phase_running_vs_floor", "requests_vs_floor"):
            assert positive(row[key]), (actor, key, row)


def test_the_floor_can_create_the_operators_own_pods() -> None:
    from benchmarks.operator_scale import operator_pod, spmdjob
    from monarch_spmd.spec import parse_job_spec
    from spmd_operator import builders
    from spmd_operator.names import JobRef

    pod = operator_pod("ns", 5, 16)
    spec = parse_job_spec(spmdjob("ns", 16)["spec"], require_image=True)
    built = builders.build_pod(JobRef(name=pod["metadata"]["labels"]["spmd.monarch.dev/job"], namespace="ns",
                                      uid=pod["metadata"]["labels"]["spmd.monarch.dev/job-uid"]), spec, 5, 0)
    assert pod["spec"] == built["spec"], "the operator's pod spec, env and all"
    assert "ownerReferences" not in pod["metadata"], "no job owns it: the collector would delete it"
    assert pod["metadata"]["labels"] == {**built["metadata"]["labels"], "spmd-bench/job": "scale", "spmd-bench/rank": "5"}


@pytest.mark.cluster
def test_operator_scale_floor_with_the_operators_bodies(cluster, bench_env, tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    result = run_benchmark(
        "benchmarks.operator_scale", "--sizes", "8", "--actors", "floor", "--floor-bodies", "operator", "--reps", "1",
        "--kubeconfig", str(cluster.kubeconfig), "--state-dir", str(tmp_path / "state"),
        "--trial-timeout", "300", "--json", str(out), env=bench_env)
    assert "the floor creates the pods the SPMDJob operator builds" in result.stdout
    data = json.loads(out.read_text())
    assert data["params"]["floor_bodies"] == "operator"
    (row,) = data["results"]
    assert row["ok"] and row["api_requests"] == 8, row
    assert row["running_s"] >= row["created_s"] > 0


@pytest.mark.cluster
def test_gang_restart_smoke(cluster, bench_env, tmp_path: Path) -> None:
    out = tmp_path / "restart.json"
    result = run_benchmark(
        "benchmarks.gang_restart", "--procs", "4", "--reps", "1",
        "--kubeconfig", str(cluster.kubeconfig), "--state-dir", str(tmp_path / "state"),
        "--timeout", "180", "--json", str(out), env=bench_env)
    assert "all new pods Running s" in result.stdout and "the wait for the old gang" in result.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "gang_restart"
    check_machine(data)
    assert [r["policy"] for r in data["runs"]] == ["Failed", "TerminatingOrFailed"]
    for run, s in zip(data["runs"], data["summary"]):
        assert "error" not in run, run.get("traceback")
        assert s["procs"] == 4 and s["reps"] == 1 and s["ok"] == 1
        for key in ("median_all_created_s", "median_all_running_s", "median_phase_running_s"):
            assert positive(s[key]), (key, s)
        (rep,) = run["reps"]
        assert rep["ok"] and 0 <= rep["rank"] < 4
        assert rep["all_running_s"] >= rep["all_created_s"] >= rep["first_created_s"]
        assert positive(rep["old_gone_s"])
    # Failed waits for the old gang: its first new pod comes after the last old one is gone.
    (waited,) = data["runs"][0]["reps"]
    assert waited["first_created_s"] >= waited["old_gone_s"]
