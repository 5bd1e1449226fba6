"""The local runner's notes from the coordinator's events (monarch_spmd.runner._follow), as its
observer hands them over (monarch_spmd.payload.follow.Follower): an observer that connects late
(the agent port is retried while the gang starts, and a rank may fail before the first try) gets
the events it missed from its ``welcome``'s history, and says them as if they had come live, each
once, also across a reconnection."""

from __future__ import annotations

from monarch_spmd import runner
from monarch_spmd.payload import follow, rendezvous


def _failure(seq: int) -> dict:
    return {"type": rendezvous.EV_FAILURE, "seq": seq, "round": 0, "rank": 1, "exit_code": 3,
            "reason": rendezvous.REASON_ERROR}


def _restart(seq: int) -> dict:
    return {"type": rendezvous.EV_RESTART, "seq": seq, "round": 0, "next_round": 1, "max_restarts": 1,
            "backoff_seconds": 0}


def _all_running(seq: int) -> dict:
    return {"type": rendezvous.EV_ALL_RUNNING, "seq": seq, "round": 1, "seconds_since_failure": 0.01}


def _welcome(seq: int, *history: dict) -> dict:
    return {"type": rendezvous.WELCOME, "round": 1, "seq": seq, "history": list(history)}


def _follow(*connections: list[dict]) -> tuple[runner._View, list[str]]:
    """The runner's view after its observer read ``connections`` (each a list of the messages
    one connection brought, the first a welcome), handing each event on as agent.Observer does."""
    view, notes, follower = runner._View(), [], follow.Follower()
    for messages in connections:
        follower.hello()
        for message in messages:
            for event in follower.take(message):
                view.inbox.put(event)
            if message["type"] == rendezvous.WELCOME:
                view.inbox.put({k: v for k, v in message.items() if k != "history"})
        follower.disconnected()
    runner._follow(view, notes.append, 2)
    return view, notes


SAID = ["rank 1 exited with code 3; stopping the other ranks",
        "restarting the gang (restart 1 of at most 1) in place",
        "restart 1: every rank is running again, 0.01s after the failure"]


def test_a_late_observer_says_the_failure_and_the_restart_from_the_welcomes_history():
    view, notes = _follow([_welcome(3, {"type": rendezvous.EV_ROUND, "seq": 1, "round": 0}, _failure(2), _restart(3)),
                           _all_running(4)])
    assert notes == SAID
    assert view.round == 1


def test_a_reconnecting_observer_says_nothing_twice():
    _, notes = _follow([_welcome(1), _failure(2), _restart(3)],
                       [_welcome(3, _failure(2), _restart(3)), _all_running(4)])
    assert notes == SAID
