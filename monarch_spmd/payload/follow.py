"""The observer's side of the restart-in-place protocol, without I/O: one client for every reader
of a coordinator's event stream.

Where it sits: in the payload (standard library only), beside :mod:`.rendezvous` (the protocol's
names and the coordinator's state machine) and below everything that listens to a coordinator:
the local runner's observer thread (:class:`.agent.Observer`) and the operator's asyncio
observer (``spmd_operator.observer``). They own their sockets and what they make of the events;
this owns the protocol: the ``hello`` an observer sends, the ``welcome`` or ``refused`` it must
get first, whose run it is, the history a welcome replays, and the sequence numbers that make
every event taken exactly once across reconnections (docs/restart-in-place.md, "The observer
protocol").

Its memory is one sequence number and a few fields, however long the gang runs: what a reader
keeps of the events is the reader's to bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import rendezvous


class Refused(ConnectionError):
    """The coordinator answered ``refused`` (a wrong token, too many observers, ...)."""


class ForeignRun(ConnectionError):
    """The coordinator belongs to another run (a reused pod IP, another job's gang)."""


class Follower:
    """One observer's account of a coordinator's stream, across its connections.

    Use: :meth:`hello` is the first line of each connection; every message read then goes to
    :meth:`take`, which returns the events not taken before, in order (a reconnection's
    ``welcome`` replays the history: only what was missed comes out of it). :meth:`disconnected`
    when a connection ends.

    Args:
        token: the attempt's agent token, sent in ``hello``.
        run_id: the run this observer follows: a welcome naming another is refused
            (:class:`ForeignRun`); None accepts any.

    Attributes:
        seq: the sequence number of the last event taken (0: none yet).
        round, phase: the coordinator's state as of the last welcome and the events since.
        welcomed: the current connection got its welcome.
        restarted: how many welcomes came from a coordinator that had started over (its sequence
            numbers behind ours: a new agent process); the events taken before are not repeated
            by it, so the reader's account starts over with its history.
        dropped: events the coordinator's history no longer had when a welcome came (its
            ``history_dropped``): a reader that was away that long may have missed them.
    """

    def __init__(self, token: str = "", run_id: str | None = None) -> None:
        self.token = token
        self.run_id = run_id
        self.seq = 0
        self.round: int | None = None
        self.phase: str | None = None
        self.welcomed = False
        self.restarted = 0
        self.dropped = 0

    def hello(self) -> dict[str, Any]:
        """The first message of a connection (its first line: :func:`rendezvous.encode`)."""
        self.welcomed = False
        return {"type": rendezvous.HELLO, "role": rendezvous.ROLE_OBSERVER,
                "versions": list(rendezvous.VERSIONS), "token": self.token}

    def disconnected(self) -> None:
        """The connection ended: the next one starts with :meth:`hello` and must be welcomed."""
        self.welcomed = False

    def take(self, message: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The events in ``message`` not taken before, in order.

        Raises:
            Refused: the coordinator refused this observer.
            ForeignRun: the welcome names another run.
            rendezvous.ProtocolError: a first message that is not a welcome, or an event whose
                sequence number is not the next one (lines were lost: reconnect).
        """
        if not self.welcomed:
            return self._welcome(message)
        seq = message.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            if seq != self.seq + 1:
                raise rendezvous.ProtocolError(f"event {seq} after {self.seq}: lines were lost")
            self.seq = seq
        event = dict(message)
        self._track(event)
        return [event]

    def _welcome(self, message: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = message.get("type")
        if kind == rendezvous.REFUSED:
            raise Refused(f"refused by the coordinator: {str(message.get('reason'))[:rendezvous.MAX_TEXT]}")
        if kind != rendezvous.WELCOME:
            raise rendezvous.ProtocolError(f"expected welcome, got {str(kind)[:64]!r}")
        run_id = message.get("run_id")
        if self.run_id is not None and run_id != self.run_id:
            raise ForeignRun(f"the coordinator is another run's ({str(run_id)[:64]!r}, not {self.run_id!r}); "
                             "not listened to")
        seq = message.get("seq")
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 else 0
        if seq < self.seq:
            self.restarted += 1
            self.seq = 0
        dropped = message.get("history_dropped")
        self.dropped = dropped if isinstance(dropped, int) and not isinstance(dropped, bool) else 0
        events = []
        for past in message.get("history") or []:
            if not isinstance(past, Mapping):
                continue
            n = past.get("seq")
            if isinstance(n, int) and not isinstance(n, bool) and n <= self.seq:
                continue  # taken on an earlier connection
            event = dict(past)
            self._track(event)
            events.append(event)
        self.seq = max(self.seq, seq)
        r, phase = message.get("round"), message.get("phase")
        if isinstance(r, int) and not isinstance(r, bool):
            self.round = r
        if isinstance(phase, str):
            self.phase = phase
        self.welcomed = True
        return events

    def _track(self, event: Mapping[str, Any]) -> None:
        """The coordinator's round and phase as its events move them."""
        kind, r = event.get("type"), event.get("round")
        if kind == rendezvous.EV_ROUND and isinstance(r, int) and not isinstance(r, bool):
            self.round, self.phase = r, rendezvous.JOINING
        elif kind == rendezvous.EV_STARTED:
            self.phase = rendezvous.RUNNING_PHASE
        elif kind == rendezvous.EV_FAILURE and self.phase == rendezvous.RUNNING_PHASE:
            self.phase = rendezvous.STOPPING
        elif kind == rendezvous.EV_RESIZE and "next_size" in event and self.phase == rendezvous.RUNNING_PHASE:
            self.phase = rendezvous.STOPPING  # an elastic gang grows: its round stops
        elif kind == rendezvous.EV_SUCCEEDED:
            self.phase = rendezvous.FINISHED
        elif kind == rendezvous.EV_FAILED:
            self.phase = rendezvous.FAILED
