"""activeDeadlineSeconds (lifecycle.deadline)."""

from __future__ import annotations

import pytest

from .helpers import apply, cond, events, gang, run, spec, status


def test_active_deadline_fails_the_job_and_stops_its_pods():
    st = status("Running")  # started 11:00, now 12:00
    plan = run(s=spec(activeDeadlineSeconds=3600), st=st, pods=gang("Running"))
    new = apply(st, plan)
    assert new["phase"] == "Failed"
    assert cond(new, "Failed")["reason"] == "DeadlineExceeded"
    assert new["failure"]["reason"] == "DeadlineExceeded"
    assert len(plan.delete_pods) == 4
    assert events(plan) == [("Warning", "DeadlineExceeded")]


def test_active_deadline_not_yet_reached_asks_to_be_woken():
    plan = run(s=spec(activeDeadlineSeconds=3700), st=status("Running"), pods=gang("Running"))
    assert plan.requeue_after == pytest.approx(100)
    assert plan.status.get("phase") is None
