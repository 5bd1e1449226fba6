"""The SPMDJob state machine as pure functions: observed pods in, a plan out.

Where it sits: above :mod:`spmd_operator.names` and :mod:`monarch_spmd.spec`, below
:mod:`spmd_operator.handlers`, which feeds :func:`reconcile` the job's spec and status, a summary
of its pods (:class:`PodInfo`, kept in memory by a kopf index) and the time, then carries out the
returned :class:`Plan` (create pods, delete pods, one status patch, Events). Nothing here talks to
Kubernetes or reads a clock, so every transition is a table-driven unit test.

Phases (``status.phase``) and transitions::

    (new) --create every pod of attempt 0--> Pending
    Pending/Restarting --every proc's pod Running (or already Succeeded)--> Running
    any active phase --every rank exited 0--> Succeeded
    any active phase --a rank failed, retryable, restarts < maxRestarts--> Restarting
        (every pod deleted, the whole gang created again as attempt restarts+1)
    any active phase --a permanent failure, or retryable with the limit used up--> Failed
    any active phase --activeDeadlineSeconds passed since startTime--> Failed (DeadlineExceeded)
    any active phase --spec.suspend--> Suspended (every pod deleted)
    Suspended --spec.suspend false, old pods gone--> Pending (same attempt, startTime reset)
    Succeeded/Failed --ttlSecondsAfterFinished passed--> the job is deleted
    invalid spec (what CEL cannot check) --> Failed (InvalidSpec), nothing created

A "failure" of the current attempt is a pod in phase Failed, a pod stuck on an image that can
never be pulled, a pod being deleted (evicted, drained, ``kubectl delete``) before it finished,
or, once the job is Running, a pod gone missing. Whether it is permanent: a reason listed in
``restartPolicy.permanentReasons`` or always fatal; an exit code in ``permanentExitCodes``; the
worker's 64 (bad input); or, when ``retryableExitCodes`` is non-empty, any exit code not in it
(the worker's 75 and pod loss stay retryable). Finished jobs stop their remaining pods and keep
the finished ones for their logs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from monarch_spmd.payload import contract, worker
from monarch_spmd.spec import JobSpec, SpecError

from . import names

PENDING: Final = "Pending"
RUNNING: Final = "Running"
RESTARTING: Final = "Restarting"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
SUSPENDED: Final = "Suspended"
PHASES: Final = (PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)
TERMINAL: Final = frozenset({SUCCEEDED, FAILED})

#: Condition types, in the order they are listed.
CONDITION_TYPES: Final = ("Created", RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)

#: Waiting reasons that no amount of waiting fixes: the pod counts as failed, permanently.
FATAL_WAITING_REASONS: Final = frozenset({"InvalidImageName", "ErrImageNeverPull"})
#: Reasons set by the lifecycle itself for a pod lost from under the job (always retryable).
REASON_POD_DELETED: Final = "PodDeleted"
REASON_POD_MISSING: Final = "PodMissing"

#: How much of a failure's message is kept in status.failure.message.
MESSAGE_LINES: Final = 20
MESSAGE_CHARS: Final = 2048

EVENT_NORMAL: Final = "Normal"
EVENT_WARNING: Final = "Warning"


@dataclass(frozen=True)
class PodInfo:
    """What the lifecycle needs to know about one pod of a job (see :func:`pod_info`).

    Attributes:
        name: the pod's name.
        rank: its global rank (label ``spmd.monarch.dev/rank``).
        restart: its gang attempt (label ``spmd.monarch.dev/restart``).
        phase: the pod phase: Pending, Running, Succeeded, Failed or Unknown.
        exit_code: the trainer container's exit code once it terminated.
        reason: the pod's reason (e.g. Evicted), else the container's terminated or waiting reason.
        message: the termination message (the end of the log on failure), else the pod's message.
        node: the node it was scheduled on.
        deleting: a deletion is under way (deletionTimestamp set).
        ready: the trainer container is ready.
        finished_at: when the trainer container terminated (RFC 3339), to order failures.
    """

    name: str
    rank: int
    restart: int
    phase: str = PENDING
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    node: str | None = None
    deleting: bool = False
    ready: bool = False
    finished_at: str | None = None

    @property
    def finished(self) -> bool:
        """Whether the pod reached Succeeded or Failed."""
        return self.phase in (SUCCEEDED, FAILED)


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the job."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """What one reconcile pass decided; the handler carries it out in this order.

    Attributes:
        status: a JSON merge patch for ``status`` (only what changed; None removes a key), empty
            when nothing changed. Written first, in one patch, so a crash later in the pass
            repeats the same decisions.
        delete: names of pods to delete (a 404 is success).
        create: ranks whose pod to create in attempt ``restart`` (a 409 is success).
        restart: the attempt new pods belong to (and the Service's selector).
        events: Events to post on the job, one per transition.
        delete_job: the job's ttlSecondsAfterFinished has passed: delete the job itself.
        requeue_after: seconds until a time-based transition (deadline, TTL), or None.
    """

    status: dict[str, Any] = field(default_factory=dict)
    delete: tuple[str, ...] = ()
    create: tuple[int, ...] = ()
    restart: int = 0
    events: tuple[Event, ...] = ()
    delete_job: bool = False
    requeue_after: float | None = None


def format_time(t: dt.datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes times."""
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: object) -> dt.datetime | None:
    """Parses a Kubernetes time; None for a missing or malformed one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def _trainer_status(status: Mapping[str, Any]) -> Mapping[str, Any]:
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == names.CONTAINER_NAME:
            return cs
    return {}


def pod_info(body: Mapping[str, Any]) -> PodInfo | None:
    """Summarizes a pod object (as the API server returns it) for the lifecycle.

    Returns None for a pod whose rank or restart label is missing or not a number (not ours).
    """
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        rank = int(labels[names.LABEL_RANK])
        restart = int(labels[names.LABEL_RESTART])
    except (KeyError, TypeError, ValueError):
        return None
    status = body.get("status") or {}
    cs = _trainer_status(status)
    state = cs.get("state") or {}
    terminated = state.get("terminated") or {}
    waiting = state.get("waiting") or {}
    exit_code = terminated.get("exitCode")
    reason = status.get("reason") or terminated.get("reason") or waiting.get("reason")
    message = terminated.get("message") or status.get("message") or waiting.get("message")
    return PodInfo(
        name=str(meta.get("name", "")),
        rank=rank,
        restart=restart,
        phase=status.get("phase") or PENDING,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        reason=reason,
        message=message,
        node=(body.get("spec") or {}).get("nodeName"),
        deleting=bool(meta.get("deletionTimestamp")),
        ready=bool(cs.get("ready")),
        finished_at=terminated.get("finishedAt"),
    )


def _tail(message: str | None) -> str | None:
    if not message:
        return None
    text = "\n".join(message.rstrip().splitlines()[-MESSAGE_LINES:])
    return text[-MESSAGE_CHARS:]


def is_permanent(spec: JobSpec, exit_code: int | None, reason: str | None) -> bool:
    """Whether a failure with this exit code / reason fails the job without a restart."""
    if reason and (reason in spec.permanent_reasons or reason in FATAL_WAITING_REASONS):
        return True
    if exit_code is None or exit_code == 0:
        return False
    if exit_code in spec.permanent_exit_codes:
        return True
    if exit_code in spec.retryable_exit_codes:
        return False
    if exit_code == worker.EX_USAGE:
        return True
    if exit_code == worker.EX_TEMPFAIL:
        return False
    return bool(spec.retryable_exit_codes)


@dataclass(frozen=True)
class _Failure:
    rank: int
    pod: str
    node: str | None
    exit_code: int | None
    reason: str
    message: str | None
    permanent: bool
    order: tuple[str, int]

    def describe(self) -> str:
        what = f"exited {self.exit_code}" if self.exit_code is not None else "was lost"
        where = f" on node {self.node}" if self.node else ""
        text = f"rank {self.rank} (pod {self.pod}{where}) {what}: {self.reason}"
        if self.message:
            last = self.message.strip().splitlines()[-1] if self.message.strip() else ""
            if last:
                text += f": {last[:300]}"
        return text

    def as_status(self, restart: int, now: dt.datetime) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "pod": self.pod,
            "reason": self.reason,
            "restart": restart,
            "permanent": self.permanent,
            "time": format_time(now),
        }
        if self.node:
            out["node"] = self.node
        if self.exit_code is not None:
            out["exitCode"] = self.exit_code
        message = _tail(self.message)
        if message:
            out["message"] = message
        return out


def _failures(job: str, restart: int, spec: JobSpec, phase: str | None, current: Mapping[int, PodInfo],
              procs: int) -> list[_Failure]:
    out: list[_Failure] = []
    for rank, pod in current.items():
        failed = pod.phase == FAILED or (pod.phase == PENDING and pod.reason in FATAL_WAITING_REASONS)
        if failed:
            reason = pod.reason or ("Error" if pod.exit_code else "Failed")
            out.append(
                _Failure(rank, pod.name, pod.node, pod.exit_code, reason, pod.message,
                         is_permanent(spec, pod.exit_code, pod.reason), (pod.finished_at or "~", rank))
            )
        elif pod.deleting and pod.phase != SUCCEEDED:
            out.append(
                _Failure(rank, pod.name, pod.node, None, REASON_POD_DELETED,
                         "the pod was deleted (evicted, drained or deleted by hand) before it finished",
                         is_permanent(spec, None, REASON_POD_DELETED), ("~~", rank))
            )
    if phase == RUNNING:
        for rank in range(procs):
            if rank not in current:
                out.append(
                    _Failure(rank, names.pod_name(job, restart, rank), None, None, REASON_POD_MISSING,
                             "the pod disappeared while the job was running",
                             is_permanent(spec, None, REASON_POD_MISSING), ("~~~", rank))
                )
    return sorted(out, key=lambda f: f.order)


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: dt.datetime,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """Returns ``conditions`` with condition ``type_`` set; lastTransitionTime moves only when the status does."""
    out = [dict(c) for c in conditions]
    for c in out:
        if c.get("type") == type_:
            if c.get("status") != status:
                c["lastTransitionTime"] = format_time(now)
            c.update(status=status, reason=reason, message=message)
            if generation is not None:
                c["observedGeneration"] = generation
            break
    else:
        c = {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": format_time(now)}
        if generation is not None:
            c["observedGeneration"] = generation
        out.append(c)
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(c.get("type", ""), len(order)))


def _clear_condition(conditions: list[dict[str, Any]], type_: str, reason: str, message: str, now: dt.datetime,
                     generation: int | None) -> list[dict[str, Any]]:
    """Sets ``type_`` to False, but only if it is present (absent means never true)."""
    if any(c.get("type") == type_ for c in conditions):
        return set_condition(conditions, type_, "False", reason, message, now, generation)
    return conditions


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``; empty when equal."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value or key not in old:
            patch[key] = value
    return patch


class _Pass:
    """One reconcile pass: accumulates the desired status, deletions, creations and events."""

    def __init__(self, generation: int | None, status: Mapping[str, Any], now: dt.datetime) -> None:
        self.old = dict(status)
        self.new: dict[str, Any] = {k: v for k, v in status.items()}
        self.now = now
        self.generation = generation
        self.events: list[Event] = []
        self.delete: list[str] = []
        self.create: list[int] = []
        self.delete_job = False
        self.requeue: list[float] = []

    @property
    def conditions(self) -> list[dict[str, Any]]:
        return list(self.new.get("conditions") or [])

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        self.new["conditions"] = set_condition(self.conditions, type_, status, reason, message, self.now, self.generation)

    def clear(self, type_: str, reason: str, message: str) -> None:
        self.new["conditions"] = _clear_condition(self.conditions, type_, reason, message, self.now, self.generation)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def plan(self, restart: int) -> Plan:
        if self.generation is not None:
            self.new["observedGeneration"] = self.generation
        return Plan(
            status=merge_patch(self.old, self.new),
            delete=tuple(dict.fromkeys(self.delete)),
            create=tuple(self.create),
            restart=restart,
            events=tuple(self.events),
            delete_job=self.delete_job,
            requeue_after=min(self.requeue) if self.requeue else None,
        )


def _fail(p: _Pass, reason: str, message: str, pods: Iterable[PodInfo]) -> None:
    p.new["phase"] = FAILED
    p.new["completionTime"] = format_time(p.now)
    p.condition(FAILED, "True", reason, message)
    p.clear(RUNNING, reason, "the job failed")
    p.clear(RESTARTING, reason, "the job failed")
    p.event(EVENT_WARNING, reason, message)
    p.delete.extend(pod.name for pod in pods if not pod.finished and not pod.deleting)


def _counts(p: _Pass, current: Mapping[int, PodInfo]) -> None:
    p.new["running"] = sum(1 for pod in current.values() if pod.phase == RUNNING and not pod.deleting)
    p.new["succeeded"] = sum(1 for pod in current.values() if pod.phase == SUCCEEDED)
    p.new["failed"] = sum(1 for pod in current.values() if pod.phase == FAILED)


def reconcile(
    *,
    name: str,
    namespace: str,
    generation: int | None,
    spec: JobSpec | SpecError,
    status: Mapping[str, Any] | None,
    pods: Iterable[PodInfo],
    now: dt.datetime,
) -> Plan:
    """Decides one reconcile pass of an SPMDJob (see the module docstring for the phases).

    Running it again with the same inputs, or with the pods it asked for already present,
    creates nothing new and emits no new Event: every decision follows from ``status`` and the
    pods, and pod names are deterministic.

    Args:
        name: the job's name.
        namespace: the job's namespace.
        generation: ``metadata.generation``, recorded as ``status.observedGeneration``.
        spec: the parsed spec, or the :class:`SpecError` that parsing it raised.
        status: the job's current ``status`` (None or empty for a new job).
        pods: every pod of the job that exists (any attempt), as :class:`PodInfo`.
        now: the current time (timezone-aware).

    Returns:
        The :class:`Plan` to carry out.
    """
    status = dict(status or {})
    pods = list(pods)
    p = _Pass(generation, status, now)
    phase = status.get("phase")
    restart = int(status.get("restarts") or 0)

    if isinstance(spec, SpecError):
        if phase != FAILED:
            message = f"invalid spec: {spec}; fix it and create the job again"
            p.new["failure"] = {"reason": "InvalidSpec", "message": message, "restart": restart,
                                "permanent": True, "time": format_time(now)}
            _fail(p, "InvalidSpec", message, pods)
        return p.plan(restart)

    procs = spec.world_size
    p.new.update(mesh=contract.format_mesh(spec.mesh_pairs), procs=procs, restarts=restart,
                 masterAddr=names.master_addr(name, namespace))
    current = {pod.rank: pod for pod in pods if pod.restart == restart and 0 <= pod.rank < procs}
    current_names = {pod.name for pod in current.values()}
    stale = [pod for pod in pods if pod.name not in current_names]

    # Finished: stop what still runs, keep the rest for its logs; honour the TTL.
    if phase in TERMINAL:
        p.delete.extend(pod.name for pod in pods if not pod.finished and not pod.deleting)
        _counts(p, current)
        done = parse_time(status.get("completionTime"))
        if spec.ttl_seconds_after_finished is not None and done is not None:
            left = (done - now).total_seconds() + spec.ttl_seconds_after_finished
            if left <= 0:
                p.delete_job = True
            else:
                p.requeue.append(left)
        return p.plan(restart)

    # Suspended, or on the way back from it.
    if spec.suspend:
        p.delete.extend(pod.name for pod in pods if not pod.deleting)
        if phase != SUSPENDED:
            p.new["phase"] = SUSPENDED
            p.new.pop("startTime", None)
            p.condition(SUSPENDED, "True", "Suspended", f"spec.suspend is true; {len(pods)} pods deleted")
            p.clear(RUNNING, "Suspended", "the job is suspended")
            p.event(EVENT_NORMAL, "Suspended", f"job suspended; deleting its {len(pods)} pods")
        _counts(p, {})
        return p.plan(restart)
    if phase == SUSPENDED:
        if pods:
            p.delete.extend(pod.name for pod in pods if not pod.deleting)
            p.condition(SUSPENDED, "True", "Resuming", f"waiting for {len(pods)} pods of the suspended gang to terminate")
            return p.plan(restart)
        p.new["phase"] = PENDING
        p.new["startTime"] = format_time(now)
        p.condition("Created", "True", "PodsCreated", f"created {procs} pods for mesh {p.new['mesh']}")
        p.condition(SUSPENDED, "False", "Resumed", "spec.suspend is false")
        p.event(EVENT_NORMAL, "Resumed", f"job resumed; creating {procs} pods (attempt {restart})")
        p.create.extend(range(procs))
        _counts(p, {})
        return p.plan(restart)

    # A new job: create the whole gang.
    if phase is None:
        p.new.update(phase=PENDING, startTime=format_time(now))
        p.condition("Created", "True", "PodsCreated", f"created {procs} pods for mesh {p.new['mesh']}")
        p.event(EVENT_NORMAL, "Created", f"creating {procs} pods for mesh {p.new['mesh']}")
        p.create.extend(r for r in range(procs) if r not in current)
        _counts(p, current)
        return p.plan(restart)

    # Deadline.
    started = parse_time(status.get("startTime"))
    if spec.active_deadline_seconds is not None and started is not None:
        left = (started - now).total_seconds() + spec.active_deadline_seconds
        if left <= 0:
            message = f"the job was active longer than activeDeadlineSeconds ({spec.active_deadline_seconds}s)"
            p.new["failure"] = {"reason": "DeadlineExceeded", "message": message, "restart": restart,
                                "permanent": True, "time": format_time(now)}
            _fail(p, "DeadlineExceeded", message, pods)
            _counts(p, current)
            return p.plan(restart)
        p.requeue.append(left)

    # Pods of an older attempt: delete.
    p.delete.extend(pod.name for pod in stale if not pod.deleting)

    # Failures of the current attempt.
    failures = _failures(name, restart, spec, phase, current, procs)
    if failures:
        permanent = [f for f in failures if f.permanent]
        root = permanent[0] if permanent else failures[0]
        p.new["failure"] = root.as_status(restart, now)
        cause = root.describe()
        if permanent:
            _fail(p, "PermanentFailure", f"{cause}; permanent, no restart", pods)
        elif restart >= spec.max_restarts:
            _fail(p, "RestartLimitExceeded", f"{cause}; restart limit {spec.max_restarts} reached", pods)
        else:
            nxt = restart + 1
            p.new.update(phase=RESTARTING, restarts=nxt)
            message = f"{cause}; replacing the whole gang (restart {nxt} of at most {spec.max_restarts})"
            p.condition(RESTARTING, "True", "GangRestart", message)
            p.clear(RUNNING, "GangRestart", "the gang is being replaced")
            p.event(EVENT_WARNING, "Restarting", message)
            p.delete.extend(pod.name for pod in pods if not pod.deleting)
            p.create.extend(range(procs))
            _counts(p, {})
            return p.plan(nxt)
        _counts(p, current)
        return p.plan(restart)

    # Success: every rank exited 0.
    if len(current) == procs and all(pod.phase == SUCCEEDED for pod in current.values()):
        p.new.update(phase=SUCCEEDED, completionTime=format_time(now))
        p.condition(SUCCEEDED, "True", "AllRanksSucceeded", f"all {procs} ranks exited 0")
        p.clear(RUNNING, "AllRanksSucceeded", "the job finished")
        p.clear(RESTARTING, "AllRanksSucceeded", "the job finished")
        p.event(EVENT_NORMAL, "Succeeded", f"all {procs} ranks exited 0")
        _counts(p, current)
        if spec.ttl_seconds_after_finished is not None:
            p.requeue.append(float(spec.ttl_seconds_after_finished))
        return p.plan(restart)

    # Still starting (or running): (re)create what is missing; Running once every proc runs.
    if phase != RUNNING:
        p.create.extend(r for r in range(procs) if r not in current)
    started_all = len(current) == procs and all(pod.phase in (RUNNING, SUCCEEDED) for pod in current.values())
    if started_all:
        if phase != RUNNING:
            p.new["phase"] = RUNNING
            p.condition(RUNNING, "True", "AllProcsRunning", f"all {procs} procs are running (attempt {restart})")
            p.clear(RESTARTING, "AllProcsRunning", f"attempt {restart} is running")
            p.event(EVENT_NORMAL, "Running", f"all {procs} procs are running (attempt {restart})")
    else:
        running = sum(1 for pod in current.values() if pod.phase == RUNNING)
        waiting = sorted((pod.rank, pod.reason) for pod in current.values() if pod.phase == PENDING and pod.reason)
        message = f"{running}/{procs} procs running"
        if waiting:
            message += "; waiting: " + ", ".join(f"rank {r} {why}" for r, why in waiting[:5])
        p.condition(RUNNING, "False", "WaitingForProcs", message)
    _counts(p, current)
    return p.plan(restart)
