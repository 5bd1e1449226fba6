"""A smoke run of benchmarks/inplace_cluster.py at its smallest size on the suite's cluster: 4 procs
(2 pods of 2) on the process node, one restart each in place, by recreating the pods and with
JobSet, one lost pod each way, one hang per detector. No time is asserted (the machine is
shared): the benchmark runs as a user runs it, and the JSON says what each system did (one pod
created in place of the lost one against the whole gang, the hangs' reasons)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.test_bench_smoke import bench_env, jobset_build, positive, run_benchmark  # noqa: F401 (fixtures)


@pytest.mark.cluster
def test_inplace_cluster_smoke(cluster, bench_env, jobset_build, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "inplace_cluster.json"
    result = run_benchmark(
        "benchmarks.inplace_cluster", "--procs", "4", "--per-host", "2", "--reps", "1", "--lost-procs", "4",
        "--hang-procs", "4", "--hang-timeout", "3", "--kubeconfig", str(cluster.kubeconfig),
        "--state-dir", str(tmp_path / "state"), "--json", str(out), env=bench_env, timeout=1200)
    assert "every rank's new process s" in result.stdout and "A lost pod" in result.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "inplace_cluster" and data["command"].startswith("python -m benchmarks.inplace_cluster")
    assert sorted(r["system"] for r in data["restart"]) == ["inplace", "jobset", "recreate"]
    for row in data["restart"]:
        assert (row["procs"], row["pods"]) == (4, 2)
        assert positive(row["started_s"][0]) and row["started_s"][0] <= row["running_s"][0]
    lost = {r["system"]: r for r in data["lost"]}
    assert lost["inplace"]["pods_created"] == [1], "the lost pod alone"
    assert lost["recreate"]["pods_created"] == [2], "the whole gang"
    hangs = {h["detector"]: h for h in data["hang"]}
    assert hangs["watchdog"]["reasons"] == ["WatchdogTimeout"] and hangs["progress"]["reasons"] == ["NoProgress"]
    assert all(positive(h["restart_s"][0]) for h in hangs.values())
