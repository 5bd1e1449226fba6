"""A hung round's stacks, captured before its ranks end: the agent's I/O around :mod:`.stacks`.

Where it sits: in the payload (standard library only, shipped into pods), between :mod:`.gang`
(whose :class:`Gang` it extends to keep what ranks write after a point) and :mod:`.agent`, which
starts a :class:`Capture` when a rank hangs (NoProgress, WatchdogTimeout) and reports the rank
:func:`.stacks.blame` names. docs/restart-in-place.md describes it for users.

What a capture does, in order:

1. every running rank of the round is marked stopped (none of their exits is a failure of its
   own while the stacks are taken) and its last lines are put aside (the failure report keeps the
   rank's own last lines, not its dump);
2. a rank the kernel shows stopped (SIGSTOP, a debugger: it could not run a handler) and a rank
   the caller exempts (the watchdog's, killed with its timer's signal) show no stack; every other
   rank gets RLIMIT_CORE 0 (set from outside at this moment, so a dying rank writes no core file
   of its whole memory, and the rank never saw the limit while it ran) and then SIGABRT, all at
   once: faulthandler (``-X faulthandler``) writes every thread's stack to the rank's stderr,
   which reaches its log under its ``[rank N]`` prefix as any output does, and the rank ends;
3. the agent's loop goes on copying output until every such rank has exited (at most
   CAPTURE_SECONDS, then SIGKILL), then :meth:`Capture.finish` parses each rank's dump from what it
   wrote after the abort and applies the rule; :func:`fail` makes the named rank the round's
   failure.
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

from . import gang, stacks

#: How long the ranks have to write their stacks and end after SIGABRT before SIGKILL (seconds).
CAPTURE_SECONDS: Final = 10.0


class Gang(gang.Gang):
    """A :class:`.gang.Gang` that keeps what chosen members write to stderr (their dumps)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.captured: dict[gang.Proc, bytearray] = {}

    def _emit(self, proc: gang.Proc, which: int, data: bytes) -> None:
        super()._emit(proc, which, data)
        buffer = self.captured.get(proc)
        if buffer is not None and which == 2:
            buffer += data[:max(0, stacks.CAPTURE_BYTES - len(buffer))]


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
    fallback: gang.Proc
    fallback_why: str
    describe: Callable[[gang.Proc], str]
    procs: list[gang.Proc]
    aborted: list[gang.Proc]
    deadline: float
    saved: dict[gang.Proc, tuple[list[str], str, float]] = field(default_factory=dict)

    @classmethod
    def start(cls, group: Gang, fallback: gang.Proc, reason: str, fallback_why: str,
              describe: Callable[[gang.Proc], str], exempt: gang.Proc | None = None) -> Capture:
        """Steps 1 and 2 on the round's running ranks (``exempt`` included, as no stack)."""
        procs = group.running()
        if exempt is not None and exempt not in procs:
            procs.append(exempt)
        if fallback not in procs:
            procs.append(fallback)
        described = {p: describe(p) for p in procs}  # as things stand now, before the dumps
        capture = cls(reason, fallback, fallback_why, lambda p: described.get(p) or describe(p), procs, [],
                      time.monotonic() + CAPTURE_SECONDS)
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
            group.captured[p] = bytearray()
            capture.aborted.append(p)
        for p in capture.aborted:
            try:
                os.kill(p.pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        return capture

    def done(self) -> bool:
        """Whether every rank of the capture has exited (SIGKILL to those left at the deadline)."""
        left = [p for p in self.procs if p.code is None]
        if left and time.monotonic() >= self.deadline:
            for p in left:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self.deadline = float("inf")
        return not left

    def finish(self, group: Gang, detail: bool) -> stacks.Blame:
        """Step 3: reads each rank's dump and applies the rule (``detail``: name call sites)."""
        dumps: dict[int, stacks.Stack | None] = {}
        for p in self.procs:
            group._drain(p)
            data = group.captured.pop(p, None)
            dumps[p.member.rank] = stacks.parse(data.decode("utf-8", "replace")) if data else None
            tail, last, _ = self.saved[p]
            p.tail = deque(tail, maxlen=gang.TAIL_LINES)
            p.last_line = last
        order = [p.member.rank for p in sorted(self.procs, key=lambda p: self.saved[p][2])]  # silent longest first
        return stacks.blame(dumps, order, self.fallback.member.rank, self.fallback_why, source=_source,
                            detail=detail)

    def proc(self, rank: int) -> gang.Proc:
        return next(p for p in self.procs if p.member.rank == rank)

    def message(self, verdict: stacks.Blame, detail: bool) -> str:
        """The failure's message: the verdict and the named rank's innermost frames when a rule
        decided; the detector's own words first otherwise (with the rule's words and frames when
        the rank showed a stack)."""
        named = self.proc(verdict.rank)
        own = self.describe(named)
        excerpt = verdict.excerpt() if detail else ""
        frames = f"; innermost frames of rank {verdict.rank}: {excerpt}" if excerpt else ""
        if verdict.decided:
            return f"{verdict.sentence}; {own}{frames}"
        if verdict.states.get(verdict.rank) is None or verdict.states[verdict.rank].state == stacks.NO_STACK:
            return own
        return f"{own}; {verdict.sentence}{frames}"


def fail(group: Gang, proc: gang.Proc, reason: str, message: str) -> None:
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
