"""Failures of the current attempt: find the root cause, then restart the gang or fail the job.

A failure is a pod of the current attempt in phase Failed, a pod stuck on an image that can never
be pulled, a pod being deleted (evicted, drained, ``kubectl delete``) before it finished, or,
once the job is Running, a pod gone missing; in Monarch mode also a pod whose worker loop exited
0 (reason MonarchHostExited: its pods serve until the job ends). Which one is the root cause: a permanent failure if
there is one, else a disruption (the cluster took a pod away; the other ranks' errors are its
consequence), else the rank whose trainer terminated first. Whether it is permanent is
:func:`monarch_spmd.policy.is_permanent`, the rule the local runner applies too.

A container that cannot start (ErrImagePull, ImagePullBackOff, CreateContainerConfigError ...:
:data:`monarch_spmd.policy.START_FAILURE_REASONS`) fails the attempt once the problem has lasted
:data:`~monarch_spmd.policy.START_FAILURE_SECONDS`, counted from when the operator first saw it,
not from the pod's creation (a pod that waited an hour for a node and then met one pull error is
not failed at once). When it was first seen is kept in ``status.startFailures`` (an operator
restart does not reset it); a problem that clears (the container starts, or waits for another
reason) is forgotten. Such a failure is retryable (a registry that was down, a Secret created
late) unless :func:`monarch_spmd.policy.start_failure_is_permanent` says otherwise
(CreateContainerConfigError, or a reason in ``permanentReasons``); InvalidImageName and
ErrImageNeverPull fail at once.

On a retryable failure the whole gang is replaced (every pod deleted, the next attempt created
by :mod:`.gang`), unless ``maxRestarts`` is used up. Disruptions (preemption, eviction, node
drain or loss: the pod condition DisruptionTarget) restart the gang without using up
``maxRestarts``; ``status.disruptions`` counts them, ``status.restarts`` counts every attempt.
"""

from __future__ import annotations

import re
from typing import Any, Final

from monarch_spmd import policy
from monarch_spmd.payload.names import EX_TEMPFAIL

from .. import names
from . import badnodes, gang, inplace, refusal
from .model import (
    FAILED,
    PENDING,
    REASON_MONARCH_HOST_EXITED,
    REASON_POD_DELETED,
    REASON_POD_MISSING,
    REASON_SCHEDULING_TIMEOUT,
    RUNNING,
    SUCCEEDED,
    PodInfo,
    format_time,
    parse_time,
)
from .status import Failure, Pass

#: The last line a PerHost worker writes when one of its procs failed (payload.worker.failure_line).
_FAILED_RANK: Final = re.compile(r"monarch-spmd worker: rank (\d+) exited with code (\d+)")
#: Why an agent gave its gang up (exit 75): its last line (payload.agent ``_give_up``, or the
#: coordinator's fallback verdict).
_GAVE_UP: Final = re.compile(r"the gang must be recreated: (\w+)|\((\w+)\); the gang must be recreated")
#: Reasons an agent gives a gang up for that are not the program's failure: its coordinator lost
#: or unreachable (rank 0's pod or node gone), superseded by a newer pod of its member, a round
#: that never came together, a member that never stopped. RepeatedFailure (one member failing
#: again and again) is the program's.
GAVE_UP_DISRUPTIONS: Final = frozenset({"CoordinatorLost", "CoordinatorUnreachable", "Superseded", "RoundTimeout",
                                        "NotStopped", "MemberLost"})


def gave_up(pod: PodInfo) -> str | None:
    """Why the agent of a pod that exited 75 gave its gang up (CoordinatorLost ...), if it said."""
    if pod.exit_code != EX_TEMPFAIL or not pod.message:
        return None
    found = _GAVE_UP.findall(pod.message)
    if not found:
        return None
    first, second = found[-1]
    return first or second


def failed_rank(p: Pass, pod: PodInfo) -> int:
    """The rank that failed in a pod: the pod's rank, or (PerHost) the one its worker named."""
    if p.procs_per_pod > 1 and pod.message:
        found = _FAILED_RANK.findall(pod.message)
        if found:
            return int(found[-1][0])
    return pod.rank


def _stuck(p: Pass, pod: PodInfo, starts: dict[str, dict[str, Any]]) -> tuple[str, str, bool] | None:
    """A Pending pod that has waited past its limit: (reason, message, permanent), else None.

    A container that cannot start fails the attempt once the problem has lasted
    START_FAILURE_SECONDS since it was first seen (``starts``, from status.startFailures, gets
    the pod's entry); a pod the scheduler cannot place fails the job after
    ``spec.scheduling.timeoutSeconds`` since its creation, when set. Until then the pass asks to
    be woken when the limit passes.
    """
    if pod.phase != PENDING:
        return None
    if pod.reason in policy.START_FAILURE_REASONS:
        seen = parse_time((p.o.status.get("startFailures") or {}).get(pod.name, {}).get("since"))
        since = seen or p.now
        starts[pod.name] = {"reason": pod.reason or "", "since": format_time(since)}
        limit = policy.START_FAILURE_SECONDS
        waited = (p.now - since).total_seconds()
        if waited < limit:
            p.requeue.append(limit - waited)
            return None
        message = (f"the container could not start for {int(waited)}s since {format_time(since)} "
                   f"(limit {int(limit)}s): {pod.message or pod.reason}")
        return pod.reason or "", message, policy.start_failure_is_permanent(p.spec, pod.reason)
    created = parse_time(pod.created)
    if pod.unschedulable and p.spec.scheduling_timeout_seconds is not None and created is not None:
        limit = float(p.spec.scheduling_timeout_seconds)
        waited = (p.now - created).total_seconds()
        if waited < limit:
            p.requeue.append(limit - waited)
            return None
        return REASON_SCHEDULING_TIMEOUT, (f"the pod could not be scheduled within spec.scheduling.timeoutSeconds "
                                           f"({int(limit)}s): {pod.unschedulable}"), True
    return None


def failures(p: Pass) -> list[Failure]:
    """The failed ranks of the current attempt, root cause first."""
    out: list[Failure] = []
    spec = p.spec
    current = p.current()
    starts: dict[str, dict[str, Any]] = {}
    releasing = refusal.released(p)
    for index, pod in current.items():
        fatal_wait = pod.phase == PENDING and pod.reason in policy.FATAL_REASONS
        stuck = None if fatal_wait else _stuck(p, pod, starts)
        if stuck is not None:
            out.append(Failure(pod.rank, pod.name, pod.node, None, stuck[0], stuck[1], stuck[2], False, False,
                               (0, "~", index)))
        elif pod.phase == FAILED or fatal_wait:
            reason = pod.reason or ("Error" if pod.exit_code else "Failed")
            why = gave_up(pod)
            given_up = why in GAVE_UP_DISRUPTIONS
            if given_up:
                reason = str(why)  # its agent gave the gang up for something not the program's
            out.append(Failure(failed_rank(p, pod), pod.name, pod.node, pod.exit_code, reason,
                               policy.failure_text(spec, pod.message),
                               policy.is_permanent(spec, pod.exit_code, reason) and not given_up,
                               # (Evicted, Terminated: a kubelet's eviction or node shutdown on a
                               # cluster that sets no DisruptionTarget condition: the cluster's act.)
                               pod.disrupted or given_up or policy.is_disruption(reason), False,
                               (0, pod.finished_at or "~", index)))
        elif pod.phase == SUCCEEDED and spec.mode == names.MODE_MONARCH:
            message = (pod.message or "") + ("\n" if pod.message else "") + (
                "the Monarch worker loop exited 0 (a client shut the host mesh down?); a Monarch-mode pod "
                "serves until the job is deleted, suspended or out of time")
            out.append(Failure(pod.rank, pod.name, pod.node, pod.exit_code, REASON_MONARCH_HOST_EXITED, message,
                               policy.is_permanent(spec, None, REASON_MONARCH_HOST_EXITED), False, False,
                               (0, pod.finished_at or "~", index)))
        elif pod.deleting and pod.phase != SUCCEEDED and not releasing:
            reason = pod.reason if pod.disrupted and pod.reason else REASON_POD_DELETED
            message = policy.failure_text(spec, pod.message) if pod.disrupted else (
                "the pod was deleted (evicted, drained or deleted by hand) before it finished")
            out.append(Failure(pod.rank, pod.name, pod.node, None, reason, message,
                               policy.is_permanent(spec, None, reason), pod.disrupted or policy.is_disruption(reason),
                               True, (1, "~", index)))
    if p.phase == RUNNING or p.in_place_round:
        last: dict[int, PodInfo] = {}
        for pod in p.o.gone:
            member = p.member_of(pod)
            if member is not None and (member not in last or pod.replacement >= last[member].replacement):
                last[member] = pod
        for index in range(p.pods_per_attempt):
            if index in current:
                continue
            was = last.get(index)
            rank = index * p.procs_per_pod
            if was is not None and was.disrupted and was.reason:
                # The watch saw why it went: e.g. removed with its node (DeletionByPodGC).
                out.append(Failure(rank, was.name, was.node, was.exit_code, was.reason,
                                   policy.failure_text(spec, was.message),
                                   policy.is_permanent(spec, was.exit_code, was.reason), True, True, (2, "~", index)))
                continue
            name = was.name if was is not None else names.pod_name(p.o.job, p.gang, index)
            out.append(Failure(rank, name, was.node if was else None, None,
                               REASON_POD_MISSING, "the pod disappeared while the job was running",
                               policy.is_permanent(spec, None, REASON_POD_MISSING),
                               policy.is_disruption(REASON_POD_MISSING), True, (2, "~", index)))
    if p.in_place:
        known = {f.pod for f in out}
        out.extend(f for f in inplace.node_losses(p)[0] if f.pod not in known)
        out.extend(inplace.ended_but_lost(p, current))
    if starts:
        p.new["startFailures"] = starts
    else:
        p.new.pop("startFailures", None)
    # Root cause first: a permanent failure, else a disruption, else the earliest.
    return sorted(out, key=lambda f: (not f.permanent, not f.disruption, f.order))


def handle(p: Pass) -> bool:
    """Acts on failures of the current attempt (restart or fail); True if there were any.

    Restart in place (:mod:`.inplace`): a lost pod other than rank 0's is replaced alone while
    the coordinator takes it back; the coordinator's final verdict names the root cause; a gang
    recreated for a round recorded in place but never started is that round (counted once).
    """
    found = failures(p)
    if not found:
        return False
    lost_wait = inplace.node_losses(p)[1]
    if lost_wait > 0 and not any(f.permanent or f.reason in inplace.NODE_LOSS_REASONS for f in found):
        # A pod whose agent fell silent may yet say why; if it does not, its node was lost and
        # this failure is that loss's consequence (a disruption, not a restart counted).
        p.requeue.append(lost_wait)
        p.counts(p.current())
        return True
    if p.in_place and inplace.replace_lost(p, found):
        return True
    if p.in_place and (wait := inplace.connecting(p, found)) > 0:
        p.requeue.append(wait)  # the coordinator is being reached for the first time: it may take the pod back
        p.counts(p.current())
        return True
    verdict = inplace.verdict(p)
    wait = verdict.wait if verdict is not None else inplace.verdict_pending(p)
    if wait > 0:
        # The agents are ending the gang on a verdict: its root cause's pod (its message is the
        # record), or the word of who it is, comes in a moment.
        p.requeue.append(wait)
        p.counts(p.current())
        return True
    root = verdict.failure if verdict is not None else found[0]
    if verdict is not None and verdict.round is not None and verdict.round > p.restart:
        # Restarts in place the operator did not hear of (it was away): the agents' last line says,
        # and how many of them were disruptions.
        p.restart = verdict.round
        p.new.update(restarts=verdict.round, gangRestart=p.gang)
        if verdict.disruptions is not None and verdict.disruptions > int(p.new.get("disruptions") or 0):
            p.new["disruptions"] = verdict.disruptions
    p.new["failure"] = root.as_status(p.restart, p.now)
    p.pods_lost = root.lost
    cause = root.describe()
    # Disruptions recorded earlier in this pass (a restart in place heard just now) count too.
    disruptions = int(p.new.get("disruptions") or 0)
    counted = p.restart - disruptions
    # After the agents' verdict every agent ends its pod with it: the pods are left to end (their
    # logs kept), not deleted (lifecycle.finished stops any left after a grace).
    stop = verdict is None or verdict.fallback
    if root.permanent:
        p.fail("PermanentFailure", f"{cause}; permanent, no restart", stop=stop)
        p.counts(p.current())
    elif root.reason == inplace.REASON_NODE_LOST and p.in_place_round and not inplace.round_started(p):
        # The restart in place for this loss was recorded (as a disruption) but its round cannot
        # come together without the lost member: the new gang completes that restart.
        gang.replace(p, p.restart, f"{cause}; a disruption, not counted against maxRestarts")
    elif inplace.unstarted_round(p):
        # Restart p.restart was recorded (and counted) in place, but its gang never came together.
        gang.replace(p, p.restart, f"{cause}; restart {p.restart} could not come together in place")
    elif not root.disruption and counted >= p.spec.max_restarts:
        p.fail("RestartLimitExceeded", f"{cause}; restart limit {p.spec.max_restarts} reached", stop=stop)
        p.counts(p.current())
    else:
        if root.disruption:
            p.new["disruptions"] = disruptions + 1
            why = f"{cause}; a disruption, not counted against maxRestarts"
        else:
            why = f"{cause}; restart {counted + 1} of at most {p.spec.max_restarts}"
            badnodes.record(p, root, p.now)  # a counted failure on its node (status.badNodes)
        gang.replace(p, p.restart + 1, why)
    return True
