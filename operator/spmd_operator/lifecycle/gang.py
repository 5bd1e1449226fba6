"""The gang: create the first attempt, replace it after a failure, and report it Running.

Creating: a new job creates every pod of attempt 0 and goes Pending. A pod of a starting gang
that goes missing is created again; once the job is Running a missing pod is a failure
(:mod:`.failure`). The job is Running when every pod of the current attempt runs (or already
succeeded); in Monarch mode when every pod is also Ready (its worker loop listens: a client may
attach as soon as the job says Running); until then the Running condition says how many run and why the others wait (the
scheduler's message, an image that cannot be pulled).

Replacing (``spec.restartPolicy.podReplacementPolicy``): every pod of the failed attempt is
deleted at once. With ``Failed`` (the default) the next attempt's pods are created only once no
pod of an older attempt is left running or terminating, as torchrun stops its whole local group
before starting the next one: two gangs never run at once (no race on a checkpoint, and the GPUs
are free again). If old pods are still there after ``replacementTimeoutSeconds`` (a node that
stopped answering keeps its pods terminating), the attempt is created anyway and a Warning Event
says so. With ``TerminatingOrFailed`` the next attempt is created at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from monarch_spmd import policy

from .. import names
from . import inplace
from .model import (
    EVENT_NORMAL,
    EVENT_WARNING,
    PENDING,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    PodInfo,
    format_time,
    parse_time,
)

UNSCHEDULABLE: str = "Unschedulable"
from .status import Pass

WAIT_FOR_TERMINATION: str = "Failed"
REPLACE_AT_ONCE: str = "TerminatingOrFailed"


def start(p: Pass) -> None:
    """A new job: phase Pending, and every pod of the first attempt."""
    pods = p.pods_per_attempt
    p.new.update(phase=PENDING, startTime=format_time(p.now))
    p.condition("Created", "True", "PodsCreated", f"created {pods} pods for mesh {p.new['mesh']}")
    p.event(EVENT_NORMAL, "Created", f"creating {pods} pods for mesh {p.new['mesh']}")
    current = p.current()
    p.create_pods((i for i in range(pods) if i not in current), p.gang)
    # The Running condition goes with the first status ("0/N procs running"), not in a status
    # patch of its own when the pods first show up: one write fewer per job.
    _waiting(p, current)
    p.counts(current)


def replace(p: Pass, nxt: int, why: str) -> None:
    """Replaces the whole gang by attempt ``nxt`` after a retryable failure."""
    p.new.update(phase=RESTARTING, restarts=nxt)
    p.new.pop("gangRestart", None)  # a new gang: its pods are those of attempt nxt
    p.new["masterAddr"] = names.master_addr(p.o.job, nxt)
    message = f"{why}; replacing the whole gang (attempt {nxt})"
    p.condition(RESTARTING, "True", "GangRestart", message)
    p.clear(RUNNING, "GangRestart", "the gang is being replaced")
    p.event(EVENT_WARNING, "Restarting", message)
    p.delete_pods.extend(pod.name for pod in p.o.pods if not pod.deleting)
    p.counts({})
    if p.spec.pod_replacement_policy == REPLACE_AT_ONCE:
        p.create_pods(range(p.pods_per_attempt), nxt)


def older_spares(p: Pass) -> list[PodInfo]:
    """The hot spares of attempts before the one the pass works on."""
    return [s for s in p.o.spares if s.restart != p.restart]


def _there_when_lost(pod: PodInfo, remembered: dict[str, dt.datetime | None]) -> bool:
    """Whether ``pod`` was on its node when the node was judged lost (a remembered loss): created
    before that second (one created in the same second may have come after: it is waited for)."""
    if pod.node not in remembered:
        return False
    at, created = remembered[pod.node], parse_time(pod.created)
    return at is None or created is None or created < at


def _old_pods_block(p: Pass) -> bool:
    """Whether the next attempt must still wait for pods of older attempts to go away, their hot
    spares included: a spare the old coordinator assigned a place before its SIGTERM came runs that
    member's ranks (the kubelet may be seconds late with it)."""
    blocking = [pod for pod in (*p.stale(), *older_spares(p)) if pod.phase not in (SUCCEEDED, "Failed")]
    if not blocking or p.spec.pod_replacement_policy == REPLACE_AT_ONCE:
        return False
    since = parse_time((p.o.status.get("failure") or {}).get("time")) or p.now
    # A node remembered as lost holds up none of the pods that were on it when it was lost; a pod
    # created there after it (the node answered again and took it) is waited for as any other.
    remembered = {node: parse_time(at) for node, at in p.remembered_lost_nodes().items()}
    lost: set[str] = set()
    if inplace.lost_node(p) is not None:
        lost.add(str(inplace.lost_node(p)))
    # The pods of a node judged lost answer nobody (their deletion waits for the node controller,
    # minutes) and hold nothing up: their agents fenced themselves (docs/restart-in-place.md,
    # "Invariants": a node is judged lost NODE_LOST_WAIT_SECONDS after its agent fell silent, by
    # when an agent cut off but running has ended its processes; one frozen ends them within
    # FENCE_SECONDS of its thaw). The new attempt keeps off those nodes.
    # So do the pods deleted well past their grace that still show Running (their kubelet does
    # not answer: their nodes are taken for lost).
    for pod in blocking:
        if pod.node and pod.deleting and inplace.overdue(p, pod):
            p.lost_nodes.add(pod.node)
            lost.add(pod.node)
    blocking = [pod for pod in blocking if pod.node not in lost and not _there_when_lost(pod, remembered)]
    if not blocking:
        return False
    limit = p.spec.replacement_timeout_seconds
    waited = (p.now - since).total_seconds()
    if waited < limit:
        p.condition(RESTARTING, "True", "WaitingForOldPods",
                    f"waiting for {len(blocking)} pods of the previous attempt to terminate before creating "
                    f"attempt {p.restart} ({int(waited)}s of at most {limit}s; restartPolicy.podReplacementPolicy)")
        p.requeue.append(limit - waited)
        return True
    if not p.current():
        p.event(EVENT_WARNING, "ReplacementTimeout",
                f"{len(blocking)} pods of the previous attempt still terminating after {limit}s "
                f"(e.g. {blocking[0].name}); creating attempt {p.restart} anyway")
    return False


#: Waiting reasons worth a Warning Event when they first appear: the job will not start by itself.
_PROBLEMS: frozenset[str] = frozenset({UNSCHEDULABLE, *policy.START_FAILURE_REASONS})


def _waiting(p: Pass, current: dict[int, PodInfo]) -> None:
    """The Running condition (False) says how many procs run and why the others wait.

    Its reason is the most telling waiting reason (Unschedulable with the scheduler's message, an
    image that cannot be pulled ...) and a Warning Event follows when such a reason appears, so a
    job never sits Pending without saying why.
    """
    running = p.procs_per_pod * sum(1 for pod in current.values() if pod.phase == RUNNING)
    waiting = sorted((i, UNSCHEDULABLE if pod.unschedulable else pod.reason, pod.unschedulable or pod.message)
                     for i, pod in current.items() if pod.phase == PENDING and (pod.reason or pod.unschedulable))
    message = f"{running}/{p.spec.world_size} procs running"
    reason = "WaitingForProcs"
    if waiting:
        message += "; waiting: " + "; ".join(
            f"{p.describe(i)} {why}" + (f" ({detail})" if detail else "") for i, why, detail in waiting[:5])
        problems = [why for _, why, _ in waiting if why in _PROBLEMS]
        reason = problems[0] if problems else waiting[0][1] or reason
    before = next((c for c in p.conditions if c.get("type") == RUNNING), {})
    p.condition(RUNNING, "False", reason, message)
    if reason in _PROBLEMS and before.get("reason") != reason:
        p.event(EVENT_WARNING, reason, message)


def kept_off_needlessly(p: Pass, pods: Iterable[PodInfo]) -> list[PodInfo]:
    """Pods the scheduler cannot place that keep off a node no longer judged lost (it answers
    again: its old pods ended): a pod's node affinity cannot change, so such a pod is deleted and
    created again without it (a cluster with no node to spare would otherwise wait forever)."""
    keep_off = set(p.avoid_nodes())
    return [pod for pod in pods if pod.phase == PENDING and pod.unschedulable and not pod.deleting
            and pod.node is None and set(pod.avoids) - keep_off]


def progress(p: Pass) -> None:
    """Deletes stale pods, creates what the starting gang misses, and reports Running."""
    current = p.current()
    pods = p.pods_per_attempt
    p.delete_pods.extend(pod.name for pod in p.stale() if not pod.deleting)
    p.delete_pods.extend(pod.name for pod in kept_off_needlessly(p, current.values()))
    if p.phase != RUNNING and not p.in_place_round:
        missing = [i for i in range(pods) if i not in current]
        if missing and not (p.phase == RESTARTING and _old_pods_block(p)):
            p.create_pods(missing, p.gang)
    if p.in_place_round:
        # The pods stay through a restart in place: their processes, not their phase, say when the
        # gang runs again, and only the coordinator knows (lifecycle.inplace).
        p.counts(current)
        return
    started = len(current) == pods and all(pod.phase in (RUNNING, SUCCEEDED) for pod in current.values())
    monarch = p.spec.mode == names.MODE_MONARCH
    unready = started and monarch and p.phase != RUNNING and not all(pod.ready for pod in current.values())
    if unready:
        ready = sum(1 for pod in current.values() if pod.ready)
        p.condition(RUNNING, "False", "WaitingForMonarchHosts",
                    f"{ready}/{pods} pods Ready: waiting for every pod's Monarch worker loop to listen "
                    f"(its readiness probe, port {names.MONARCH_PORT_NAME})")
    elif started:
        if p.phase != RUNNING:
            p.new["phase"] = RUNNING
            every = p.spec.world_size
            what = (f"all {pods} Monarch hosts are ready for a client ({every} procs)" if monarch
                    else f"all {every} procs are running")
            p.condition(RUNNING, "True", "AllProcsRunning", f"{what} (attempt {p.restart})")
            p.clear(RESTARTING, "AllProcsRunning", f"attempt {p.restart} is running")
            p.event(EVENT_NORMAL, "Running", f"{what} (attempt {p.restart})")
    elif current:
        _waiting(p, current)
    p.counts(current)
