"""A hung round's stacks, captured before its ranks end: the agent's I/O around :mod:`.stacks`.

Where it sits: in the payload (standard library only, shipped into pods), between :mod:`.procgroup`
(whose :class:`.procgroup.ProcGroup` it extends to keep what ranks write after a point) and :mod:`.agent`, which
starts a :class:`Capture` when a rank hangs (NoProgress, WatchdogTimeout) and reports the rank
:func:`.stacks.blame` names. docs/restart-in-place.md describes it for users.

What a capture does, in order:

1. every running rank of the round is marked stopped (none of their exits is a failure of its
   own while the stacks are taken) and its last lines are put aside (the failure report keeps the
   rank's own last lines, not its dump);
2. freeze (:meth:`Capture.freeze`): a rank the kernel shows stopped (SIGSTOP, a debugger: it
   could not run a handler) and a rank the caller exempts (the watchdog's, killed with its
   timer's signal) show no stack; every other rank gets RLIMIT_CORE 0 (set from outside at this
   moment, so a dying rank writes no core file of its whole memory, and the rank never saw the
   limit while it ran) and SIGSTOP on its process group;
3. abort (:meth:`Capture.abort`), on every member once every member's ranks are frozen (the
   coordinator says when: a rank that saw a peer's connection close would leave its collective
   with an error and show that instead): SIGABRT, then SIGCONT: faulthandler (``-X
   faulthandler``) writes every thread's stack to the rank's stderr, which reaches its log under
   its ``[rank N]`` prefix as any output does, and the rank ends;
4. the agent's loop goes on copying output until every such rank has exited (at most
   CAPTURE_SECONDS, then SIGKILL), then :meth:`Capture.states` parses each rank's dump from what
   it wrote after the abort. Within a gang of agents the states go to the coordinator, which
   applies the rule to every rank of the gang (:meth:`.coordinator.Coordinator.stacks`); an agent
   alone applies it to its own ranks (:meth:`Capture.finish`) and :func:`fail` makes the named
   rank the round's failure.
"""

from __future__ import annotations

import linecache
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from . import procgroup, stacks

#: How long the ranks have to write their stacks and end after SIGABRT before SIGKILL (seconds).
CAPTURE_SECONDS: Final = 10.0


class CapturingGroup(procgroup.ProcGroup):
    """A :class:`.procgroup.ProcGroup` that keeps what chosen processes write to stderr (their dumps)."""

    #: The most bytes of a dumping rank's unfinished stderr line held back (then passed on as is).
    HOLD_BYTES: Final = 64 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.captured: dict[procgroup.Proc, bytearray] = {}
        self.held: dict[procgroup.Proc, bytes] = {}

    def _emit(self, proc: procgroup.Proc, which: int, data: bytes) -> None:
        buffer = self.captured.get(proc)
        if buffer is None or which != 2:
            super()._emit(proc, which, data)
            return
        buffer += data[:max(0, stacks.CAPTURE_BYTES - len(buffer))]
        # faulthandler writes a line in pieces ("Fatal Python error: ", "Aborted"), and every rank
        # dumps at the same moment: whole lines only, so that no piece of one lands between
        # another rank's lines under a prefix of its own.
        held = self.held.pop(proc, b"") + data
        cut = held.rfind(b"\n") + 1 if len(held) <= self.HOLD_BYTES else len(held)
        if held[cut:]:
            self.held[proc] = held[cut:]
        if cut:
            super()._emit(proc, which, held[:cut])

    def release(self, proc: procgroup.Proc) -> None:
        """Stops keeping ``proc``'s stderr; passes on what was held back."""
        self.captured.pop(proc, None)
        held = self.held.pop(proc, b"")
        if held:
            super()._emit(proc, 2, held)

    def _close(self, fileobj: Any, proc: procgroup.Proc, which: int) -> None:
        if which == 2:
            held = self.held.pop(proc, b"")
            if held:
                super()._emit(proc, 2, held)
        super()._close(fileobj, proc, which)


def stopped(pid: int) -> bool:
    """Whether the kernel shows ``pid`` stopped (SIGSTOP) or stopped by a tracer (Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def _no_core(pid: int) -> None:
    try:
        import resource

        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
    except (ImportError, AttributeError, OSError, ValueError):
        pass  # a core file may follow; the stack is still taken


def _source(file: str, line: int) -> str:
    return linecache.getline(file, line)


@dataclass(eq=False)
class Capture:
    """One hang's capture (see the module docstring).

    Attributes:
        reason: NoProgress or WatchdogTimeout.
        fallback: the rank to name when the rule cannot decide.
        fallback_why: what it is, e.g. ``went silent first``.
        describe: the detector's own words about a rank (``rank 1 wrote nothing for 10s ...``).
        procs: every rank of the round that was running.
        aborted: those sent SIGABRT.
        deadline: when those still running get SIGKILL (monotonic).
    """

    reason: str
    fallback: procgroup.Proc
    fallback_why: str
    describe: Callable[[procgroup.Proc], str]
    procs: list[procgroup.Proc]
    aborted: list[procgroup.Proc]
    deadline: float
    saved: dict[procgroup.Proc, tuple[list[str], str, float]] = field(default_factory=dict)
    finished: bool = False
    killed: bool = False

    @classmethod
    def freeze(cls, group: CapturingGroup, fallback: procgroup.Proc, reason: str, fallback_why: str,
               describe: Callable[[procgroup.Proc], str], exempt: procgroup.Proc | None = None) -> Capture:
        """Steps 1 and 2 up to the abort, on the round's running ranks (``exempt`` included, as no
        stack): each rank to dump is stopped (SIGSTOP to its process group), so that none sees a
        peer die before every rank of the gang, on every member, has been stopped too (a rank
        that saw it would leave its collective with an error, and show that instead of where it
        hung). :meth:`abort` takes the stacks."""
        procs = group.running()
        if exempt is not None and exempt not in procs:
            procs.append(exempt)
        if fallback not in procs:
            procs.append(fallback)
        described = {p: describe(p) for p in procs}  # as things stand now, before the dumps
        capture = cls(reason, fallback, fallback_why, lambda p: described.get(p) or describe(p), procs, [],
                      float("inf"))
        for p in procs:
            capture.saved[p] = (list(p.tail), p.last_line, p.last_output)
            p.stopped = True
        for p in procs:
            if p is exempt or p.code is not None:
                continue
            if stopped(p.pid):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                continue
            _no_core(p.pid)
            try:
                os.killpg(p.pid, signal.SIGSTOP)
            except (ProcessLookupError, PermissionError):
                pass
            group.captured[p] = bytearray()
            capture.aborted.append(p)
        return capture

    @classmethod
    def start(cls, group: CapturingGroup, fallback: procgroup.Proc, reason: str, fallback_why: str,
              describe: Callable[[procgroup.Proc], str], exempt: procgroup.Proc | None = None) -> Capture:
        """Steps 1 and 2 at once (:meth:`freeze`, then :meth:`abort`): the ranks of one agent."""
        capture = cls.freeze(group, fallback, reason, fallback_why, describe, exempt)
        capture.abort()
        return capture

    @property
    def frozen(self) -> bool:
        """Whether the ranks are stopped and not yet aborted."""
        return self.deadline == float("inf") and not self.killed

    def abort(self) -> None:
        """SIGABRT to every frozen rank, then SIGCONT to its process group: the signal waits while
        the rank is stopped, and faulthandler's handler runs first thing when it goes on, where
        the rank was. Those still running at CAPTURE_SECONDS get SIGKILL (:meth:`done`)."""
        if not self.frozen:
            return
        for p in self.aborted:
            try:
                os.kill(p.pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        for p in self.aborted:
            try:
                os.killpg(p.pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        self.deadline = time.monotonic() + CAPTURE_SECONDS

    def done(self) -> bool:
        """Whether every rank of the capture has exited (SIGKILL to those left at the deadline)."""
        left = [p for p in self.procs if p.code is None]
        if left and not self.killed and time.monotonic() >= self.deadline:
            self.killed = True
            for p in left:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        return not left

    def states(self, group: CapturingGroup) -> dict[int, stacks.RankState]:
        """Rule 1 on each rank's dump (read from what it wrote after the abort); each rank's own
        last lines are put back (the failure report keeps them, not its dump)."""
        dumps: dict[int, stacks.Stack | None] = {}
        for p in self.procs:
            group._drain(p)
            data = group.captured.get(p)
            group.release(p)
            dumps[p.spec.rank] = stacks.parse(data.decode("utf-8", "replace")) if data else None
            tail, last, _ = self.saved[p]
            p.tail = deque(tail, maxlen=procgroup.TAIL_LINES)
            p.last_line = last
        self.finished = True
        return {rank: stacks.classify(rank, dump, _source) for rank, dump in dumps.items()}

    def order(self) -> list[int]:
        """The ranks, silent longest first."""
        return [p.spec.rank for p in sorted(self.procs, key=lambda p: self.saved[p][2])]

    def silent_for(self, proc: procgroup.Proc, now: float) -> float:
        """Seconds ``proc`` had been silent when the capture began (its last output before)."""
        return max(0.0, now - self.saved[proc][2])

    def finish(self, group: CapturingGroup, detail: bool) -> stacks.Blame:
        """Step 3: reads each rank's dump and applies the rule (``detail``: name call sites)."""
        return stacks.judge(self.states(group), self.order(), self.fallback.spec.rank, self.fallback_why,
                            detail=detail)

    def proc(self, rank: int) -> procgroup.Proc:
        return next(p for p in self.procs if p.spec.rank == rank)

    def message(self, verdict: stacks.Blame, detail: bool) -> str:
        """The failure's message (:func:`.stacks.failure_message`)."""
        return stacks.failure_message(verdict, self.describe(self.proc(verdict.rank)), detail)


def fail(group: CapturingGroup, proc: procgroup.Proc, reason: str, message: str) -> None:
    """Makes ``proc`` the round's failure with ``reason`` (as if it had failed of its own): it is
    reported (``on_failure``) and every rank's process group is killed (what they started)."""
    proc.stopped = False
    proc.reason, proc.message = reason, message
    group.kill_groups()
    if group.first_failure is None:
        group.first_failure = proc
        if group.on_failure is not None:
            group.on_failure(proc)
    if group.stop_on_failure and group.running():
        group.stop()
