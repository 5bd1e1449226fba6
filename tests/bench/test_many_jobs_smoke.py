"""Smoke run of the many-jobs benchmark (benchmarks/many_jobs.py; full figures in RESULTS.md).

A tiny version of the real run, as a user runs it (``python -m benchmarks.many_jobs``), on a
cluster the benchmark starts itself (its kwok nodes never complete a pod, and JobSet's Job
controller runs apart, counted with JobSet, as in the full run): 6 jobs of 2 procs by every actor
(the floor, SPMDJob, PyTorchJob, JobSet), 20 s idle, the deletion; and the fairness run at 16 + 2
procs for the floor and SPMDJob; the SPMDJob operator runs with a flag and an environment
variable passed through (``--operator-flag``, ``--operator-env``). Nothing asserts a time: the test checks that the benchmark
measured what it says (every job reached Running, every pod was seen, the request counts by verb
add up to the totals, the floor's requests are exactly its pods) and wrote the numbers the
tables and plots read. The pure parts (plans, the floor's job-Running rule, the verdicts) have
unit tests of their own below.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from benchmarks import kube, many_jobs, many_jobs_report, many_jobs_watch, procstat
from benchmarks.many_jobs_floor import LABEL_JOB as FLOOR_LABEL_JOB
from tests.bench.test_bench_smoke import (check_machine, jobset_build, positive,  # noqa: F401 (fixtures)
                                          pytorchjob_build, run_benchmark)

JOBS, PROCS, IDLE = 6, 2, 20


@pytest.mark.cluster
def test_many_jobs_smoke(pytorchjob_build, jobset_build, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "many.json"
    result = run_benchmark(
        "benchmarks.many_jobs", "--scenarios", "many", "fairness", "--jobs", str(JOBS), "--procs", str(PROCS),
        "--idle", str(IDLE), "--settle", "2", "--after-delete", "2", "--sample-seconds", "2",
        "--fairness-large", "16", "--fairness-small", "2", "--timeout", "300",
        "--operator-flag=--concurrency=8", "--operator-env", "MALLOC_ARENA_MAX=2",
        "--state-dir", str(tmp_path / "state"), "--json", str(out), timeout=1200)
    assert "Idle with every job Running" in result.stdout and "Targets (issue 23)" in result.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "many_jobs"
    check_machine(data)
    assert data["operator"]["commit"]
    # The operator ran with the flag and environment given, and the report says so.
    assert data["operator"]["flags"] == ["--concurrency=8"] and data["operator"]["env"] == {"MALLOC_ARENA_MAX": "2"}
    assert "with MALLOC_ARENA_MAX=2 --concurrency=8" in result.stdout

    runs = {r["actor"]: r for r in data["runs"]}
    assert set(runs) == {"floor", "spmdjob", "pytorchjob", "jobset"}
    pods = JOBS * PROCS
    for actor, run in runs.items():
        assert run["ok"], f"{actor}: {run.get('error')}\n{run.get('traceback')}"
        assert run["jobs"] == JOBS and run["pods"] == pods
        assert run["pods_seen"] == pods and run["pods_running"] == pods and run["jobs_running"] == JOBS
        assert len(run["job_running_times"]) == JOBS
        assert 0 < run["created_s"] <= run["pods_running_s"]
        assert run["job_running_times"][-1] == pytest.approx(run["jobs_running_s"], abs=1e-3)
        for phase, reqs in run["requests"].items():
            # The verb split (one FlowSchema per verb) accounts for every request of the actor.
            assert reqs["total"] == sum(reqs["by_verb"].values()) == sum(reqs["by_identity"].values()), (actor, phase)
            assert reqs["writes"] == sum(reqs["by_verb"].get(v, 0) for v in kube.WRITE_VERBS)
        d = run["delete"]
        assert d["children_gone_s"] >= d["pods_gone_s"] > 0
        assert run["samples"], actor
    for actor, run in runs.items():  # each trial's record, kept as the trial ended
        kept = json.loads((tmp_path / "state" / "logs" / f"many-{actor}.json").read_text())
        assert (kept["actor"], kept["jobs_running_s"]) == (actor, run["jobs_running_s"])
    # The floor makes exactly one request per pod, all of them creations: the counter is exact.
    assert runs["floor"]["requests"]["start"]["by_verb"] == {"create": pods}
    assert "idle" not in runs["floor"]

    for actor in ("spmdjob", "pytorchjob", "jobset"):
        run = runs[actor]
        idle = run["idle"]
        assert idle["seconds"] >= IDLE
        assert idle["requests"] == run["requests"]["idle"]["total"]
        assert idle["per_job_per_10min"] == pytest.approx(idle["requests"] / JOBS * 600 / idle["seconds"])
        assert idle["cpu_s"] >= 0 and idle["watch_events"] >= 0
        assert idle["apiserver_top"], actor  # the API server served someone in 20 s (kwok, at least)
        rss = run["rss_mib"]
        for key in ("start", "running", "idle_end", "after_delete", "peak"):
            assert positive(rss[key]), (actor, key, rss)
        assert rss["peak"] >= rss["start"]
        assert positive(run["rss_after_vs_start"])
        assert run["requests"]["start"]["writes"] > 0  # it made the pods (or the Jobs that did)
    # Who had the cores while the jobs started: every control-plane process, and the controller.
    assert "Cores used from the first submission" in result.stdout
    for actor, run in runs.items():
        cores = run["startup_cores"]
        assert set(many_jobs_report.PLANE) <= set(cores), (actor, cores)
        assert all(v >= 0 for v in cores.values()), (actor, cores)
        assert cores["kube-apiserver"] > 0, (actor, cores)  # it served the pods' creations
        assert ("controller" in cores) == (actor != "floor"), (actor, cores)
        # Every client's requests of the start-up by verb and resource: at least the pods' POSTs.
        busiest = dict(run["startup_apiserver_top"])
        assert busiest.get("POST pods", 0) >= pods, (actor, busiest)
    assert "The API server's busiest requests during the start-up" in result.stdout
    # JobSet's pods come from a Job controller of its own, counted with it.
    assert runs["jobset"]["job_controller_counted"] is True
    assert set(runs["jobset"]["processes"]) == {"jobset-controller", "job-controller"}
    assert runs["jobset"]["requests"]["start"]["by_identity"]["job-controller"] >= pods

    rows = {r["actor"]: r for r in data["results"]}
    for actor in ("spmdjob", "pytorchjob", "jobset"):
        assert positive(rows[actor]["jobs_running_vs_floor"]), rows[actor]

    fair = {f["actor"]: f for f in data["fairness"]}
    assert set(fair) == {"floor", "spmdjob"}
    for actor, f in fair.items():
        assert f["ok"], f"{actor}: {f.get('error')}\n{f.get('traceback')}"
        assert f["submitted_apart_s"] >= 1.0
        for job in ("small_alone", "small", "large"):
            assert 0 < f[job]["first_pod_s"] <= f[job]["created_s"] <= f[job]["pods_running_s"], (actor, job)
            assert positive(f[job]["running_s"]), (actor, job)
        assert f["created_delay_s"] == pytest.approx(f["small"]["created_s"] - f["small_alone"]["created_s"])

    # Every actor and the fairness run took part, so every target has a verdict (no scale JSON given).
    names = [t["target"] for t in data["targets"]]
    assert any("idle API requests" in n for n in names) and any(n.startswith("fairness:") for n in names)
    assert all(t["met"] in (True, False) for t in data["targets"]), data["targets"]


@pytest.mark.cluster
def test_the_floor_with_a_service_per_job_creates_and_deletes_them(tmp_path: Path) -> None:
    """``--floor-services``: the floor creates each job's headless Service before its pods (one
    creation more per job, counted by the API server) and deletes them with the pods."""
    out = tmp_path / "floor.json"
    result = run_benchmark(
        "benchmarks.many_jobs", "--scenarios", "many", "--actors", "floor", "--floor-services", "--jobs", str(JOBS),
        "--procs", str(PROCS), "--settle", "2", "--after-delete", "2", "--sample-seconds", "2", "--timeout", "300",
        "--state-dir", str(tmp_path / "state"), "--json", str(out), timeout=600)
    assert "floor + Services" in result.stdout
    run = json.loads(out.read_text())["runs"][0]
    # ok: the deletion's wait for every pod and Service of the namespace to be gone ended.
    assert run["ok"], f"{run.get('error')}\n{run.get('traceback')}"
    assert run["actor"] == "floor" and run["floor_services"] is True
    assert run["requests"]["start"]["by_verb"] == {"create": JOBS * PROCS + JOBS}
    assert run["pods_running"] == JOBS * PROCS and run["jobs_running"] == JOBS
    busiest = dict(run["startup_apiserver_top"])
    assert busiest.get("POST services") == JOBS, busiest


# --- the pure parts -----------------------------------------------------------------------------

def test_plans_name_every_job_once_with_its_size() -> None:
    mixed = many_jobs.mixed_plan(200, many_jobs.MIXED_SIZES)
    assert len({name for name, _ in mixed}) == 200
    assert sum(size for _, size in mixed) == 22 * 511 + 1 + 2  # 22 whole cycles of 1..256, then 1 and 2
    assert many_jobs.many_plan(3, 4) == [("job-0000", 4), ("job-0001", 4), ("job-0002", 4)]


def test_job_bodies_are_named_and_a_jobset_points_at_its_own_rank_zero() -> None:
    for actor in many_jobs.CONTROLLERS:
        body = many_jobs.job_body(actor, "ns", "job-0007", 4)
        assert body["metadata"] == {"name": "job-0007", "namespace": "ns"}
    js = many_jobs.job_body("jobset", "ns", "job-0007", 4)
    env = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "MASTER_ADDR", "value": "job-0007-workers-0-0.job-0007"} in env


def _pod(name: str, job: str, phase: str = "Pending") -> dict:
    return {"metadata": {"name": name, "uid": "u-" + name, "labels": {FLOOR_LABEL_JOB: job}},
            "status": {"phase": phase}}


def test_a_floor_job_runs_when_its_last_pod_runs_and_is_gone_when_its_pods_are() -> None:
    t = many_jobs_watch.Tracker("floor", {"a": 2, "b": 1})
    t.pods_listed([], 0.0)
    t.pod_event("ADDED", _pod("a-0", "a"), 1.0)
    t.pod_event("ADDED", _pod("a-1", "a"), 2.0)
    t.pod_event("MODIFIED", _pod("a-0", "a", "Running"), 3.0)
    assert t.running_at("a") is None and t.job_pods_seen["a"] == 2.0
    t.pod_event("MODIFIED", _pod("a-1", "a", "Running"), 4.0)
    t.pod_event("MODIFIED", _pod("a-1", "a", "Running"), 5.0)  # a later update changes nothing
    assert t.running_at("a") == 4.0 and t.running_at("b") is None
    t.pod_event("DELETED", _pod("a-0", "a", "Running"), 6.0)
    assert len(t.pods_live) == 1
    # A list after a broken watch replaces the live set: a deletion the watch missed is seen then.
    t.pods_listed([], 7.0)
    assert not t.pods_live and t.last_pod_gone == 7.0


def test_a_controllers_job_runs_when_its_status_says_so() -> None:
    t = many_jobs_watch.Tracker("spmdjob", {"j": 1})
    job = {"metadata": {"name": "j", "uid": "u"}, "status": {"phase": "Pending"}}
    t.job_event("ADDED", job, 1.0)
    pod = {"metadata": {"name": "j-0", "uid": "p", "labels": {"spmd.monarch.dev/job": "j"}}, "status": {"phase": "Running"}}
    t.pod_event("ADDED", pod, 2.0)
    assert t.running_at("j") is None  # its pod runs, its status does not say so yet
    t.job_event("MODIFIED", dict(job, status={"phase": "Running"}), 3.0)
    assert t.running_at("j") == 3.0


def test_a_wait_ends_as_soon_as_its_check_raises() -> None:
    t = many_jobs_watch.Tracker("spmdjob", {"j": 1})
    calls: list[float] = []

    def check() -> None:  # the controller under test: exited by the second look
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise RuntimeError("spmd-operator exited with -10")

    deadline = time.monotonic() + 3600
    with pytest.raises(RuntimeError, match="exited with -10"):
        t.wait(lambda: False, deadline, check)
    assert len(calls) == 2 and calls[-1] < deadline - 3000
    # Without a check the same wait returns False at its deadline.
    assert t.wait(lambda: False, time.monotonic() + 0.1) is False


def test_requests_by_verb_reads_the_verb_schemas_and_the_rest() -> None:
    admin_less = object.__new__(kube.Identity)
    admin_less.name, admin_less.flow_schema = "op", "spmd-bench-op"
    counts = {"spmd-bench-op.list": 7.0, "spmd-bench-op.watch": 3.0, "spmd-bench-op": 1.0, "spmd-bench-other.list": 9.0}
    by_verb = kube.requests_by_verb(counts, admin_less)
    assert by_verb["list"] == 7 and by_verb["watch"] == 3 and by_verb["other"] == 1 and by_verb["get"] == 0
    assert sum(by_verb.values()) == 11


def _result(**spmd) -> dict:
    base = {"scenario": "many", "ok": True, "jobs": 1000, "pods": 4000}
    rows = [dict(base, actor="floor", jobs_running_s=100.0),
            dict(base, actor="pytorchjob", jobs_running_s=500.0, rss_peak_mib=100.0),
            dict(base, actor="jobset", jobs_running_s=300.0),
            dict(base, actor="spmdjob", **spmd)]
    return {"results": rows, "fairness": []}


def test_targets_are_met_or_missed_by_their_thresholds() -> None:
    good = dict(jobs_running_s=105.0, jobs_running_vs_floor=1.05, idle_per_job_per_10min=0.5, idle_requests=500,
                idle_s=600.0, idle_writes=0, rss_peak_mib=90.0, rss_start_mib=50.0, rss_after_delete_mib=54.0,
                rss_after_vs_start=1.08)
    met = {t["target"].split(": ", 1)[1]: t["met"] for t in many_jobs_report.targets(_result(**good))}
    assert met == {"all Running <= 1.1x the floor": True, "all Running ahead of both peers": True,
                   "idle API requests <= 1 per job per 10 min": True, "idle writes 0": True,
                   "peak RSS <= the PyTorchJob controller's": True,
                   "RSS after the deletion within 10% of the start": True}
    bad = dict(good, jobs_running_s=350.0, jobs_running_vs_floor=3.5, idle_per_job_per_10min=40.0, idle_writes=3,
               rss_peak_mib=120.0, rss_after_delete_mib=80.0, rss_after_vs_start=1.6)
    assert not any(t["met"] for t in many_jobs_report.targets(_result(**bad)))


def test_startup_cores_are_cpu_seconds_over_wall_seconds_per_process() -> None:
    plane_a = {"t": 100.0, "cpu_s": {"kube-apiserver": 10.0, "etcd": 2.0, "kwok": None}}
    plane_b = {"t": 110.0, "cpu_s": {"kube-apiserver": 19.0, "etcd": 3.5, "kwok": 4.0}}
    a = {"t": 100.0, "usage": {"spmd-operator": procstat.Usage((1,), rss_mib=50.0, hwm_mib=50.0, cpu_s=1.0)}}
    b = {"t": 110.0, "usage": {"spmd-operator": procstat.Usage((1,), rss_mib=60.0, hwm_mib=60.0, cpu_s=4.0)}}
    cores = many_jobs.startup_cores(plane_a, plane_b, a, b)
    assert cores["kube-apiserver"] == pytest.approx(0.9) and cores["etcd"] == pytest.approx(0.15)
    assert "kwok" not in cores, "a process not read at the start has no figure rather than a wrong one"
    assert cores["controller"] == pytest.approx(0.3)
    floor = many_jobs.startup_cores(plane_a, plane_b, {"t": 100.0, "usage": {}}, {"t": 110.0, "usage": {}})
    assert "controller" not in floor, "the floor has no controller process"
