"""Bad nodes (lifecycle.badnodes): a node where the job's ranks fail again and again (counted
failures, never disruptions) is kept off by every pod created afterwards, its in-place members are
replaced elsewhere, and its avoidance never leaves the job with no node."""

from __future__ import annotations

import dataclasses
import datetime as dt

from spmd_operator.lifecycle import format_time

from .helpers import NOW, apply, events, gang, pod, pod_name, run, spec, status
from .test_inplace import T, restart_event, view

IN_PLACE = spec(restartPolicy={"maxRestarts": 9})
RECREATE = spec(restartPolicy={"mode": "RecreatePods", "maxRestarts": 9})


def ago(seconds):
    return format_time(NOW - dt.timedelta(seconds=seconds))


def bad(node="node-2", times=(600, 500, 400), **kw):
    return {"node": node, "failures": len(times), "times": [ago(s) for s in times], **kw}


def entry(st, node):
    return next((e for e in st.get("badNodes") or [] if e["node"] == node), None)


def avoided(plan):
    return [e for e in plan.events if e.reason == "NodeAvoided"]


def test_a_rank_failing_three_times_on_one_node_makes_it_avoided_once_and_its_replacement_keeps_off_it():
    st = status("Running")
    restarts = [restart_event(n, rank=2) for n in (1, 2, 3)]
    plan = run(s=IN_PLACE, st=st, pods=gang("Running"), coordinator=view(round_=3, restarts=restarts))
    new = apply(st, plan)
    assert new["restarts"] == 3 and new.get("disruptions", 0) == 0
    e = entry(new, "node-2")
    assert (e["failures"], e["avoided"], len(e["times"])) == (3, True, 3), e
    [event] = avoided(plan)
    assert event.type == "Warning" and "node-2" in event.message and "3 failures" in event.message
    # The member on it keeps running: restarts in place stay in place (a program's bug fails
    # on every node); the pods created from now on keep off node-2.
    assert plan.delete_pods == ()
    # Heard again: no second Event, no second count.
    again = run(s=IN_PLACE, st=new, pods=gang("Running"), coordinator=view(round_=3, restarts=restarts))
    assert avoided(again) == [] and entry(apply(new, again), "node-2")["failures"] == 3
    # Its pod ended: created again alone, off node-2.
    pods = gang("Running")
    pods[2] = dataclasses.replace(pod(2, "Failed", exit_code=143, reason="Error"), deleting=True)
    plan = run(s=IN_PLACE, st=new, pods=pods, coordinator=view(round_=3))
    assert plan.replace == ((2, 1),) and "node-2" in plan.avoid_nodes
    # The coordinator's word of that loss is a disruption: it never counts toward node-2.
    lost = restart_event(4, rank=None, member=2, code=None, reason="MemberLost", tail=[],
                         message="member 2's agent is gone (Left)")
    plan = run(s=IN_PLACE, st=new, pods=pods, coordinator=view(round_=4, restarts=[*restarts, lost]))
    after = apply(new, plan)
    assert (after["restarts"], after["disruptions"], after["failure"]["reason"]) == (4, 1, "PodDeleted")
    assert entry(after, "node-2")["failures"] == 3 and avoided(plan) == []


def test_a_gang_recreated_on_its_third_failure_there_keeps_off_the_node_and_so_do_spares():
    st = status("Running", restarts=2, badNodes=[bad(times=(900, 300))])
    pods = gang("Running", restart=2)
    pods[2] = pod(2, "Failed", restart=2, exit_code=1, reason="Error", finished_at=ago(5))
    plan = run(s=RECREATE, st=st, pods=pods)
    new = apply(st, plan)
    assert new["restarts"] == 3 and entry(new, "node-2")["avoided"] is True
    assert len(avoided(plan)) == 1
    # The next attempt's gang, once the old pods are gone, keeps off it.
    plan = run(s=RECREATE, st=new)
    assert plan.create == (0, 1, 2, 3) and plan.avoid_nodes == ("node-2",)
    # A new spare keeps off it.
    st = status("Running", badNodes=[bad(avoided=True, since=ago(400))])
    plan = run(s=spec(spares=1), st=st, pods=gang("Running"))
    assert plan.spares == (0,) and plan.avoid_nodes == ("node-2",)
    assert avoided(plan) == [], "said once, when it became bad"


def test_failures_spread_over_nodes_avoid_none():
    st = status("Running")
    restarts = [restart_event(n, rank=r) for n, r in ((1, 1), (2, 2), (3, 3))]
    plan = run(s=IN_PLACE, st=st, pods=gang("Running"), coordinator=view(round_=3, restarts=restarts))
    new = apply(st, plan)
    assert [(e["node"], e["failures"]) for e in new["badNodes"]] == [("node-1", 1), ("node-2", 1), ("node-3", 1)]
    assert all("avoided" not in e for e in new["badNodes"]) and avoided(plan) == [] and plan.delete_pods == ()
    plan = run(s=spec(spares=1), st=new, pods=gang("Running"))
    assert plan.spares == (0,) and plan.avoid_nodes == ()


def test_old_failures_age_out():
    hour = 3600
    st = status("Running", restarts=2, gangRestart=0, badNodes=[bad(times=(hour + 100, hour + 50))])
    plan = run(s=IN_PLACE, st=st, pods=gang("Running"), coordinator=view(round_=3, restarts=[restart_event(3)]))
    new = apply(st, plan)
    assert entry(new, "node-2")["failures"] == 1 and avoided(plan) == [] and plan.delete_pods == ()
    # An avoided node whose failures are all older than the window is forgotten and no longer kept off.
    st = status("Running", badNodes=[bad(times=(hour + 300, hour + 200, hour + 100), avoided=True, since=ago(hour))])
    plan = run(s=spec(spares=1), st=st, pods=gang("Running"))
    assert plan.avoid_nodes == () and "badNodes" not in apply(st, plan)
    # Two of three aged out: not bad any more.
    st = status("Running", badNodes=[bad(times=(hour + 300, hour + 200, 100), avoided=True, since=ago(hour))])
    new = apply(st, run(s=spec(spares=1), st=st, pods=gang("Running")))
    assert entry(new, "node-2")["failures"] == 1 and "avoided" not in entry(new, "node-2")


def test_disruptions_never_count_toward_a_bad_node():
    two = [bad(times=(600, 500))]
    # A member deleted (PodDeleted) and a member lost whose pod says nothing (MemberLost).
    lost = restart_event(3, rank=None, member=2, code=None, reason="MemberLost", tail=[],
                         message="member 2's agent is gone (Left)")
    st = status("Running", restarts=2, gangRestart=0, badNodes=two)
    pods = gang("Running")
    pods[2] = dataclasses.replace(pod(2), deleting=True)
    for what, pods_ in (("PodDeleted", pods), ("MemberLost", gang("Running"))):
        plan = run(s=IN_PLACE, st=st, pods=pods_, coordinator=view(round_=3, restarts=[lost]))
        new = apply(st, plan)
        assert (new["restarts"], new["failure"]["reason"], new["failure"]["disruption"]) == (3, what, True), what
        assert entry(new, "node-2")["failures"] == 2 and avoided(plan) == [], what
    # Its node lost (the pod removed with it): the gang is recreated, not counted.
    st = status("Running", badNodes=two)
    pods = [*gang("Running")[:2], pod(2, "Failed", reason="DeletionByPodGC", disrupted=True), pod(3)]
    plan = run(s=IN_PLACE, st=st, pods=pods, coordinator=view(round_=0, phase="stopping"))
    new = apply(st, plan)
    assert (new["restarts"], new["disruptions"]) == (1, 1)
    assert entry(new, "node-2")["failures"] == 2 and avoided(plan) == []
    # NodeLost: a member's agent fell silent while its pod shows Running.
    silent = {"type": "lost", "seq": 9, "time": T - 6, "round": 0, "member": 2, "reason": "Disconnected",
              "node": "node-2", "received": T - 6}
    lost = restart_event(1, rank=None, member=2, code=None, reason="MemberLost", tail=[], received=T - 6,
                         message="member 2's agent is gone (Disconnected)")
    coordinator = dataclasses.replace(view(round_=1, restarts=[lost]), lost=(silent,))
    plan = run(s=IN_PLACE, st=st, pods=gang("Running"), coordinator=coordinator)
    new = apply(st, plan)
    assert new["failure"]["reason"] == "NodeLost" and entry(new, "node-2")["failures"] == 2 and avoided(plan) == []
    # While the rank's own failure there is the third: counted, the node avoided.
    st = status("Running", restarts=2, gangRestart=0, badNodes=two)
    plan = run(s=IN_PLACE, st=st, pods=gang("Running"), coordinator=view(round_=3, restarts=[restart_event(3)]))
    assert entry(apply(st, plan), "node-2")["failures"] == 3 and len(avoided(plan)) == 1


def test_a_pod_that_cannot_be_placed_off_the_bad_nodes_lifts_their_avoidance():
    st = status("Pending", badNodes=[bad(avoided=True, since=ago(400))])
    pods = gang("Pending")
    pods[0] = dataclasses.replace(pods[0], node=None, unschedulable="0/4 nodes are available",
                                  avoids=("node-2",))
    plan = run(s=IN_PLACE, st=st, pods=pods)
    new = apply(st, plan)
    assert entry(new, "node-2")["avoided"] is False
    assert ("Warning", "NodeAvoidanceLifted") in events(plan)
    assert pod_name(0) in plan.delete_pods, "created again without the affinity"
    assert "node-2 not kept off" in new["message"]
    # The pod created next may go there; no second Event.
    pods = gang("Pending")
    pods[0] = dataclasses.replace(pods[0], node=None)
    plan = run(s=IN_PLACE, st=new, pods=pods[1:])
    assert plan.create == (0,) and plan.avoid_nodes == ()
    assert ("Warning", "NodeAvoidanceLifted") not in events(plan)
