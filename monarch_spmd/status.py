"""``monarch-spmd status [JOB]``: SPMDJobs on one screen, each with why it is in its phase.

Where it sits: a command of the CLI (``monarch_spmd.cli`` dispatches ``monarch-spmd status ...``
to :func:`main`), beside :mod:`monarch_spmd.logs`, whose kubeconfig loading it shares; it talks
to Kubernetes through the ``kubernetes`` Python client, imported inside functions so that
``import monarch_spmd`` stays standard-library only (``pip install 'monarch-spmd[cli]'``).

::

    monarch-spmd status [JOB] [-n NAMESPACE | -A] [--kubeconfig PATH]

Without JOB, one line per SPMDJob, like ``kubectl get spmdjobs`` but with the reason::

    NAME   PHASE    MESH            RUNNING/PROCS  RESTARTS  AGE  REASON
    bert   Running  hosts=2,gpus=8  16/16          1         3h   AllProcsRunning: 16 of 16 procs running
    gpt    Failed   hosts=4,gpus=8  0/32           3         5d   rank 17 exit 1 (Error): RuntimeError: NCCL timeout
    llama  Pending  hosts=8,gpus=8  40/64          0         2m   Unschedulable: 24 pods wait: 0/12 nodes ...

The REASON of a failed job is its root cause (``status.failure``: the rank that failed first,
its exit code, reason and last line of output); of any other job ``status.reason`` and
``status.message``. With JOB, a few more lines: the counts, times, the failure with its last
lines of output, the conditions and the job's newest Events.

The pure parts (:func:`reason`, :func:`table`, :func:`describe`, :func:`human_age`) take plain
dicts, as the API server returns them, and the time; the unit tests exercise them without a
cluster.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any, Final

from . import kubeconfig as kubeconfig_rule
from .payload.names import GROUP, KIND, PLURAL, VERSION

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


def failure_summary(failure: Mapping[str, Any]) -> str:
    """``rank 3 exit 1 (Error): <last line>``: the root cause of a gang failure in one line; for a
    failure of the job itself (no rank: deadline, invalid spec), ``<reason>: <last line>``."""
    if failure.get("rank") is None:
        cause = str(failure.get("reason") or "failed")
    elif failure.get("exitCode") is not None:
        cause = f"rank {failure['rank']} exit {failure['exitCode']}"
        cause += f" ({failure['reason']})" if failure.get("reason") else ""
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


def row(job: Mapping[str, Any], now: dt.datetime, *, namespace: bool = False) -> list[str]:
    """The table's cells for one job (NAMESPACE first when ``namespace``)."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    mesh = status.get("mesh") or ",".join(
        f"{d.get('name')}={d.get('size')}" for d in (job.get("spec") or {}).get("mesh") or [])
    cells = [
        str(meta.get("name", "")),
        str(status.get("phase") or "<none>"),
        mesh or "-",
        _procs(status),
        str(status.get("restarts") or 0),
        age(meta.get("creationTimestamp"), now),
        reason(job),
    ]
    return [str(meta.get("namespace", "")), *cells] if namespace else cells


def table(jobs: Iterable[Mapping[str, Any]], now: dt.datetime, *, all_namespaces: bool = False,
          width: int | None = None) -> str:
    """The one-screen summary: a header and one line per job, sorted by namespace and name.

    Columns are separated by three spaces, as kubectl's; with ``width`` (a terminal's), the last
    column (REASON) is cut to fit, ending in ``...`` (but never to fewer than REASON_MIN characters:
    the other columns are never cut).
    """
    ordered = sorted(jobs, key=lambda j: ((j.get("metadata") or {}).get("namespace", ""),
                                          (j.get("metadata") or {}).get("name", "")))
    headers = (["NAMESPACE"] if all_namespaces else []) + list(HEADERS)
    rows = [headers] + [row(j, now, namespace=all_namespaces) for j in ordered]
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers) - 1)]
    lines = []
    for r in rows:
        head = "   ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "   "
        last = r[-1]
        room = max(width - len(head), REASON_MIN) if width is not None else len(last)
        if len(last) > room:
            last = last[:room - 3].rstrip() + "..."
        lines.append((head + last).rstrip())
    return "\n".join(lines) + "\n"


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


def describe(job: Mapping[str, Any], events: Iterable[Mapping[str, Any]], now: dt.datetime) -> str:
    """The one-job view: phase and why, counts, times, failure, conditions, newest Events."""
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
    return "\n".join(out) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``monarch-spmd status``."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="SPMDJobs on one screen, each with why it is in its phase (for a failed job, the "
        "rank, exit code and last line that failed it). With JOB: counts, failure, conditions and Events.",
    )
    parser.add_argument("job", nargs="?", metavar="JOB", help="one SPMDJob to describe (default: list them all)")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="the namespace (default: the kubeconfig context's, else 'default')")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parses the command line; JOB with --all-namespaces is a usage error (a name is per namespace)."""
    parser = build_parser()
    opts = parser.parse_args(list(argv))
    if opts.job and opts.all_namespaces:
        parser.error(f"JOB ({opts.job}) names one job of one namespace: give -n NAMESPACE instead of -A")
    return opts


# --------------------------------------------------------------------------- Kubernetes side


def _api_error(err: Any, what: str) -> StatusError:
    if err.status in (401, 403):
        return StatusError(f"{what}: not allowed ({err.status} {err.reason}); check your credentials and RBAC")
    return StatusError(f"{what}: {err.status} {err.reason}")


def list_jobs(api_client: Any, namespace: str | None) -> list[dict[str, Any]]:
    """Every SPMDJob of ``namespace`` (of all namespaces with None)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.CustomObjectsApi(api_client)
    try:
        if namespace is None:
            answer = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        else:
            answer = api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    except ApiException as err:
        if err.status == 404:
            raise StatusError(f"the SPMDJob API ({PLURAL}.{GROUP}/{VERSION}) is not served: install the CRD "
                              "(kubectl apply --server-side -f crds/) or the Helm chart") from None
        raise _api_error(err, "listing spmdjobs") from None
    return list(answer.get("items") or [])


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


def run(opts: argparse.Namespace, stdout: IO[str], stderr: IO[str], now: dt.datetime | None = None) -> int:
    """Runs the command with parsed options; returns the exit code."""
    try:
        api_client, default_ns = kubeconfig_rule.load(opts.kubeconfig)
    except kubeconfig_rule.ConfigError as err:
        raise StatusError(str(err)) from None
    namespace = None if opts.all_namespaces else (opts.namespace or default_ns)
    now = now or dt.datetime.now(dt.timezone.utc)
    if opts.job:
        assert namespace is not None
        job = get_job(api_client, namespace, opts.job)
        stdout.write(describe(job, job_events(api_client, job), now))
        return 0
    jobs = list_jobs(api_client, namespace)
    if not jobs:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        stderr.write(f"No SPMDJobs in {where}.\n")
        return 0
    width = shutil.get_terminal_size().columns if stdout.isatty() else None
    stdout.write(table(jobs, now, all_namespaces=namespace is None, width=width))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``monarch-spmd status`` (``argv`` without the ``status`` word); returns the exit code."""
    return kubeconfig_rule.run_command(_PROG, sys.argv[1:] if argv is None else argv, parse_args, run, StatusError)


if __name__ == "__main__":
    sys.exit(main())
