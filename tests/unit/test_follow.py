"""The one observer client (monarch_spmd.payload.follow.Follower), from tables: the first message
of a connection, the run id, the history's replay across reconnections, the sequence numbers, a
coordinator that started over, and the round and phase every event type moves."""

from __future__ import annotations

import pytest

from monarch_spmd.payload import coordinator, counting, follow, rendezvous
from monarch_spmd.payload.follow import Follower

R = rendezvous


def ev(kind: str, seq: int, round: int = 0, **fields) -> dict:  # noqa: A002
    return {"type": kind, "seq": seq, "round": round, **fields}


def welcome(seq: int, *history: dict, round: int = 0, phase: str = R.JOINING, run_id: str = "run-1",  # noqa: A002
            **fields) -> dict:
    return {"type": R.WELCOME, "seq": seq, "round": round, "phase": phase, "run_id": run_id,
            "history": list(history), **fields}


def seqs(events: list[dict]) -> list[int]:
    return [e["seq"] for e in events]


def test_hello_carries_the_role_the_versions_and_the_token():
    f = Follower("tok", "run-1")
    assert f.hello() == {"type": R.HELLO, "role": R.ROLE_OBSERVER, "versions": list(R.VERSIONS), "token": "tok"}
    assert rendezvous.check_hello(f.hello(), 2) == {"role": R.ROLE_OBSERVER, "versions": list(R.VERSIONS),
                                                    "token": "tok"}  # what the coordinator reads of it
    assert not f.welcomed


@pytest.mark.parametrize("first, error, words", [
    ({"type": R.REFUSED, "reason": "wrong token"}, follow.Refused, "wrong token"),
    ({"type": R.REFUSED, "reason": "x" * 100_000}, follow.Refused, "refused by the coordinator"),
    (ev(R.EV_ROUND, 1), rendezvous.ProtocolError, "expected welcome, got 'round'"),
    ({"type": R.GO, "round": 0}, rendezvous.ProtocolError, "expected welcome"),
    (welcome(0, run_id="run-2"), follow.ForeignRun, "another run's ('run-2', not 'run-1')"),
    ({**welcome(0), "run_id": None}, follow.ForeignRun, "another run's ('None'"),
])
def test_a_connection_that_does_not_begin_with_this_runs_welcome_is_refused(first, error, words):
    f = Follower("tok", "run-1")
    f.hello()
    with pytest.raises(error, match=None) as e:
        f.take(first)
    assert words in str(e.value)
    assert len(str(e.value)) < 2 * R.MAX_TEXT
    assert not f.welcomed and f.seq == 0
    assert issubclass(error, (ConnectionError, ValueError))


def test_without_a_run_id_any_run_is_followed():
    f = Follower()
    assert f.take(welcome(0, run_id="whatever")) == [] and f.welcomed


def test_a_welcome_replays_its_history_in_order_and_moves_on_to_its_seq():
    f = Follower(run_id="run-1")
    history = [ev(R.EV_ROUND, 1), ev(R.EV_STARTED, 3), ev(R.EV_FAILURE, 5, rank=1)]
    events = f.take(welcome(6, *history, phase=R.STOPPING))
    assert seqs(events) == [1, 3, 5] and f.seq == 6
    assert (f.round, f.phase) == (0, R.STOPPING)
    assert f.take(ev(R.EV_EXITED, 7)) == [ev(R.EV_EXITED, 7)] and f.seq == 7


def test_the_events_are_copies():
    f = Follower()
    original = ev(R.EV_ROUND, 1)
    [event] = f.take(welcome(1, original))
    event["received"] = 1.0
    assert "received" not in original


@pytest.mark.parametrize("live, error", [
    (3, "event 3 after 1: lines were lost"),   # a gap
    (1, "event 1 after 1: lines were lost"),   # a repeat
    (0, "event 0 after 1"),
])
def test_a_live_event_out_of_sequence_is_a_protocol_error(live, error):
    f = Follower()
    f.take(welcome(1))
    with pytest.raises(rendezvous.ProtocolError, match=error):
        f.take(ev(R.EV_JOINED, live))


def test_messages_without_a_seq_pass_and_leave_it_alone():
    f = Follower()
    f.take(welcome(2))
    assert f.take({"type": "future-kind", "x": 1}) == [{"type": "future-kind", "x": 1}]
    assert f.take({"type": "other", "seq": True}) == [{"type": "other", "seq": True}]  # a bool is no seq
    assert f.seq == 2


def test_a_reconnection_takes_only_what_was_missed():
    f = Follower(run_id="run-1")
    assert seqs(f.take(welcome(2, ev(R.EV_ROUND, 1), ev(R.EV_STARTED, 2)))) == [1, 2]
    assert seqs(f.take(ev(R.EV_FAILURE, 3, rank=0))) == [3]
    f.disconnected()
    assert not f.welcomed
    f.hello()
    again = welcome(6, ev(R.EV_ROUND, 1), ev(R.EV_STARTED, 2), ev(R.EV_FAILURE, 3, rank=0),
                    ev(R.EV_RESTART, 5, next_round=1), ev(R.EV_ROUND, 6, round=1), round=1)
    assert seqs(f.take(again)) == [5, 6] and f.seq == 6
    assert (f.round, f.phase) == (1, R.JOINING)


def test_a_welcome_whose_history_lost_its_oldest_events_says_so():
    f = Follower()
    f.take(welcome(0))
    f.disconnected()
    f.hello()
    assert seqs(f.take(welcome(9000, ev(R.EV_ROUND, 8999, round=4), history_dropped=37))) == [8999]
    assert f.dropped == 37 and f.seq == 9000


def test_a_coordinator_that_started_over_is_followed_from_its_beginning():
    """A welcome whose seq is behind ours comes from a new coordinator process: its events are
    all new (the reader is told by ``restarted``), none skipped for having an old number."""
    f = Follower()
    f.take(welcome(40))
    f.disconnected()
    f.hello()
    assert seqs(f.take(welcome(2, ev(R.EV_ROUND, 1), ev(R.EV_STARTED, 2)))) == [1, 2]
    assert f.restarted == 1 and f.seq == 2
    assert seqs(f.take(ev(R.EV_FAILURE, 3))) == [3]


@pytest.mark.parametrize("bad_seq", [None, "7", -1, True, 1.5])
def test_a_welcome_with_a_bad_seq_counts_as_zero(bad_seq):
    f = Follower()
    assert f.take({**welcome(0), "seq": bad_seq}) == [] and f.seq == 0
    assert seqs(f.take(ev(R.EV_ROUND, 1))) == [1]


def test_history_entries_that_are_not_objects_are_skipped():
    f = Follower()
    events = f.take(welcome(2, "junk", 7, None, ev(R.EV_ROUND, 1), [1], ev(R.EV_STARTED, 2)))
    assert seqs(events) == [1, 2]


# Every observer event type, and what it does to the coordinator's phase as the follower tracks it.
PHASES = [
    # (phase before, event, round before, phase after, round after)
    (R.RUNNING_PHASE, ev(R.EV_ROUND, 0, round=3), 2, R.JOINING, 3),
    (R.JOINING, ev(R.EV_JOINED, 0, round=2, member=1), 2, R.JOINING, 2),
    (R.JOINING, ev(R.EV_STARTED, 0, round=2), 2, R.RUNNING_PHASE, 2),
    (R.RUNNING_PHASE, ev(R.EV_RUNNING, 0, round=2), 2, R.RUNNING_PHASE, 2),
    (R.RUNNING_PHASE, ev(R.EV_ALL_RUNNING, 0, round=2), 2, R.RUNNING_PHASE, 2),
    (R.RUNNING_PHASE, ev(R.EV_FAILURE, 0, round=2, rank=0), 2, R.STOPPING, 2),
    (R.JOINING, ev(R.EV_FAILURE, 0, round=2, rank=0), 2, R.JOINING, 2),  # before go: no stopping
    (R.STOPPING, ev(R.EV_FAILURE, 0, round=2, rank=1), 2, R.STOPPING, 2),
    (R.RUNNING_PHASE, ev(R.EV_LOST, 0, round=2, member=1), 2, R.RUNNING_PHASE, 2),
    (R.STOPPING, ev(R.EV_EXITED, 0, round=2), 2, R.STOPPING, 2),
    (R.STOPPING, ev(R.EV_RESTART, 0, round=2, next_round=3), 2, R.STOPPING, 2),
    (R.RUNNING_PHASE, ev(R.EV_PROGRESS, 0, round=2, seconds_since_progress=1.0), 2, R.RUNNING_PHASE, 2),
    (R.RUNNING_PHASE, ev(R.EV_HANG, 0, round=2, member=0, rank=1, reason="NoProgress"), 2, R.RUNNING_PHASE, 2),
    (R.RUNNING_PHASE, ev(R.EV_SPARE, 0, round=2, spare=0, state="ready", ready=1), 2, R.RUNNING_PHASE, 2),
    (R.RUNNING_PHASE, ev(R.EV_TAKEOVER, 0, round=2, member=1, spare=0), 2, R.RUNNING_PHASE, 2),
    (R.RUNNING_PHASE, ev(R.EV_RESIZE, 0, round=2, size=2, round_members=[0, 1]), 2, R.RUNNING_PHASE, 2),
    (R.RUNNING_PHASE, ev(R.EV_RESIZE, 0, round=2, member=2, size=2, next_size=3), 2, R.STOPPING, 2),
    (R.RUNNING_PHASE, ev(R.EV_SUCCEEDED, 0, round=2), 2, R.FINISHED, 2),
    (R.STOPPING, ev(R.EV_FAILED, 0, round=2), 2, R.FAILED, 2),
    (R.JOINING, ev(R.EV_ROUND, 0, round="3"), 2, R.JOINING, 2),  # a round that is not a number moves nothing
]


@pytest.mark.parametrize("before, event, r, after, r_after", PHASES, ids=[f"{p[1]['type']}-{p[0]}" for p in PHASES])
def test_every_event_type_moves_the_phase_as_the_coordinator_did(before, event, r, after, r_after):
    f = Follower()
    f.take(welcome(0, round=r, phase=before))
    [taken] = f.take({**event, "seq": 1})
    assert taken["type"] == event["type"]
    assert (f.phase, f.round) == (after, r_after)


def test_every_observer_event_type_is_in_the_table():
    kinds = {v for k, v in vars(R).items() if k.startswith("EV_")}
    assert kinds == {p[1]["type"] for p in PHASES}


def test_against_the_real_coordinator_an_observer_that_comes_back_misses_nothing_and_repeats_nothing():
    """The coordinator's own welcome and events (coordinator.Coordinator) through a restart, with an
    observer that leaves mid-gang and comes back: each event at most once, in order, and every
    event of the history the coordinator keeps taken."""
    c = coordinator.Coordinator(2, 0, counting.Policy(max_restarts=3, backoff=0), 0.0, world_size=2,
                               run_id="run-1", wall=lambda: 0.0)
    outs = list(c.start())
    f = Follower(run_id="run-1")
    taken: list[dict] = []

    def reconnect():
        f.disconnected()
        f.hello()
        taken.extend(f.take(c.observer_welcome()))

    def step(new: list) -> None:
        outs.extend(new)

    reconnect()
    for m in (0, 1):
        step(c.hello(m, f"i{m}", 0.0))
    for m in (0, 1):
        step(c.join(m, 0, 0.0))
    for m in (0, 1):
        step(c.running(m, 0, [{"rank": m, "local_rank": 0, "pid": 10 + m}], 0.0))
    live = [o.message for o in outs if o.to == rendezvous.OBSERVERS]
    for message in live:
        if message["seq"] > f.seq:
            taken.extend(f.take(message))
    # Away while rank 1 fails and the gang restarts in place.
    f.disconnected()
    step(c.failure(1, 0, {"rank": 1, "exit_code": 3, "returncode": 3, "reason": R.REASON_ERROR, "at": 1.0}, 1.0))
    for m in (0, 1):
        step(c.exited(m, 0, [{"rank": m, "exit_code": 0 if m == 0 else 3, "stopped": m == 0}], 1.0))
    for m in (0, 1):
        step(c.join(m, 1, 1.0))
    step(c.tick(2.0))
    reconnect()
    numbers = [e["seq"] for e in taken]
    assert numbers == sorted(set(numbers)), "each event once, in order"
    assert {e["seq"] for e in c.history} <= set(numbers), "nothing of the history missed"
    assert f.seq == c.seq
    assert R.EV_RESTART in {e["type"] for e in taken}
    assert f.round == c.round == 1
