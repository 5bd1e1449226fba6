"""Elastic sizes in the operator (mesh[0].minSize): a member lost with its node is created again
as a new pod while the gang goes on smaller (never the gang recreated for it); a pod ready again
grows the gang in a restart that is a membership change, not a failure; status.size is the
running round's; gang admission counts the minimum (PodGroup) and the largest size (Kueue)."""

from __future__ import annotations

import dataclasses

from spmd_operator import builders, names
from spmd_operator.lifecycle import CoordinatorView

from .helpers import JOB, NOW, apply, cond, events, gang, pod_name, run, spec, status

T = NOW.timestamp()
ELASTIC = {"mesh": [{"name": "nodes", "size": 4, "minSize": 2}, {"name": "procs", "size": 1}], "podLayout": "PerHost"}


def elastic(**changes):
    return spec(**{**ELASTIC, "restartPolicy": {"maxRestarts": 0}, **changes})


def lost_event(member=2):
    return {"type": "restart", "seq": 11, "time": T - 6, "round": 0, "next_round": 1, "rank": None, "member": member,
            "exit_code": None, "reason": "MemberLost", "message": f"member {member}'s agent is gone (Disconnected)",
            "tail": [], "counted": 1, "max_restarts": 0, "backoff_seconds": 0.0, "received": T - 6}


def silent(member=2):
    return {"type": "lost", "seq": 9, "time": T - 6, "round": 0, "member": member, "reason": "Disconnected",
            "node": f"node-{member}", "received": T - 6}


def started(round_, members):
    return {"type": "started", "round": round_, "members": len(members), "round_members": members}


def view(*, round_=1, phase="joining", restarts=(), started_=(), all_running=(), lost=()):
    return CoordinatorView(pod=names.pod_name(JOB, 0, 0), connected=True, round=round_, phase=phase,
                           restarts=tuple(restarts), started=tuple(started_),
                           all_running=tuple({"type": "all_running", "round": r, "seconds_since_failure": 21.0}
                                             for r in all_running), lost=tuple(lost))


def test_a_member_lost_with_its_node_is_created_again_alone_and_the_gang_is_not_recreated():
    st = status("Running", mesh="nodes=4,procs=1")
    plan = run(s=elastic(), st=st, pods=gang("Running"), coordinator=view(restarts=[lost_event()], lost=[silent()]))
    new = apply(st, plan)
    assert (new["phase"], new["restarts"], new["disruptions"]) == ("Restarting", 1, 1), new
    assert new.get("gangRestart") == 0 and plan.create == (), "the same gang goes on"
    assert plan.replace == ((2, 1),) and plan.replace_round == 1
    assert plan.delete_pods == (pod_name(2),), "only the lost pod goes (it ends when its node answers)"
    assert plan.avoid_nodes == (), "it may go back to its node when the node returns"
    failure = new["failure"]
    assert (failure["reason"], failure["pod"], failure["disruption"]) == ("NodeLost", pod_name(2), True)
    assert "the gang goes on without it (elastic, at least 2 pods)" in failure["message"]


def test_rank_zeros_node_lost_still_recreates_the_gang():
    st = status("Running", mesh="nodes=4,procs=1")
    lost = lost_event(member=0)
    pods = gang("Running")
    plan = run(s=elastic(), st=st, pods=pods, coordinator=view(restarts=[lost], lost=[silent(0)]))
    # Member 0 holds the coordinator: its loss is never the elastic kind.
    assert plan.replace == ()


def test_a_membership_change_is_a_disruption_and_no_failure():
    failure = {"reason": "NodeLost", "pod": pod_name(2), "rank": 2, "restart": 0, "disruption": True,
               "permanent": False, "time": "2026-01-01T11:59:00Z", "message": "lost"}
    st = status("Running", restarts=1, mesh="nodes=4,procs=1", gangRestart=0, disruptions=1, failure=failure)
    grow = {"type": "restart", "seq": 20, "time": T - 2, "round": 1, "next_round": 2, "rank": None, "member": 2,
            "exit_code": None, "reason": "MembershipChange", "message": "member 2 is ready: the gang grows from 3 to 4",
            "tail": [], "counted": 1, "max_restarts": 0, "backoff_seconds": 0.0, "received": T - 2}
    coordinator = view(round_=2, restarts=[lost_event(), grow], started_=[started(0, [0, 1, 2, 3]), started(1, [0, 1, 3])],
                       all_running=[1])
    plan = run(s=elastic(), st=st, pods=gang("Running"), coordinator=coordinator)
    new = apply(st, plan)
    assert (new["phase"], new["restarts"], new["disruptions"]) == ("Restarting", 2, 2), new
    assert new["failure"] == failure, "a grow is not a failure"
    assert cond(new, "Restarting")["reason"] == "Resizing"
    assert events(plan) == [("Normal", "Resizing")]
    assert "not counted against maxRestarts" in plan.events[0].message


def test_status_size_is_the_running_rounds_and_running_again_says_it_is_smaller():
    st = status("Restarting", restarts=1, mesh="nodes=4,procs=1", gangRestart=0, disruptions=1)
    coordinator = view(round_=1, phase="running", restarts=[lost_event()],
                       started_=[started(0, [0, 1, 2, 3]), started(1, [0, 1, 3])], all_running=[1])
    new = apply(st, run(s=elastic(), st=st, pods=gang("Running"), coordinator=coordinator))
    assert new["size"] == {"pods": 3, "procs": 3, "members": [0, 1, 3]}
    assert new["phase"] == "Running"
    assert "the 3 procs of 3 of its 4 pods (elastic, at least 2) are running again" in cond(new, "Running")["message"]


def test_a_fixed_size_job_has_no_size_in_status():
    st = status("Restarting", restarts=1, gangRestart=0)
    coordinator = dataclasses.replace(view(round_=1, phase="running", started_=[{"type": "started", "round": 1}],
                                           all_running=[1]), pod=names.pod_name(JOB, 0, 0))
    new = apply(st, run(st=st, pods=gang("Running"), coordinator=coordinator))
    assert "size" not in new


def test_gang_admission_counts_the_minimum_for_podgroups_and_the_largest_size_for_kueue():
    s = elastic(spares=1, scheduling={"provider": "Volcano"})
    assert builders.build_podgroup(JOB, s, 0)["spec"]["minMember"] == 3  # minSize 2 and the spare
    k = elastic(scheduling={"provider": "Kueue", "queue": "q"})
    assert builders.build_workload(JOB, k)["spec"]["podSets"][0]["count"] == 4


def test_a_shrink_and_a_grow_missed_while_the_operator_was_away_are_recorded_in_one_pass_uncounted():
    """The operator restarted (or failed over) while the gang shrank and grew: both restarts come in
    the welcome's history and are recorded at once, neither counted (maxRestarts 0), and a pass
    with the same history records nothing again."""
    st = status("Running", mesh="nodes=4,procs=1")
    grow = {"type": "restart", "seq": 20, "time": T - 2, "round": 1, "next_round": 2, "rank": None, "member": 2,
            "exit_code": None, "reason": "MembershipChange", "message": "member 2 is ready", "tail": [],
            "counted": 1, "max_restarts": 0, "backoff_seconds": 0.0, "received": T - 1}
    coordinator = view(round_=2, phase="running", restarts=[lost_event(), grow], lost=[silent()],
                       started_=[started(0, [0, 1, 2, 3]), started(1, [0, 1, 3]), started(2, [0, 1, 2, 3])],
                       all_running=[2])
    pods = gang("Running")
    pods[2] = dataclasses.replace(pods[2], name=names.pod_name(JOB, 0, 2, 1), replacement=1, joins=2)
    new = apply(st, run(s=elastic(), st=st, pods=pods, coordinator=coordinator))
    assert (new["phase"], new["restarts"], new["disruptions"], new.get("gangRestart")) == ("Running", 2, 2, 0), new
    assert new["size"] == {"pods": 4, "procs": 4, "members": [0, 1, 2, 3]}
    again = run(s=elastic(), st=new, pods=pods, coordinator=coordinator)
    assert apply(new, again)["restarts"] == 2 and again.replace == () and again.create == ()
