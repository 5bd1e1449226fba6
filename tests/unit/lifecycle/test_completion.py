"""Success (lifecycle.completion)."""

from __future__ import annotations

from .helpers import apply, cond, events, gang, run, status


def test_all_ranks_exit_zero_is_success():
    st = status("Running")
    plan = run(st=st, pods=gang("Succeeded"))
    new = apply(st, plan)
    assert new["phase"] == "Succeeded"
    assert new["completionTime"] == "2026-01-01T12:00:00Z"
    assert new["succeeded"] == 4
    assert cond(new, "Succeeded")["status"] == "True"
    assert events(plan) == [("Normal", "Succeeded")]
    assert plan.delete_pods == ()


def test_some_ranks_done_others_running_stays_running():
    st = status("Running")
    plan = run(st=st, pods=gang("Succeeded")[:2] + gang("Running")[2:])
    assert apply(st, plan)["phase"] == "Running"
    assert plan.create == ()


def test_success_of_an_old_attempt_does_not_count():
    st = status("Restarting", restarts=1)
    plan = run(st=st, pods=gang("Succeeded", restart=0))
    assert apply(st, plan)["phase"] == "Restarting"
