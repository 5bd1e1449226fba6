"""The agent's member side of the restart-in-place protocol, as a state machine without I/O.

Where it sits: in the payload (standard library only), beside :mod:`.rendezvous` (whose
:class:`.coordinator.Coordinator` is the other side) and below :mod:`.agent`, which owns the
connection, the processes and the signals, feeds this what happens, and carries out what it
returns. Nothing here reads a clock or touches a socket, so every phase and every message is
tested from tables (tests/unit/test_member.py), as the coordinator is.

The phases of one member (one agent, one pod), docs/restart-in-place.md's "Rounds":

    hello     connected, ``hello`` sent; ``welcome`` says the round to join
    joining   ``join`` r sent; waits for ``go`` r
    running   round r's processes run; a ``stop`` r stops them; ``freeze`` r and ``dump`` r take
              their stacks when a rank of the gang hangs (the agent sends ``frozen``, ``stacks``)
    stopping  stopping them; when they are gone, ``exited`` r, then ``join`` r+1
    waiting   every process exited on its own (``exited`` sent); waits for ``finish``, or for
              ``stop`` r when another member failed (then ``join`` r+1)

``finish`` ends the member with 0, ``fail`` with the coordinator's verdict, ``refused`` with a
give-up (CoordinatorLost); a lost coordinator is decided by :meth:`Member.on_link_lost`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from . import rendezvous

HELLO: Final = "hello"
JOINING: Final = "joining"
RUNNING: Final = "running"
STOPPING: Final = "stopping"
WAITING: Final = "waiting"
PHASES: Final = (HELLO, JOINING, RUNNING, STOPPING, WAITING)

# --- what the agent is told to do -----------------------------------------------------------------
SEND: Final = "send"          # send ``message`` to the coordinator
SAY: Final = "say"            # a line of the agent's own in the pod's log (``text``)
START: Final = "start"        # start round ``round``'s processes
STOP: Final = "stop"          # stop the running processes (not again if a signal already did)
FINISH: Final = "finish"      # stop and wait for any process, then exit 0
FAIL: Final = "fail"          # stop and wait, then exit with the verdict in ``message``
GIVE_UP: Final = "give_up"    # stop and wait, then give up: ``text``, ``reason``
SIGNAL_EXIT: Final = "signal_exit"  # wait for the signalled processes, then exit as they did
EXIT: Final = "exit"          # exit with ``code`` now (nothing runs)
FREEZE: Final = "freeze"      # stop every running process for its stack, then send ``frozen``
DUMP: Final = "dump"          # take the frozen processes' stacks, then send ``stacks``


@dataclass(frozen=True)
class Do:
    """One thing for the agent to do (``what`` is one of the names above)."""

    what: str
    message: Mapping[str, Any] = field(default_factory=dict)
    text: str = ""
    reason: str = ""
    round: int = 0
    code: int = 0


@dataclass
class Member:
    """One member's side of the gang's rounds.

    Args:
        first_round: the round this agent's pod was created for (TORCHELASTIC_RESTART_COUNT of
            its first processes; a replacement pod's is its attempt's).
        member: this agent's member id: an elastic gang's ``go`` lists the members of its round,
            and one not listed waits for the next round instead of starting (-1: always listed).

    Attributes:
        phase: one of PHASES.
        round: the round this member is in (or joins).
        left: a ``leave`` was sent (a signal asked the agent to stop).
    """

    first_round: int = 0
    member: int = -1
    phase: str = HELLO
    round: int = -1
    left: bool = False

    def __post_init__(self) -> None:
        if self.round < 0:
            self.round = self.first_round

    # --- inputs --------------------------------------------------------------------------------

    def on_signal(self, signum: int, at: float | None = None) -> list[Do]:
        """The agent got a stop signal (at ``at``, Unix time): the coordinator hears ``leave``
        once (the processes get the signal from the agent itself)."""
        if self.left:
            return []
        self.left = True
        leave = {"type": rendezvous.LEAVE, "round": self.round, "signal": signum}
        if at is not None:
            leave["at"] = at
        return [Do(SEND, leave)]

    def on_round_ended(self, rows: Sequence[Mapping[str, Any]]) -> list[Do]:
        """Every process of the round is gone (``rows``: one per process, as ``exited`` carries)."""
        out = [Do(SEND, {"type": rendezvous.EXITED, "round": self.round, "procs": [dict(r) for r in rows]})]
        if self.phase == STOPPING:
            return out + self._join_next()
        self.phase = WAITING
        return out

    def on_message(self, message: Mapping[str, Any], *, procs_running: bool) -> list[Do]:
        """A message from the coordinator; ``procs_running``: this round's processes still run."""
        kind, r = message.get("type"), message.get("round")
        if kind == rendezvous.WELCOME and self.phase == HELLO:
            self.round = int(r) if isinstance(r, int) and not isinstance(r, bool) else self.round
            out = []
            if self.round != self.first_round:
                out.append(Do(SAY, text=f"joining the gang at restart {self.round}"))
            self.phase = JOINING
            return out + [Do(SEND, {"type": rendezvous.JOIN, "round": self.round})]
        if kind == rendezvous.REFUSED:
            return [Do(GIVE_UP, text=f"the coordinator refused this agent: {message.get('reason')}",
                       reason=rendezvous.REASON_COORDINATOR_LOST)]
        if kind == rendezvous.GO and self.phase == JOINING and r == self.round:
            listed = message.get("members")
            if isinstance(listed, list) and self.member >= 0 and self.member not in listed:
                # An elastic round that closed without this member: it waits for the next one,
                # which its join makes the coordinator start (the gang grows).
                return [Do(SAY, text=f"round {self.round} started with {len(listed)} members without this one; "
                                     f"joining round {self.round + 1}")] + self._join_next()
            self.phase = RUNNING
            return [Do(START, round=self.round, message=dict(message))]
        if kind == rendezvous.STOP and r == self.round:
            if self.phase == RUNNING and procs_running:
                self.phase = STOPPING
                return [Do(STOP, dict(message))]
            if self.phase in (RUNNING, WAITING):
                return self._join_next()
            if self.phase == STOPPING and message.get("fence"):
                return [Do(STOP, dict(message))]  # stopping already: within the fence now
            return []
        if kind in (rendezvous.FREEZE, rendezvous.DUMP) and r == self.round and self.phase in (RUNNING, WAITING):
            # A hang in the gang: every rank's stack is taken (a member whose processes all ended
            # already freezes nothing and reports no rank).
            what = FREEZE if kind == rendezvous.FREEZE else DUMP
            return [Do(what, round=self.round, reason=str(message.get("reason") or ""))]
        if kind == rendezvous.FINISH:
            return [Do(FINISH, dict(message))]
        if kind == rendezvous.FAIL:
            return [Do(FAIL, message)]
        return []

    def on_link_lost(self, where: str, *, signalled: int | None, procs_running: bool,
                     all_succeeded: bool) -> Do:
        """The coordinator's connection closed, or went quiet past the heartbeat timeout.

        Args:
            where: the coordinator's address, for the give-up line.
            signalled: the stop signal the agent got, if any.
            procs_running: this round's processes still run.
            all_succeeded: this member's processes of the round all exited 0.
        """
        if signalled is not None:
            return Do(SIGNAL_EXIT) if procs_running else Do(EXIT, code=128 + signalled)
        if self.phase == WAITING and all_succeeded:
            return Do(EXIT, code=0)  # its part is done; the coordinator's verdict is not needed
        return Do(GIVE_UP, text=f"lost the coordinator at {where} (the rank-0 pod's agent)",
                  reason=rendezvous.REASON_COORDINATOR_LOST)

    def _join_next(self) -> list[Do]:
        self.phase = JOINING
        self.round += 1
        return [Do(SEND, {"type": rendezvous.JOIN, "round": self.round})]
