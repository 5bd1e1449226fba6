"""What the lifecycle policies read and what they decide: observed state in, a plan out.

Where it sits: the bottom of :mod:`spmd_operator.lifecycle`, above :mod:`spmd_operator.names`
and :mod:`monarch_spmd.spec`. Plain frozen dataclasses and two functions that summarize API
objects (:func:`pod_info`, :func:`child_info`); nothing here talks to Kubernetes or reads a clock.
"""

from __future__ import annotations

import datetime as dt
import enum
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from monarch_spmd.payload.names import AGENT_TOKEN_VAR, RESTART_COUNT_VAR
from monarch_spmd.spec import JobSpec, SpecError

from .. import names


class Phase(str, enum.Enum):
    """``status.phase``: each member IS its string (the CRD's enum, printer columns and JSON use
    the strings; ``Phase.RUNNING == "Running"``)."""

    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


PENDING: Final = Phase.PENDING
RUNNING: Final = Phase.RUNNING
RESTARTING: Final = Phase.RESTARTING
SUCCEEDED: Final = Phase.SUCCEEDED
FAILED: Final = Phase.FAILED
SUSPENDED: Final = Phase.SUSPENDED
PHASES: Final = tuple(Phase)
TERMINAL: Final = frozenset({SUCCEEDED, FAILED})

#: Condition types, in the order they are listed.
#: Restart in place: whether the operator hears the gang's coordinator (set only once it did
#: not for a while; lifecycle.inplace).
COORDINATOR_REACHABLE: Final = "CoordinatorReachable"
CONDITION_TYPES: Final = ("Created", RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED, COORDINATOR_REACHABLE)

#: Reasons set by the lifecycle itself for a pod lost from under the job (always retryable).
REASON_POD_DELETED: Final = "PodDeleted"
REASON_POD_MISSING: Final = "PodMissing"
#: A pod of the job could not be scheduled within spec.scheduling.timeoutSeconds.
REASON_SCHEDULING_TIMEOUT: Final = "SchedulingTimeout"
#: Monarch mode: a host's worker loop exited 0 (a client shut the host mesh down). A Monarch-mode
#: pod serves until the job ends, so this is a lost host, never success (always retryable).
REASON_MONARCH_HOST_EXITED: Final = "MonarchHostExited"

EVENT_NORMAL: Final = "Normal"
EVENT_WARNING: Final = "Warning"

#: A pod lost with its node: its agent fell silent while the pod still showed Running
#: (lifecycle.inplace.node_losses).
REASON_NODE_LOST: Final = "NodeLost"

#: What :attr:`Observed.configmap` may say about the namespace's payload ConfigMap.
CONFIGMAP_MISSING: Final = "missing"
CONFIGMAP_CURRENT: Final = "current"


@dataclass(frozen=True)
class PodInfo:
    """What the lifecycle needs to know about one pod of a job (see :func:`pod_info`).

    Attributes:
        name: the pod's name.
        rank: its (first) global rank (label ``spmd.monarch.dev/rank``).
        restart: its gang attempt (label ``spmd.monarch.dev/restart``).
        phase: the pod phase: Pending, Running, Succeeded, Failed or Unknown.
        exit_code: the trainer container's exit code once it terminated.
        reason: the disruption reason if the cluster took the pod away, else the pod's reason
            (e.g. Evicted), else the container's terminated or waiting reason.
        message: the disruption's message, the termination message (the end of the log on
            failure), the pod's message or the waiting message, in that order.
        node: the node it was scheduled on.
        deleting: a deletion is under way (deletionTimestamp set).
        finished_at: when the trainer container terminated (RFC 3339), to order failures.
        disrupted: the pod carries the condition DisruptionTarget (preempted, evicted, its node
            drained or lost): a failure the cluster caused, which does not use up maxRestarts.
        unschedulable: the scheduler's message while the pod cannot be placed.
        created: when the pod was created (RFC 3339): how long it has been waiting.
        ready: the pod's condition Ready is True (Monarch mode: its worker loop accepts
            connections, as its readiness probe found).
        uid: the pod's uid.
        ip: the pod's IP once it has one.
        agent_port: the restart-in-place coordinator's container port (``spmd-agent``) the pod
            declares, None when its gang does not restart in place (RecreatePods, or a pod of an
            older operator version).
        replacement: 0 for a pod of the gang; n for the n-th pod created alone in place of a
            lost one of the same index (label ``spmd.monarch.dev/replacement``).
        joins: for a replacement, the round its processes first join (its trainer's
            MONARCH_SPMD_RESTART_COUNT); None for a pod of the gang.
        agent_token: its attempt's proof of membership (the trainer's MONARCH_SPMD_AGENT_TOKEN):
            the observer's hello carries it, a replacement gets it; None when it has none.
        spare: a hot spare's index (label ``spmd.monarch.dev/spare``, no rank label: ``rank`` is
            -1); None for a pod of the gang (a spare that took a lost pod's place is one).
        deleted_at: when its deletion was asked (RFC 3339, ``deletionTimestamp``), if it was.
        avoids: the nodes its required node affinity keeps it off (``kubernetes.io/hostname
            NotIn``: nodes lost when it was created).
        node_silent: its node stopped reporting: the pod shows Running, its condition Ready is
            False and ContainersReady True (the node controller marks a node's pods not ready
            after its grace, 40 s, without touching ContainersReady, which the kubelet sets).
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
    finished_at: str | None = None
    disrupted: bool = False
    unschedulable: str | None = None
    created: str | None = None
    ready: bool = False
    uid: str = ""
    ip: str | None = None
    agent_port: int | None = None
    replacement: int = 0
    joins: int | None = None
    agent_token: str | None = field(default=None, repr=False)
    spare: int | None = None
    deleted_at: str | None = None
    avoids: tuple[str, ...] = ()
    node_silent: bool = False

    @property
    def finished(self) -> bool:
        """Whether the pod reached Succeeded or Failed."""
        return self.phase in (SUCCEEDED, FAILED)


def _trainer_status(status: Mapping[str, Any]) -> Mapping[str, Any]:
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == names.CONTAINER_NAME:
            return cs
    return {}


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    for c in status.get("conditions") or []:
        if c.get("type") == type_:
            return c
    return {}


class _NoRank(Exception):
    """A pod of the job that runs no rank."""


def pod_info(body: Mapping[str, Any]) -> PodInfo | None:
    """Summarizes a pod object (as the API server returns it) for the lifecycle.

    Returns None for a pod whose rank or restart label is missing or not a number (not ours).
    """
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    spare: int | None = None
    try:
        if labels.get(names.LABEL_ROLE) == names.ROLE_LIGHTHOUSE:
            raise _NoRank  # the Lighthouse of a job with replica groups: rank -1, no gang's
        restart = int(labels[names.LABEL_RESTART])
        if names.LABEL_RANK not in labels and names.LABEL_SPARE in labels:
            rank, spare = -1, int(labels[names.LABEL_SPARE])
            if spare < 0:
                return None
        else:
            rank = int(labels[names.LABEL_RANK])
    except _NoRank:
        restart, rank = 0, -1
    except (KeyError, TypeError, ValueError):
        return None
    status = body.get("status") or {}
    cs = _trainer_status(status)
    state = cs.get("state") or {}
    terminated = state.get("terminated") or {}
    waiting = state.get("waiting") or {}
    disruption = _condition(status, "DisruptionTarget")
    disrupted = disruption.get("status") == "True"
    scheduled = _condition(status, "PodScheduled")
    unschedulable = scheduled.get("message") if scheduled.get("status") == "False" else None
    exit_code = terminated.get("exitCode")
    try:
        replacement = int(labels.get(names.LABEL_REPLACEMENT) or 0)
    except (TypeError, ValueError):
        replacement = 0
    if disrupted:
        reason = disruption.get("reason") or status.get("reason") or "Disrupted"
        message = disruption.get("message") or status.get("message")
    else:
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
        finished_at=terminated.get("finishedAt"),
        disrupted=disrupted,
        unschedulable=unschedulable,
        created=meta.get("creationTimestamp"),
        ready=_condition(status, "Ready").get("status") == "True",
        uid=str(meta.get("uid") or ""),
        ip=status.get("podIP") or None,
        agent_port=_agent_port(body.get("spec") or {}),
        replacement=max(0, replacement),
        joins=_joins(body.get("spec") or {}) if replacement > 0 else None,
        agent_token=_env_value(body.get("spec") or {}, AGENT_TOKEN_VAR) if replacement == 0 and spare is None else None,
        spare=spare,
        deleted_at=meta.get("deletionTimestamp") or None,
        avoids=_avoided(body.get("spec") or {}),
        node_silent=(status.get("phase") == RUNNING and _condition(status, "Ready").get("status") == "False"
                     and _condition(status, "ContainersReady").get("status") == "True"),
    )


def _avoided(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The nodes a pod's required node affinity keeps it off by name (hostname NotIn)."""
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    out: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        for expression in (term or {}).get("matchExpressions") or []:
            if expression.get("key") == "kubernetes.io/hostname" and expression.get("operator") == "NotIn":
                out.update(str(v) for v in expression.get("values") or [])
    return tuple(sorted(out))


def _trainer(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    for c in spec.get("containers") or []:
        if c.get("name") == names.CONTAINER_NAME:
            return c
    return {}


def _env_value(spec: Mapping[str, Any], name: str) -> str | None:
    """The literal value of the trainer's env variable ``name``, if it sets one."""
    for e in _trainer(spec).get("env") or []:
        if e.get("name") == name and isinstance(e.get("value"), str):
            return sys.intern(str(e["value"]))  # one copy per attempt, however many pods
    return None


def _joins(spec: Mapping[str, Any]) -> int | None:
    """The round a replacement's processes first join: its trainer's MONARCH_SPMD_RESTART_COUNT."""
    for e in _trainer(spec).get("env") or []:
        if e.get("name") == RESTART_COUNT_VAR:
            try:
                return int(e.get("value"))
            except (TypeError, ValueError):
                return None
    return None


def _agent_port(spec: Mapping[str, Any]) -> int | None:
    """The trainer's container port named ``spmd-agent`` (the restart-in-place coordinator's)."""
    for port in _trainer(spec).get("ports") or []:
        if port.get("name") == names.AGENT_PORT_NAME and isinstance(port.get("containerPort"), int):
            return int(port["containerPort"])
    return None


@dataclass(frozen=True)
class ChildInfo:
    """A Service or ConfigMap of a job, as the controller's caches keep it.

    Attributes:
        name: the object's name.
        restart: its attempt label, if any (the per-attempt master Services carry one).
        payload_hash: the ConfigMap's payload-hash annotation, if any.
        deleting: a deletion is under way.
    """

    name: str
    restart: int | None = None
    payload_hash: str | None = None
    deleting: bool = False


def child_info(body: Mapping[str, Any]) -> ChildInfo:
    """Summarizes a Service or ConfigMap for the lifecycle."""
    meta = body.get("metadata") or {}
    try:
        restart: int | None = int((meta.get("labels") or {})[names.LABEL_RESTART])
    except (KeyError, TypeError, ValueError):
        restart = None
    return ChildInfo(
        name=str(meta.get("name", "")),
        restart=restart,
        payload_hash=(meta.get("annotations") or {}).get(names.PAYLOAD_HASH_ANNOTATION),
        deleting=bool(meta.get("deletionTimestamp")),
    )


@dataclass(frozen=True)
class WorkloadInfo:
    """The job's Kueue Workload, as far as the lifecycle cares.

    Attributes:
        name: its name.
        admitted: Kueue admitted it (quota reserved, admission checks passed).
        evicted: the reason Kueue evicted it (preemption, inactivation ...), while it is.
        message: Kueue's message about its state (why it waits, why it was evicted).
        finished: the operator marked it finished.
        reserved: quota is still reserved for it (``status.admission`` present).
        flavors: the ResourceFlavors of its admission (their node labels go onto the pods).
    """

    name: str
    admitted: bool = False
    evicted: str | None = None
    message: str | None = None
    finished: bool = False
    reserved: bool = False
    flavors: tuple[str, ...] = ()


def _true(conditions: list[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    for c in conditions:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def workload_info(body: Mapping[str, Any]) -> WorkloadInfo:
    """Summarizes a Kueue Workload: admitted, evicted, finished."""
    status = body.get("status") or {}
    conditions = list(status.get("conditions") or [])
    admitted = _true(conditions, "Admitted")
    evicted = _true(conditions, "Evicted")
    pending = next((c for c in conditions if c.get("type") == "QuotaReserved"), None)
    message = (evicted or admitted or pending or {}).get("message")
    admission = status.get("admission") or {}
    flavors = sorted({f for a in admission.get("podSetAssignments") or [] for f in (a.get("flavors") or {}).values()})
    return WorkloadInfo(
        name=str((body.get("metadata") or {}).get("name", "")),
        admitted=admitted is not None and evicted is None and bool(admission),
        evicted=(evicted or {}).get("reason") or ("Evicted" if evicted else None),
        message=message,
        finished=_true(conditions, "Finished") is not None,
        reserved=bool(admission),
        flavors=tuple(flavors),
    )


@dataclass(frozen=True)
class Refusal:
    """The API server refused to create a child of the job (what :mod:`.refusal` acts on).

    Attributes:
        kind: the child's kind: Pod, Service, ConfigMap, PodGroup or Workload.
        name: the child's name.
        code: the HTTP status: 403 (a ResourceQuota, Pod Security admission, another admission
            plugin or RBAC said no), 400 or 422 (the object is invalid).
        reason: the Status reason (Forbidden, Invalid, BadRequest ...).
        message: the API server's message.
        at: when it happened (RFC 3339): a refusal seen again in a later pass is not a new one.
        index: a pod's index in its attempt, else None.
    """

    kind: str
    name: str
    code: int
    reason: str
    message: str
    at: str
    index: int | None = None


#: A ``takeover`` event's state when the spare never said hello in the member's place.
TAKEOVER_FAILED: Final = "failed"


@dataclass(frozen=True)
class CoordinatorView:
    """What the operator heard from a gang's restart-in-place coordinator (the agent of its rank-0
    pod) over the observer protocol (docs/restart-in-place.md): the controller's observer keeps
    it, the lifecycle reads it. Events are the protocol's JSON objects, each with ``received``
    added: when the operator heard it (Unix time).

    Attributes:
        pod: the pod (rank 0 of the gang) whose coordinator this is.
        connected: a connection is open and its ``welcome`` was read.
        error: why the last connection attempt failed or ended, if it did.
        since: when the operator began to connect (Unix time).
        dark_since: while not connected, since when (Unix time: the first try, or the last drop).
        round: the coordinator's current round (from ``welcome``, then its events).
        phase: ``joining``, ``running``, ``stopping``, ``finished`` or ``failed``.
        restarts: every ``restart`` event (the decision to restart in place), oldest first.
        rounds: every ``round`` event (a round opened, with its back-off).
        started: every ``started`` event (a round's barrier closed: its processes start).
        all_running: every ``all_running`` event (a round's processes all started).
        lost: every ``lost`` event (a member's agent gone).
        final: the ``failed`` or ``succeeded`` event, once there is one.
        progress: the latest ``progress`` event (the stalest rank of the running round).
        takeovers: every ``takeover`` event (a hot spare given a lost member's place).
        spares_ready: hot spares connected and waiting, as the latest ``spare`` or ``takeover``
            event said (None before any).
    """

    pod: str
    connected: bool = False
    error: str | None = None
    since: float | None = None
    dark_since: float | None = None
    round: int | None = None
    phase: str | None = None
    restarts: tuple[Mapping[str, Any], ...] = ()
    rounds: tuple[Mapping[str, Any], ...] = ()
    started: tuple[Mapping[str, Any], ...] = ()
    all_running: tuple[Mapping[str, Any], ...] = ()
    lost: tuple[Mapping[str, Any], ...] = ()
    final: Mapping[str, Any] | None = None
    progress: Mapping[str, Any] | None = None
    takeovers: tuple[Mapping[str, Any], ...] = ()
    spares_ready: int | None = None

    def taken_over(self) -> dict[int, Mapping[str, Any]]:
        """Each member whose place a spare took, with its latest ``takeover`` event (one whose
        spare never arrived, ``state`` failed, gives the place back)."""
        out: dict[int, Mapping[str, Any]] = {}
        for event in self.takeovers:
            member = event.get("member")
            if isinstance(member, int) and not isinstance(member, bool):
                out[member] = event
        return {m: e for m, e in out.items() if e.get("state") != TAKEOVER_FAILED}

    @property
    def heard(self) -> bool:
        """Whether a ``welcome`` was ever read (the state is the coordinator's, not a guess)."""
        return self.phase is not None

    def running_round(self, round_: int) -> Mapping[str, Any] | None:
        """The ``all_running`` event of round ``round_``, if the coordinator sent it."""
        return next((e for e in self.all_running if e.get("round") == round_), None)

    def round_started(self, round_: int) -> bool:
        """Whether round ``round_``'s barrier closed (its processes were started)."""
        return any(e.get("round") == round_ for e in self.started)

    def round_event(self, round_: int) -> Mapping[str, Any] | None:
        """The ``round`` event that opened round ``round_``, if heard."""
        return next((e for e in reversed(self.rounds) if e.get("round") == round_), None)

    def open_round(self) -> int | None:
        """The round a member joining now is put in: the open one, or the next while one runs."""
        if self.round is None or self.phase in (None, "finished", "failed"):
            return None
        return self.round if self.phase == "joining" else self.round + 1


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile pass reads.

    Attributes:
        job: the job's identity.
        generation: ``metadata.generation``.
        spec: the parsed spec, or the :class:`SpecError` that parsing it raised.
        status: the job's current ``status`` (empty for a new job).
        pods: every pod the job owns (controller owner reference = its uid), any attempt.
        gone: the last states of pods of the job deleted recently (from the watch's DELETED
            events): why a pod that went missing is gone, when the cluster said so.
        services: the job's Services that exist.
        configmap: whether the namespace's ConfigMap of the operator's payload exists (current)
            or not (missing); the job's jobs share it.
        podgroups: the job's PodGroups (Volcano or coscheduling), one per attempt.
        workload: the job's Kueue Workload, None when it does not exist.
        rejection: the API server's latest refusal to create a child (a pod built from the
            template, its Service, ConfigMap, PodGroup or Workload), from the previous pass;
            None once a pass created what it tried to.
        outdated: what the spec breaks of rules that came after the job was stored (the spec
            parsed anyway: :func:`monarch_spmd.spec.parse_stored`).
        unavailable: (reason, message) when an optional API the job names (Kueue Workloads,
            PodGroups) cannot be used: forbidden by RBAC or not installed; else None.
        coordinator: restart in place: what the operator heard from the coordinator of the
            current gang (its rank-0 pod's agent), or None when it never connected to it.
        now: the current time (timezone-aware).
        spares: the job's hot spare pods still waiting (any attempt; ``pods`` has none of them).
    """

    job: names.JobRef
    generation: int | None
    spec: JobSpec | SpecError
    status: Mapping[str, Any]
    pods: tuple[PodInfo, ...] = ()
    gone: tuple[PodInfo, ...] = ()
    services: tuple[ChildInfo, ...] = ()
    configmap: str = CONFIGMAP_CURRENT
    podgroups: tuple[ChildInfo, ...] = ()
    workload: WorkloadInfo | None = None
    rejection: Refusal | None = None
    outdated: tuple[SpecError, ...] = ()
    unavailable: tuple[str, str] | None = None
    coordinator: CoordinatorView | None = None
    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    spares: tuple[PodInfo, ...] = ()
    #: Names of children this operator created that its informers do not show yet (a create's
    #: answer comes before the watch's event): a pass counts them as there.
    creating: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the job."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """What one reconcile pass decided; the controller carries it out in this order.

    Attributes:
        status: a JSON merge patch for ``status`` (only what changed; None removes a key), empty
            when nothing changed. Written first, in one patch, so a crash later in the pass
            repeats the same decisions.
        delete_pods: names of pods to delete (a 404 is success).
        delete_services: names of Services to delete (those of attempts other than the current).
        configmap: create the namespace's payload ConfigMap (it is missing).
        service: the attempt whose master Service must be created (it is missing), or None.
        podgroup: the attempt whose PodGroup must be created (it is missing), or None.
        delete_podgroups: names of PodGroups of other attempts to delete.
        workload: create the job's Kueue Workload (it is missing).
        finish_workload: mark the Workload finished (the job ended): Kueue frees its quota.
        release_workload: Kueue evicted the job and its pods are gone: give the quota back.
        create: indices of the pods to create in attempt ``restart`` (a 409 is checked).
        restart: the attempt new pods belong to.
        events: Events to post on the job, one per transition.
        delete_job: the job's ttlSecondsAfterFinished has passed: delete the job itself.
        requeue_after: seconds until a time-based transition (deadline, TTL, replacement
            timeout), or None.
        pods_lost: the pass's decision follows from pods deleted or missing; the controller
            checks the namespace is not being deleted before it writes anything.
        replace: restart in place: ``(index, replacement)`` of each pod to create alone in
            attempt ``restart``'s gang, in place of a lost one (a 409 is checked).
        replace_round: the round (MONARCH_SPMD_RESTART_COUNT) those pods join.
        disruptions: MONARCH_SPMD_DISRUPTIONS of the pods created (status.disruptions).
        avoid_nodes: nodes the pods created must not be scheduled on (a node lost under the
            previous attempt, before the node controller marks it NotReady).
        spares: indices of the hot spare pods to create in attempt ``spare_restart``.
        spare_restart: the attempt those spares belong to.
        adopt: ``(pod name, index, replacement)`` of each hot spare's pod that took the place of
            pod ``index`` of the current gang: relabel it as that pod's replacement.
    """

    status: dict[str, Any] = field(default_factory=dict)
    delete_pods: tuple[str, ...] = ()
    delete_services: tuple[str, ...] = ()
    configmap: bool = False
    service: int | None = None
    podgroup: int | None = None
    delete_podgroups: tuple[str, ...] = ()
    workload: bool = False
    finish_workload: bool = False
    release_workload: bool = False
    create: tuple[int, ...] = ()
    restart: int = 0
    events: tuple[Event, ...] = ()
    delete_job: bool = False
    requeue_after: float | None = None
    pods_lost: bool = False
    replace: tuple[tuple[int, int], ...] = ()
    replace_round: int = 0
    disruptions: int = 0
    avoid_nodes: tuple[str, ...] = ()
    spares: tuple[int, ...] = ()
    spare_restart: int = 0
    adopt: tuple[tuple[str, int, int], ...] = ()


def format_time(t: dt.datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes times."""
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: object) -> dt.datetime | None:
    """Parses a Kubernetes time (RFC 3339, ``Z`` or an offset, any fraction of a second); None for
    a missing or malformed one. The operator's one time parser."""
    if not isinstance(text, str) or not text:
        return None
    text = text.strip().replace("Z", "+00:00").replace("z", "+00:00")
    if "." in text:  # Python 3.10 takes at most 6 digits of fraction; the API server may send 9
        head, _, rest = text.partition(".")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
