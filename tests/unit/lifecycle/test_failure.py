"""Failures of the current attempt (lifecycle.failure): root cause, restart or fail, disruptions."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from spmd_operator import names

from .helpers import JOB, NOW, apply, cond, events, gang, pod, pod_name, run, spec, status


def test_retryable_failure_replaces_the_whole_gang():
    st = status("Running")
    pods = gang("Running")
    pods[2] = pod(2, "Failed", exit_code=1, reason="Error", message="line1\nRuntimeError: boom", finished_at="2026-01-01T11:59:00Z")
    pods[0] = pod(0, "Failed", exit_code=1, reason="Error", message="connection reset", finished_at="2026-01-01T11:59:30Z")
    plan = run(st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Restarting"
    assert new["restarts"] == 1
    assert new["masterAddr"] == names.master_addr(JOB, 1), "a new attempt, a new master name"
    assert set(plan.delete_pods) == {p.name for p in pods}, "every old pod goes, failed ones included"
    assert plan.create == (), "the next attempt waits until the old pods are gone (podReplacementPolicy Failed)"
    assert plan.service == 1, "the next attempt's Service is created at once"
    failure = new["failure"]
    assert failure == {"rank": 2, "pod": pod_name(2), "node": "node-2", "exitCode": 1, "reason": "Error",
                       "message": "line1\nRuntimeError: boom", "restart": 0, "permanent": False,
                       "disruption": False, "time": "2026-01-01T12:00:00Z"}
    assert cond(new, "Restarting")["status"] == "True"
    assert cond(new, "Running")["status"] == "False"
    [event] = plan.events
    assert (event.type, event.reason) == ("Warning", "Restarting")
    assert "rank 2" in event.message and "RuntimeError: boom" in event.message


def test_permanent_exit_code_fails_at_once():
    st = status("Running")
    pods = gang("Running")
    pods[1] = pod(1, "Failed", exit_code=64, reason="Error", message="bad input: MONARCH_SPMD_MESH")
    plan = run(st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Failed"
    assert new["restarts"] == 0
    assert plan.create == ()
    assert set(plan.delete_pods) == {pod_name(0), pod_name(2), pod_name(3)}, "the rest of the gang is stopped"
    assert new["failure"]["exitCode"] == 64
    assert new["failure"]["permanent"] is True
    failed = cond(new, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "PermanentFailure")
    assert events(plan) == [("Warning", "PermanentFailure")]


def test_permanent_failure_wins_over_an_earlier_retryable_one():
    st = status("Running")
    pods = gang("Running")
    pods[0] = pod(0, "Failed", exit_code=1, reason="Error", finished_at="2026-01-01T11:00:00Z")
    pods[3] = pod(3, "Failed", exit_code=137, reason="OOMKilled", finished_at="2026-01-01T11:00:05Z")
    new = apply(st, run(s=spec(restartPolicy={"permanentReasons": ["OOMKilled"]}), st=st, pods=pods))
    assert new["phase"] == "Failed"
    assert (new["failure"]["rank"], new["failure"]["reason"]) == (3, "OOMKilled")


def test_restart_limit_fails_with_the_root_cause():
    st = status("Running", restarts=2)
    pods = gang("Running", restart=2)
    pods[3] = pod(3, "Failed", restart=2, exit_code=1, reason="Error", message="\n".join(f"line {i}" for i in range(100)))
    plan = run(s=spec(restartPolicy={"maxRestarts": 2}), st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Failed"
    assert new["restarts"] == 2
    assert plan.create == ()
    assert cond(new, "Failed")["reason"] == "RestartLimitExceeded"
    failure = new["failure"]
    assert (failure["rank"], failure["pod"], failure["node"], failure["exitCode"], failure["restart"]) == (3, pod_name(3, 2), "node-3", 1, 2)
    assert failure["message"].splitlines() == [f"line {i}" for i in range(80, 100)], "the last lines only"


def test_max_restarts_zero_fails_on_the_first_failure():
    st = status("Running")
    pods = gang("Running")
    pods[0] = pod(0, "Failed", exit_code=1, reason="Error")
    assert apply(st, run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=pods))["phase"] == "Failed"


@pytest.mark.parametrize("how", ["deleting", "missing", "evicted"])
def test_pod_lost_under_a_running_job_restarts_the_gang(how):
    st = status("Running")
    pods = gang("Running")
    if how == "deleting":
        pods[1] = dataclasses.replace(pods[1], deleting=True)
        reason = "PodDeleted"
    elif how == "missing":
        del pods[1]
        reason = "PodMissing"
    else:
        pods[1] = pod(1, "Failed", reason="Evicted", message="The node was low on resource: memory.")
        reason = "Evicted"
    plan = run(st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Restarting"
    assert new["restarts"] == 1
    assert (new["failure"]["rank"], new["failure"]["reason"]) == (1, reason)
    assert new["failure"]["pod"] == pod_name(1), "a vanished pod is still named"
    assert "exitCode" not in new["failure"]
    assert plan.pods_lost is (how != "evicted")


def test_failure_patch_clears_fields_of_the_previous_failure():
    st = status("Running", restarts=1, failure={"rank": 0, "pod": pod_name(0), "exitCode": 1, "reason": "Error", "restart": 0})
    pods = gang("Running", restart=1)
    del pods[2]
    plan = run(st=st, pods=pods)
    assert plan.status["failure"]["exitCode"] is None, "a merge patch must remove the old exit code"
    assert "exitCode" not in apply(st, plan)["failure"]


def test_image_that_can_never_be_pulled_fails_permanently():
    st = status("Pending")
    pods = gang("Pending")
    pods[0] = pod(0, "Pending", reason="InvalidImageName", message="couldn't parse image reference")
    new = apply(st, run(st=st, pods=pods))
    assert new["phase"] == "Failed"
    assert new["failure"]["reason"] == "InvalidImageName"


def test_a_deleted_pod_while_pending_is_a_failure_but_a_missing_one_is_recreated():
    st = status("Pending")
    pods = gang("Pending")
    pods[0] = dataclasses.replace(pods[0], deleting=True)
    assert apply(st, run(st=st, pods=pods))["phase"] == "Restarting"
    plan = run(st=st, pods=gang("Pending")[1:])
    assert plan.create == (0,)
    assert apply(st, plan)["phase"] == "Pending"


def test_node_loss_is_a_disruption_with_its_reason_and_does_not_use_up_max_restarts():
    st = status("Running", restarts=1)
    pods = gang("Running", restart=1)
    pods[2] = pod(2, "Failed", restart=1, reason="DeletionByPodGC", message="PodGC: node no longer exists",
                  disrupted=True, deleting=True)
    plan = run(s=spec(restartPolicy={"maxRestarts": 1}), st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Restarting", "maxRestarts 1 is used up, but a disruption does not count"
    assert (new["restarts"], new["disruptions"]) == (2, 1)
    failure = new["failure"]
    assert (failure["reason"], failure["message"], failure["disruption"]) == (
        "DeletionByPodGC", "PodGC: node no longer exists", True)
    assert "not counted against maxRestarts" in plan.events[0].message


def test_a_disruption_is_the_root_cause_over_the_errors_it_caused():
    st = status("Running")
    pods = gang("Running")
    pods[0] = pod(0, "Failed", exit_code=1, reason="Error", message="gloo: connection reset", finished_at="2026-01-01T11:59:00Z")
    pods[3] = pod(3, "Running", reason="PreemptionByScheduler", message="preempted by a higher priority pod",
                  disrupted=True, deleting=True)
    new = apply(st, run(st=st, pods=pods))
    assert (new["failure"]["rank"], new["failure"]["reason"]) == (3, "PreemptionByScheduler")
    assert new["disruptions"] == 1


def test_restart_limit_counts_failures_not_disruptions():
    st = status("Running", restarts=3, disruptions=2)
    pods = gang("Running", restart=3)
    pods[0] = pod(0, "Failed", restart=3, exit_code=1, reason="Error")
    assert apply(st, run(s=spec(restartPolicy={"maxRestarts": 2}), st=st, pods=pods))["phase"] == "Restarting"
    assert apply(st, run(s=spec(restartPolicy={"maxRestarts": 1}), st=st, pods=pods))["phase"] == "Failed"


def test_a_pod_gone_with_its_node_is_named_with_the_reason_the_watch_saw():
    st = status("Running")
    pods = gang("Running")
    del pods[3]
    last = pod(3, "Failed", reason="DeletionByPodGC", message="PodGC: node no longer exists", disrupted=True, deleting=True)
    new = apply(st, run(st=st, pods=pods, gone=[last]))
    assert (new["failure"]["reason"], new["failure"]["message"], new["failure"]["node"]) == (
        "DeletionByPodGC", "PodGC: node no longer exists", "node-3")
    assert new["disruptions"] == 1 and new["phase"] == "Restarting"


def test_a_per_host_pods_failure_names_the_rank_its_worker_named():
    s = spec(podLayout="PerHost")
    st = status("Running")
    pods = [pod(0, "Running"), pod(2, "Failed", exit_code=3, reason="Error",
                                   message="[rank 3] Traceback ...\n[rank 3] RuntimeError: boom\n"
                                           "monarch-spmd worker: rank 3 exited with code 3 (local rank 1); stopped the other local ranks")]
    new = apply(st, run(s=s, st=st, pods=pods))
    assert new["phase"] == "Restarting"
    assert (new["failure"]["rank"], new["failure"]["pod"], new["failure"]["exitCode"]) == (3, pod_name(2), 3)


# --- start failures: measured from when the problem was first seen -------------------------------

ERR = 'rpc error: code = Unknown desc = failed to pull and unpack image "registry/train:1": 503 Service Unavailable'


def _pulling(rank=1, reason="ErrImagePull", created="2026-01-01T11:40:00Z"):
    """A pod that waited 20 minutes (unschedulable until a node came) and now cannot pull its image."""
    return pod(rank, "Pending", reason=reason, message=ERR, created=created)


def test_a_transient_pull_error_after_a_long_wait_does_not_fail_the_job_at_once():
    st = status("Pending")
    pods = gang("Pending")[:1] + [_pulling()] + gang("Pending")[2:]
    plan = run(st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Pending", new.get("failure")
    assert "failure" not in new
    assert new["startFailures"][pod_name(1)]["since"] == "2026-01-01T12:00:00Z"


def test_the_first_seen_time_is_kept_in_status_so_an_operator_restart_does_not_reset_it():
    st = status("Pending", startFailures={pod_name(1): {"reason": "ImagePullBackOff", "since": "2026-01-01T11:56:00Z"}})
    pods = gang("Pending")[:1] + [_pulling(reason="ImagePullBackOff")] + gang("Pending")[2:]
    plan = run(st=st, pods=pods)
    assert plan.requeue_after == pytest.approx(60), "the wait goes on from 11:56, not from this pass"
    assert "startFailures" not in plan.status, "ErrImagePull and ImagePullBackOff alternate: one problem"
    new = apply(st, run(st=st, pods=pods, now=NOW + dt.timedelta(seconds=60)))
    assert new["phase"] == "Restarting" and new["failure"]["reason"] == "ImagePullBackOff"


def test_a_problem_that_clears_resets_the_clock():
    st = status("Pending", startFailures={pod_name(1): {"reason": "ErrImagePull", "since": "2026-01-01T11:50:00Z"}})
    pulled = pod(1, "Pending", reason="ContainerCreating", created="2026-01-01T11:40:00Z")
    new = apply(st, run(st=st, pods=gang("Pending")[:1] + [pulled] + gang("Pending")[2:]))
    assert "startFailures" not in new
    again = apply(new, run(st=new, pods=gang("Pending")[:1] + [_pulling()] + gang("Pending")[2:]))
    assert again["phase"] == "Pending"
    assert again["startFailures"][pod_name(1)]["since"] == "2026-01-01T12:00:00Z"


@pytest.mark.parametrize(("reason", "listed", "permanent"), [
    ("ErrImagePull", (), False),
    ("CreateContainerError", (), False),
    ("CreateContainerConfigError", (), True),
    ("ErrImagePull", ("ErrImagePull",), True),
])
def test_a_start_failure_is_retryable_unless_its_reason_is_permanent(reason, listed, permanent):
    s = spec(restartPolicy={"permanentReasons": list(listed)}) if listed else spec()
    st = status("Pending", startFailures={pod_name(1): {"reason": reason, "since": "2026-01-01T11:55:00Z"}})
    new = apply(st, run(s=s, st=st, pods=gang("Pending")[:1] + [_pulling(reason=reason)] + gang("Pending")[2:]))
    assert new["failure"]["reason"] == reason
    assert new["failure"]["permanent"] is permanent
    assert new["phase"] == ("Failed" if permanent else "Restarting")


def test_invalid_image_name_still_fails_at_once():
    st = status("Pending")
    bad = pod(1, "Pending", reason="InvalidImageName", message="couldn't parse image name", created="2026-01-01T11:59:59Z")
    new = apply(st, run(st=st, pods=gang("Pending")[:1] + [bad] + gang("Pending")[2:]))
    assert new["phase"] == "Failed" and new["failure"]["reason"] == "InvalidImageName"
