"""spec.suspend (lifecycle.suspend)."""

from __future__ import annotations

from .helpers import apply, cond, deleting, events, gang, pod_name, run, spec, status


def test_suspend_deletes_the_pods_and_resume_recreates_them():
    st = status("Running", restarts=1)
    plan = run(s=spec(suspend=True), st=st, pods=gang("Running", restart=1))
    new = apply(st, plan)
    assert new["phase"] == "Suspended"
    assert "startTime" not in new
    assert set(plan.delete_pods) == {pod_name(r, 1) for r in range(4)}
    assert cond(new, "Suspended")["status"] == "True"
    assert events(plan) == [("Normal", "Suspended")]
    # Suspended again: nothing new.
    again = run(s=spec(suspend=True), st=new, pods=[])
    assert (again.create, again.delete_pods, again.events) == ((), (), ())
    # Resumed while old pods still terminate: wait.
    waiting = run(st=new, pods=deleting(gang("Running", restart=1)))
    assert waiting.create == ()
    assert apply(new, waiting)["phase"] == "Suspended"
    assert cond(apply(new, waiting), "Suspended")["reason"] == "Resuming"
    # Resumed with the old pods gone: the same attempt again, the deadline clock restarted.
    resumed = run(st=new, pods=[])
    after = apply(new, resumed)
    assert after["phase"] == "Pending"
    assert after["restarts"] == 1
    assert after["startTime"] == "2026-01-01T12:00:00Z"
    assert resumed.create == (0, 1, 2, 3)
    assert resumed.restart == 1
    assert cond(after, "Suspended")["status"] == "False"
    assert events(resumed) == [("Normal", "Resumed")]


def test_created_suspended_creates_nothing():
    plan = run(s=spec(suspend=True), st=None)
    assert (plan.create, plan.service, plan.configmap) == ((), None, False)
    assert apply(None, plan)["phase"] == "Suspended"
