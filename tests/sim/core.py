"""The simulation's ground: one virtual clock, processes that stop when their node freezes, and TCP.

Nothing here reads a real clock or touches a socket. Every delay is drawn from the world's own
random generator, seeded by the schedule, so a schedule replays exactly.

* :class:`World`: the clock and the queue of what happens next, in (time, order) order.
* :class:`Node`: a machine. ``frozen`` stops its processes (their callbacks wait for the thaw, as
  SIGSTOP holds a process) and drops its traffic; ``partitioned`` drops its traffic only.
* :class:`Proc`: anything that runs on a node: an agent, a rank, a spare, a stranger.
* :class:`Conn`: one TCP connection: per-direction FIFO delivery with a latency, a close that
  reaches the other side, and the kernel's user timeout (rendezvous.USER_TIMEOUT_MS) that breaks
  a connection whose traffic is dropped.
"""

from __future__ import annotations

import datetime as dt
import heapq
import random
from collections.abc import Callable
from typing import Any

from monarch_spmd.payload import rendezvous

#: Unix time of the simulation's start (the wall clock the events and status times carry).
WALL0 = 1_800_000_000.0
#: Seconds after its traffic stops that a connection is broken by the kernel (both ends).
USER_TIMEOUT = rendezvous.USER_TIMEOUT_MS / 1000.0


class Violation(AssertionError):
    """An invariant broke: the message names it and what the world looked like."""


class World:
    """The clock, the event queue and the log of one simulated run."""

    def __init__(self, seed: int) -> None:
        self.now = 0.0
        self.rng = random.Random(seed)
        self._queue: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.steps = 0
        self.log: list[str] = []
        self.checks: list[Callable[[], None]] = []

    # --- time -----------------------------------------------------------------------------------

    def wall(self) -> float:
        return WALL0 + self.now

    def datetime(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.wall(), dt.timezone.utc)

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (max(t, self.now), self._seq, fn, args))

    def after(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + max(0.0, delay), fn, *args)

    def uniform(self, low: float, high: float) -> float:
        return self.rng.uniform(low, high)

    def run_until(self, t: float, stop: Callable[[], bool] = lambda: False) -> None:
        """Runs every event up to time ``t`` (or until ``stop()``), checking the invariants after each."""
        while self._queue and self._queue[0][0] <= t and not stop():
            when, _, fn, args = heapq.heappop(self._queue)
            self.now = when
            fn(*args)
            self.steps += 1
            for check in self.checks:
                check()
        if not stop():
            self.now = max(self.now, t)

    def say(self, text: str) -> None:
        """A line of the run's log (printed with a violation)."""
        self.log.append(f"{self.now:9.3f} {text}")
        if len(self.log) > 4000:
            del self.log[:1000]


class Node:
    """A machine of the cluster."""

    def __init__(self, world: World, name: str, capacity: int = 1) -> None:
        self.world = world
        self.name = name
        self.capacity = capacity
        self.frozen = False
        self.partitioned = False
        self.frozen_since: float | None = None
        self.back_at: float | None = None  # when its traffic last came back (a thaw, a heal)
        self.cut_since: float | None = None  # since when its traffic is cut
        self.on_back: list[Callable[[], None]] = []
        self.deferred: list[tuple[Proc, Callable[..., Any], tuple[Any, ...]]] = []
        self.conns: list[Conn] = []

    @property
    def cut(self) -> bool:
        """Its traffic is dropped (frozen or partitioned)."""
        return self.frozen or self.partitioned

    def freeze(self) -> None:
        if self.frozen:
            return
        was_cut = self.cut
        self.frozen = True
        self.frozen_since = self.world.now
        if not was_cut:
            self._traffic_stopped()

    def thaw(self) -> None:
        if not self.frozen:
            return
        self.frozen = False
        self.frozen_since = None
        deferred, self.deferred = self.deferred, []
        for proc, fn, args in deferred:
            self.world.after(0.0, proc.run, fn, args)
        if not self.cut:
            self._traffic_back()

    def partition(self) -> None:
        if self.partitioned:
            return
        was_cut = self.cut
        self.partitioned = True
        if not was_cut:
            self._traffic_stopped()

    def heal(self) -> None:
        if not self.partitioned:
            return
        self.partitioned = False
        if not self.cut:
            self._traffic_back()

    def _traffic_stopped(self) -> None:
        self.cut_since = self.world.now
        for conn in list(self.conns):
            conn.traffic_stopped()

    def _traffic_back(self) -> None:
        self.back_at = self.world.now
        self.cut_since = None
        for conn in list(self.conns):
            conn.traffic_back()
        for fn in self.on_back:
            fn()


class Proc:
    """A process on a node: its callbacks run only while it lives and its node is not frozen."""

    def __init__(self, world: World, node: Node, name: str) -> None:
        self.world = world
        self.node = node
        self.name = name
        self.alive = True
        self.conns: list[Conn] = []

    def later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.world.after(delay, self.run, fn, args)

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if not self.alive:
            return
        if self.node.frozen:
            self.node.deferred.append((self, fn, args))
            return
        fn(*args)

    def die(self) -> None:
        """The process is gone: the kernel closes its connections (the peers read the end)."""
        if not self.alive:
            return
        self.alive = False
        for conn in list(self.conns):
            conn.close(self)


class Conn:
    """One TCP connection between ``a`` (the side that connected) and ``b``.

    Each side has handlers ``(on_data(conn, bytes), on_closed(conn))``; they run in its process
    (deferred while its node is frozen). Data sent while the path is cut waits (the kernel
    retransmits) and goes through when the path is back, unless the user timeout broke the
    connection first. A side that closed its end reads nothing more; the other reads the end of
    the stream after what was sent before it.
    """

    def __init__(self, world: World, a: Proc, b: Proc, a_handlers: tuple[Callable[..., Any], Callable[..., Any]],
                 b_handlers: tuple[Callable[..., Any], Callable[..., Any]], latency: float) -> None:
        self.world = world
        self.a, self.b = a, b
        self.handlers = {id(a): a_handlers, id(b): b_handlers}
        self.latency = latency
        self.dead = False
        self.broken = False  # it ended by the kernel's timeout (or a reset), not by a side closing it
        self.closed: set[int] = set()
        self.last: dict[int, float] = {id(a): 0.0, id(b): 0.0}  # the last delivery time towards each side
        self.waiting: list[tuple[Proc, bytes | None]] = []  # what waits for the path (None: the end)
        self.cut_since: float | None = None
        self.loopback = a.node is b.node
        for proc in (a, b):
            proc.conns.append(self)
            if self not in proc.node.conns:
                proc.node.conns.append(self)
        if self.cut:
            self.traffic_stopped()

    @property
    def cut(self) -> bool:
        return not self.loopback and (self.a.node.cut or self.b.node.cut)

    def other(self, proc: Proc) -> Proc:
        return self.b if proc is self.a else self.a

    def is_open(self, side: Proc) -> bool:
        return not self.dead and id(side) not in self.closed

    def send(self, sender: Proc, data: bytes) -> bool:
        """Sends ``data`` from ``sender``; False when its end is closed or broken (an OSError)."""
        if not self.is_open(sender):
            return False
        if id(self.other(sender)) not in self.closed:
            self._push(sender, data)
        return True

    def close(self, closer: Proc) -> None:
        """``closer`` closed its end (or died): the other side reads the end of the stream."""
        if not self.is_open(closer):
            return
        self.closed.add(id(closer))
        if id(self.other(closer)) not in self.closed:
            self._push(closer, None)
        else:
            self._detach()

    def _push(self, sender: Proc, data: bytes | None) -> None:
        if self.cut:
            self.waiting.append((sender, data))
            return
        receiver = self.other(sender)
        when = max(self.world.now + self.latency, self.last[id(receiver)])
        self.last[id(receiver)] = when
        self.world.at(when, self._deliver, receiver, data)

    def _deliver(self, receiver: Proc, data: bytes | None) -> None:
        if self.is_open(receiver):
            receiver.run(self._take, (receiver, data))

    def _take(self, receiver: Proc, data: bytes | None) -> None:
        if not self.is_open(receiver):
            return
        on_data, on_closed = self.handlers[id(receiver)]
        if data is None:
            self.closed.add(id(receiver))
            self._detach()
            on_closed(self)
        else:
            on_data(self, data)

    def traffic_stopped(self) -> None:
        if self.cut_since is not None or self.dead or self.loopback:
            return
        self.cut_since = started = self.world.now
        # Heartbeats go every second each way: a kernel gives up USER_TIMEOUT after its first
        # unacknowledged one; whichever side's comes first breaks the connection for both.
        self.world.after(USER_TIMEOUT + self.world.uniform(0.0, 1.0), self._timed_out, started)

    def traffic_back(self) -> None:
        if self.cut or self.cut_since is None:
            return
        self.cut_since = None
        waiting, self.waiting = self.waiting, []
        for sender, data in waiting:
            self._push(sender, data)

    def _timed_out(self, started: float) -> None:
        if self.cut_since != started or self.dead:
            return
        self.dead = True
        self.broken = True
        self._detach()
        for proc in (self.a, self.b):
            if id(proc) not in self.closed:
                self.closed.add(id(proc))
                proc.run(self.handlers[id(proc)][1], (self,))

    def _detach(self) -> None:
        if len(self.closed) < 2 and not self.dead:
            return
        self.dead = True
        for proc in (self.a, self.b):
            if self in proc.conns:
                proc.conns.remove(self)
            if self in proc.node.conns:
                proc.node.conns.remove(self)
