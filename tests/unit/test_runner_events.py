"""The local runner's notes from the coordinator's events (monarch_spmd.runner._follow): an
observer that connects late (the agent port is retried while the gang starts, and a rank may fail
before the first try) gets the events it missed in its ``welcome``'s history, and says them as if
they had come live, each once."""

from __future__ import annotations

from monarch_spmd import runner
from monarch_spmd.payload import rendezvous


def _failure(seq: int) -> dict:
    return {"type": rendezvous.EV_FAILURE, "seq": seq, "round": 0, "rank": 1, "exit_code": 3,
            "reason": rendezvous.REASON_ERROR}


def _restart(seq: int) -> dict:
    return {"type": rendezvous.EV_RESTART, "seq": seq, "round": 0, "next_round": 1, "max_restarts": 1,
            "backoff_seconds": 0}


def _all_running(seq: int) -> dict:
    return {"type": rendezvous.EV_ALL_RUNNING, "seq": seq, "round": 1, "seconds_since_failure": 0.01}


def _follow(*events: dict) -> tuple[runner._View, list[str]]:
    view, notes = runner._View(), []
    for event in events:
        view.inbox.put(event)
    runner._follow(view, notes.append, 2)
    return view, notes


def test_a_late_observer_says_the_failure_and_the_restart_from_the_welcomes_history():
    welcome = {"type": rendezvous.WELCOME, "round": 1, "seq": 3,
               "history": [{"type": rendezvous.EV_ROUND, "seq": 1, "round": 0}, _failure(2), _restart(3)]}
    view, notes = _follow(welcome, _all_running(4))
    assert notes == ["rank 1 exited with code 3; stopping the other ranks",
                     "restarting the gang (restart 1 of at most 1) in place",
                     "restart 1: every rank is running again, 0.01s after the failure"]
    assert view.round == 1 and view.seq == 4


def test_a_reconnecting_observer_says_nothing_twice():
    welcome = {"type": rendezvous.WELCOME, "round": 1, "seq": 3, "history": [_failure(2), _restart(3)]}
    _, notes = _follow(_failure(2), _restart(3), welcome, _all_running(4))
    assert notes == ["rank 1 exited with code 3; stopping the other ranks",
                     "restarting the gang (restart 1 of at most 1) in place",
                     "restart 1: every rank is running again, 0.01s after the failure"]
