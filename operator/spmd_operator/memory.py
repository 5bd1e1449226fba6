"""Memory: what the operator holds, and when it starts afresh to give a burst's peak back.

Owns handing memory back after jobs went: a little after a job is forgotten (or the last child
of a deleted job is deleted) the :class:`Trimmer` collects what they left and trims the C
library's heap (:func:`trim_memory`, once however many jobs go), then asks
:meth:`RecyclePolicy.verdict` and, when it says so, stops the controller's job loops and calls
:func:`recycle`.

Where it sits: a part of the controller (:mod:`.controller` makes the :class:`Trimmer` and
tells it when jobs go); below it, and imports nothing of the operator's.

Why: a start-up of a thousand jobs takes the operator from about 50 to 150 MiB; once they are
deleted their objects are freed (the caches are pruned, the loops collected), yet the process
keeps about 150 MiB. Each of CPython's 1 MiB arenas, and the C library's heap, still holds a few
objects that outlived the peak, so neither can give its pages back (benchmarks/RESULTS.md, 8k:
every one of 53 arenas held a live object; with the C library's allocator for everything it was
no better). Only a new process starts without that fragmentation.

The policy asks for a new process only when all of these hold:

* resident memory is at least ``factor`` times what it was when the controller was made (before
  any job was listed) and at least ``min_excess`` bytes above it;
* the jobs the controller knows are at most a quarter of the most it knew at once in this
  process, and fewer than that most: the memory was for jobs that went;
* no child of a deleted job is still held that will go (owned, or being deleted): a new process
  would list them again only to drop them, and be left fragmented by them (the 1,000-job
  benchmark's first try started afresh while 4,000 terminating pods were still there, and the
  new process settled at 95 MiB instead of 50).

It does not loop: a new process counts its peak afresh, so it asks again only after it held
jobs and three quarters of them went (a fourfold drop each time), and a small operator (a few
jobs of a few MiB each) never reaches ``min_excess``.

How: ``execve`` of the same command line in the same process (same pid, same pod, no container
restart). Nothing the jobs see changes: the operator is built to be killed at any point (every
pass is repeated from the server's state), and this is gentler than a kill: the job loops are
stopped first, as when the Lease is lost, and the Lease keeps its holder (the pid and the pod
name are unchanged), so the new process leads again at its first try. It costs what a start
costs: one LIST per informer and a GET per remaining job, and a few seconds without passes.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

logger = logging.getLogger(__name__)

#: The environment variable that carries how many times this process started afresh.
RECYCLES_ENV: Final = "SPMD_OPERATOR_RECYCLES"
#: Default of ``--memory-recycle-factor``.
DEFAULT_FACTOR: Final = 1.5
#: Default of ``--memory-recycle-min-mib``.
DEFAULT_MIN_EXCESS_MIB: Final = 32
#: The jobs left, as a share of the most held at once, at or under which a new process may start.
JOBS_SHARE: Final = 0.25
MIB: Final = 1 << 20
#: Seconds after a job was forgotten before the memory freed with it is handed back to the system
#: (once per this many seconds however many jobs go: deleting 1,000 jobs trims a few times).
TRIM_DELAY_SECONDS: Final = 5.0


def resident_bytes() -> int | None:
    """This process's resident memory (``/proc/self/statm``); None where there is no /proc."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def recycles() -> int:
    """How many times this process started afresh (0 for a process started by its parent)."""
    try:
        return max(0, int(os.environ.get(RECYCLES_ENV, "0")))
    except ValueError:
        return 0


@dataclass
class RecyclePolicy:
    """When the operator's process should start afresh (see the module's text).

    Args:
        factor: resident memory at least this many times the start; 0 turns recycling off
            (under 1: the jobs' share alone decides, down to the memory the start had).
        min_excess: and at least this many bytes above the start (0: no least excess).
        start: the resident bytes at the start (None: unknown, never recycle).
    """

    factor: float = DEFAULT_FACTOR
    min_excess: int = DEFAULT_MIN_EXCESS_MIB * MIB
    start: int | None = field(default_factory=resident_bytes)
    peak_jobs: int = 0

    def __post_init__(self) -> None:
        if self.factor < 0 or self.min_excess < 0:
            raise ValueError(f"memory recycling: factor ({self.factor}) and min_excess ({self.min_excess}) "
                             "must be 0 or more")

    def jobs_seen(self, jobs: int) -> None:
        """Records how many jobs the controller knows now (called as jobs are added)."""
        self.peak_jobs = max(self.peak_jobs, jobs)

    def verdict(self, resident: int | None, jobs: int, collecting: bool) -> str | None:
        """Why the process should start afresh now, or None.

        Args:
            resident: the resident bytes now (:func:`resident_bytes`).
            jobs: the jobs the controller knows now.
            collecting: children of deleted jobs are still being deleted (or still held, to be).
        """
        if not self.factor or self.start is None or resident is None or collecting:
            return None
        if not (self.peak_jobs and jobs < self.peak_jobs and jobs <= self.peak_jobs * JOBS_SHARE):
            return None
        if resident < self.start * self.factor or (self.min_excess and resident - self.start < self.min_excess):
            return None
        return (f"resident memory {resident / MIB:.0f} MiB is {resident / self.start:.2f}x the "
                f"{self.start / MIB:.0f} MiB at the start, with {jobs} of the {self.peak_jobs} jobs held at "
                "the peak left")


#: The exit code when starting afresh failed (EX_OSERR).
EXEC_FAILED_EXIT = 71


def recycle() -> None:
    """Replaces this process with a new run of the same command line (never returns).

    Open files and sockets are not inherited (Python opens them close-on-exec), so the health and
    metrics ports are bound again by the new process; the environment is kept, with the count of
    recycles (:data:`RECYCLES_ENV`) one higher.
    """
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[RECYCLES_ENV] = str(recycles() + 1)
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except OSError as e:
        # The loops are stopped already: a leader that went on holding its Lease would run no job.
        # Ending the process gives the Lease up (a standby, or the kubelet's restart, takes over).
        logging.getLogger(__name__).critical("could not start afresh (%s %s): %s; exiting so that another "
                                             "replica or a restart takes over", sys.executable, sys.orig_argv[1:], e)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXEC_FAILED_EXIT)


def trim_memory() -> bool:
    """Frees what the jobs that went left behind, then gives the pages the C library's allocator
    holds free back to the system (glibc's ``malloc_trim``); False where there is no such call.

    First a full collection of reference cycles: a job's cancelled loop is one (its task, the
    CancelledError, its traceback and frames refer to one another), as is much of what kopf
    kept for the object, and only the cycle collector frees them. Left to itself it runs its
    oldest generation only after many new allocations, which an idle operator never makes: the
    loops of 300 deleted jobs stayed alive for good (benchmarks/RESULTS.md, 8k). Python's small-object arenas go back
    when they empty; the decoded API objects and buffers of a busy start-up live in the C
    library's heap, which otherwise keeps its peak after the objects are freed."""
    gc.collect()
    try:
        libc = ctypes.CDLL(None)
        call = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    call.argtypes = [ctypes.c_size_t]
    call(0)
    return True


class Trimmer:
    """Hands freed memory back a little after jobs went, and starts the process afresh when the
    policy says so.

    Args:
        policy: when the process starts afresh (None: never); :attr:`recycle` from then on.
        jobs: how many jobs the controller knows now.
        collecting: whether children of deleted jobs are still being deleted (or held, to be).
        stop_loops: stops the controller's job loops (as when the Lease is lost).

    Attributes:
        start_afresh: replaces the process (:func:`recycle`) once the policy says so.
    """

    def __init__(self, policy: RecyclePolicy | None, *, jobs: Callable[[], int], collecting: Callable[[], bool],
                 stop_loops: Callable[[], Awaitable[None]]) -> None:
        self.recycle = policy
        self.jobs = jobs
        self.collecting = collecting
        self.stop_loops = stop_loops
        self.start_afresh: Callable[[], None] = recycle
        self._task: asyncio.Task[None] | None = None

    def jobs_seen(self, jobs: int) -> None:
        """Records how many jobs the controller knows now (called as jobs are added)."""
        if self.recycle is not None:
            self.recycle.jobs_seen(jobs)

    def soon(self) -> None:
        """Hands freed memory back a little after jobs went (:func:`trim_memory`): what a start-up
        of many jobs took is otherwise kept by the C library's allocator for good."""
        if self._task is not None and not self._task.done():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = running.create_task(self._trim(), name="trim memory")

    def stop(self) -> asyncio.Future[Any]:
        """Cancels a trim waiting to run; what it returns is done once it ended."""
        tasks = [self._task] if self._task is not None else []
        for task in tasks:
            task.cancel()
        return asyncio.gather(*tasks, return_exceptions=True)

    async def _trim(self) -> None:
        await asyncio.sleep(TRIM_DELAY_SECONDS)
        trim_memory()
        if self.recycle is None:
            return
        resident, jobs, collecting = resident_bytes(), self.jobs(), self.collecting()
        why = self.recycle.verdict(resident, jobs, collecting)
        if why is None:
            start = self.recycle.start
            logger.info("memory: trimmed; resident %s MiB (%s MiB at the start), %d of the %d jobs held at the peak "
                        "left%s: not starting afresh",
                        "?" if resident is None else f"{resident / MIB:.0f}", "?" if start is None else f"{start / MIB:.0f}",
                        jobs, self.recycle.peak_jobs, ", children of deleted jobs still held" if collecting else "")
            return
        # What stays is fragmentation, not objects (see the module's text): only a new process is
        # rid of it. The loops stop first, as when the Lease is lost; the Lease keeps its holder.
        logger.warning("memory: %s; the operator starts afresh in this process to give it back "
                       "(running jobs and their pods are not touched)", why)
        await self.stop_loops()
        self.start_afresh()
