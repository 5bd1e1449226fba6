"""Hot spares with real workers, as pods run them: three members and one spare worker started by
hand with the inputs the operator gives pods, real sockets to the coordinator in rank 0's worker,
real gloo training that checkpoints. A member's pod is lost (its worker's process group killed
with SIGKILL); the spare takes its place at once and the gang trains on from its checkpoint, with
maxRestarts 0: the loss is not a restart of the program's."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path

from monarch_spmd.payload import rendezvous

from .test_agent import PROGRAMS, Gang

SPARE = {"MONARCH_SPMD_SPARE": "0", "MONARCH_SPMD_COORDS": ""}


def test_a_lost_member_is_taken_over_by_the_spare_and_the_gang_trains_on_uncounted(spawn, tmp_path):
    gang = Gang(spawn, "hosts=3", ["-m", f"{PROGRAMS}.resume_training", "--checkpoint-dir", str(tmp_path),
                                   "--steps", "60", "--step-seconds", "0.1"], MONARCH_SPMD_MAX_RESTARTS="0")
    events = gang.observed()
    try:
        spare = spawn(gang_cmd(gang), env=gang_env(gang, **SPARE))
        events.wait(rendezvous.EV_SPARE, state="ready")
        events.wait(rendezvous.EV_ALL_RUNNING)
        _trained(tmp_path / "rank2.json", 3)
        os.killpg(gang.workers[2].proc.pid, signal.SIGKILL)  # the pod of member 2 is lost
        takeover = events.wait(rendezvous.EV_TAKEOVER)
        assert (takeover["member"], takeover["spare"]) == (2, 0)
        restart = events.wait(rendezvous.EV_RESTART)
        assert (restart["reason"], restart["counted"], restart["max_restarts"]) == ("MemberLost", 0, 0)
        back = events.wait(rendezvous.EV_ALL_RUNNING, count=2)
        assert back["round"] == 1 and back["seconds_since_failure"] < 30, back
        joined = events.wait(rendezvous.EV_JOINED, member=2, round=1)
        assert joined["replacement"] is True
        assert events.wait(rendezvous.EV_SUCCEEDED, timeout=180)
        assert [gang.workers[i].finish(60) for i in (0, 1)] == [0, 0]
        assert spare.finish(60) == 0
        text = spare.text
        assert "hot spare 0 takes the place of member 2" in text, text[-2000:]
        resumed = re.search(r"resume_training rank 2 pid \d+ restart 1 from step (\d+)", text)
        assert resumed and int(resumed.group(1)) > 0, "the spare's rank 2 resumed from member 2's checkpoint"
        assert "resume_training rank 2 done" in text
        print(f"from the loss to every rank running again: {back['seconds_since_failure']:.2f}s")
    finally:
        events.close()


def test_a_stranger_without_the_token_is_no_spare_and_takes_no_place(spawn, tmp_path):
    """A pod of another namespace says hello as a spare without the attempt's token: refused; the
    loss of a member then finds no spare, and the round waits for the member's own replacement."""
    gang = Gang(spawn, "hosts=2", ["-m", f"{PROGRAMS}.resume_training", "--checkpoint-dir", str(tmp_path),
                                   "--steps", "400", "--step-seconds", "0.1"], MONARCH_SPMD_MAX_RESTARTS="3")
    events = gang.observed()
    try:
        with socket.create_connection(("127.0.0.1", gang.agent_port), timeout=10) as sock:
            sock.sendall(rendezvous.encode({"type": rendezvous.HELLO, "role": rendezvous.ROLE_SPARE, "versions": [1],
                                            "spare": 0, "token": "not-the-token", "incarnation": "x"}))
            answer = sock.makefile().readline()
        assert '"refused"' in answer and "wrong token" in answer
        events.wait(rendezvous.EV_ALL_RUNNING)
        os.killpg(gang.workers[1].proc.pid, signal.SIGKILL)
        events.wait(rendezvous.EV_RESTART)
        assert not events.of(rendezvous.EV_TAKEOVER) and not events.of(rendezvous.EV_SPARE)
        gang.start(1, MONARCH_SPMD_RESTART_COUNT="1")  # what the operator does without a spare
        events.wait(rendezvous.EV_ALL_RUNNING, count=2)
    finally:
        gang.stop_all()
        events.close()


def _trained(checkpoint: Path, steps: int, timeout: float = 120.0) -> None:
    """Waits until a rank's checkpoint says it trained ``steps`` steps (gloo all_reduces)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(checkpoint.read_text())["step"] >= steps:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{checkpoint} did not reach step {steps} in {timeout:g}s")


def gang_cmd(gang: Gang) -> list[str]:
    from .conftest import worker_cmd

    return worker_cmd(*gang.argv)


def gang_env(gang: Gang, **extra: str) -> dict[str, str]:
    from .conftest import worker_inputs

    return worker_inputs(gang.mesh, "", gang.master_port, MONARCH_SPMD_AGENT_PORT=str(gang.agent_port),
                         MONARCH_SPMD_POD_LAYOUT=gang.layout, **{**gang.extra, **extra})
