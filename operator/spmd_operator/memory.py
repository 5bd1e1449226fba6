"""Memory: what the operator holds, and when it starts afresh to give a burst's peak back.

Where it sits: beside the controller, which asks :meth:`RecyclePolicy.verdict` after each trim
that follows deleted jobs (:func:`.controller.trim_memory`) and, when it says so, stops its job
loops and calls :func:`recycle`.

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

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Final

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
        factor: resident memory at least this many times the start; 0 turns recycling off.
        min_excess: and at least this many bytes above the start.
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
        if resident < self.start * self.factor or resident - self.start < self.min_excess:
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
