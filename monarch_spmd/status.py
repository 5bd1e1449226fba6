"""``monarch-spmd status [JOB]``: SPMDJobs on one screen, each with why it is in its phase.

Where it sits: a command of the CLI (``monarch_spmd.cli`` dispatches ``monarch-spmd status ...``
to :func:`main`), beside :mod:`monarch_spmd.logs`, whose kubeconfig loading it shares and which
prints its per-rank table; it talks to Kubernetes through the ``kubernetes`` Python client,
imported inside functions so that ``import monarch_spmd`` stays standard-library only
(``pip install 'monarch-spmd[cli]'``).

::

    monarch-spmd status [JOB] [-n NAMESPACE | -A] [-o wide|json|yaml] [-w] [--kubeconfig PATH]

Without JOB, one line per SPMDJob, like ``kubectl get spmdjobs`` but with the reason::

    NAME   PHASE    MESH            RUNNING/PROCS  RESTARTS  AGE  REASON
    bert   Running  hosts=2,gpus=8  16/16          1         3h   AllProcsRunning: 16 of 16 procs running
    gpt    Failed   hosts=4,gpus=8  0/32           3         5d   rank 17 exit 1 (Error): RuntimeError: NCCL timeout
    llama  Pending  hosts=8,gpus=8  40/64          0         2m   Unschedulable: 24 pods wait: 0/12 nodes ...

The REASON of a failed job is its root cause (``status.failure``: the rank that failed first,
its exit code, reason and last line of output); of any other job ``status.reason`` and
``status.message``. With JOB, a few more lines: the counts, times, the failure with its last
lines of output, the conditions and the job's newest Events; a failed job's view ends with the
per-rank table of its failed attempt (rank, local rank, pod, exit code with the signal's name,
the first failure marked) and a last line naming the rank that failed first. ``-o wide`` adds
columns (and the per-rank table of any job), ``-o json|yaml`` prints the objects as the API
server returns them, ``-w`` keeps watching and prints a line (or an object) per change, as
``kubectl get -w`` does.

Every read of a job's children selects them by the job's uid (the ``job-uid`` label and the
controller owner reference), never by its name alone: a job re-created under the name of a
deleted one never shows the older job's pods or Events.

The pure parts (:func:`reason`, :func:`table`, :func:`describe`, :func:`rank_rows`,
:func:`exit_text`, :func:`human_age`) take plain dicts, as the API server returns them, and the
time; the unit tests exercise them without a cluster.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import re
import shutil
import signal
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Final

from . import kubeconfig as kubeconfig_rule
from .payload.names import (GROUP, KIND, LABEL_JOB_UID, LABEL_PREFIX, LABEL_PROCS, LABEL_RANK, LABEL_RESTART, PER_HOST,
                            PLURAL, VERSION)
from .payload.names import TRAINER_CONTAINER

_PROG: Final = "monarch-spmd status"
#: The most Events the one-job view shows (the newest).
EVENTS_SHOWN: Final = 10
#: The most lines of a failure's output the one-job view shows (the last).
FAILURE_LINES: Final = 8
#: The maxRestarts of a job that does not set one (the CRD's default).
DEFAULT_MAX_RESTARTS: Final = 3
#: The fewest characters of REASON a narrow terminal still gets.
REASON_MIN: Final = 20
HEADERS: Final = ("NAME", "PHASE", "MESH", "RUNNING/PROCS", "RESTARTS", "AGE", "REASON")
#: ``-o wide``: more columns, and REASON never cut.
WIDE_HEADERS: Final = ("NAME", "PHASE", "MESH", "LAYOUT", "RUNNING/PROCS", "SUCCEEDED", "FAILED", "RESTARTS",
                       "DISRUPTIONS", "AGE", "MASTER", "REASON")
#: The formats of ``-o``.
OUTPUTS: Final = ("wide", "json", "yaml")
#: A per-rank table longer than this shows only the ranks that did not end well (and counts the rest).
RANK_ROWS_SHOWN: Final = 16
#: What marks the first failure in the per-rank table.
FIRST_FAILURE: Final = "<- first failure"


class StatusError(Exception):
    """A problem the user can act on (no such job, no CRD, not allowed); the message says which."""


# --------------------------------------------------------------------------- pure parts


def parse_time(text: str | None) -> dt.datetime | None:
    """An API server timestamp (RFC 3339, ``Z`` or an offset, optional fraction), or None."""
    if not text or not isinstance(text, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def human_age(seconds: float) -> str:
    """A duration as kubectl prints ages: ``45s``, ``3m20s``, ``45m``, ``5h30m``, ``30h``,
    ``3d5h``, ``45d``, ``2y30d`` (k8s.io/apimachinery's HumanDuration)."""
    s = int(max(0, seconds))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    if d < 365 * 8:
        return f"{d // 365}y{d % 365}d" if d % 365 else f"{d // 365}y"
    return f"{d // 365}y"


def age(timestamp: str | None, now: dt.datetime) -> str:
    """How long ago ``timestamp`` was, as :func:`human_age`; ``<unknown>`` without one."""
    when = parse_time(timestamp)
    return human_age((now - when).total_seconds()) if when else "<unknown>"


def _one_line(text: Any) -> str:
    return " ".join(str(text or "").split())


def last_line(text: Any) -> str:
    """The last non-empty line of a (multi-line) message, whitespace squeezed."""
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    return _one_line(lines[-1]) if lines else ""


def signal_name(code: Any) -> str | None:
    """The signal an exit code stands for: ``-9`` (a process killed by it, as Python and torchrun
    report it) or ``137`` (128 + 9, as a shell and a container runtime report it) give SIGKILL."""
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    number = -code if code < 0 else code - 128 if 128 < code < 128 + 65 else None
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def exit_text(code: Any) -> str:
    """An exit code with its signal's name when it stands for one: ``-9 (SIGKILL)`` as torchrun
    prints it, ``137 (SIGKILL)``, ``1``."""
    name = signal_name(code)
    return f"{code} ({name})" if name else str(code)


def failure_summary(failure: Mapping[str, Any]) -> str:
    """``rank 3 exit 1 (Error): <last line>``: the root cause of a gang failure in one line (a
    signal's name joins the reason: ``exit 137 (SIGKILL, OOMKilled)``); for a failure of the job
    itself (no rank: deadline, invalid spec), ``<reason>: <last line>``."""
    if failure.get("rank") is None:
        cause = str(failure.get("reason") or "failed")
    elif failure.get("exitCode") is not None:
        cause = f"rank {failure['rank']} exit {failure['exitCode']}"
        why = ", ".join(str(x) for x in (signal_name(failure["exitCode"]), failure.get("reason")) if x)
        cause += f" ({why})" if why else ""
    else:
        cause = f"rank {failure['rank']} {failure.get('reason') or 'failed'}"
    line = last_line(failure.get("message"))
    return f"{cause}: {line}" if line else cause


def reason(job: Mapping[str, Any]) -> str:
    """Why the job is in its phase, in one line.

    A failed job: its root cause (``status.failure``), prefixed by ``status.reason`` when that
    says more than the failure (e.g. RestartLimitExceeded). Any other job: ``reason: message``.
    A job without status: the operator has not seen it yet.
    """
    status = job.get("status") or {}
    if not status.get("phase"):
        return "no status yet: the operator has not seen this job (is it running and watching this namespace?)"
    why, message = _one_line(status.get("reason")), _one_line(status.get("message"))
    failure = status.get("failure") or {}
    if status.get("phase") == "Failed" and failure.get("rank") is not None:
        summary = failure_summary(failure)
        # RestartLimitExceeded says more than the failure; PermanentFailure says nothing more.
        return f"{why}: {summary}" if why and why not in (failure.get("reason"), "PermanentFailure") else summary
    if status.get("phase") == "Failed" and failure and not why:
        return failure_summary(failure)
    if why and message:
        return f"{why}: {message}"
    return why or message


def _procs(status: Mapping[str, Any]) -> str:
    if status.get("procs") is None:
        return "-"
    return f"{status.get('running') or 0}/{status['procs']}"


def _mesh_text(job: Mapping[str, Any]) -> str:
    status = job.get("status") or {}
    return status.get("mesh") or ",".join(
        f"{d.get('name')}={d.get('size')}" for d in (job.get("spec") or {}).get("mesh") or [])


def row(job: Mapping[str, Any], now: dt.datetime, *, namespace: bool = False, wide: bool = False) -> list[str]:
    """The table's cells for one job (NAMESPACE first when ``namespace``; :data:`WIDE_HEADERS`'
    cells with ``wide``)."""
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    name, phase = str(meta.get("name", "")), str(status.get("phase") or "<none>")
    mesh, restarts, when = _mesh_text(job) or "-", str(status.get("restarts") or 0), age(meta.get("creationTimestamp"), now)
    if wide:
        counts = "-" if status.get("procs") is None else None
        cells = [name, phase, mesh, str(spec.get("podLayout") or "PerProc"), _procs(status),
                 counts or str(status.get("succeeded") or 0), counts or str(status.get("failed") or 0), restarts,
                 str(status.get("disruptions") or 0), when, str(status.get("masterAddr") or "-"), reason(job)]
    else:
        cells = [name, phase, mesh, _procs(status), restarts, when, reason(job)]
    return [str(meta.get("namespace", "")), *cells] if namespace else cells


def headers(*, all_namespaces: bool = False, wide: bool = False) -> list[str]:
    """The table's header cells."""
    return (["NAMESPACE"] if all_namespaces else []) + list(WIDE_HEADERS if wide else HEADERS)


def _sort_key(job: Mapping[str, Any]) -> tuple[str, str]:
    meta = job.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class Table:
    """Lines of the one-screen summary, aligned as kubectl aligns them.

    Columns are separated by three spaces; the widths are those of the rows seen so far, so rows
    printed later (a watch) line up with the first ones. With ``width`` (a terminal's), the last
    column (REASON) is cut to fit, ending in ``...`` (but never to fewer than REASON_MIN
    characters: the other columns are never cut).
    """

    def __init__(self, header: Sequence[str], width: int | None = None) -> None:
        self.widths = [len(h) for h in header[:-1]]
        self.width = width

    def fit(self, rows: Iterable[Sequence[str]]) -> None:
        """Widens the columns for ``rows``."""
        for r in rows:
            self.widths = [max(w, len(c)) for w, c in zip(self.widths, r)]

    def line(self, r: Sequence[str]) -> str:
        """One row as a line (no line end)."""
        head = "   ".join(cell.ljust(w) for cell, w in zip(r, self.widths)) + "   "
        last = r[-1]
        room = max(self.width - len(head), REASON_MIN) if self.width is not None else len(last)
        if len(last) > room:
            last = last[:room - 3].rstrip() + "..."
        return (head + last).rstrip()


def table(jobs: Iterable[Mapping[str, Any]], now: dt.datetime, *, all_namespaces: bool = False,
          width: int | None = None, wide: bool = False) -> str:
    """The one-screen summary: a header and one line per job, sorted by namespace and name
    (see :class:`Table`; ``wide`` never cuts REASON)."""
    header = headers(all_namespaces=all_namespaces, wide=wide)
    rows = [header] + [row(j, now, namespace=all_namespaces, wide=wide) for j in sorted(jobs, key=_sort_key)]
    printer = Table(header, None if wide else width)
    printer.fit(rows)
    return "\n".join(printer.line(r) for r in rows) + "\n"


# --------------------------------------------------------------------------- the per-rank table


@dataclass(frozen=True)
class RankRow:
    """One rank of one attempt, as the per-rank table shows it.

    Attributes:
        rank: the global rank.
        local_rank: LOCAL_RANK as the worker gave it (the index in a PerHost pod; the coordinate
            on the last dimension, or 0 where each pod is its own node).
        pod: the pod that ran it (``-`` when none is left).
        node: the node it ran on, or ``-``.
        exit: the exit code with its signal's name, or the state (running, stopped, pod gone ...).
        reason: the container's reason (Error, OOMKilled, Completed ...), or what happened to it.
        code: the exit code, when it ended with one.
        first: whether it is the job's root cause (``status.failure.rank``).
    """

    rank: int
    local_rank: int
    pod: str
    node: str
    exit: str
    reason: str
    code: int | None = None
    first: bool = False

    @property
    def ended_well(self) -> bool:
        """It exited 0 or has not ended (the rows a long table leaves out)."""
        return not self.first and (self.code == 0 or (self.code is None and self.exit in _UNDERWAY))


#: States of a rank that has not ended (yet).
_UNDERWAY: Final = ("running", "waiting", "pending")
#: The last line a PerHost worker writes when one of its procs failed (payload.worker.failure_line).
_WORKER_FAILURE: Final = re.compile(r"monarch-spmd worker: rank (\d+) exited with code (-?\d+)")


def _label_int(pod: Mapping[str, Any], label: str) -> int | None:
    raw = ((pod.get("metadata") or {}).get("labels") or {}).get(label)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether a child belongs to the job of ``uid``: its ``job-uid`` label names it and its
    controller owner reference, when it has one, too (a pod orphaned from a deleted namesake keeps
    only the older job's uid label)."""
    meta = obj.get("metadata") or {}
    if not uid or (meta.get("labels") or {}).get(LABEL_JOB_UID) != uid:
        return False
    controllers = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
    return all(r.get("uid") == uid for r in controllers)


@dataclass(frozen=True)
class _Layout:
    procs: int
    per_pod: int
    last: int
    pod_scope: bool

    def local_rank(self, rank: int, local: int, size: int) -> int:
        """LOCAL_RANK of ``rank``, the ``local``-th proc of a pod of ``size`` procs."""
        return local if size > 1 else (0 if self.pod_scope else rank % self.last)


def _layout(job: Mapping[str, Any]) -> _Layout:
    """How a job's ranks sit in its pods, from its spec (or, for a spec this version cannot
    parse, its mesh as written)."""
    from . import policy
    from . import spec as spec_module

    body = job.get("spec") or {}
    try:
        parsed = spec_module.parse_job_spec(body)
    except (ValueError, TypeError):
        sizes = [int(d.get("size") or 1) for d in body.get("mesh") or [] if isinstance(d, Mapping)] or [1]
        procs = int((job.get("status") or {}).get("procs") or 0) or _product(sizes)
        return _Layout(procs, sizes[-1] if body.get("podLayout") == PER_HOST else 1, sizes[-1], False)
    return _Layout(parsed.world_size, policy.procs_per_pod(parsed), parsed.mesh[-1].size,
                   policy.local_rank_scope(parsed) == policy.SCOPE_POD)


def _product(sizes: Sequence[int]) -> int:
    out = 1
    for size in sizes:
        out *= size
    return out


def _trainer_state(pod: Mapping[str, Any]) -> tuple[int | None, str, str]:
    """``(exit code or None, state, reason)`` of a pod's trainer container."""
    status = pod.get("status") or {}
    statuses = [c for c in status.get("containerStatuses") or [] if c.get("name") == TRAINER_CONTAINER]
    state = (statuses[0].get("state") or {}) if statuses else {}
    if "terminated" in state:
        ended = state["terminated"] or {}
        code = ended.get("exitCode")
        return code, exit_text(code), str(ended.get("reason") or "")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None, "stopping", "the pod is being deleted"
    if "running" in state:
        return None, "running", ""
    if "waiting" in state:
        return None, "waiting", str((state["waiting"] or {}).get("reason") or "")
    return None, str(status.get("phase") or "Pending").lower(), str(status.get("reason") or "")


def attempt_of(job: Mapping[str, Any]) -> int:
    """The attempt the per-rank table shows: that of ``status.failure`` when there is one, else
    the current one (``status.restarts``)."""
    status = job.get("status") or {}
    for value in ((status.get("failure") or {}).get("restart"), status.get("restarts")):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0


def _pod_rows(pod: Mapping[str, Any] | None, first: int, layout: _Layout) -> list[RankRow]:
    """The ranks of one pod (of ``first`` and, in PerHost, the next ones). A pod's worker names the
    rank that failed in its last line (every pod of a gang the same one): that rank gets the exit
    code, and every other rank was stopped by its worker."""
    if pod is None:
        return [RankRow(r, layout.local_rank(r, r - first, layout.per_pod), "-", "-", "pod gone", "")
                for r in range(first, first + layout.per_pod)]
    size = max(1, _label_int(pod, LABEL_PROCS) or layout.per_pod)
    code, state, why = _trainer_state(pod)
    name = str((pod.get("metadata") or {}).get("name"))
    node = str((pod.get("spec") or {}).get("nodeName") or "-")
    rows = [RankRow(r, layout.local_rank(r, r - first, size), name, node, state, why, code)
            for r in range(first, first + size)]
    named = _WORKER_FAILURE.findall(_termination_message(pod))
    if named and (size > 1 or int(named[-1][0]) != first):
        # The gang's verdict, the same line in every pod: the rank it names failed, every other
        # rank was stopped by its own pod's worker (the pod exits with the verdict's code).
        failed, failed_code = int(named[-1][0]), int(named[-1][1])
        rows = [dataclasses.replace(r, code=failed_code, exit=exit_text(failed_code)) if r.rank == failed else
                dataclasses.replace(r, code=None, exit="stopped", reason=f"by its worker after rank {failed} failed")
                for r in rows]
    return rows


def _as_root(row: RankRow, failure: Mapping[str, Any]) -> RankRow:
    """The root cause's row, completed from ``status.failure`` where its pod says less (a pod
    gone, or one still being deleted, or the container's generic ``Error`` where the worker
    knew why: NoProgress, WatchdogTimeout ...)."""
    changes: dict[str, Any] = {"first": True}
    if row.code is None and failure.get("exitCode") is not None:
        changes.update(code=failure["exitCode"], exit=exit_text(failure["exitCode"]))
    if failure.get("reason") and row.reason in ("", "the pod is being deleted", "Error"):
        changes["reason"] = str(failure["reason"])
    if row.pod == "-" and failure.get("pod"):
        changes.update(pod=str(failure["pod"]), node=str(failure.get("node") or "-"))
    return dataclasses.replace(row, **changes)


def rank_rows(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> list[RankRow]:
    """Every rank of the job's attempt (:func:`attempt_of`), from its pods' states and
    ``status.failure``; pods of another job (another uid) or another attempt are ignored."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    failure = status.get("failure") or {}
    attempt = attempt_of(job)
    layout = _layout(job)
    by_first: dict[int, Mapping[str, Any]] = {}
    for pod in pods:
        first = _label_int(pod, LABEL_RANK)
        if first is not None and owned_by(pod, meta.get("uid")) and _label_int(pod, LABEL_RESTART) == attempt:
            # Of a pod and its replacements (created alone, or a hot spare adopted), the newest.
            if first not in by_first or _replacement(pod) >= _replacement(by_first[first]):
                by_first[first] = pod
    root = failure.get("rank") if failure.get("restart", attempt) == attempt else None
    rows = [row for first in range(0, layout.procs, layout.per_pod)
            for row in _pod_rows(by_first.get(first), first, layout)]
    mode = ((job.get("spec") or {}).get("restartPolicy") or {}).get("mode") or "InPlace"
    code = failure.get("exitCode")
    if root is not None and mode == "InPlace" and isinstance(code, int) and not isinstance(code, bool):
        # Restart in place: every agent of the gang exits with the verdict's code, so the pods of
        # the other ranks end with the root cause's code too; their ranks were stopped.
        failed_pod = next((r.pod for r in rows if r.rank == root), None)
        rows = [dataclasses.replace(r, code=None, exit="stopped", reason=f"by its worker after rank {root} failed")
                if r.rank != root and r.pod != failed_pod and r.code == code else r for r in rows]
    return [_as_root(r, failure) if r.rank == root else r for r in rows]


def _replacement(pod: Mapping[str, Any]) -> int:
    """A pod's ``spmd.monarch.dev/replacement`` label (0 for a pod of the gang)."""
    return _label_int(pod, LABEL_PREFIX + "replacement") or 0


def _termination_message(pod: Mapping[str, Any]) -> str:
    """The trainer container's termination message (a PerHost worker's last lines)."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == TRAINER_CONTAINER:
            return str(((c.get("state") or {}).get("terminated") or {}).get("message") or "")
    return ""


def rank_table(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The per-rank table of the job's attempt and, for a failed job, a last line naming the rank
    that failed first (as torchrun ends a failed run). A table of more than RANK_ROWS_SHOWN ranks
    shows those that did not end well and counts the others by state."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    rows = rank_rows(job, pods)
    shown = rows if len(rows) <= RANK_ROWS_SHOWN else [r for r in rows if not r.ended_well]
    out = [f"Ranks of attempt {attempt_of(job)}:"]
    out.extend(_columns([("RANK", "LOCAL_RANK", "POD", "NODE", "EXIT CODE", "REASON", "")] + [
        (str(r.rank), str(r.local_rank), r.pod, r.node, r.exit, r.reason or "-", FIRST_FAILURE if r.first else "")
        for r in shown]))
    hidden = [r for r in rows if r not in shown]
    if hidden:
        counts: dict[str, int] = {}
        for r in hidden:
            counts[r.exit] = counts.get(r.exit, 0) + 1
        out.append(f"  ... and {len(hidden)} more rank(s): "
                   + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    if status.get("phase") == "Failed":
        out.append(failed_line(job, rows))
    return out


def failed_line(job: Mapping[str, Any], rows: Sequence[RankRow]) -> str:
    """The last line of a failed job's view: which rank failed first, where, and how."""
    name = (job.get("metadata") or {}).get("name", "")
    status = job.get("status") or {}
    failure = status.get("failure") or {}
    first = next((r for r in rows if r.first), None)
    if first is None:
        why = failure.get("reason") or status.get("reason") or "Failed"
        return f"spmdjob {name} failed: {why}, not a rank: {last_line(failure.get('message') or status.get('message'))}"
    where = f"pod {first.pod}" + (f" on node {first.node}" if first.node != "-" else "")
    if first.code is not None:
        why = ", ".join(x for x in (signal_name(first.code), first.reason) if x)
        how = f"exit code {first.code}" + (f" ({why})" if why else "")
    else:
        how = first.exit + (f" ({first.reason})" if first.reason else "")
    return f"spmdjob {name} failed: rank {first.rank} (local rank {first.local_rank}, {where}) failed first: {how}"


def _event_time(event: Mapping[str, Any]) -> dt.datetime:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        when = parse_time(event.get(key))
        if when:
            return when
    return parse_time((event.get("metadata") or {}).get("creationTimestamp")) or dt.datetime.min.replace(
        tzinfo=dt.timezone.utc)


def _columns(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [(indent + "   ".join(c.ljust(w) for c, w in zip(r, widths)) + "   " + r[-1]).rstrip() for r in rows]


def describe(job: Mapping[str, Any], events: Iterable[Mapping[str, Any]], now: dt.datetime,
             pods: Iterable[Mapping[str, Any]] | None = None) -> str:
    """The one-job view: phase and why, counts, times, failure, conditions, newest Events; with
    ``pods`` (the job's, read by its uid) it ends with the per-rank table (:func:`rank_table`)."""
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    out = [f"Name:        {meta.get('name', '')}", f"Namespace:   {meta.get('namespace', '')}"]
    why = reason(job)
    out.append(f"Phase:       {status.get('phase') or '<none>'}" + (f"   ({why})" if why else ""))
    mesh = status.get("mesh") or ",".join(f"{d.get('name')}={d.get('size')}" for d in spec.get("mesh") or [])
    if status.get("procs") is not None:
        counts = ", ".join(f"{status.get(k) or 0} {k}" for k in ("running", "succeeded", "failed"))
        out.append(f"Mesh:        {mesh}   ({status['procs']} procs: {counts})")
    else:
        out.append(f"Mesh:        {mesh or '-'}")
    limit = (spec.get("restartPolicy") or {}).get("maxRestarts", DEFAULT_MAX_RESTARTS)
    restarts = f"Restarts:    {status.get('restarts') or 0} of at most {limit}"
    if status.get("disruptions"):
        restarts += f" ({status['disruptions']} after disruptions, not counted against the limit)"
    out.append(restarts)
    out.append(f"Created:     {age(meta.get('creationTimestamp'), now)} ago")
    for key, label in (("startTime", "Started"), ("completionTime", "Completed")):
        if status.get(key):
            out.append(f"{label + ':':<13}{age(status[key], now)} ago ({status[key]})")
    if status.get("masterAddr"):
        out.append(f"Master:      {status['masterAddr']}")
    refusal = status.get("refusal") or {}
    if refusal:
        what = " ".join(str(refusal[k]) for k in ("kind", "name") if refusal.get(k))
        times = f", {refusal['retries']} time(s)" if refusal.get("retries") else ""
        since = f" since {age(refusal['since'], now)} ago" if refusal.get("since") else ""
        out.append(f"Refused:     {refusal.get('reason') or 'Forbidden'}: the API server refuses {what or 'a child'}"
                   f"{times}{since} ({refusal.get('code') or 403}); retried with back-off")
        if refusal.get("message"):
            out.append(f"  {_one_line(refusal['message'])}")
    failure = status.get("failure") or {}
    if failure:
        where = " ".join(x for x in (f"pod {failure['pod']}" if failure.get("pod") else "",
                                     f"on node {failure['node']}" if failure.get("node") else "") if x)
        verdict = "permanent" if failure.get("permanent") else (
            "a disruption" if failure.get("disruption") else "retryable")
        attempt = f"attempt {failure['restart']}, " if failure.get("restart") is not None else ""
        out.append(f"Failure:     {failure_summary({**failure, 'message': ''})}"
                   + (f", {where}" if where else "") + f" ({attempt}{verdict})")
        lines = [line for line in str(failure.get("message") or "").splitlines() if line.strip()]
        if lines:
            out.append(f"  last {min(len(lines), FAILURE_LINES)} lines of its output:")
            out.extend(f"    {line}" for line in lines[-FAILURE_LINES:])
    conditions = status.get("conditions") or []
    if conditions:
        out.append("Conditions:")
        out.extend(_columns([("TYPE", "STATUS", "REASON", "AGE", "MESSAGE")] + [
            (str(c.get("type", "")), str(c.get("status", "")), str(c.get("reason") or ""),
             age(c.get("lastTransitionTime"), now), _one_line(c.get("message")))
            for c in conditions]))
    ordered = sorted(events, key=_event_time)
    if ordered:
        shown = ordered[-EVENTS_SHOWN:]
        more = f", newest {len(shown)} of {len(ordered)}" if len(ordered) > len(shown) else ""
        out.append(f"Events (oldest first{more}):")
        out.extend(_columns([("AGE", "TYPE", "REASON", "MESSAGE")] + [
            (human_age((now - _event_time(e)).total_seconds()), str(e.get("type") or ""), str(e.get("reason") or ""),
             _one_line(e.get("message")) + (f" (x{e['count']})" if (e.get("count") or 1) > 1 else ""))
            for e in shown]))
    else:
        out.append("Events:      none")
    if pods is not None:
        out.extend(rank_table(job, pods))
    return "\n".join(out) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``monarch-spmd status``."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="SPMDJobs on one screen, each with why it is in its phase (for a failed job, the "
        "rank, exit code and last line that failed it). With JOB: counts, failure, conditions, Events and, "
        "for a failed job, a per-rank table ending with the rank that failed first.",
    )
    parser.add_argument("job", nargs="?", metavar="JOB", help="one SPMDJob to describe (default: list them all)")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="the namespace (default: the kubeconfig context's, else 'default')")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    parser.add_argument("-o", "--output", choices=OUTPUTS, metavar="FORMAT",
                        help="wide (more columns; with JOB, the per-rank table of any job), json or yaml "
                        "(the objects as the API server returns them)")
    parser.add_argument("-w", "--watch", action="store_true",
                        help="after the list (or JOB), print a line (or an object) for every change, as kubectl get -w; "
                        "Ctrl-C ends it")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parses the command line; JOB with --all-namespaces is a usage error (a name is per namespace)."""
    parser = build_parser()
    opts = parser.parse_args(list(argv))
    if opts.job and opts.all_namespaces:
        parser.error(f"JOB ({opts.job}) names one job of one namespace: give -n NAMESPACE instead of -A")
    return opts


def dump(obj: Any, output: str) -> str:
    """An object as ``-o json`` (kubectl's indentation) or ``-o yaml`` prints it."""
    if output == "json":
        return json.dumps(obj, indent=4) + "\n"
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)


def as_list(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several objects as kubectl prints them with ``-o json|yaml``: a ``v1`` List."""
    return {"apiVersion": "v1", "items": list(items), "kind": "List", "metadata": {"resourceVersion": ""}}


# --------------------------------------------------------------------------- Kubernetes side


def _api_error(err: Any, what: str) -> StatusError:
    if err.status in (401, 403):
        return StatusError(f"{what}: not allowed ({err.status} {err.reason}); check your credentials and RBAC")
    return StatusError(f"{what}: {err.status} {err.reason}")


def list_jobs(api_client: Any, namespace: str | None) -> list[dict[str, Any]]:
    """Every SPMDJob of ``namespace`` (of all namespaces with None)."""
    return list_jobs_at(api_client, namespace)[0]


def list_jobs_at(api_client: Any, namespace: str | None, name: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """Every SPMDJob of ``namespace`` (all with None; only ``name`` with one), and the list's
    resourceVersion (where a watch starts)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.CustomObjectsApi(api_client)
    kwargs = {"field_selector": f"metadata.name={name}"} if name else {}
    try:
        if namespace is None:
            answer = api.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kwargs)
        else:
            answer = api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, **kwargs)
    except ApiException as err:
        if err.status == 404:
            raise StatusError(f"the SPMDJob API ({PLURAL}.{GROUP}/{VERSION}) is not served: install the CRD "
                              "(kubectl apply --server-side -f crds/) or the Helm chart") from None
        raise _api_error(err, "listing spmdjobs") from None
    return list(answer.get("items") or []), str((answer.get("metadata") or {}).get("resourceVersion") or "")


def get_job(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    """The SPMDJob ``namespace/name``."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        return client.CustomObjectsApi(api_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as err:
        if err.status == 404:
            raise StatusError(f"spmdjob {name} not found in namespace {namespace} "
                              f"(monarch-spmd status -n {namespace} lists them)") from None
        raise _api_error(err, f"reading spmdjob {name}") from None


def job_events(api_client: Any, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The core v1 Events about this very job (its uid: not a deleted namesake's)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    meta = job.get("metadata") or {}
    selector = f"involvedObject.kind={KIND},involvedObject.name={meta.get('name')}"
    if meta.get("uid"):
        selector += f",involvedObject.uid={meta['uid']}"
    try:
        answer = client.CoreV1Api(api_client).list_namespaced_event(
            meta.get("namespace"), field_selector=selector, _preload_content=False)
    except ApiException as err:
        if err.status in (401, 403):
            return []  # the job's own view still helps; Events are an extra
        raise _api_error(err, "listing events") from None
    import json

    return list(json.loads(answer.data).get("items") or [])


def job_pods(api_client: Any, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods of this very job: selected by its uid label and kept only when its uid owns them
    (:func:`owned_by`), so that a deleted namesake's orphaned pods never count."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    meta = job.get("metadata") or {}
    try:
        answer = client.CoreV1Api(api_client).list_namespaced_pod(
            meta.get("namespace"), label_selector=f"{LABEL_JOB_UID}={meta.get('uid')}", _preload_content=False)
    except ApiException as err:
        if err.status in (401, 403):
            return []  # the per-rank table needs pods; the job's own view still helps
        raise _api_error(err, "listing the job's pods") from None
    return [p for p in json.loads(answer.data).get("items") or [] if owned_by(p, meta.get("uid"))]


Clock = Callable[[], dt.datetime]


class Watcher:
    """``-w``: prints the jobs as they change, from a watch that starts at a list's resourceVersion.

    A watch the API server ends is resumed where it stopped; one whose resourceVersion is too old
    (410 Gone) is replaced by a new list, from which the jobs that changed in between (or went
    away) are printed before the new watch starts.
    """

    def __init__(self, opts: argparse.Namespace, namespace: str | None, stdout: IO[str], clock: Clock) -> None:
        self.opts, self.namespace, self.stdout, self.clock = opts, namespace, stdout, clock
        self.all_namespaces = namespace is None
        self.wide = opts.output == "wide"
        self.header = headers(all_namespaces=self.all_namespaces, wide=self.wide)
        width = shutil.get_terminal_size().columns if stdout.isatty() and not self.wide else None
        self.printer = Table(self.header, width)
        self.printed_header = False
        self.seen: dict[str, dict[str, Any]] = {}

    def show(self, job: Mapping[str, Any], deleted: bool = False) -> None:
        """Prints one job: a row (its REASON ``deleted`` once it is gone) or the whole object."""
        meta = job.get("metadata") or {}
        if deleted:
            self.seen.pop(str(meta.get("uid")), None)
        else:
            self.seen[str(meta.get("uid"))] = dict(job)
        if self.opts.output in ("json", "yaml"):
            self.stdout.write(dump(job, self.opts.output) if self.opts.output == "json" else "---\n" + dump(job, "yaml"))
        else:
            cells = row(job, self.clock(), namespace=self.all_namespaces, wide=self.wide)
            if deleted:
                cells[-1] = "deleted"
            self.printer.fit([cells])
            if not self.printed_header:
                self.printer.fit([self.header])
                self.stdout.write(self.printer.line(self.header) + "\n")
                self.printed_header = True
            self.stdout.write(self.printer.line(cells) + "\n")
        self.stdout.flush()

    def relist(self, api_client: Any) -> str:
        """After a 410: prints what changed or went away since the last event; returns the new start."""
        items, version = list_jobs_at(api_client, self.namespace, self.opts.job)
        now = {str((j.get("metadata") or {}).get("uid")): j for j in items}
        for uid, old in list(self.seen.items()):
            if uid not in now:
                self.show(old, deleted=True)
        for uid, job in now.items():
            old = self.seen.get(uid)
            old_version = (old or {}).get("metadata", {}).get("resourceVersion")
            if old_version != (job.get("metadata") or {}).get("resourceVersion"):
                self.show(job)
        return version

    def run(self, api_client: Any, items: Sequence[Mapping[str, Any]], version: str) -> int:
        """Prints ``items``, then every change from ``version`` on, until Ctrl-C."""
        from kubernetes import client, watch
        from kubernetes.client.rest import ApiException

        for job in sorted(items, key=_sort_key):
            self.show(job)
        api = client.CustomObjectsApi(api_client)
        kwargs: dict[str, Any] = {"field_selector": f"metadata.name={self.opts.job}"} if self.opts.job else {}
        while True:
            stream = watch.Watch()
            try:
                if self.namespace is None:
                    events = stream.stream(api.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                                           resource_version=version, **kwargs)
                else:
                    events = stream.stream(api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                                           resource_version=version, **kwargs)
                for event in events:
                    job = event.get("object") or {}
                    version = str((job.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self.show(job, deleted=event["type"] == "DELETED")
            except ApiException as err:
                if err.status != 410:
                    raise _api_error(err, "watching spmdjobs") from None
                version = self.relist(api_client)


def run(opts: argparse.Namespace, stdout: IO[str], stderr: IO[str], now: dt.datetime | None = None) -> int:
    """Runs the command with parsed options; returns the exit code."""
    try:
        api_client, default_ns = kubeconfig_rule.load(opts.kubeconfig)
    except kubeconfig_rule.ConfigError as err:
        raise StatusError(str(err)) from None
    namespace = None if opts.all_namespaces else (opts.namespace or default_ns)

    def clock() -> dt.datetime:
        return now or dt.datetime.now(dt.timezone.utc)

    output = opts.output
    if opts.job:
        assert namespace is not None
        job = get_job(api_client, namespace, opts.job)
        if opts.watch:
            return Watcher(opts, namespace, stdout, clock).run(
                api_client, [job], str((job.get("metadata") or {}).get("resourceVersion") or ""))
        if output in ("json", "yaml"):
            stdout.write(dump(job, output))
            return 0
        failed = (job.get("status") or {}).get("phase") == "Failed"
        pods = job_pods(api_client, job) if failed or output == "wide" else None
        stdout.write(describe(job, job_events(api_client, job), clock(), pods))
        return 0
    jobs, version = list_jobs_at(api_client, namespace)
    if opts.watch:
        if not jobs:
            where = "any namespace" if namespace is None else f"namespace {namespace}"
            stderr.write(f"No SPMDJobs in {where} yet; watching.\n")
            stderr.flush()
        return Watcher(opts, namespace, stdout, clock).run(api_client, jobs, version)
    if output in ("json", "yaml"):
        stdout.write(dump(as_list(jobs), output))
        return 0
    if not jobs:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        stderr.write(f"No SPMDJobs in {where}.\n")
        return 0
    width = shutil.get_terminal_size().columns if stdout.isatty() else None
    stdout.write(table(jobs, clock(), all_namespaces=namespace is None, width=width, wide=output == "wide"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``monarch-spmd status`` (``argv`` without the ``status`` word); returns the exit code."""
    return kubeconfig_rule.run_command(_PROG, sys.argv[1:] if argv is None else argv, parse_args, run, StatusError)


if __name__ == "__main__":
    sys.exit(main())
