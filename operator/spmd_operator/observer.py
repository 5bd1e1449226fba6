"""The operator's observer connection to a gang's restart-in-place coordinator: it listens, never writes.

Where it sits: below the controller's :mod:`.observers`, which starts one per job whose gang
restarts in place (restartPolicy.mode InPlace) once the gang's rank-0 pod runs, stops it when
that pod goes, the gang is recreated, the job ends or is suspended or deleted, or this replica
stops leading, and hands what it heard to the lifecycle as a :class:`.lifecycle.CoordinatorView`.
Above :mod:`monarch_spmd.payload.rendezvous` (the protocol's names and line framing) and
:mod:`.lifecycle.model`; no Kubernetes API here at all.

The protocol is docs/restart-in-place.md's observer protocol, version 1: connect to the rank-0
pod's IP on the agent port (``spmd-agent``), send ``hello`` (role observer), read ``welcome``
(the coordinator's round, phase and the history of its job-level events), then one event per
line. What is heard is kept (restarts, rounds, the barrier closing, the processes all running,
members lost, the final verdict, the latest progress report) and the job's loop is woken: the
pass decides, and writes one status patch and one Event per restart. The connection itself
never touches the API server, so no fence is needed here; after ``hello`` only a heartbeat
goes to the coordinator, every second (it then knows the operator still hears it).

The protocol itself (hello, welcome or refusal, the run id, the history's replay, the sequence
numbers) is :class:`monarch_spmd.payload.follow.Follower`'s, the one observer client the local
runner uses too; this module owns the asyncio connection and what the lifecycle reads.

Failures: a refused or broken connection, a line that is not a message, or a gap in the events'
sequence numbers (lines lost) closes it; it is opened again after a back-off (0.2 s growing to
RECONNECT_MAX_SECONDS), and ``welcome`` brings the history back: the events missed meanwhile are
taken, each event once; a restart already recorded is never counted twice (the lifecycle also
compares rounds with status.restarts). TCP keepalive notices a rank-0 pod whose node is gone in
~8 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from monarch_spmd.payload import follow, rendezvous
from monarch_spmd.payload.link import keepalive

from .lifecycle.model import CoordinatorView

logger = logging.getLogger(__name__)

#: Waits between connection attempts, growing to the last, which repeats.
RECONNECT_SECONDS: Final = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
RECONNECT_MAX_SECONDS: Final = RECONNECT_SECONDS[-1]
#: How long one connection attempt (and the welcome after it) may take.
CONNECT_TIMEOUT: Final = 5.0

Target = tuple[str, str, str, int]  # (pod name, pod uid, address, port)
#: The events kept (per kind) of those the lifecycle reads; the newest are enough for it.
EVENTS_KEPT: Final = 64
_KEPT: Final = frozenset({rendezvous.EV_ROUND, rendezvous.EV_STARTED, rendezvous.EV_ALL_RUNNING,
                          rendezvous.EV_RESTART, rendezvous.EV_LOST, rendezvous.EV_TAKEOVER})


class Observer:
    """One job's observer connection to its gang's coordinator.

    Args:
        pod: the gang's rank-0 pod (name, uid), whose agent runs the coordinator.
        address: the pod's IP.
        port: the agent port (the pod's ``spmd-agent`` container port).
        wake: called (on the event loop) after each batch of messages: the job's loop runs a pass.
        token: the attempt's agent token (the pod's MONARCH_SPMD_AGENT_TOKEN), sent in hello.
        run_id: the job's uid: a welcome naming another run (a reused pod IP, another job's
            coordinator) is refused and the connection closed.
        job: ``namespace/name``, for the log.
        clock: Unix time now (the stamps of what is heard; a simulation passes its own).

    Memory is bounded however long the gang runs: the events kept per kind are the newest
    EVENTS_KEPT (the lifecycle reads the newest rounds).
    """

    def __init__(self, pod: tuple[str, str], address: str, port: int, wake: Callable[[], None], *,
                 token: str = "", run_id: str | None = None, job: str = "",
                 clock: Callable[[], float] = time.time) -> None:
        self.pod_name, self.pod_uid = pod
        self.clock = clock
        self.address = address
        self.port = port
        self.wake = wake
        self.follower = follow.Follower(token, run_id)
        self.job = job or self.pod_name
        self.warned: str | None = None  # the trouble last logged at WARNING (each kind once per outage)
        self.task: asyncio.Task[None] | None = None
        self.connected = False
        self.error: str | None = None
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.final: dict[str, Any] | None = None
        self.progress: dict[str, Any] | None = None
        self.spares_ready: int | None = None
        self.progress_at: float | None = None  # monotonic time the latest progress event came
        self.since = clock()
        #: Since when (Unix time) there has been no open connection: the start, then each drop.
        self.dark_since: float | None = self.since
        self._view: CoordinatorView | None = None

    @property
    def target(self) -> Target:
        return (self.pod_name, self.pod_uid, self.address, self.port)

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name=f"observer {self.pod_name}")

    def stop(self) -> None:
        """Closes the connection (what was heard is kept: :meth:`view` still says it)."""
        if self.task is not None:
            self.task.cancel()
            self.task = None
        if self.connected:
            self.connected = False
            self.dark_since = self.clock()
            self._view = None

    @property
    def round(self) -> int | None:
        return self.follower.round

    @property
    def phase(self) -> str | None:
        return self.follower.phase

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    # --- what was heard ------------------------------------------------------------------------

    def view(self) -> CoordinatorView:
        """What was heard, as the lifecycle reads it (an immutable snapshot)."""
        if self._view is None:
            kinds = self.events
            self._view = CoordinatorView(
                pod=self.pod_name, connected=self.connected, error=self.error, since=self.since,
                dark_since=None if self.connected else self.dark_since, round=self.round,
                phase=self.phase,
                restarts=tuple(kinds.get(rendezvous.EV_RESTART, ())), rounds=tuple(kinds.get(rendezvous.EV_ROUND, ())),
                started=tuple(kinds.get(rendezvous.EV_STARTED, ())),
                all_running=tuple(kinds.get(rendezvous.EV_ALL_RUNNING, ())),
                lost=tuple(kinds.get(rendezvous.EV_LOST, ())), final=self.final, progress=self.progress,
                takeovers=tuple(kinds.get(rendezvous.EV_TAKEOVER, ())), spares_ready=self.spares_ready)
        return self._view

    def seconds_since_progress(self) -> float | None:
        """The stalest rank's seconds without output now, while the gang runs, else None."""
        event = self.progress
        if not self.connected or self.phase != rendezvous.RUNNING_PHASE or event is None or self.progress_at is None:
            return None
        if event.get("round") != self.round:
            return None
        idle = event.get("seconds_since_progress")
        if not isinstance(idle, (int, float)) or isinstance(idle, bool):
            return None
        return float(idle) + max(0.0, time.monotonic() - self.progress_at)

    def _apply(self, event: Mapping[str, Any], received: float) -> None:
        kind = event.get("type")
        item = {**event, "received": received}
        if kind in _KEPT:
            events = self.events.setdefault(str(kind), [])
            events.append(item)
            if len(events) > EVENTS_KEPT:
                del events[:len(events) - EVENTS_KEPT]
        if kind == rendezvous.EV_PROGRESS:
            self.progress, self.progress_at = item, time.monotonic()
        elif kind in (rendezvous.EV_SPARE, rendezvous.EV_TAKEOVER):
            ready = event.get("ready")
            if isinstance(ready, int) and not isinstance(ready, bool) and ready >= 0:
                self.spares_ready = ready
        elif kind in (rendezvous.EV_SUCCEEDED, rendezvous.EV_FAILED):
            self.final = item
        self._view = None

    def _take(self, message: Mapping[str, Any]) -> None:
        """A message read: the events in it not taken before (the follower decides) are kept."""
        restarted = self.follower.restarted
        events = self.follower.take(message)
        if self.follower.restarted != restarted:  # a new coordinator process: its account, not ours
            self.events, self.final, self.progress, self.spares_ready = {}, None, None, None
        now = self.clock()
        for event in events:
            self._apply(event, now)
        self._view = None

    def _welcome(self, message: Mapping[str, Any]) -> None:
        """Takes up the coordinator's own account again: its state now and what its history
        holds that was missed."""
        self._take(message)
        ready = message.get("spares")
        if isinstance(ready, int) and not isinstance(ready, bool) and ready >= 0:
            self.spares_ready = ready  # spares that said hello before this connection
            self._view = None
        self.connected, self.error = True, None
        self.dark_since = None
        if self.warned is not None:
            logger.warning("SPMDJob %s: the observer reaches the coordinator at %s:%s (%s) again", self.job,
                           self.address, self.port, self.pod_name)
            self.warned = None

    # --- the connection --------------------------------------------------------------------------

    async def _run(self) -> None:
        tries = 0
        while True:
            try:
                await self._session()
                tries = 0  # it had connected: start the back-off over
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.TimeoutError, rendezvous.ProtocolError, ConnectionError, ValueError) as e:
                error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                if error != self.error:  # the same failure again changes nothing the job's pass reads
                    self.error = error
                    self._view = None
                    self.wake()
            finally:
                if self.connected:
                    self.connected = False
                    self.dark_since = self.clock()
                    self._view = None
                    self.wake()
            wait = RECONNECT_SECONDS[min(tries, len(RECONNECT_SECONDS) - 1)]
            tries += 1
            if self.final is not None:
                return  # the verdict is in: the agents are ending, nothing more will come
            kind = (self.error or "").split(":", 1)[0]
            if kind != self.warned and tries >= 2:  # the first try of a starting pod often finds no one yet
                self.warned = kind
                logger.warning("SPMDJob %s: the observer cannot reach the coordinator at %s:%s (%s): %s; "
                               "trying again every %ss at most", self.job, self.address, self.port,
                               self.pod_name, self.error, RECONNECT_MAX_SECONDS)
            else:
                logger.debug("observer %s:%s (%s): %s; again in %ss", self.address, self.port, self.pod_name,
                             self.error, wait)
            await asyncio.sleep(wait)

    async def _session(self) -> None:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.address, self.port, limit=rendezvous.MAX_LINE + 1024), CONNECT_TIMEOUT)
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                _keepalive(sock)
            writer.write(rendezvous.encode(self.follower.hello()))
            await writer.drain()
            first = await asyncio.wait_for(reader.readline(), CONNECT_TIMEOUT)
            self._welcome(_decode(first))
            self.wake()
            beats = asyncio.create_task(self._beat(writer))
            try:
                while True:
                    line = await reader.readline()
                    if not line:
                        self.error = "the coordinator closed the connection"
                        return
                    self._take(_decode(line))
                    self.wake()
            finally:
                beats.cancel()
        finally:
            self.follower.disconnected()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


    @staticmethod
    async def _beat(writer: asyncio.StreamWriter) -> None:
        """A heartbeat every HEARTBEAT_INTERVAL: the coordinator knows the operator still hears
        it (one that loses a member by silence and hears no beat since holds its next round:
        it may be the one cut off)."""
        beat = rendezvous.encode({"type": rendezvous.HEARTBEAT})
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                await asyncio.sleep(rendezvous.HEARTBEAT_INTERVAL)
                writer.write(beat)
                await writer.drain()


def _decode(line: bytes) -> dict[str, Any]:
    if not line:
        raise ConnectionError("the coordinator closed the connection")
    messages = rendezvous.LineBuffer().feed(line if line.endswith(b"\n") else line + b"\n")
    if len(messages) != 1:
        raise rendezvous.ProtocolError(f"expected one message on a line, got {len(messages)}")
    return messages[0]


def _keepalive(sock: Any) -> None:
    """TCP keepalive and the user timeout as the agents use them (rendezvous.TCP_OPTIONS): a lost
    node is noticed in ~8 s."""
    with contextlib.suppress(OSError, AttributeError):
        keepalive(sock)
