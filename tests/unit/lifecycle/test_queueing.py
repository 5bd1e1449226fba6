"""Admission by Kueue (lifecycle.suspend): no pod until the Workload is admitted; evictions hold."""

from __future__ import annotations

from spmd_operator import lifecycle

from .helpers import apply, cond, events, gang, run, spec, status

KUEUE = {"provider": "Kueue", "queue": "team-a"}


def test_a_kueue_job_writes_its_workload_and_waits_without_pods():
    plan = run(s=spec(scheduling=KUEUE), st=None)
    st = apply(None, plan)
    assert plan.workload is True
    assert plan.create == () and st["phase"] == "Suspended"
    assert cond(st, "Suspended")["reason"] == "WaitingForAdmission"
    assert "queue team-a" in st["message"] and st["reason"] == "WaitingForAdmission"
    pending = lifecycle.WorkloadInfo(name="w", message="couldn't assign flavors to pod set procs: insufficient quota")
    again = run(s=spec(scheduling=KUEUE), st=st, workload=pending)
    assert again.workload is False and again.create == ()
    assert "insufficient quota" in apply(st, again)["message"]


def test_admission_creates_the_gang_and_an_eviction_holds_it_again_without_a_restart():
    st = apply(None, run(s=spec(scheduling=KUEUE), st=None))
    admitted = lifecycle.WorkloadInfo(name="w", admitted=True)
    plan = run(s=spec(scheduling=KUEUE), st=st, workload=admitted)
    new = apply(st, plan)
    assert plan.create == (0, 1, 2, 3) and new["phase"] == "Pending"
    assert events(plan) == [("Normal", "Admitted")]
    running = status("Running")
    evicted = lifecycle.WorkloadInfo(name="w", evicted="Preempted", message="preempted by a workload of priority 100")
    plan = run(s=spec(scheduling=KUEUE), st=running, pods=gang("Running"), workload=evicted)
    new = apply(running, plan)
    assert new["phase"] == "Suspended" and new["restarts"] == 0, "an eviction is no failure"
    assert len(plan.delete_pods) == 4
    assert events(plan) == [("Warning", "Evicted")]
    assert "preempted by a workload of priority 100" in new["message"]


def test_a_finished_kueue_job_frees_its_quota():
    done = status("Succeeded", completionTime="2026-01-01T11:59:00Z")
    plan = run(s=spec(scheduling=KUEUE), st=done, pods=gang("Succeeded"), workload=lifecycle.WorkloadInfo(name="w", admitted=True))
    assert plan.finish_workload
    plan = run(s=spec(scheduling=KUEUE), st=done, pods=gang("Succeeded"),
               workload=lifecycle.WorkloadInfo(name="w", admitted=True, finished=True))
    assert not plan.finish_workload
