"""Hot spares (lifecycle.spares, and their part in lifecycle.inplace; builders): spare pods come
with the gang and are counted by its admission; a spare that took a lost pod's place is adopted as
that pod's replacement, its loss is a disruption and nothing is recreated; a new spare follows."""

from __future__ import annotations

import dataclasses

from spmd_operator import builders, names
from spmd_operator.lifecycle import PodInfo, pod_info

from .helpers import JOB, apply, gang, run, spec, status
from .test_inplace import T, restart_event, view


def spare(k, phase="Running", restart=0, **kw):
    return PodInfo(name=names.spare_pod_name(JOB, restart, k), rank=-1, restart=restart, phase=phase,
                   node=f"spare-node-{k}", spare=k, **kw)


def takeover(member=2, k=0, round_=0):
    return {"type": "takeover", "seq": 8, "time": T - 6, "round": round_, "member": member, "spare": k,
            "node": f"spare-node-{k}", "ready": 0, "takeovers": 1, "received": T - 5}


def test_a_new_job_creates_its_spares_with_its_gang():
    plan = run(s=spec(spares=2))
    assert plan.create == (0, 1, 2, 3) and (plan.spares, plan.spare_restart) == ((0, 1), 0)
    assert run(s=spec()).spares == (), "no spares asked, none made"


def test_a_running_gang_with_fewer_spares_waiting_gets_new_ones_with_unused_indices():
    st = status("Running")
    plan = run(s=spec(spares=2), st=st, pods=gang("Running"), spares=[spare(0), spare(1, phase="Succeeded")])
    assert plan.spares == (2,), "spare 1 ended: its index is not used again"
    assert run(s=spec(spares=1), st=st, pods=gang("Running"), spares=[spare(0)]).spares == ()


def test_a_spare_created_by_the_pass_before_and_not_yet_shown_by_the_informer_is_not_made_again():
    # The pass before created s1 (status.spares.next 2); the pod informer shows only s0 yet.
    st = {**status("Running"), "spares": {"ready": 1, "used": 0, "attempt": 0, "next": 2}}
    s1 = names.spare_pod_name(JOB, 0, 1)
    plan = run(s=spec(spares=2), st=st, pods=gang("Running"), spares=[spare(0)], creating=[s1])
    assert plan.spares == () and plan.delete_pods == (), "s1 is on its way: none is missing"
    assert run(s=spec(spares=2), st=st, pods=gang("Running"), spares=[spare(0)]).spares == (2,), \
        "gone without a trace (never shown, no longer remembered): a new index"


def test_spares_beyond_spec_spares_are_deleted_newest_first():
    # Two passes raced a lagging informer and made s1 and s2 for one missing spare: the job would
    # hold a pod more than its Workload and its quota count.
    st = {**status("Running"), "spares": {"ready": 2, "used": 1, "attempt": 0, "next": 3}}
    plan = run(s=spec(spares=1), st=st, pods=gang("Running"), spares=[spare(1), spare(2)])
    assert plan.delete_pods == (names.spare_pod_name(JOB, 0, 2),) and plan.spares == ()
    # One still on its way: nothing more is made, and nothing goes until it is shown.
    plan = run(s=spec(spares=1), st=st, pods=gang("Running"), spares=[spare(1)],
               creating=[names.spare_pod_name(JOB, 0, 2)])
    assert plan.delete_pods == () and plan.spares == ()


def test_a_spare_that_took_a_lost_pods_place_is_adopted_and_its_restart_is_a_disruption():
    """maxRestarts 0 and the job goes on: the loss is a disruption, pod 2 is neither created again
    alone nor the gang recreated, the spare's pod becomes pod 2's replacement and a new spare comes."""
    st = status("Running")
    lost = restart_event(rank=None, member=2, code=None, reason="MemberLost", tail=[],
                         message="member 2's agent is gone (Left); a hot spare takes its place", received=T - 0.5)
    coordinator = dataclasses.replace(view(round_=1, phase="joining", restarts=[lost]), takeovers=(takeover(),),
                                      spares_ready=0)
    pods = gang("Running")
    pods[2] = dataclasses.replace(pods[2], deleting=True)
    plan = run(s=spec(spares=1, restartPolicy={"maxRestarts": 0}), st=st, pods=pods, spares=[spare(0)],
               coordinator=coordinator)
    new = apply(st, plan)
    assert (new["phase"], new["restarts"], new["disruptions"], new.get("gangRestart")) == ("Restarting", 1, 1, 0), new
    assert (new["failure"]["reason"], new["failure"]["disruption"]) == ("MemberLost", True)
    assert f"hot spare pod {names.spare_pod_name(JOB, 0, 0)} took its place" in new["failure"]["message"]
    assert plan.adopt == ((names.spare_pod_name(JOB, 0, 0), 2, 1),)
    assert plan.replace == () and plan.create == () and plan.delete_pods == ()
    assert plan.spares == (1,), "a new spare, with an index of its own"
    assert new["spares"] == {"ready": 0, "used": 1, "attempt": 0, "next": 2}  # s0 took the place, s1 comes
    [warning] = [e.message for e in plan.events if e.reason == "Restarting"]
    assert "not counted against maxRestarts" in warning and "with the spare in its place" in warning


def test_a_lost_node_whose_pod_a_spare_replaced_recreates_nothing():
    st = status("Restarting", restarts=1, gangRestart=0, disruptions=1)
    silent = {"type": "lost", "seq": 7, "time": T - 20, "round": 0, "member": 2, "reason": "HeartbeatTimeout",
              "node": "node-2", "received": T - 20}
    coordinator = dataclasses.replace(view(round_=1, phase="running", all_running=[1]), lost=(silent,),
                                      takeovers=(takeover(),))
    adopted = dataclasses.replace(spare(0), rank=2, spare=None, replacement=1, joins=0)
    plan = run(s=spec(spares=1, restartPolicy={"maxRestarts": 0}), st=st, pods=[*gang("Running"), adopted],
               spares=[spare(1)], coordinator=coordinator)
    new = apply(st, plan)
    assert new["phase"] == "Running" and new.get("gangRestart") == 0, new
    assert plan.delete_pods == (names.pod_name(JOB, 0, 2),), "the lost pod goes; its spare is pod 2 now"
    assert plan.spares == () and plan.adopt == ()


def test_spares_of_another_attempt_or_of_a_finished_job_are_deleted():
    st = status("Running", restarts=1)
    plan = run(s=spec(spares=1), st=st, pods=gang("Running", restart=1), spares=[spare(0), spare(0, restart=1)])
    assert plan.delete_pods == (names.spare_pod_name(JOB, 0, 0),)
    done = run(s=spec(spares=1), st=status("Succeeded"), pods=gang("Succeeded"), spares=[spare(0)])
    assert done.delete_pods == (names.spare_pod_name(JOB, 0, 0),) and done.spares == ()


def test_a_spare_pod_is_a_member_pod_without_a_place_and_adoption_gives_it_one():
    s = spec(spares=2, scheduling={"provider": "Volcano"})
    pod = builders.build_spare_pod(JOB, s, 1, 0, token="t" * 20)
    labels = pod["metadata"]["labels"]
    assert pod["metadata"]["name"] == "hello-3fa9c-r0-s1"
    assert labels[names.LABEL_SPARE] == "1" and names.LABEL_RANK not in labels
    assert not any(k.startswith(names.LABEL_PREFIX + "coord-") for k in labels)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["MONARCH_SPMD_SPARE"] == "1" and "MONARCH_SPMD_COORDS" not in env
    assert env["MONARCH_SPMD_AGENT_TOKEN"] == "t" * 20
    info = pod_info(pod)
    assert (info.spare, info.rank, info.restart) == (1, -1, 0)
    adopted = {**pod, "metadata": {**pod["metadata"], "labels": {
        k: v for k, v in {**labels, **builders.adopt_labels(JOB, s, 3, 0, 1)}.items() if v is not None}}}
    info = pod_info(adopted)
    assert (info.spare, info.rank, info.replacement) == (None, 3, 1)
    assert builders.build_podgroup(JOB, s, 0)["spec"]["minMember"] == 4 + 2, "the gang's admission counts the spares"


def test_the_spare_made_when_a_frozen_nodes_pod_was_taken_over_keeps_off_that_node():
    """The pass that sees the takeover makes the next spare before the restart is recorded as
    NodeLost (its pod's state is waited for): the lost member's silence is enough to keep the new
    spare off the frozen node, which the scheduler still takes for Ready."""
    st = status("Running")
    silent = {"type": "lost", "seq": 7, "time": T - 1, "round": 0, "member": 2, "reason": "HeartbeatTimeout",
              "node": "node-2", "received": T - 1}
    lost = restart_event(rank=None, member=2, code=None, reason="MemberLost", tail=[],
                         message="member 2's agent is gone (HeartbeatTimeout)", received=T - 0.5)
    coordinator = dataclasses.replace(view(round_=1, phase="joining", restarts=[lost]), takeovers=(takeover(),),
                                      lost=(silent,), spares_ready=0)
    plan = run(s=spec(spares=1, restartPolicy={"maxRestarts": 0}), st=st, pods=gang("Running"), spares=[spare(0)],
               coordinator=coordinator)
    assert plan.spares == (1,) and plan.avoid_nodes == ("node-2",)
    left = dataclasses.replace(coordinator, lost=(dict(silent, reason="Left"),))
    plan = run(s=spec(spares=1, restartPolicy={"maxRestarts": 0}), st=st, pods=gang("Running"), spares=[spare(0)],
               coordinator=left)
    assert plan.spares == (1,) and plan.avoid_nodes == (), "a member that left said why: its node is fine"


def test_a_member_lost_while_no_spare_was_ready_waits_for_the_spare_pod_on_its_way_then_gets_its_own():
    """Member 2's pod was evicted while the spare's pod was still starting (the coordinator had none
    ready, so its loss came without a takeover). The coordinator gives the place to the spare at
    its hello, so no pod is created for member 2 for SPARE_ARRIVAL_SECONDS after the loss: one
    would be turned away. Past that, or with every spare pod ready at the loss, member 2 gets one."""
    from spmd_operator.lifecycle import inplace

    def plan_after(seconds, spares_ready=0, phase="Pending"):
        restart = restart_event(rank=None, member=2, code=None, reason="MemberLost", tail=[],
                                message="member 2's agent is gone (Left)", received=T - seconds)
        loss = {"type": "lost", "seq": 7, "time": T - seconds, "round": 0, "member": 2, "reason": "Left",
                "node": "node-2", "received": T - seconds}
        coordinator = dataclasses.replace(view(round_=1, phase="joining", restarts=[restart]), lost=(loss,),
                                          spares_ready=spares_ready)
        pods = [p for p in gang("Running") if p.rank != 2]  # evicted and gone
        return run(s=spec(spares=1, restartPolicy={"maxRestarts": 0}), st=status("Running"), pods=pods,
                   spares=[spare(0, phase=phase)], coordinator=coordinator)

    waiting = plan_after(1.0)
    assert waiting.replace == () and waiting.create == (), "the spare on its way takes the place"
    assert waiting.requeue_after is not None and waiting.requeue_after <= 1.0
    assert plan_after(inplace.SPARE_ARRIVAL_SECONDS + 0.5).replace == ((2, 1),), "it never came: a pod of its own"
    assert plan_after(1.0, spares_ready=1, phase="Running").replace == ((2, 1),), \
        "the spare was ready at the loss and was not given the place (its node is suspect): a pod at once"
