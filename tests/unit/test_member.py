"""The agent's member side (monarch_spmd.payload.member.Member), from tables like the coordinator's
(test_rendezvous.py): every coordinator message in every phase, the round's end, signals and a lost
coordinator; then a whole gang of Members against the real coordinator.Coordinator."""

from __future__ import annotations

import pytest

from monarch_spmd.payload import member as m
from monarch_spmd.payload import coordinator
from monarch_spmd.payload import rendezvous as R
from monarch_spmd.payload.member import Do, Member

RND = 2  # the round each case starts in


def at(phase: str, first_round: int = 0) -> Member:
    return Member(first_round=first_round, phase=phase, round=RND)


def join(r: int) -> Do:
    return Do(m.SEND, {"type": R.JOIN, "round": r})


FAIL_MSG = {"type": R.FAIL, "round": RND, "exit_code": 3, "rank": 1}
REFUSAL = Do(m.GIVE_UP, text="the coordinator refused this agent: wrong token", reason=R.REASON_COORDINATOR_LOST)

# (phase, message, procs running) -> (phase after, round after, what the agent is told)
TABLE = [
    # welcome: only in hello, names the round to join
    (m.HELLO, {"type": R.WELCOME, "round": 2}, False, m.JOINING, 2, [Do(m.SAY, text="joining the gang at restart 2"), join(2)]),
    (m.JOINING, {"type": R.WELCOME, "round": 5}, False, m.JOINING, RND, []),
    (m.RUNNING, {"type": R.WELCOME, "round": 5}, True, m.RUNNING, RND, []),
    # refused: give up in any phase
    *[(p, {"type": R.REFUSED, "reason": "wrong token"}, False, p, RND, [REFUSAL]) for p in m.PHASES],
    # go: only in joining, for its round
    (m.JOINING, {"type": R.GO, "round": RND}, False, m.RUNNING, RND,
     [Do(m.START, round=RND, message={"type": R.GO, "round": RND})]),
    (m.JOINING, {"type": R.GO, "round": RND + 1}, False, m.JOINING, RND, []),
    (m.JOINING, {"type": R.GO, "round": RND - 1}, False, m.JOINING, RND, []),
    (m.HELLO, {"type": R.GO, "round": RND}, False, m.HELLO, RND, []),
    (m.RUNNING, {"type": R.GO, "round": RND}, True, m.RUNNING, RND, []),
    (m.STOPPING, {"type": R.GO, "round": RND}, True, m.STOPPING, RND, []),
    (m.WAITING, {"type": R.GO, "round": RND}, False, m.WAITING, RND, []),
    # stop r: running processes are stopped; a member with none left joins r+1 at once
    (m.RUNNING, {"type": R.STOP, "round": RND}, True, m.STOPPING, RND, [Do(m.STOP, {"type": R.STOP, "round": RND})]),
    (m.RUNNING, {"type": R.STOP, "round": RND}, False, m.JOINING, RND + 1, [join(RND + 1)]),
    (m.WAITING, {"type": R.STOP, "round": RND}, False, m.JOINING, RND + 1, [join(RND + 1)]),
    (m.RUNNING, {"type": R.STOP, "round": RND - 1}, True, m.RUNNING, RND, []),  # an old round's
    (m.STOPPING, {"type": R.STOP, "round": RND}, True, m.STOPPING, RND, []),  # already stopping
    (m.JOINING, {"type": R.STOP, "round": RND}, False, m.JOINING, RND, []),
    (m.HELLO, {"type": R.STOP, "round": RND}, False, m.HELLO, RND, []),
    # finish and fail end the member in any phase
    *[(p, {"type": R.FINISH, "round": RND}, False, p, RND, [Do(m.FINISH, {"type": R.FINISH, "round": RND})])
      for p in m.PHASES],
    *[(p, FAIL_MSG, True, p, RND, [Do(m.FAIL, FAIL_MSG)]) for p in m.PHASES],
    # what a member never gets, or a newer protocol's type: nothing
    *[(p, {"type": kind, "round": RND}, True, p, RND, [])
      for p in m.PHASES for kind in (R.JOIN, R.HEARTBEAT, R.EXITED, "from-the-future")],
]


@pytest.mark.parametrize("phase, message, running, after, round_after, actions", TABLE,
                         ids=[f"{t[1]['type']}-in-{t[0]}-{'procs' if t[2] else 'none'}" for t in TABLE])
def test_each_message_in_each_phase(phase, message, running, after, round_after, actions):
    member = at(phase)
    assert member.on_message(message, procs_running=running) == actions
    assert (member.phase, member.round) == (after, round_after)


def test_every_message_type_and_phase_is_in_the_table():
    kinds = {t[1]["type"] for t in TABLE}
    assert {R.WELCOME, R.REFUSED, R.GO, R.STOP, R.FINISH, R.FAIL} <= kinds
    for kind in (R.FINISH, R.FAIL, R.REFUSED):
        assert {t[0] for t in TABLE if t[1]["type"] == kind} == set(m.PHASES)


def test_a_welcome_to_the_first_round_says_nothing_and_a_bad_round_keeps_its_own():
    member = Member(first_round=3)
    assert member.on_message({"type": R.WELCOME, "round": 3}, procs_running=False) == [join(3)]
    other = Member(first_round=1)
    assert other.on_message({"type": R.WELCOME, "round": "7"}, procs_running=False) == [join(1)]
    assert other.on_message({"type": R.WELCOME, "round": 4}, procs_running=False) == []  # once only


ROWS = [{"rank": 0, "exit_code": 0}, {"rank": 1, "exit_code": 0, "reason": "x"}]


@pytest.mark.parametrize("phase, after, round_after, joins", [
    (m.RUNNING, m.WAITING, RND, []),             # exited on their own: wait for the verdict
    (m.STOPPING, m.JOINING, RND + 1, [join(RND + 1)]),  # stopped as asked: on to the next round
])
def test_the_rounds_end(phase, after, round_after, joins):
    member = at(phase)
    exited = Do(m.SEND, {"type": R.EXITED, "round": RND, "procs": ROWS})
    assert member.on_round_ended(ROWS) == [exited, *joins]
    assert (member.phase, member.round) == (after, round_after)


def test_a_signal_sends_leave_once_with_the_round_and_the_signal():
    member = at(m.RUNNING)
    assert member.on_signal(15) == [Do(m.SEND, {"type": R.LEAVE, "round": RND, "signal": 15})]
    assert member.on_signal(2) == [] and member.left
    assert member.phase == m.RUNNING


@pytest.mark.parametrize("phase, signalled, running, ok, expect", [
    (m.RUNNING, 15, True, False, Do(m.SIGNAL_EXIT)),
    (m.JOINING, 15, False, False, Do(m.EXIT, code=143)),
    (m.WAITING, 2, False, True, Do(m.EXIT, code=130)),
    (m.WAITING, None, False, True, Do(m.EXIT, code=0)),   # its part done: no verdict needed
    *[(p, None, p in (m.RUNNING, m.STOPPING), False,
       Do(m.GIVE_UP, text="lost the coordinator at 10.0.0.1:29401 (the rank-0 pod's agent)",
          reason=R.REASON_COORDINATOR_LOST)) for p in m.PHASES],
    (m.JOINING, None, False, True, Do(m.GIVE_UP, text="lost the coordinator at 10.0.0.1:29401 (the rank-0 pod's agent)",
                                      reason=R.REASON_COORDINATOR_LOST)),  # succeeded, but a round was coming
])
def test_a_lost_coordinator(phase, signalled, running, ok, expect):
    assert at(phase).on_link_lost("10.0.0.1:29401", signalled=signalled, procs_running=running,
                                  all_succeeded=ok) == expect


def _gang_against_the_coordinator(fail_in_round: dict[int, int], max_restarts: int) -> tuple[list[Member], list]:
    """Two Members and the real Coordinator, message by message: member ``fail_in_round[r]``'s
    process fails in round r, the others run until stopped."""
    c = coordinator.Coordinator(2, 0, coordinator.Policy(max_restarts=max_restarts, backoff=0), 0.0, world_size=2, wall=lambda: 0.0)
    c.start()
    members = [Member(0), Member(0)]
    running = [False, False]
    ended: list = [None, None]
    inbox: list[tuple[int, dict]] = []

    def deliver(outs):
        for out in outs:
            if out.to == R.OBSERVERS:
                continue
            for i in ((0, 1) if out.to == R.ALL else (out.to,)):
                inbox.append((i, dict(out.message)))

    def act(i: int, dos: list[Do], now: float) -> None:
        for do in dos:
            if do.what == m.SEND:
                msg = do.message
                if msg["type"] == R.JOIN:
                    deliver(c.join(i, msg["round"], now))
                elif msg["type"] == R.EXITED:
                    deliver(c.exited(i, msg["round"], msg["procs"], now))
            elif do.what == m.START:
                running[i] = True
                deliver(c.running(i, do.round, [{"rank": i, "local_rank": 0, "pid": 100 + i}], now))
                if fail_in_round.get(do.round) == i:
                    running[i] = False
                    deliver(c.failure(i, do.round, {"rank": i, "exit_code": 1, "returncode": 1,
                                                    "reason": R.REASON_ERROR, "at": now}, now))
                    act(i, members[i].on_round_ended([{"rank": i, "exit_code": 1, "returncode": 1}]), now)
            elif do.what == m.STOP:
                running[i] = False
                act(i, members[i].on_round_ended([{"rank": i, "exit_code": -15, "stopped": True}]), now)
            elif do.what in (m.FINISH, m.FAIL, m.GIVE_UP, m.EXIT):
                ended[i] = do

    for i in (0, 1):
        deliver(c.hello(i, f"inc{i}", 0.0))
    now = 0.0
    for _ in range(200):
        if not inbox:
            now += 1.0
            deliver(c.tick(now))
            if not inbox:
                break
        i, message = inbox.pop(0)
        if ended[i] is None:
            act(i, members[i].on_message(message, procs_running=running[i]), now)
        if all(e is not None for e in ended):
            break
    return members, ended


def test_a_gang_of_members_restarts_in_place_and_fails_when_the_restarts_are_used_up():
    members, ended = _gang_against_the_coordinator({0: 1, 1: 0}, max_restarts=1)
    assert [e.what for e in ended] == [m.FAIL, m.FAIL]
    assert ended[0].message["round"] == 1, "round 1's failure was the last straw"
    # both had stopped and joined round 2 when the verdict came, as the protocol has it
    assert [(x.phase, x.round) for x in members] == [(m.JOINING, 2), (m.JOINING, 2)]


def test_a_gang_of_members_restarts_once_then_every_member_stops_when_told():
    members, ended = _gang_against_the_coordinator({0: 1}, max_restarts=3)
    # round 1 runs with no failure: both members are running, nobody ended
    assert ended == [None, None]
    assert [(x.phase, x.round) for x in members] == [(m.RUNNING, 1), (m.RUNNING, 1)]
