"""Resident memory and CPU time of a controller under test, read from /proc.

Where it sits: beside ``benchmarks.kube`` (which counts a controller's requests at the API server);
used by ``benchmarks.many_jobs`` to sample the controllers it runs. Standard library only.

A controller is measured as its process **tree**: the process the benchmark started and every
live descendant (a controller that hands work to a child process is charged for it). Values:

- ``rss_mib``: the sum of VmRSS over the tree (pages shared between the processes are counted
  once per process, so a forked helper may be over-counted);
- ``hwm_mib``: the sum of VmHWM (each process's own peak; the peaks need not coincide);
- ``cpu_s``: user + system CPU seconds of every live process in the tree, plus what its reaped
  children used (``cutime``/``cstime`` of the root).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Usage:
    """One reading of a process tree."""

    pids: tuple[int, ...]
    rss_mib: float
    hwm_mib: float
    cpu_s: float


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3 onwards), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold spaces or parentheses.
    return text[text.rindex(")") + 2:].split()


def parent_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def descendants(root: int) -> list[int]:
    """``root`` and its live descendants (root first), from the parent links in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = parent_of(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def cpu_seconds(pid: int, reaped: bool = False) -> float | None:
    """utime + stime of one process (plus its reaped children's with ``reaped``), seconds."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    # stat fields 14-17 (utime, stime, cutime, cstime) are 11-14 here (counting from field 3).
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def status_kib(pid: int, key: str) -> int | None:
    """A ``kB`` line of /proc/PID/status (e.g. VmRSS, VmHWM), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def usage(root: int) -> Usage | None:
    """The tree of ``root`` now; None when ``root`` is gone."""
    root_cpu = cpu_seconds(root, reaped=True)
    if root_cpu is None:
        return None
    pids = descendants(root)
    rss = hwm = 0
    cpu = root_cpu
    for pid in pids:
        rss += status_kib(pid, "VmRSS") or 0
        hwm += status_kib(pid, "VmHWM") or 0
        if pid != root:
            cpu += cpu_seconds(pid) or 0.0
    return Usage(tuple(pids), rss / 1024, hwm / 1024, cpu)
