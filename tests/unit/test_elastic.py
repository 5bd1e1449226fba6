"""Elastic sizes in the restart-in-place protocol (torchrun's --nnodes MIN:MAX): the coordinator
closes a round on its minimum of members after a bounded wait, shrinks when a member is lost and
nothing takes its place, grows when a member is ready again; each member computes its ranks from
the round's list. The same machine runs behind real sockets in tests/lib/test_elastic_local.py."""

from __future__ import annotations

import pytest

from monarch_spmd.payload import member as mb
from monarch_spmd.payload import elastic
from monarch_spmd.payload import rendezvous as rv
from monarch_spmd.payload import worker
from monarch_spmd.payload.coordinator import Coordinator, Policy
from monarch_spmd.payload.rendezvous import ALL, OBSERVERS

from .coordinators import Observed


def machine(members: int = 4, minimum: int = 2, wait: float = 10.0, **policy) -> Coordinator:
    c = Observed(members, 0, Policy(**{"max_restarts": 0, "backoff": 0.0, "min_members": minimum,
                                          "elastic_wait": wait, **policy}),
                    now=0.0, world_size=members * 2, run_id="job", wall=lambda: 1000.0)
    c.start()
    return c


def go(outs):
    return [o.message for o in outs if o.to == ALL and o.message["type"] == rv.GO]


def events(outs, kind):
    return [o.message for o in outs if o.to == OBSERVERS and o.message["type"] == kind]


def join(c: Coordinator, members, now: float) -> list:
    outs = []
    for m in members:
        if m not in c.incarnations:
            outs += c.hello(m, f"inc-{m}", now)
        outs += c.join(m, c.round, now)
    return outs


def run(c: Coordinator, now: float) -> list:
    outs = []
    for m in sorted(c.round_members):
        outs += c.running(m, c.round, [{"rank": m, "local_rank": 0, "pid": 100 + m}], now)
    return outs


def small_round(minimum: int = 2) -> Coordinator:
    """A gang of 4 whose round 0 runs with members 0 and 1 (the others never came in time)."""
    c = machine(minimum=minimum)
    join(c, [0, 1], 1.0)
    c.tick(11.0)
    run(c, 12.0)
    return c


def test_a_fixed_size_gang_sees_nothing_new():
    c = machine(members=3, minimum=0)
    assert not c.elastic
    outs = join(c, [0, 1, 2], 1.0)
    assert go(outs) == [{"type": rv.GO, "round": 0}]
    started = events(outs, rv.EV_STARTED)[0]
    assert "round_members" not in started and started["members"] == 3
    assert "min_members" not in c.observer_welcome()


def test_the_round_starts_at_once_when_every_member_joined():
    c = machine()
    outs = join(c, [0, 1, 2, 3], 1.0)
    assert go(outs) == [{"type": rv.GO, "round": 0, "members": [0, 1, 2, 3]}]
    assert events(outs, rv.EV_RESIZE) == []


def test_the_minimum_waits_the_bound_for_the_rest_then_starts_smaller():
    c = machine(minimum=2, wait=10.0)
    assert go(join(c, [0, 1], 1.0)) == []
    assert go(c.tick(10.9)) == []  # the wait runs from when the minimum joined
    outs = c.tick(11.0)
    assert go(outs) == [{"type": rv.GO, "round": 0, "members": [0, 1]}]
    started = events(outs, rv.EV_STARTED)[0]
    assert started["members"] == 2 and started["round_members"] == [0, 1] and started["world_size"] == 4
    assert events(outs, rv.EV_RESIZE)[0]["size"] == 2


def test_below_the_minimum_nothing_starts_and_member_zero_is_always_in():
    c = machine(minimum=2)
    join(c, [0], 1.0)
    assert go(c.tick(100.0)) == []
    c2 = machine(minimum=2)
    join(c2, [1, 2, 3], 1.0)  # three, but not member 0 (the coordinator's own)
    assert go(c2.tick(100.0)) == []
    assert go(join(c2, [0], 101.0)) == [{"type": rv.GO, "round": 0, "members": [0, 1, 2, 3]}]


def test_a_member_lost_before_the_wait_ends_restarts_the_wait():
    c = machine(minimum=2, wait=10.0)
    join(c, [0, 1], 1.0)
    c.lost(1, rv.LOST_DISCONNECTED, 5.0)
    join(c, [2], 8.0)  # the minimum again at 8 s: the wait runs from there
    assert go(c.tick(17.9)) == []
    assert go(c.tick(18.0)) == [{"type": rv.GO, "round": 0, "members": [0, 2]}]


def test_a_lost_member_shrinks_the_next_round_after_the_wait():
    c = machine(minimum=2)
    join(c, [0, 1, 2, 3], 1.0)
    run(c, 2.0)
    outs = c.lost(2, rv.LOST_HEARTBEAT, 3.0)
    assert [o.message["type"] for o in outs if o.to == ALL] == [rv.STOP]
    for m in (0, 1, 3):
        c.exited(m, 0, [{"rank": m, "exit_code": 143, "stopped": True}], 4.0)
        outs = c.join(m, 1, 4.0)
    assert events(outs, rv.EV_RESTART)[0]["reason"] == rv.REASON_MEMBER_LOST
    assert c.round == 1 and go(outs) == []
    outs = c.tick(14.0)
    assert go(outs) == [{"type": rv.GO, "round": 1, "members": [0, 1, 3]}]
    assert events(outs, rv.EV_RESIZE)[0]["message"].startswith("round 1 runs 3 of 4 members")
    # Every rank of the smaller round runs: the job is all running again.
    assert events(run(c, 15.0), rv.EV_ALL_RUNNING)


def test_a_replacement_that_joins_within_the_wait_keeps_the_full_size():
    c = machine(minimum=2)
    join(c, [0, 1, 2, 3], 1.0)
    run(c, 2.0)
    c.lost(2, rv.LOST_HEARTBEAT, 3.0)
    for m in (0, 1, 3):
        c.exited(m, 0, [], 4.0)
        c.join(m, 1, 4.0)
    c.hello(2, "inc-2b", 9.0)
    assert go(c.join(2, 1, 9.0)) == [{"type": rv.GO, "round": 1, "members": [0, 1, 2, 3]}]


def test_a_member_ready_while_a_smaller_round_runs_grows_the_gang_as_a_membership_change():
    c = machine(minimum=2, max_restarts=0)
    join(c, [0, 1, 3], 1.0)
    c.tick(11.0)
    run(c, 12.0)
    assert c.round_members == {0, 1, 3}
    welcome = c.hello(2, "inc-2", 20.0)
    assert [o.message["round"] for o in welcome if o.message["type"] == rv.WELCOME] == [1]
    outs = c.join(2, 1, 20.0)
    assert [o.message["type"] for o in outs if o.to == ALL] == [rv.STOP]
    resize = events(outs, rv.EV_RESIZE)[0]
    assert (resize["member"], resize["size"], resize["next_size"]) == (2, 3, 4)
    assert c.join(2, 1, 20.1) == []  # said twice: one grow
    for m in (0, 1, 3):
        c.exited(m, 0, [{"rank": m, "exit_code": 143, "stopped": True}], 21.0)
        outs = c.join(m, 1, 21.0)
    restart = events(outs, rv.EV_RESTART)[0]
    # Not counted (maxRestarts 0 would fail the job otherwise), no back-off.
    assert restart["reason"] == rv.REASON_MEMBERSHIP and restart["backoff_seconds"] == 0.0
    assert c.disruptions == 1 and c.phase == rv.RUNNING_PHASE
    assert go(outs) == [{"type": rv.GO, "round": 1, "members": [0, 1, 2, 3]}]


def test_a_waiting_member_lost_is_no_failure_of_the_running_round():
    c = small_round()
    c.hello(3, "inc-3", 13.0)
    c.join(3, 1, 13.0)  # grows: the round stops
    assert c.phase == rv.STOPPING
    outs = c.lost(3, rv.LOST_DISCONNECTED, 13.5)
    assert events(outs, rv.EV_FAILURE) == [] and c.failures[0].info["reason"] == rv.REASON_MEMBERSHIP
    for m in (0, 1):
        c.exited(m, 0, [], 14.0)
        outs = c.join(m, 1, 14.0)
    assert c.round == 1 and c.tick(24.0) and c.round_members == {0, 1}


def test_a_failure_of_a_member_not_in_the_round_is_ignored():
    c = machine(minimum=2)
    join(c, [0, 1], 1.0)
    c.tick(11.0)
    c.hello(2, "inc-2", 11.5)  # arrives after the round closed, has not joined yet
    assert c.failure(2, 0, {"rank": 4, "exit_code": 1, "at": 12.0}, 12.0) == []
    assert c.phase == rv.RUNNING_PHASE


def test_the_round_finishes_when_its_members_succeeded():
    c = small_round()
    c.exited(0, 0, [{"rank": 0, "exit_code": 0}], 13.0)
    outs = c.exited(1, 0, [{"rank": 2, "exit_code": 0}], 13.0)
    assert events(outs, rv.EV_SUCCEEDED) and c.phase == rv.FINISHED


def test_a_hang_capture_waits_only_for_the_members_in_the_round():
    c = small_round()
    c.hello(3, "inc-3", 12.5)  # connected, not joined: no processes to freeze
    c.hang(1, 0, {"rank": 2, "reason": rv.REASON_NO_PROGRESS, "message": "silent"}, 13.0)
    c.frozen(0, 0, 13.1)
    outs = c.frozen(1, 0, 13.2)
    assert [o.message["type"] for o in outs if o.to == ALL] == [rv.DUMP]


@pytest.mark.parametrize(("participants", "member", "group"), [
    ([0, 1, 2, 3], 2, (2, 4)),
    ([0, 1, 3], 3, (2, 3)),
    ([3, 0], 3, (1, 2)),
    ([0, 1, 3], 2, None),
])
def test_group_of_numbers_the_round_densely_in_member_order(participants, member, group):
    assert elastic.group_of(member, participants) == group


def test_a_member_not_listed_in_go_joins_the_next_round_instead_of_starting():
    m = mb.Member(0, member=2)
    m.on_message({"type": rv.WELCOME, "round": 0}, procs_running=False)
    outs = m.on_message({"type": rv.GO, "round": 0, "members": [0, 1, 3]}, procs_running=False)
    assert [d.what for d in outs] == [mb.SAY, mb.SEND]
    assert outs[1].message == {"type": rv.JOIN, "round": 1} and m.phase == mb.JOINING
    outs = m.on_message({"type": rv.GO, "round": 1, "members": [0, 1, 2, 3]}, procs_running=False)
    assert [d.what for d in outs] == [mb.START] and outs[0].message["members"] == [0, 1, 2, 3]


def test_the_worker_env_of_a_smaller_round_is_torchruns_after_a_re_rendezvous():
    env = worker.worker_input_env([("nodes", 4), ("procs", 2)], [3], "m.svc", 29500, pod_layout=worker.PER_HOST,
                                  agent_port=29400, min_members=2)
    inputs = worker.read_inputs(env)
    assert inputs.min_members == 2 and inputs.policy().min_members == 2
    # Member 3 is the third of round [0, 1, 3]: GROUP_RANK 2, ranks 4 and 5 of 6.
    small = worker.build_env(inputs.resized(2, 3), {}, 1)
    assert {k: small[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "5", "WORLD_SIZE": "6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2",
        "GROUP_WORLD_SIZE": "3", "ROLE_RANK": "5", "ROLE_WORLD_SIZE": "6", "MASTER_ADDR": "m.svc"}


@pytest.mark.parametrize(("env", "needle"), [
    ({"MONARCH_SPMD_MIN_MEMBERS": "5"}, "more than the 4 pods"),
    ({"MONARCH_SPMD_MIN_MEMBERS": "0"}, "MONARCH_SPMD_MIN_MEMBERS: 0 is out of range"),
    ({"MONARCH_SPMD_POD_LAYOUT": "PerProc", "MONARCH_SPMD_COORDS": "3,1"}, "needs MONARCH_SPMD_POD_LAYOUT=PerHost"),
    ({"MONARCH_SPMD_AGENT_PORT": ""}, "needs the gang's coordinator"),
])
def test_bad_elastic_inputs_are_refused_naming_the_variable(env, needle):
    base = worker.worker_input_env([("nodes", 4), ("procs", 2)], [3], "m.svc", 29500, pod_layout=worker.PER_HOST,
                                   agent_port=29400, min_members=2)
    base.update(env)
    with pytest.raises(worker.WorkerInputError, match=needle):
        worker.read_inputs(base)


def test_an_exit_reported_by_a_member_outside_the_round_is_no_failure_of_it():
    c = small_round()
    c.hello(2, "inc-2", 12.5)
    outs = c.exited(2, 0, [{"rank": 4, "exit_code": 1}], 13.0)
    assert events(outs, rv.EV_FAILURE) == [] and c.phase == rv.RUNNING_PHASE and c.failures == []
