"""Creating, replacing and reporting the gang (lifecycle.gang)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from .helpers import NOW, apply, cond, deleting, events, gang, pod, pod_name, run, spec, status


def test_first_pass_creates_every_pod_and_goes_pending():
    plan = run(st=None)
    assert plan.create == (0, 1, 2, 3)
    assert plan.restart == 0
    assert plan.delete_pods == ()
    st = apply(None, plan)
    assert st["phase"] == "Pending"
    assert (st["mesh"], st["procs"], st["restarts"]) == ("hosts=2,gpus=2", 4, 0)
    assert st["masterAddr"] == "hello-3fa9c-m0.ns.svc"
    assert st["startTime"] == "2026-01-01T12:00:00Z"
    assert st["observedGeneration"] == 1
    assert cond(st, "Created")["status"] == "True"
    assert events(plan) == [("Normal", "Created")]


def test_first_pass_again_with_pods_present_creates_nothing():
    st = apply(None, run(st=None))
    plan = run(st=st, pods=gang("Pending"))
    assert plan.create == ()
    assert plan.delete_pods == ()
    assert plan.events == ()


def test_first_status_says_how_many_run_so_the_pods_showing_up_need_no_status_write():
    """The Running condition goes with the first status: the pass that sees the new pods Pending
    has nothing to write (one status patch fewer per job; 1,000 jobs made 1,000 of them)."""
    st = apply(None, run(st=None))
    running = cond(st, "Running")
    assert (running["status"], running["reason"], running["message"]) == ("False", "WaitingForProcs",
                                                                        "0/4 procs running")
    assert (st["reason"], st["message"]) == ("WaitingForProcs", "0/4 procs running")
    assert run(st=st, pods=gang("Pending")).status == {}
    # The first pod Running moves the counts only (a progress patch, which may wait).
    moved = run(st=st, pods=gang("Running")[:1] + gang("Pending")[1:]).status
    assert moved["running"] == 1 and cond(moved, "Running")["message"] == "1/4 procs running"


def test_missing_pods_of_a_starting_gang_are_created_again():
    st = apply(None, run(st=None))
    plan = run(st=st, pods=gang("Pending")[:2])
    assert plan.create == (2, 3)


def test_running_only_when_every_proc_runs_and_the_waiting_say_why():
    st = status("Pending")
    sched = "0/5 nodes are available: 5 Insufficient nvidia.com/gpu."
    plan = run(st=st, pods=gang("Running")[:2] + [pod(2, "Pending", reason="ContainerCreating"),
                                                   pod(3, "Pending", unschedulable=sched)])
    new = apply(st, plan)
    assert new["phase"] == "Pending"
    assert new["running"] == 2
    running = cond(new, "Running")
    assert running["status"] == "False"
    assert "2/4 procs running" in running["message"]
    assert "rank 2 ContainerCreating" in running["message"]
    assert f"rank 3 Unschedulable ({sched})" in running["message"]
    assert (running["reason"], new["reason"]) == ("Unschedulable", "Unschedulable")
    assert new["message"] == running["message"], "kubectl get -o wide shows why it waits"
    assert events(plan) == [("Warning", "Unschedulable")]
    again = run(st=new, pods=gang("Running")[:2] + [pod(2, "Pending", reason="ContainerCreating"),
                                                     pod(3, "Pending", unschedulable=sched)])
    assert again.events == (), "the same reason is not posted twice"
    plan = run(st=new, pods=gang("Running"))
    new = apply(new, plan)
    assert new["phase"] == "Running"
    assert cond(new, "Running")["status"] == "True"
    assert events(plan) == [("Normal", "Running")]


def test_running_and_the_same_pass_again_is_a_no_op():
    st = status("Running", running=4, succeeded=0, failed=0, observedGeneration=1,
                reason="AllProcsRunning", message="all 4 procs are running")
    st["conditions"] = [{**c, "observedGeneration": 1} for c in st["conditions"]]
    plan = run(st=st, pods=gang("Running"))
    assert plan.status == {}
    assert (plan.create, plan.delete_pods, plan.events, plan.service, plan.configmap) == ((), (), (), None, False)


def test_next_attempt_waits_for_the_old_pods_to_terminate_then_comes_up():
    failed_at = "2026-01-01T11:59:50Z"
    st = status("Restarting", restarts=1, failure={"rank": 0, "time": failed_at})
    old = deleting(gang("Running", restart=0))
    plan = run(st=st, pods=old)
    assert plan.create == (), "two gangs never run at once"
    assert plan.delete_pods == (), "old pods already being deleted are left alone"
    new = apply(st, plan)
    assert new["phase"] == "Restarting"
    assert cond(new, "Restarting")["reason"] == "WaitingForOldPods"
    assert "4 pods of the previous attempt" in cond(new, "Restarting")["message"]
    assert plan.requeue_after == pytest.approx(110), "woken when the replacement timeout (120 s) passes"
    # A finished old pod does not hold the next attempt back; a terminating one does.
    plan = run(st=st, pods=[dataclasses.replace(p, phase="Failed") for p in old[:3]] + old[3:])
    assert plan.create == ()
    # Old pods gone: the next attempt is created, then reported Running.
    plan = run(st=st, pods=[])
    assert (plan.create, plan.restart) == ((0, 1, 2, 3), 1)
    plan = run(st=st, pods=gang("Running", restart=1))
    new = apply(st, plan)
    assert new["phase"] == "Running"
    assert cond(new, "Restarting") is None or cond(new, "Restarting")["status"] == "False"


def test_a_node_remembered_as_lost_holds_up_only_the_pods_that_were_on_it_when_it_was_lost():
    # tests/sim, seed 4346287: node-3 lost at 11:59:00 came back and took a pod of the next attempt
    # at 11:59:30; when that attempt's rank 0 was deleted, its pod there ran out its grace beside
    # the attempt after it, which had not waited for it.
    st = status("Restarting", restarts=2, failure={"rank": 0, "time": "2026-01-01T11:59:55Z"},
                lostNodes=[{"node": "node-3", "time": "2026-01-01T11:59:00Z"}])
    old = deleting(gang("Running", restart=1))
    before = [dataclasses.replace(p, created="2026-01-01T11:58:00Z") for p in old]
    after = [dataclasses.replace(p, created="2026-01-01T11:59:30Z") for p in old]
    plan = run(st=st, pods=[*before[:3], after[3]])
    assert plan.create == (), "the pod created on node-3 after its loss is waited for"
    assert "4 pods of the previous attempt" in cond(apply(st, plan), "Restarting")["message"]
    plan = run(st=st, pods=[*after[:3], before[3]])
    assert "3 pods of the previous attempt" in cond(apply(st, plan), "Restarting")["message"], \
        "the one there when node-3 was lost holds nothing up"
    plan = run(st=st, pods=before[3:])
    assert plan.create == (0, 1, 2, 3)
    same_second = [dataclasses.replace(old[3], created="2026-01-01T11:59:00Z")]
    assert run(st=st, pods=same_second).create == (), "created in the second of the loss: maybe after it"


def test_next_attempt_proceeds_after_the_replacement_timeout_and_says_so():
    st = status("Restarting", restarts=1, failure={"rank": 0, "time": "2026-01-01T11:57:00Z"})
    plan = run(s=spec(restartPolicy={"replacementTimeoutSeconds": 120}), st=st, pods=deleting(gang("Running", restart=0)))
    assert plan.create == (0, 1, 2, 3)
    [event] = plan.events
    assert (event.type, event.reason) == ("Warning", "ReplacementTimeout")
    assert pod_name(0, 0) in event.message


def test_terminating_or_failed_replaces_at_once():
    st = status("Running")
    pods = gang("Running")
    pods[1] = pod(1, "Failed", exit_code=1, reason="Error")
    plan = run(s=spec(restartPolicy={"podReplacementPolicy": "TerminatingOrFailed"}), st=st, pods=pods)
    assert (plan.create, plan.restart) == ((0, 1, 2, 3), 1)


def test_stale_pods_of_an_older_attempt_are_deleted():
    st = status("Restarting", restarts=1)
    plan = run(st=st, pods=gang("Running", restart=0) + gang("Pending", restart=1))
    assert set(plan.delete_pods) == {pod_name(r, 0) for r in range(4)}
    assert plan.create == ()


def test_time_waiting_counts_from_the_failure():
    st = status("Restarting", restarts=1, failure={"rank": 0, "time": "2026-01-01T12:00:00Z"})
    later = NOW + dt.timedelta(seconds=30)
    plan = run(st=st, pods=deleting(gang("Running", restart=0)), now=later)
    assert plan.requeue_after == pytest.approx(90)


def test_a_per_host_job_has_one_pod_per_host_and_counts_procs():
    s = spec(podLayout="PerHost")
    plan = run(s=s, st=None)
    assert plan.create == (0, 1), "two hosts of two procs: two pods"
    st = apply(None, plan)
    plan = run(s=s, st=st, pods=[pod(0, "Running"), pod(2, "Pending", unschedulable="0/1 nodes are available")])
    new = apply(st, plan)
    assert new["running"] == 2 and new["procs"] == 4
    assert "2/4 procs running" in cond(new, "Running")["message"]
    assert "pod 1 (ranks 2..3) Unschedulable (0/1 nodes are available)" in cond(new, "Running")["message"]
    new = apply(new, run(s=s, st=new, pods=[pod(0, "Running"), pod(2, "Running")]))
    assert (new["phase"], new["running"]) == ("Running", 4)


def test_a_container_that_cannot_start_fails_the_attempt_after_the_limit_from_when_it_was_first_seen():
    st = status("Pending")
    stuck = pod(1, "Pending", reason="ImagePullBackOff", message='Back-off pulling image "nope:1"',
                created="2026-01-01T11:00:00Z")
    pods = gang("Pending")[:1] + [stuck] + gang("Pending")[2:]
    plan = run(st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Pending" and cond(new, "Running")["reason"] == "ImagePullBackOff"
    assert new["startFailures"] == {pod_name(1): {"reason": "ImagePullBackOff", "since": "2026-01-01T12:00:00Z"}}
    assert plan.requeue_after == pytest.approx(300), "woken when the 300 s limit passes, counted from now"
    later = apply(new, run(st=new, pods=pods, now=NOW + dt.timedelta(seconds=299)))
    assert later["phase"] == "Pending"
    failed = apply(new, run(st=new, pods=pods, now=NOW + dt.timedelta(seconds=300)))
    assert failed["phase"] == "Restarting", "retryable: the gang is replaced, a restart used"
    assert (failed["failure"]["reason"], failed["failure"]["permanent"]) == ("ImagePullBackOff", False)
    assert 'pulling image "nope:1"' in failed["failure"]["message"]
    assert "since 2026-01-01T12:00:00Z" in failed["failure"]["message"]


def test_scheduling_timeout_fails_a_job_that_cannot_be_placed():
    s = spec(scheduling={"timeoutSeconds": 60})
    st = status("Pending")
    stuck = pod(0, "Pending", unschedulable="0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                created="2026-01-01T11:59:30Z")
    assert apply(st, run(s=s, st=st, pods=[stuck] + gang("Pending")[1:]))["phase"] == "Pending"
    late = dataclasses.replace(stuck, created="2026-01-01T11:58:00Z")
    new = apply(st, run(s=s, st=st, pods=[late] + gang("Pending")[1:]))
    assert new["phase"] == "Failed"
    assert new["failure"]["reason"] == "SchedulingTimeout"
    assert "Insufficient nvidia.com/gpu" in new["failure"]["message"]
    without = apply(st, run(st=st, pods=[late] + gang("Pending")[1:]))
    assert without["phase"] == "Pending", "no timeout unless one is set"
