"""Restart in place (lifecycle.inplace, and its part in lifecycle.failure and lifecycle.gang): what the
coordinator reports becomes status, Events and counts; a lost pod is replaced alone or the gang is
recreated; the operator judges every restart with the spec as it is now."""

from __future__ import annotations

import dataclasses
import datetime as dt

from spmd_operator import names
from spmd_operator.lifecycle import CoordinatorView

from .helpers import JOB, NOW, apply, cond, deleting, events, gang, pod, pod_name, run, spec, status

T = NOW.timestamp()


def restart_event(next_round=1, rank=2, member=None, code=1, reason="Error", backoff=0.0, received=T - 5, **kw):
    return {"type": "restart", "seq": 10 + next_round, "time": T - 6, "round": next_round - 1, "next_round": next_round,
            "rank": rank, "member": rank if member is None else member, "exit_code": code, "reason": reason,
            "message": kw.pop("message", f"rank {rank} exited with code {code}"),
            "tail": kw.pop("tail", ["Traceback (most recent call last):", "RuntimeError: boom"]),
            "counted": next_round, "max_restarts": 3, "backoff_seconds": backoff, "received": received, **kw}


def view(gang_restart=0, *, round_=1, phase="joining", restarts=(), started=(), all_running=(), final=None,
         progress=None, connected=True, rounds=()):
    return CoordinatorView(pod=names.pod_name(JOB, gang_restart, 0), connected=connected, round=round_, phase=phase,
                           restarts=tuple(restarts), started=tuple({"type": "started", "round": r} for r in started),
                           all_running=tuple({"type": "all_running", "round": r, "seconds_since_failure": 1.25}
                                             for r in all_running),
                           rounds=tuple(rounds), final=final, progress=progress)


def test_a_restart_in_place_is_one_status_patch_and_one_event_and_no_pod_is_touched():
    st = status("Running")
    plan = run(st=st, pods=gang("Running"), coordinator=view(restarts=[restart_event(backoff=0.0)]))
    new = apply(st, plan)
    assert (new["phase"], new["restarts"], new["gangRestart"]) == ("Restarting", 1, 0)
    assert new["masterAddr"] == names.master_addr(JOB, 0), "the same MASTER_ADDR: the pods stay"
    assert new["failure"] == {"rank": 2, "pod": pod_name(2), "node": "node-2", "exitCode": 1, "reason": "Error",
                              "message": "rank 2 exited with code 1\nTraceback (most recent call last):\nRuntimeError: boom",
                              "restart": 0, "permanent": False, "disruption": False, "time": "2026-01-01T11:59:54Z",
                              "inPlace": True, "backoffSeconds": 0}
    assert plan.delete_pods == () and plan.create == () and plan.replace == ()
    assert plan.service is None and plan.delete_services == (), "the gang's Service stays"
    [event] = plan.events
    assert (event.type, event.reason) == ("Warning", "Restarting")
    assert "rank 2" in event.message and "restart 1 of at most 3" in event.message and "in place" in event.message
    assert "Error: RuntimeError: boom" in event.message, "the rank's last line, not the agent's repetition of the code"
    restarting = cond(new, "Restarting")
    assert (restarting["status"], restarting["reason"]) == ("True", "RestartingInPlace")


def test_a_restart_already_recorded_is_never_counted_again():
    st = status("Restarting", restarts=1, gangRestart=0,
                conditions=[{"type": "Restarting", "status": "True", "reason": "RestartingInPlace", "message": "x",
                             "lastTransitionTime": "2026-01-01T11:59:54Z"}])
    plan = run(st=st, pods=gang("Running"), coordinator=view(restarts=[restart_event()], round_=1, phase="joining"))
    assert events(plan) == []
    new = apply(st, plan)
    assert (new["phase"], new["restarts"]) == ("Restarting", 1)


def test_the_back_off_of_the_waiting_round_is_in_the_condition_and_the_event():
    st = status("Running")
    plan = run(st=st, pods=gang("Running"), coordinator=view(restarts=[restart_event(backoff=20.0)]))
    new = apply(st, plan)
    assert new["failure"]["backoffSeconds"] == 20
    message = cond(new, "Restarting")["message"]
    assert "after a back-off of 20s, at 2026-01-01T12:00:14Z" in message, message
    assert "back-off of 20s" in plan.events[0].message


def test_running_again_only_when_the_coordinator_says_every_process_of_the_round_runs():
    st = apply(status("Running"), run(st=status("Running"), pods=gang("Running"),
                                      coordinator=view(restarts=[restart_event()])))
    # The pods never stopped running: their phase says nothing about the processes.
    waiting = run(st=st, pods=gang("Running"), coordinator=view(restarts=[restart_event()], phase="joining"))
    assert apply(st, waiting)["phase"] == "Restarting" and events(waiting) == []
    started = run(st=st, pods=gang("Running"), coordinator=view(restarts=[restart_event()], phase="running",
                                                                 started=[1], all_running=[1]))
    new = apply(st, started)
    assert new["phase"] == "Running"
    running = cond(new, "Running")
    assert running["status"] == "True" and "restart 1, in place, 1.2s after the failure" in running["message"]
    assert cond(new, "Restarting")["status"] == "False"
    assert events(started) == [("Normal", "Running")]


def test_without_the_coordinator_a_restart_in_place_stays_restarting():
    st = status("Restarting", restarts=1, gangRestart=0)
    plan = run(st=st, pods=gang("Running"))  # the observer has not connected (yet)
    assert apply(st, plan)["phase"] == "Restarting" and plan.delete_pods == () and plan.create == ()


def test_restarts_missed_while_the_operator_was_away_are_recorded_in_one_pass():
    st = status("Running")
    history = [restart_event(1, rank=2), restart_event(2, rank=3, code=9)]
    plan = run(st=st, pods=gang("Running"),
               coordinator=view(restarts=history, round_=2, phase="running", started=[1, 2], all_running=[1, 2]))
    new = apply(st, plan)
    assert (new["restarts"], new["phase"], new["failure"]["rank"], new["failure"]["exitCode"]) == (2, "Running", 3, 9)
    assert events(plan) == [("Warning", "Restarting"), ("Warning", "Restarting"), ("Normal", "Running")]


def test_the_operator_judges_each_restart_with_the_spec_as_it_is_now():
    st = status("Running", restarts=2, gangRestart=0)
    # maxRestarts lowered to 2 after the gang started: the coordinator still restarted a third time.
    plan = run(s=spec(restartPolicy={"maxRestarts": 2}), st=st, pods=gang("Running"),
               coordinator=view(restarts=[restart_event(3)], round_=3))
    new = apply(st, plan)
    assert new["phase"] == "Failed" and cond(new, "Failed")["reason"] == "RestartLimitExceeded"
    assert set(plan.delete_pods) == {pod_name(i) for i in range(4)}, "its pods are stopped"
    # An exit code made permanent since: the job fails at once.
    plan = run(s=spec(restartPolicy={"permanentExitCodes": [1]}), st=status("Running"), pods=gang("Running"),
               coordinator=view(restarts=[restart_event()]))
    new = apply(status("Running"), plan)
    assert new["phase"] == "Failed" and cond(new, "Failed")["reason"] == "PermanentFailure"
    assert new["failure"]["permanent"] is True


def test_a_hang_reaches_status_naming_the_rank_and_its_last_line():
    st = status("Running")
    message = "rank 1 wrote nothing for 2s (progress timeout 2s); last line: step 41 done"
    plan = run(st=st, pods=gang("Running"), coordinator=view(restarts=[
        restart_event(rank=1, code=137, reason="NoProgress", message=message, tail=["step 41 done"])]))
    new = apply(st, plan)
    assert (new["failure"]["rank"], new["failure"]["reason"], new["failure"]["exitCode"]) == (1, "NoProgress", 137)
    assert new["failure"]["message"].splitlines()[-1] == message
    assert "NoProgress: rank 1 wrote nothing for 2s" in plan.events[0].message


def test_failure_output_none_keeps_the_output_out_of_status_even_if_a_tail_came():
    st = status("Running")
    plan = run(s=spec(failureOutput="None"), st=st, pods=gang("Running"),
               coordinator=view(restarts=[restart_event(tail=["password=hunter2"])]))
    new = apply(st, plan)
    assert new["failure"]["message"] == "rank 2 exited with code 1"
    assert "hunter2" not in plan.events[0].message


def test_a_lost_member_that_the_cluster_evicted_is_a_disruption():
    st = status("Running", disruptions=0)
    pods = gang("Running")
    pods[2] = pod(2, "Failed", exit_code=143, reason="Evicted", disrupted=True, message="The node was low on memory.")
    lost = restart_event(rank=None, member=2, code=None, reason="MemberLost", message="member 2's agent is gone (Left)",
                         tail=[])
    plan = run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=pods, coordinator=view(restarts=[lost]))
    new = apply(st, plan)
    assert (new["phase"], new["restarts"], new["disruptions"]) == ("Restarting", 1, 1), "maxRestarts 0, yet it goes on"
    assert (new["failure"]["rank"], new["failure"]["reason"], new["failure"]["disruption"]) == (2, "Evicted", True)
    assert "pod " + pod_name(2) + " to be created again alone" in plan.events[0].message


def test_a_lost_member_waits_briefly_for_its_pod_to_say_why_then_is_a_disruption():
    st = status("Running")
    lost = restart_event(rank=None, member=1, code=None, reason="MemberLost", tail=[],
                         message="member 1's agent is gone (Disconnected)", received=T - 0.5)
    plan = run(st=st, pods=gang("Running"), coordinator=view(restarts=[lost]))
    assert plan.status.get("restarts") is None and events(plan) == []
    assert 1.0 <= plan.requeue_after <= 1.5
    later = run(st=st, pods=gang("Running"), coordinator=view(restarts=[dict(lost, received=T - 3)]))
    new = apply(st, later)
    # A member lost is the program's failure only when its pod's own container failed.
    assert (new["restarts"], new["failure"]["reason"], new["failure"]["disruption"]) == (1, "MemberLost", True)
    pods = deleting(gang("Running"))
    seen = run(st=st, pods=pods, coordinator=view(restarts=[lost]))
    assert apply(st, seen)["failure"]["reason"] == "PodDeleted", "its pod is being deleted: said at once"


# --- replace only what was lost -------------------------------------------------------------------


def test_a_lost_pod_whose_containers_ended_is_replaced_alone_at_the_open_round():
    st = status("Restarting", restarts=1, gangRestart=0)
    pods = gang("Running")
    pods[3] = pod(3, "Failed", exit_code=143, reason="Error")
    plan = run(st=st, pods=pods, coordinator=view(round_=1, phase="joining"))
    assert plan.replace == ((3, 1),) and plan.replace_round == 1 and plan.restart == 0
    assert plan.delete_pods == () and plan.create == ()
    new = apply(st, plan)
    assert (new["phase"], new["restarts"]) == ("Restarting", 1), "the restart itself was recorded from the coordinator"
    assert names.pod_name(JOB, 0, 3, 1) in cond(new, "Restarting")["message"]
    # Lost while the round still runs: it joins the next one.
    plan = run(st=status("Running"), pods=pods, coordinator=view(round_=0, phase="stopping"))
    assert plan.replace == ((3, 1),) and plan.replace_round == 1


def test_a_pod_still_terminating_is_waited_for_and_a_replacement_gets_a_name_of_its_own():
    st = status("Restarting", restarts=1, gangRestart=0)
    pods = gang("Running")
    pods[1] = dataclasses.replace(pod(1), deleting=True)
    plan = run(st=st, pods=pods, coordinator=view())
    assert plan.replace == () and plan.delete_pods == () and plan.create == ()
    assert "waiting for " + pod_name(1) in cond(apply(st, plan), "Restarting")["message"]
    # Its first replacement was lost too: the next one is the second.
    old = pod(1, "Failed", exit_code=137, reason="OOMKilled")
    first = dataclasses.replace(pod(1, "Failed", exit_code=143), name=names.pod_name(JOB, 0, 1, 1), replacement=1)
    plan = run(st=st, pods=[p for p in gang("Running") if p.rank != 1] + [old, first], coordinator=view())
    assert plan.replace == ((1, 2),)


def test_once_the_replacement_exists_it_is_the_pod_of_its_index_and_the_old_one_goes():
    st = status("Restarting", restarts=1, gangRestart=0)
    pods = gang("Running")
    pods[3] = pod(3, "Failed", exit_code=143)
    replacement = dataclasses.replace(pod(3, "Pending"), name=names.pod_name(JOB, 0, 3, 1), replacement=1)
    plan = run(st=st, pods=[*pods, replacement], coordinator=view())
    assert plan.replace == () and plan.delete_pods == (pod_name(3),)
    assert apply(st, plan)["phase"] == "Restarting"


def test_what_cannot_be_replaced_alone_recreates_the_gang():
    st = status("Running")
    lost_zero = gang("Running")
    lost_zero[0] = pod(0, "Failed", exit_code=143)
    cases = {
        "rank 0's pod (the coordinator, MASTER_ADDR)": (lost_zero, view(round_=0, phase="stopping")),
        "its node was lost": ([*gang("Running")[:2], pod(2, "Failed", reason="DeletionByPodGC", disrupted=True),
                               pod(3)], view(round_=0, phase="stopping")),
        "the coordinator is not heard": ([*gang("Running")[:2], pod(2, "Failed", exit_code=143), pod(3)], None),
        "the connection is down": ([*gang("Running")[:2], pod(2, "Failed", exit_code=143), pod(3)],
                                   view(round_=0, phase="stopping", connected=False)),
    }
    for what, (pods, coordinator) in cases.items():
        plan = run(st=st, pods=pods, coordinator=coordinator)
        new = apply(st, plan)
        assert plan.replace == (), what
        assert (new["phase"], new["restarts"]) == ("Restarting", 1), what
        assert "gangRestart" not in new and new["masterAddr"] == names.master_addr(JOB, 1), what
        assert set(plan.delete_pods) >= {p.name for p in pods if not p.finished}, what


def test_the_coordinators_verdict_names_the_root_cause_when_the_pods_end():
    st = status("Running", restarts=3, gangRestart=0)
    final = {"type": "failed", "round": 3, "rank": 5, "member": 2, "exit_code": 7, "rank_exit_code": 7, "reason": "Error",
             "message": "rank 5 exited with code 7", "tail": ["ValueError: bad batch"], "permanent": False,
             "exhausted": True, "fallback": False, "counted": 3, "max_restarts": 3}
    pods = [pod(r, "Failed", exit_code=7, reason="Error", finished_at=f"2026-01-01T11:59:5{r}Z") for r in range(4)]
    plan = run(s=spec(podLayout="PerHost"), st=st, pods=[pods[0], pods[2]],
               coordinator=view(round_=3, phase="failed", final=final, connected=False))
    new = apply(st, plan)
    assert new["phase"] == "Failed" and cond(new, "Failed")["reason"] == "RestartLimitExceeded"
    assert (new["failure"]["rank"], new["failure"]["pod"], new["failure"]["exitCode"]) == (5, pod_name(2), 7)
    assert new["failure"]["message"].splitlines() == ["rank 5 exited with code 7", "ValueError: bad batch"]
    # maxRestarts raised since the pods were created: the operator recreates the gang instead.
    plan = run(s=spec(podLayout="PerHost", restartPolicy={"maxRestarts": 5}), st=st, pods=[pods[0], pods[2]],
               coordinator=view(round_=3, phase="failed", final=final, connected=False))
    assert apply(st, plan)["restarts"] == 4


def test_a_round_recorded_in_place_that_never_started_is_completed_by_a_new_gang_counted_once():
    st = status("Restarting", restarts=2, gangRestart=0)
    pods = gang("Running")
    pods[0] = pod(0, "Failed", exit_code=75, reason="Error")  # the agents gave up: RoundTimeout
    never = view(round_=2, phase="failed", started=[0, 1], connected=False,
                 final={"type": "failed", "round": 2, "rank": None, "reason": "RoundTimeout", "exit_code": 75,
                        "fallback": True})
    plan = run(s=spec(restartPolicy={"maxRestarts": 2}), st=st, pods=pods, coordinator=never)
    new = apply(st, plan)
    assert (new["phase"], new["restarts"]) == ("Restarting", 2), "restart 2 was counted when recorded"
    assert "gangRestart" not in new and new["masterAddr"] == names.master_addr(JOB, 2)
    assert set(plan.delete_pods) == {pod_name(i) for i in range(4)}, "every pod of the old gang goes, as before"
    # Round 2 did start (its processes ran) and failed: that is a new failure, counted.
    ran = dataclasses.replace(never, started=never.started + ({"type": "started", "round": 2},))
    plan = run(s=spec(restartPolicy={"maxRestarts": 3}), st=st, pods=pods, coordinator=ran)
    assert apply(st, plan)["restarts"] == 3


def test_last_progress_time_is_written_only_when_it_moved_five_minutes():
    progress = {"type": "progress", "round": 0, "time": T - 1, "seconds_since_progress": 2.0, "rank": 1, "line": "x"}
    st = status("Running")
    plan = run(st=st, pods=gang("Running"), coordinator=view(round_=0, phase="running", progress=progress))
    assert plan.status["lastProgressTime"] == "2026-01-01T11:59:57Z"
    recent = status("Running", lastProgressTime="2026-01-01T11:56:00Z")
    assert "lastProgressTime" not in run(st=recent, pods=gang("Running"),
                                         coordinator=view(round_=0, phase="running", progress=progress)).status
    hung = dict(progress, seconds_since_progress=900.0)
    stale = status("Running", lastProgressTime="2026-01-01T11:45:00Z")
    assert "lastProgressTime" not in run(st=stale, pods=gang("Running"),
                                         coordinator=view(round_=0, phase="running", progress=hung)).status, \
        "a hung rank's last progress does not move: nothing to write"


def test_recreate_pods_and_monarch_mode_ignore_any_coordinator():
    st = status("Running")
    for s in (spec(restartPolicy={"mode": "RecreatePods"}),):
        plan = run(s=s, st=st, pods=gang("Running"), coordinator=view(restarts=[restart_event()]))
        assert plan.status.get("restarts") is None and plan.events == ()
    pods = gang("Running")
    pods[1] = pod(1, "Failed", exit_code=3)
    plan = run(s=spec(restartPolicy={"mode": "RecreatePods"}), st=st, pods=pods, coordinator=view(round_=0, phase="stopping"))
    assert plan.replace == () and apply(st, plan)["restarts"] == 1


def test_a_new_gang_in_place_runs_when_its_pods_run_as_before():
    """Only a restart recorded in place waits for the coordinator; a fresh gang (the first, or one
    recreated) is Running once its pods run, as with RecreatePods (and on nodes without agents)."""
    st = status("Restarting", restarts=1)
    plan = run(st=st, pods=gang("Running", restart=1))
    assert apply(st, plan)["phase"] == "Running"


def test_the_seconds_of_the_failure_come_from_the_coordinator():
    st = status("Running")
    plan = run(st=st, pods=gang("Running"), coordinator=view(restarts=[restart_event()]), now=NOW + dt.timedelta(seconds=30))
    assert apply(st, plan)["failure"]["time"] == "2026-01-01T11:59:54Z"


def test_after_the_verdict_the_pods_end_by_themselves_and_keep_their_logs():
    st = status("Running", restarts=1, gangRestart=0)
    final = {"type": "failed", "round": 1, "rank": 1, "member": 1, "exit_code": 7, "rank_exit_code": 7, "reason": "Error",
             "message": "rank 1 exited with code 7", "tail": [], "permanent": False, "exhausted": True,
             "fallback": False}
    pods = gang("Running")
    pods[0] = pod(0, "Failed", exit_code=7, reason="Error")  # the first to end; rank 1's pod is still ending
    plan = run(s=spec(restartPolicy={"maxRestarts": 1}), st=st, pods=pods,
               coordinator=view(round_=1, phase="failed", final=final, connected=False))
    new = apply(st, plan)
    assert new["phase"] == "Failed" and new["failure"]["pod"] == pod_name(1)
    assert plan.delete_pods == (), "rank 1's pod, the root cause, ends by itself with its log"
    # Finished: a pod still running after the stop grace (the template's, 30 s) and 15 s is stopped.
    soon = run(s=spec(), st=new, pods=pods, now=NOW + dt.timedelta(seconds=10))
    assert soon.delete_pods == () and 34 <= soon.requeue_after <= 36
    late = run(s=spec(), st=new, pods=pods, now=NOW + dt.timedelta(seconds=46))
    assert set(late.delete_pods) == {pod_name(i) for i in (1, 2, 3)}


def test_the_verdict_waits_a_little_for_the_root_causes_pod_to_end_and_takes_its_message():
    st = status("Running", restarts=1, gangRestart=0)
    final = {"type": "failed", "round": 1, "rank": 1, "member": 1, "exit_code": 7, "rank_exit_code": 7, "reason": "Error",
             "message": "rank 1 exited with code 7", "tail": [], "permanent": False, "exhausted": True,
             "fallback": False, "received": T - 2}
    pods = gang("Running")
    pods[0] = pod(0, "Failed", exit_code=7)
    coordinator = view(round_=1, phase="failed", final=final, connected=False)
    plan = run(s=spec(restartPolicy={"maxRestarts": 1}), st=st, pods=pods, coordinator=coordinator)
    assert plan.status.get("phase") is None and 7.5 <= plan.requeue_after <= 8.5, "rank 1's pod is still ending"
    pods[1] = pod(1, "Failed", exit_code=7, message="ValueError: bad batch\nmonarch-spmd worker: rank 1 exited with "
                  "code 7 in restart 1; job failed: restarts used up (1 of 1)")
    new = apply(st, run(s=spec(restartPolicy={"maxRestarts": 1}), st=st, pods=pods, coordinator=coordinator))
    assert new["phase"] == "Failed" and new["failure"]["message"].splitlines() == [
        "monarch-spmd worker: rank 1 exited with code 7 in restart 1; job failed: restarts used up (1 of 1)",
        "ValueError: bad batch"], "the verdict first, the rank's own last line last"
    assert cond(new, "Failed")["message"].startswith(f"rank 1 (pod {pod_name(1)} on node node-1) exited 7: Error: "
                                                     "ValueError: bad batch;"), cond(new, "Failed")["message"]


def test_without_the_coordinator_the_agents_last_line_names_the_root_cause_and_the_missed_restarts():
    """The gang ended before the operator heard its coordinator: rank 0's pod ended first with the
    root cause's code; rank 1's own last line (every agent writes it) says who, and that two
    restarts in place happened meanwhile."""
    st = status("Running")
    line = "monarch-spmd worker: rank 1 exited with code 137 in restart 2; job failed: restarts used up (2 of 2)"
    pods = [pod(0, "Failed", exit_code=137, reason="Error", message="hi rank 0", finished_at="2026-01-01T11:59:00Z"),
            pod(1, "Failed", exit_code=137, reason="Error", message=f"hi rank 1\n{line}",
                finished_at="2026-01-01T11:59:01Z"), pod(2), pod(3)]
    plan = run(s=spec(restartPolicy={"maxRestarts": 2}), st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Failed" and cond(new, "Failed")["reason"] == "RestartLimitExceeded"
    assert (new["failure"]["rank"], new["failure"]["exitCode"], new["restarts"], new["failure"]["restart"]) == (1, 137, 2, 2)
    assert plan.delete_pods == (), "the agents end every pod themselves after their verdict"
    # With RecreatePods the same line (a PerHost worker's) is only a pod's message.
    plan = run(s=spec(restartPolicy={"mode": "RecreatePods", "maxRestarts": 2}), st=st, pods=pods)
    assert apply(st, plan)["failure"]["rank"] == 0 and apply(st, plan)["restarts"] == 1


def test_a_pod_ending_first_waits_a_little_for_the_agents_to_say_who_failed():
    st = status("Running")
    pods = gang("Running")
    pods[0] = pod(0, "Failed", exit_code=137, reason="Error", message="hi rank 0", finished_at="2026-01-01T11:59:58Z")
    plan = run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=pods)
    assert plan.status.get("phase") is None and plan.delete_pods == () and 7.5 <= plan.requeue_after <= 8.5
    later = run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=pods, now=NOW + dt.timedelta(seconds=9))
    assert apply(st, later)["phase"] == "Failed" and apply(st, later)["failure"]["rank"] == 0, \
        "no word came: judged by the pods, as before"
    deleted = gang("Running")
    deleted[0] = dataclasses.replace(pod(0), deleting=True)
    assert apply(st, run(st=st, pods=deleted))["restarts"] == 1, "a pod taken away is no verdict: no wait"


def test_a_pod_lost_before_the_first_connection_to_the_coordinator_waits_for_it_briefly():
    st = status("Running")
    pods = gang("Running")
    pods[2] = pod(2, "Failed", exit_code=143, reason="Error")
    trying = dataclasses.replace(view(connected=False), phase=None, round=None, since=T - 1)
    plan = run(st=st, pods=pods, coordinator=trying)
    assert plan.status.get("restarts") is None and plan.delete_pods == () and 1.5 <= plan.requeue_after <= 2.5
    late = dataclasses.replace(trying, since=T - 4)
    assert apply(st, run(st=st, pods=pods, coordinator=late))["restarts"] == 1, "no answer: the gang is recreated"
    refused = dataclasses.replace(trying, error="ConnectionRefusedError")  # the agent is still starting
    assert run(st=st, pods=pods, coordinator=refused).status.get("restarts") is None
    assert apply(st, run(st=st, pods=pods, coordinator=dataclasses.replace(refused, since=T - 4)))["restarts"] == 1


def test_the_kubelets_reason_wins_over_a_plain_signal_in_the_verdict():
    st = status("Running")
    final = {"type": "failed", "round": 0, "rank": 0, "member": 0, "exit_code": 137, "rank_exit_code": 137,
             "reason": "Signal", "message": "rank 0 was killed by SIGKILL (exit code 137)", "tail": [],
             "permanent": False, "exhausted": True, "fallback": False}
    pods = [pod(0, "Failed", exit_code=137, reason="OOMKilled", message="x")]
    new = apply(st, run(s=spec(mesh=[{"name": "hosts", "size": 1}], restartPolicy={"maxRestarts": 0}), st=st,
                        pods=pods, coordinator=view(round_=0, phase="failed", final=final, connected=False)))
    assert (new["failure"]["reason"], new["failure"]["exitCode"]) == ("OOMKilled", 137)


def test_the_coordinators_signal_gives_way_to_the_kubelets_error_as_when_read_from_the_pods():
    """Killed by SIGKILL: the verdict says Signal, the ended pod Error; once the pod ended the status
    reads the same whichever word the operator heard first (the pods' last lines say Error)."""
    st = status("Running")
    final = {"type": "failed", "round": 0, "rank": 1, "member": 1, "exit_code": 137, "rank_exit_code": 137,
             "reason": "Signal", "message": "rank 1 was killed by SIGKILL (exit code 137)", "tail": ["hi rank 1"],
             "permanent": False, "exhausted": True, "fallback": False}
    line = "monarch-spmd worker: rank 1 exited with code 137 in restart 0; job failed: restarts used up (0 of 0)"
    pods = [pod(0, "Failed", exit_code=137, reason="Error", message=f"hi rank 0\n{line}"),
            pod(1, "Failed", exit_code=137, reason="Error", message=f"hi rank 1\n{line}")]
    s = spec(mesh=[{"name": "procs", "size": 2}], restartPolicy={"maxRestarts": 0})
    heard = apply(st, run(s=s, st=st, pods=pods, coordinator=view(round_=0, phase="failed", final=final,
                                                                   connected=False)))
    unheard = apply(st, run(s=s, st=st, pods=pods))
    assert (heard["failure"]["rank"], heard["failure"]["reason"]) == (1, "Error")
    assert (unheard["failure"]["rank"], unheard["failure"]["reason"]) == (1, "Error")


def test_a_lost_members_restart_heard_after_its_replacement_was_created_names_the_lost_pod():
    """The pod went and was replaced (the round was running: the replacement joins the next) before
    the coordinator's word of the loss came: the restart names the deleted pod, not its replacement."""
    st = status("Running")
    gone = dataclasses.replace(pod(2, "Failed", exit_code=143), deleting=True)
    replacement = dataclasses.replace(pod(2), name=names.pod_name(JOB, 0, 2, 1), replacement=1, joins=1)
    pods = [p for p in gang("Running") if p.rank != 2] + [replacement]
    lost = restart_event(rank=None, member=2, code=None, reason="MemberLost", tail=[],
                         message="member 2's agent is gone (Disconnected)", received=T - 0.5)
    plan = run(st=st, pods=pods, gone=[gone], coordinator=view(round_=1, phase="joining", restarts=[lost]))
    new = apply(st, plan)
    assert (new["restarts"], new["failure"]["pod"], new["failure"]["reason"]) == (1, pod_name(2), "PodDeleted")
    assert plan.requeue_after is None or plan.requeue_after > 2, "no wait: the lost pod is known"
    # The replacement itself lost in the round it joined: it is the one named.
    again = restart_event(next_round=2, rank=None, member=2, code=None, reason="MemberLost", tail=[],
                          message="member 2's agent is gone (Disconnected)")
    st2 = dict(new, phase="Running")
    ended = dataclasses.replace(replacement, phase="Failed", exit_code=143, deleting=True)
    plan = run(st=st2, pods=[p for p in pods if p.rank != 2] + [ended], gone=[gone],
               coordinator=view(round_=2, phase="joining", restarts=[lost, again]))
    assert apply(st2, plan)["failure"]["pod"] == names.pod_name(JOB, 0, 2, 1)


# --- a lost node: a disruption, the gang recreated without waiting for the node controller -------


def _silent(member=2, received=T - 6, round_=0, reason="Disconnected"):
    return {"type": "lost", "seq": 9, "time": T - 6, "round": round_, "member": member, "reason": reason,
            "node": f"node-{member}", "received": received}


def test_a_member_whose_agent_fell_silent_while_its_pod_runs_was_lost_with_its_node():
    """maxRestarts 0, yet the job goes on: the loss is a disruption, the restart in place is
    completed by a new gang at once (the lost member cannot rejoin), and its pods keep off the node."""
    st = status("Running", disruptions=0)
    lost = restart_event(rank=None, member=2, code=None, reason="MemberLost", tail=[],
                         message="member 2's agent is gone (Disconnected)", received=T - 0.5)
    early = dataclasses.replace(view(round_=1, phase="joining", restarts=[lost]), lost=(_silent(received=T - 0.5),))
    plan = run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=gang("Running"), coordinator=early)
    assert plan.status.get("restarts") is None and events(plan) == [], "the pod may yet say why"
    assert 4.0 <= plan.requeue_after <= 5.0
    later = dataclasses.replace(early, restarts=(dict(lost, received=T - 6),), lost=(_silent(),))
    plan = run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=gang("Running"), coordinator=later)
    new = apply(st, plan)
    assert (new["phase"], new["restarts"], new["disruptions"]) == ("Restarting", 1, 1), new
    failure = new["failure"]
    assert (failure["reason"], failure["node"], failure["disruption"], failure["pod"]) == ("NodeLost", "node-2", True,
                                                                                         pod_name(2))
    assert "went silent (Disconnected)" in failure["message"] and "node-2 is lost" in failure["message"]
    assert new["masterAddr"] == names.master_addr(JOB, 1) and "gangRestart" not in new, "a new gang, attempt 1"
    assert set(plan.delete_pods) == {pod_name(r) for r in range(4)}
    warnings = [e.message for e in plan.events if e.reason == "Restarting"]
    assert warnings and all("NodeLost" in m for m in warnings), warnings
    assert all("not counted against maxRestarts" in m for m in warnings), warnings


def test_the_silent_loss_of_an_earlier_pod_of_a_member_is_not_its_replacements_node_lost():
    """The agent's hello names its pod, and so does the coordinator's ``lost``: a pod of member 2
    deleted while the coordinator's node was cut off is heard lost by silence only once the cut
    heals, when its replacement runs already. That replacement's node is not lost (taking it for
    lost would create the next gang while the replacement's ranks still run)."""
    st = status("Running")
    lost = restart_event(rank=None, member=2, code=None, reason="MemberLost", tail=[],
                         message="member 2's agent is gone (Disconnected)", received=T - 6)
    earlier = dict(_silent(), pod=pod_name(2))
    replacement = dataclasses.replace(pod(2), name=names.pod_name(JOB, 0, 2, 1), replacement=1)
    pods = [p for p in gang("Running") if p.rank != 2] + [replacement]
    coordinator = dataclasses.replace(view(round_=1, phase="joining", restarts=[lost]), lost=(earlier,))
    plan = run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=pods, coordinator=coordinator)
    new = apply(st, plan)
    assert new.get("failure", {}).get("reason") != "NodeLost" and "lostNodes" not in new, new
    assert not plan.delete_pods, "the gang is not recreated for another pod's silence"
    named = dataclasses.replace(coordinator, lost=(dict(earlier, pod=replacement.name),))
    plan = run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=pods, coordinator=named)
    assert apply(st, plan)["failure"]["reason"] == "NodeLost", "the replacement's own silence is its node's loss"


def test_a_member_that_said_why_it_went_is_not_a_node_loss():
    st = status("Running")
    lost = restart_event(rank=None, member=2, code=None, reason="MemberLost", tail=[],
                         message="member 2's agent is gone (Disconnected)", received=T - 6)
    pods = gang("Running")
    pods[2] = pod(2, "Failed", exit_code=137, reason="OOMKilled")
    coordinator = dataclasses.replace(view(round_=1, phase="joining", restarts=[lost]), lost=(_silent(),))
    new = apply(st, run(s=spec(restartPolicy={"maxRestarts": 2}), st=st, pods=pods, coordinator=coordinator))
    assert (new["failure"]["reason"], new["failure"]["disruption"], new.get("disruptions", 0)) == ("OOMKilled", False, 0)
    left = dataclasses.replace(coordinator, lost=(_silent(reason="Left"),))
    plan = run(s=spec(restartPolicy={"maxRestarts": 2}), st=st, pods=gang("Running"), coordinator=left)
    assert apply(st, plan)["failure"]["reason"] == "MemberLost", "it left (a signal): not silence"


def test_a_member_that_gave_up_alone_while_the_coordinator_is_heard_is_replaced_alone():
    # Cut off from its coordinator (its node partitioned a while), it fenced itself and exited 75;
    # the coordinator, heard, lives on: only that pod is created again.
    st = status("Running")
    message = ("monarch-spmd worker: lost the coordinator at hello-m0:29400 (the rank-0 pod's agent) "
               "(CoordinatorLost); the gang must be recreated")
    pods = [*gang("Running")[:2], pod(2, "Failed", exit_code=75, message=message), pod(3)]
    plan = run(st=st, pods=pods, coordinator=view(round_=1, phase="joining"))
    assert plan.replace == ((2, 1),) and plan.delete_pods == ()


def test_rank_zeros_node_lost_the_members_give_up_and_the_gang_is_recreated_as_a_disruption():
    st = status("Running")
    pods = [dataclasses.replace(p, ready=True) for p in gang("Running")]
    message = ("monarch-spmd worker: lost the coordinator at hello-m0:29400 (the rank-0 pod's agent) "
               "(CoordinatorLost); the gang must be recreated")
    for r in (1, 2, 3):
        pods[r] = pod(r, "Failed", exit_code=75, reason="Error", message=message, finished_at="2026-01-01T11:59:58Z")
    dark = view(round_=0, phase="running", connected=False)
    plan = run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=pods, coordinator=dark)
    assert plan.status.get("phase") in (None, "Running") and plan.delete_pods == (), "not judged yet"
    assert 2.0 <= plan.requeue_after <= 3.0
    plan = run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=pods, coordinator=dark,
               now=NOW + dt.timedelta(seconds=4))
    new = apply(st, plan)
    assert (new["phase"], new["restarts"], new["disruptions"]) == ("Restarting", 1, 1), new
    assert (new["failure"]["reason"], new["failure"]["pod"], new["failure"]["node"]) == ("NodeLost", pod_name(0), "node-0")


def test_the_lost_nodes_pods_never_hold_the_next_attempt_and_it_keeps_off_that_node():
    # Judged lost 5 s after its agent fell silent: by then an agent that runs at all has fenced
    # itself (it ends its processes within FENCE_GRACE of losing its coordinator), and one frozen
    # does so when it thaws. Nothing of the old gang waits for it.
    failure = {"reason": "NodeLost", "node": "node-2", "pod": pod_name(2), "rank": 2, "restart": 0,
               "disruption": True, "permanent": False, "time": "2026-01-01T11:59:50Z"}
    st = status("Restarting", restarts=1, disruptions=1, failure=failure)
    old = [pod(0, "Failed", exit_code=143), pod(1, "Failed", exit_code=143),
           dataclasses.replace(pod(2), deleting=True), pod(3, "Failed", exit_code=143)]
    grace = {"terminationGracePeriodSeconds": 30}
    s = spec(template={"spec": grace})
    plan = run(s=s, st=st, pods=old)
    assert plan.create == (0, 1, 2, 3) and plan.restart == 1
    assert plan.avoid_nodes == ("node-2",), "its pod there never ended: the node does not answer"
    answered = [*old[:2], pod(2, "Failed", exit_code=137), old[3]]
    plan = run(s=s, st=st, pods=answered)
    assert plan.avoid_nodes == (), "its pod ended: the node answers again"
    still = [pod(0, "Running"), *old[1:]]  # a pod of a healthy node still terminating holds it up as ever
    plan = run(s=s, st=st, pods=[dataclasses.replace(still[0], deleting=True), *still[1:]])
    assert plan.create == ()


def test_a_running_gang_the_operator_cannot_hear_for_30s_is_said_in_a_condition_until_it_is_heard_again():
    st = status("Running")

    def gang(phase):  # their pods Ready: their nodes report
        return [dataclasses.replace(p, ready=True) for p in globals()["gang"](phase)]
    dark = dataclasses.replace(view(round_=0, phase="running", connected=False), dark_since=T - 10,
                               error="ConnectionRefusedError: [Errno 111] Connection refused")
    plan = run(st=st, pods=gang("Running"), coordinator=dark)
    assert cond(apply(st, plan), "CoordinatorReachable") is None and events(plan) == [], "a blip is not news"
    assert 19.0 <= plan.requeue_after <= 21.0
    plan = run(st=st, pods=gang("Running"), coordinator=dataclasses.replace(dark, dark_since=T - 45))
    new = apply(st, plan)
    c = cond(new, "CoordinatorReachable")
    assert (c["status"], c["reason"]) == ("False", "CoordinatorUnreachable")
    assert "for 45s" in c["message"] and "Connection refused" in c["message"] and pod_name(0) in c["message"]
    assert events(plan) == [("Warning", "CoordinatorUnreachable")]
    assert new["phase"] == "Running", "the job itself is not judged by what the operator cannot hear"
    same = run(st=new, pods=gang("Running"), coordinator=dataclasses.replace(dark, dark_since=T - 90))
    assert same.events == () and cond(apply(new, same), "CoordinatorReachable") == c, "said once"
    back = run(st=new, pods=gang("Running"), coordinator=view(round_=0, phase="running"))
    c = cond(apply(new, back), "CoordinatorReachable")
    assert (c["status"], c["reason"]) == ("True", "CoordinatorReachable")
    quiet = run(st=st, pods=gang("Running"), coordinator=view(round_=0, phase="running"))
    assert cond(apply(st, quiet), "CoordinatorReachable") is None, "no condition for a job never out of sight"


def test_rank_zeros_pod_marked_not_ready_while_the_operator_hears_it_no_more_is_a_lost_node():
    # A node that stops reporting has its pods marked not ready by the node controller (40 s):
    # Ready False, ContainersReady untouched (True); their phase stays Running. With the operator
    # cut off from the coordinator, rank 0's node is taken for lost, whether or not a member has
    # given up yet.
    st = status("Running")
    pods = [dataclasses.replace(p, ready=True) for p in gang("Running")]
    dark = view(round_=0, phase="running", connected=False)
    plan = run(st=st, pods=pods, coordinator=dark)
    assert plan.status.get("phase") in (None, "Running"), "its pod still ready: its node reports"
    pods[0] = dataclasses.replace(pods[0], ready=False)
    assert run(st=st, pods=pods, coordinator=dark).status.get("phase") in (None, "Running"), \
        "not ready by its own containers (a readiness probe): not its node"
    pods[0] = dataclasses.replace(pods[0], ready=False, node_silent=True)
    new = apply(st, run(st=st, pods=pods, coordinator=dark))
    assert (new["phase"], new["failure"]["reason"], new["failure"]["node"]) == ("Restarting", "NodeLost", "node-0")
    heard = view(round_=0, phase="running")
    assert run(st=st, pods=pods, coordinator=heard).status.get("phase") in (None, "Running"), "heard: not lost"
