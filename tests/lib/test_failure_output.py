"""spec.failureOutput None reaches the agents as MONARCH_SPMD_FAILURE_OUTPUT=None: no line of the
ranks' output leaves the pod through the coordinator (failure, restart and failed events, the
progress heartbeats) or the verdict the agents end with. Real workers started as pods, real
sockets, an observer reading the coordinator as the operator does."""

from __future__ import annotations

import re

import json

from monarch_spmd.payload import rendezvous

from .test_agent import PROGRAMS, Events, Gang


def _everything(events: Events) -> str:
    return "\n".join(json.dumps(m) for m in events.messages)


def test_with_failure_output_none_no_line_of_the_program_reaches_the_observer(spawn):
    gang = Gang(spawn, "hosts=2", ["-m", f"{PROGRAMS}.fail_once", "--rank", "1", "--code", "7", "--always",
                                   "--no-rendezvous"],
                MONARCH_SPMD_MAX_RESTARTS="1", MONARCH_SPMD_FAILURE_OUTPUT="None")
    events = gang.observed()
    try:
        assert [w.finish(120) for w in gang.workers.values()] == [7, 7]
        failed = events.wait(rendezvous.EV_FAILED)
        assert (failed["rank"], failed["rank_exit_code"], failed["exhausted"]) == (1, 7, True)
        assert failed["tail"] == [] and failed["message"] == "rank 1 exited with code 7", failed
        failure = events.wait(rendezvous.EV_FAILURE)
        assert failure["tail"] == [], failure
        restart = events.wait(rendezvous.EV_RESTART)
        assert restart["tail"] == [] and restart["reason"] == "Error", restart
        # The program printed this on every attempt; with Tail it is the failure's last line.
        assert "exiting with code 7" in gang.workers[1].text
        assert "exiting with code 7" not in _everything(events)
    finally:
        events.close()


def test_with_failure_output_tail_the_last_lines_travel_with_the_failure(spawn):
    gang = Gang(spawn, "hosts=2", ["-m", f"{PROGRAMS}.fail_once", "--rank", "1", "--code", "7", "--always",
                                   "--no-rendezvous"], MONARCH_SPMD_MAX_RESTARTS="0")
    events = gang.observed()
    try:
        assert [w.finish(120) for w in gang.workers.values()] == [7, 7]
        failed = events.wait(rendezvous.EV_FAILED)
        assert any("exiting with code 7" in line for line in failed["tail"]), failed
    finally:
        events.close()


def test_a_hung_rank_is_named_without_its_last_line_and_heartbeats_carry_no_output(spawn):
    gang = Gang(spawn, "hosts=2", ["-m", f"{PROGRAMS}.hang", "--rank", "1", "--seconds", "6"],
                MONARCH_SPMD_MAX_RESTARTS="1", MONARCH_SPMD_PROGRESS_TIMEOUT="2",
                MONARCH_SPMD_FAILURE_OUTPUT="None")
    events = gang.observed()
    try:
        assert [w.finish(120) for w in gang.workers.values()] == [0, 0]
        failure = events.wait(rendezvous.EV_FAILURE)
        assert (failure["rank"], failure["reason"]) == (1, "NoProgress")
        # Judged for the gang: rank 0 writes for 6 s (progress events come every 5 s) and ends.
        assert re.match(r"rank 1 wrote nothing for \d+s \(progress timeout 2s\)", failure["message"]), failure
        assert "last line" not in failure["message"]
        progress = events.of(rendezvous.EV_PROGRESS)
        assert progress and all(p["line"] == "" for p in progress), progress
        assert "about to hang" not in _everything(events) and "working" not in _everything(events)
    finally:
        events.close()


def test_a_bad_value_is_refused_naming_the_variable():
    import pytest

    from monarch_spmd.payload import worker

    env = {"MONARCH_SPMD_MESH": "hosts=2", "MONARCH_SPMD_COORDS": "0", "MONARCH_SPMD_MASTER_ADDR": "x",
           "MONARCH_SPMD_MASTER_PORT": "29500"}
    assert worker.read_inputs(env).failure_output == "Tail"
    assert worker.read_inputs({**env, "MONARCH_SPMD_FAILURE_OUTPUT": "None"}).failure_output == "None"
    with pytest.raises(worker.WorkerInputError, match="MONARCH_SPMD_FAILURE_OUTPUT: 'tail' is not valid; expected one of Tail, None"):
        worker.read_inputs({**env, "MONARCH_SPMD_FAILURE_OUTPUT": "tail"})
