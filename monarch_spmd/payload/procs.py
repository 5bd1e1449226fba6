"""The agent's duties towards processes besides running them: orphans reaped, a parent's death passed on, OOM kills counted.

Where it sits: in the payload (standard library only), below :mod:`.agent` (and the local runner,
which gives its workers the same parent-death hook). Linux's /proc and prctl; elsewhere each
function does nothing and says so in its result.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Collection
from typing import Final


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer ended in this cgroup (v2 ``memory.events``, v1
    ``memory.oom_control``), or None where it cannot be read."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path, encoding="ascii") as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def error_file_message(path: str | None) -> str | None:
    """The message torch's ``@record`` wrote to TORCHELASTIC_ERROR_FILE, if any."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    return str(message).strip() or None if message else None


def _parent_death_hook(signum: int) -> Callable[[], None] | None:
    """A pre-exec hook: the child gets ``signum`` when this process dies (Linux), and exits at
    once if this process is already gone by then. The C library is loaded here, in the parent:
    the hook runs between fork and exec and must not import anything."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(1, int(signum), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(128 + int(signum))

    return hook


def parent_death_hook(signum: int = signal.SIGKILL) -> Callable[[], None] | None:
    """See :func:`_parent_death_hook`; None for PID 1 (the worker as a container's command): when
    it dies the kernel ends every process of its PID namespace, and a fork without a pre-exec
    hook starts processes several times faster."""
    if os.getpid() == 1:
        return None
    return _parent_death_hook(signum)


def children() -> set[int]:
    """The pids of this process's children (of every thread), from /proc (Linux)."""
    out: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children", encoding="ascii") as f:
                out.update(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def reap_orphans(known: Collection[int]) -> int:
    """Waits for every exited child that is not one of ``known`` (the agent's own processes,
    which their Popen objects wait for); returns how many were reaped.

    The worker is PID 1 of its container: every process a rank leaves behind (a DataLoader
    worker, a ``multiprocessing`` child, a daemonized subprocess) becomes its child when its
    parent exits, and stays a zombie, holding a pid of the pod's limit, until PID 1 waits for it.
    A child still running is left alone (``WNOHANG``)."""
    reaped = 0
    for pid in children() - set(known):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if done:
            reaped += 1
    return reaped


#: How often PID 1's agent looks for orphans to reap (seconds).
REAP_EVERY: Final = 1.0
