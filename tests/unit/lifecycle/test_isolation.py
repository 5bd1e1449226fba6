"""Holding needs evidence, and an unusable scheduling API blocks only its job (lifecycle.suspend):
what a pass decides from a Workload that is absent, pending or admitted, and from
``Observed.unavailable``."""

from __future__ import annotations

from spmd_operator import lifecycle
from spmd_operator.lifecycle import Observed

from .helpers import JOB, NOW, apply, cond, events, gang, service, spec, status

KUEUE = {"provider": "Kueue", "queue": "team-a"}
FORBIDDEN = ("SchedulingForbidden", "needs workloads.kueue.x-k8s.io ...: install the chart with "
                                    "gangScheduling.kueue.enabled=true")


def run(st, pods=(), workload=None, unavailable=None, scheduling=KUEUE):
    o = Observed(job=JOB, generation=1, spec=spec(scheduling=scheduling), status=st or {}, pods=tuple(pods),
                 services=(service(0),) if st else (), workload=workload, unavailable=unavailable, now=NOW)
    return lifecycle.reconcile(o)


def test_running_pods_without_a_workload_are_kept_and_the_workload_created():
    running = status("Running")
    plan = run(running, gang("Running"))
    assert plan.workload is True
    assert plan.delete_pods == () and "phase" not in plan.status, "no evidence: nothing deleted, no transition"


def test_a_new_job_without_a_workload_waits_without_pods():
    plan = run(None)
    assert plan.workload is True and plan.create == ()
    assert apply(None, plan)["phase"] == "Suspended"


def test_a_pending_workload_holds_running_pods():
    plan = run(status("Running"), gang("Running"), workload=lifecycle.WorkloadInfo(name="w"))
    assert len(plan.delete_pods) == 4 and apply(status("Running"), plan)["phase"] == "Suspended"


def test_an_unusable_api_says_why_once_and_creates_nothing():
    plan = run(None, unavailable=FORBIDDEN)
    st = apply(None, plan)
    assert plan.create == () and plan.workload is False
    assert st["phase"] == "Pending"
    assert cond(st, "Created")["status"] == "False" and cond(st, "Created")["reason"] == "SchedulingForbidden"
    assert "gangScheduling.kueue.enabled=true" in st["message"]
    assert events(plan) == [("Warning", "SchedulingForbidden")]
    again = run(st, unavailable=FORBIDDEN)
    assert events(again) == [] and again.status == {}, "one Warning Event, and no status churn"


def test_an_api_lost_under_a_running_job_leaves_its_pods_alone():
    plan = run(status("Running", conditions=[{"type": "Created", "status": "True", "reason": "PodsCreated"}]),
               gang("Running"), unavailable=FORBIDDEN)
    assert plan.delete_pods == () and plan.create == () and "phase" not in plan.status


def test_a_plain_job_is_not_affected():
    plan = run(None, scheduling={})
    assert plan.create == (0, 1, 2, 3)
