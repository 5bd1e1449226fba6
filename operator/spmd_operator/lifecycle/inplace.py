"""Restart in place: what the gang's coordinator reports becomes the job's status; a lost pod is replaced alone.

Where it sits: a policy of :mod:`spmd_operator.lifecycle`, beside :mod:`.failure` and :mod:`.gang`;
it reads what the controller's observer heard from the current gang's coordinator (the agent of
its rank-0 pod: :attr:`.model.Observed.coordinator`, the protocol of docs/restart-in-place.md).
Pure, like every policy: the observer never writes to the API server, this module decides and
the controller writes.

With restartPolicy.mode InPlace the agents in the pods restart the processes themselves. The
operator's part:

* **Each restart becomes status.** Each ``restart`` event (the coordinator's decision to restart
  in place) gives one status patch: restarts = its next round, status.failure (rank, pod, node,
  exit code, reason, the last lines, the round that failed, the back-off), phase Restarting, one
  Warning Event Restarting, and through the patch the restart metric. The operator judges the
  restart again with the spec as it is now (maxRestarts and the permanent codes change at any
  time): a failure that has become permanent, or a restart beyond maxRestarts, fails the job and
  stops its pods. A restart caused by a pod the cluster took away (preemption, eviction) is a
  disruption: not counted against maxRestarts, and status.disruptions reaches the pods created
  after it. Restarts that happened while the operator was away (its own restart, a failover) come
  in ``welcome``'s history and are recorded then, in one pass; one already recorded (its next
  round is not above status.restarts) is never counted again.
* **Running again** on ``all_running`` of the current round (not on the pods' phase: the pods
  never stopped running).
* **Progress**: status.lastProgressTime, the stalest rank's last output, written only when it
  moved by PROGRESS_STATUS_SECONDS (a job whose ranks all print gets one write per 5 minutes; a
  hung rank, none).
* **Replace only what was lost** (:func:`replace_lost`): a lost pod other than rank 0's whose
  containers are known to have ended (phase Failed, or deleted and gone without a node loss) is
  created again alone, with the gang's MASTER_ADDR and the round it joins; the other pods wait
  for it at the coordinator's barrier. Never rank 0's pod (it holds the coordinator and is what
  MASTER_ADDR names: replacing it alone would connect the other pods' processes to a new store
  under the old name, the mixing the barrier exists to prevent), never a pod whose node was lost
  (its processes may still run), never without hearing the coordinator (it must be there to take
  the pod in, and say no final verdict came): then :mod:`.failure` recreates the gang or fails the
  job, as with RecreatePods.
* A restart in place recorded for a round whose processes never started (the round did not come
  together: rank 0's pod lost during it, RoundTimeout) is completed by recreating the gang as that
  same round: the failure was counted once, when the restart was recorded.
* **A lost node is a disruption** (:func:`node_losses`). The coordinator loses a member whose
  agent fell silent (its node froze, lost power or was cut off: the kernel's user timeout notices
  in ~8 s), or every member but rank 0's loses its coordinator (rank 0's node: they exit 75,
  CoordinatorLost), and the silent pod still shows Running NODE_LOST_WAIT_SECONDS later: the
  kubelet would have said if its container had ended. That pod is lost with its node (reason
  NodeLost, naming the node): not counted against maxRestarts, never replaced alone (its
  processes may still run), the gang recreated without waiting for the node controller, and
  without waiting for that pod beyond the stop grace in which its agent, if it runs at all, has
  stopped its processes (it fences itself when it loses the coordinator); the new attempt's pods
  keep off that node.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from monarch_spmd import policy
from monarch_spmd.payload import rendezvous
from monarch_spmd.payload.names import EX_TEMPFAIL
from monarch_spmd.spec import FAILURE_OUTPUT_NONE

from .. import names
from . import badnodes
from .model import (
    COORDINATOR_REACHABLE,
    EVENT_NORMAL,
    EVENT_WARNING,
    FAILED,
    PENDING,
    REASON_NODE_LOST,
    REASON_POD_DELETED,
    REASON_POD_MISSING,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    TAKEOVER_FAILED,
    CoordinatorView,
    PodInfo,
    format_time,
    parse_time,
)
from .status import VERDICT_LINE, Failure, Pass

#: A restart caused by a lost member (no process exit: MemberLost) waits this long for the pod's
#: state to say why it went (a disruption is not counted) before it is recorded as a failure.
LOST_WAIT_SECONDS: Final = 2.0
#: A member lost while no hot spare was ready waits this long after the loss was heard for a
#: spare pod on its way (created, its agent not yet connected): the coordinator gives it the place
#: at its hello, and a pod created meanwhile would be turned away. Past it, a pod is created.
SPARE_ARRIVAL_SECONDS: Final = 5.0
#: status.lastProgressTime is written only when it moved by at least this much.
PROGRESS_STATUS_SECONDS: Final = 300.0
#: The coordinator's reason for a member whose agent is gone, not a process that exited.
REASON_MEMBER_LOST: Final = "MemberLost"
#: Reasons of a pod taken away with its node: its containers may still run there, so it is
#: never replaced alone.
NODE_LOSS_REASONS: Final = frozenset({"DeletionByTaintManager", "DeletionByPodGC", REASON_NODE_LOST})
#: The coordinator's reasons for a member whose agent fell silent (one that left, or was
#: superseded by a new incarnation, said so).
SILENT_LOSSES: Final = frozenset({rendezvous.LOST_DISCONNECTED, rendezvous.LOST_HEARTBEAT})
#: How long the operator may not hear a running gang's coordinator before the job says so.
SIGHT_LOST_SECONDS: Final = 30.0
#: How long a pod whose agent fell silent may still show Running before its node is taken as
#: lost: the kubelet reports a container that ended (an agent that crashed) within about a second.
NODE_LOST_WAIT_SECONDS: Final = 5.0
#: Reasons the agents report for a hung rank (torchrun's watchdog, the progress timeout).
HANG_REASONS: Final = frozenset({"WatchdogTimeout", "NoProgress"})
#: Reasons whose message from the agent only repeats the exit ("rank 1 exited with code 3"): the
#: rank's own last lines say more, so they come last (the one line Events and status show).
PLAIN_EXITS: Final = frozenset({"Error", "Signal", "OOMKilled"})
#: How long a lost pod waits for the operator's first connection to the coordinator (just started:
#: a new gang, an operator that just started leading) before the gang is recreated instead.
CONNECT_WAIT_SECONDS: Final = 3.0
#: After the coordinator's verdict, how long the root cause's pod is given to end (its termination
#: message, the end of its log, is then the record) before the verdict is acted on without it.
VERDICT_WAIT_SECONDS: Final = 10.0


def view(p: Pass) -> CoordinatorView | None:
    """What was heard from the current gang's coordinator (its rank-0 pod's agent), if anything."""
    v = p.o.coordinator
    if v is None or not p.in_place or v.pod != names.pod_name(p.o.job, p.gang, 0):
        return None
    return v


def _int(value: Any, default: int | None = None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _time(event: Mapping[str, Any], key: str = "time") -> dt.datetime | None:
    value = event.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(float(value), dt.timezone.utc)
    return None


# --- recording what the coordinator reported ------------------------------------------------------


def handle(p: Pass) -> bool:
    """Records the coordinator's restarts, the gang running again and its progress; True when the
    job failed on a restart the operator judges otherwise (permanent now, or beyond maxRestarts)."""
    v = view(p)
    if v is None:
        return False
    if _record_restarts(p, v):
        return True
    _size(p, v)
    _running_again(p, v)
    _progress(p, v)
    _sight(p, v)
    return False


def _sight(p: Pass, v: CoordinatorView) -> None:
    """The condition CoordinatorReachable: False once the operator has not heard the running
    gang's coordinator for SIGHT_LOST_SECONDS (its restarts go unseen meanwhile), True again
    when it hears it; never written for a job whose view was never lost (no write per job)."""
    before = next((c for c in p.conditions if c.get("type") == COORDINATOR_REACHABLE), None)
    zero = p.current().get(0)
    watched = p.new.get("phase") in (RUNNING, RESTARTING) and zero is not None and _alive(zero)
    if v.connected:
        if before is not None and before.get("status") == "False":
            p.condition(COORDINATOR_REACHABLE, "True", "CoordinatorReachable",
                        f"the operator hears the coordinator of pod {v.pod} again")
        return
    if not watched or v.dark_since is None:
        return
    dark = p.now.timestamp() - v.dark_since
    if dark < SIGHT_LOST_SECONDS:
        p.requeue.append(SIGHT_LOST_SECONDS - dark)
        return
    message = (f"the operator has not heard the coordinator of pod {v.pod} for {int(dark)}s"
               f"{': ' + v.error if v.error else ''}; restarts in place are not seen until it is back "
               "(a NetworkPolicy without the operator, the agent port blocked, the pod's network down)")
    if before is None or before.get("status") != "False":
        p.condition(COORDINATOR_REACHABLE, "False", "CoordinatorUnreachable", message[:2048])
        p.event(EVENT_WARNING, "CoordinatorUnreachable", message[:1024])


def _lost_pod(p: Pass, member: int, failed_round: int | None = None) -> PodInfo | None:
    """Member ``member``'s pod as it was lost in round ``failed_round``: being deleted, ended, or
    gone (its last state seen, or a placeholder when none was); None while it still looks alive.

    A replacement that joins a later round than ``failed_round`` is not the one lost (it was
    created for this loss before the coordinator's word of it came): the newest one before it is.
    """
    pod = p.current().get(member)
    older = None
    if pod is not None and failed_round is not None and pod.joins is not None and pod.joins > failed_round:
        older = pod.replacement
    elif pod is not None:
        return pod if pod.deleting or pod.finished or pod.phase == "Unknown" else None
    # A pod still listed comes first: max keeps the first of equal replacements.
    gone = [g for g in p.member_pods(member) if older is None or g.replacement < older]
    if gone:
        return max(gone, key=lambda g: g.replacement)
    return PodInfo(name=names.pod_name(p.o.job, p.gang, member, older - 1 if older else 0),
                   rank=member * p.procs_per_pod, restart=p.gang, phase=FAILED, reason=REASON_POD_MISSING,
                   message="the pod disappeared while the job was running")


def _loss_reason(pod: PodInfo) -> str:
    if pod.disrupted and pod.reason:
        return pod.reason
    if pod.deleting:
        return REASON_POD_DELETED
    if pod.finished:
        return pod.reason or ("Error" if pod.exit_code else FAILED)
    return pod.reason or REASON_POD_MISSING


def _text(p: Pass, event: Mapping[str, Any]) -> str | None:
    """A coordinator event's message with the rank's last lines before it (none with failureOutput
    None: the agents send none then, and none would be shown)."""
    lines = [str(x) for x in event.get("tail") or []] if p.spec.failure_output != FAILURE_OUTPUT_NONE else []
    message = event.get("message")
    if message and str(message) not in lines:
        if event.get("reason") in PLAIN_EXITS:
            lines.insert(0, str(message))
        else:
            lines.append(str(message))
    return "\n".join(lines) or None


def _failure(p: Pass, event: Mapping[str, Any]) -> Failure:
    """The Failure a ``restart`` or ``failed`` event reports, in the lifecycle's terms."""
    per = p.procs_per_pod
    member = _int(event.get("member"), 0) or 0
    rank = _int(event.get("rank"))
    rank = member * per if rank is None else rank
    pod = p.current().get(member)
    took = _takeover(p, member, _int(event.get("round"))) if event.get("reason") == REASON_MEMBER_LOST else None
    if took is not None:
        return _taken_over(p, member, event, took)
    if event.get("reason") == REASON_MEMBER_LOST and pod is not None and _alive(pod):
        silent = silent_loss(p, member, pod)
        if silent is not None and not _newer(pod, silent):
            return _node_lost(p, member, pod, str(silent.get("reason")))
    if event.get("reason") == REASON_MEMBER_LOST:
        lost = _lost_pod(p, member, _int(event.get("round")))
        if lost is not None:
            reason = _loss_reason(lost)
            message = policy.failure_text(p.spec, lost.message) if lost.finished or lost.disrupted else None
            if reason == REASON_POD_DELETED and not message:
                message = "the pod was deleted (evicted, drained or deleted by hand) before it finished"
            return Failure(rank, lost.name, lost.node or event.get("node") or None, lost.exit_code, reason,
                           message or event.get("message"), policy.is_permanent(p.spec, lost.exit_code, reason),
                           not charged(lost), True, (0, "~", member))
    name = pod.name if pod is not None else names.pod_name(p.o.job, p.gang, member)
    node = event.get("node") or (pod.node if pod is not None else None) or None
    code = _int(event.get("rank_exit_code"), _int(event.get("exit_code")))
    reason = str(event.get("reason") or "Error")
    permanent = policy.is_permanent(p.spec, code, reason) and not event.get("fallback")
    lost = reason == REASON_MEMBER_LOST
    return Failure(rank, name, node, code, reason, _text(p, event), permanent, lost, lost, (0, "~", member))


def charged(pod: PodInfo) -> bool:
    """Whether a lost member's pod is the program's failure: its container itself failed (an
    OOM-killed container, a crashed worker), not taken away (deleted, evicted, its node lost),
    ended well, or given up in place (75: its coordinator was gone). Every other loss of a member
    is a disruption, as the coordinator takes it (counting.root_cause)."""
    if pod.disrupted or policy.is_disruption(_loss_reason(pod)):
        return False  # taken away: deleted, evicted, preempted, its node lost
    return pod.phase == FAILED and pod.exit_code not in (None, 0, EX_TEMPFAIL)


def _takeover(p: Pass, member: int, round_: int | None = None) -> Mapping[str, Any] | None:
    """The ``takeover`` of ``member``'s newest loss (in round ``round_``, when given): a hot spare
    took its place (:mod:`.spares` adopts the spare's pod). A takeover answers the loss it
    follows (the coordinator sends the two together): an earlier loss's takeover says nothing of
    a later loss (the spare that took the place lost in its turn), and one whose spare never
    arrived (state failed) gives the place back."""
    v = view(p)
    if v is None:
        return None
    losses = [e for e in v.lost if _int(e.get("member")) == member
              and (round_ is None or _int(e.get("round")) == round_)]
    after = _int(losses[-1].get("seq"), 0) or 0 if losses else 0
    found = [e for e in v.takeovers if _int(e.get("member")) == member and (_int(e.get("seq"), 0) or 0) > after
             and (round_ is None or _int(e.get("round")) == round_ or losses)]
    if not found or found[-1].get("state") == TAKEOVER_FAILED:
        return None
    return found[-1]


def recent(v: CoordinatorView, event: Mapping[str, Any]) -> bool:
    """Whether a coordinator's event came in the round that runs (or is joined) or the one before."""
    return (_int(event.get("round"), -1) or 0) >= (v.round or 0) - 1


def _of_spare(p: Pass, f: Failure, took: Mapping[str, Any]) -> bool:
    """Whether failure ``f`` is of the pod of the spare that ``took`` the place (not of the pod
    that lost it)."""
    spare = _int(took.get("spare"))
    return spare is not None and f.pod == names.spare_pod_name(p.o.job, p.gang, spare)


def _taken_over(p: Pass, member: int, event: Mapping[str, Any], took: Mapping[str, Any]) -> Failure:
    """The restart of a member whose place a hot spare took: a disruption, never a recreation."""
    spare = _int(took.get("spare"))
    spare_pod = names.spare_pod_name(p.o.job, p.gang, spare) if spare is not None else "a spare"
    lost = member_before_takeover(p, member, took)
    name = lost.name if lost is not None else names.pod_name(p.o.job, p.gang, member)
    silent = (event.get("reason") == REASON_MEMBER_LOST and silent_loss(p, member, lost) is not None
              and (lost is None or alive(lost)))
    reason = REASON_NODE_LOST if silent else REASON_MEMBER_LOST
    if silent and lost is not None and lost.node:
        p.lost_nodes.add(lost.node)
    message = (f"{event.get('message') or f'the agent of pod {name} is gone'}; hot spare pod {spare_pod} took its "
               f"place (on node {took.get('node') or '?'})")
    node = (lost.node if lost is not None else None) or None
    return Failure(member * p.procs_per_pod, name, node, None, reason, message, False, True, True, (0, "~", member))


def member_before_takeover(p: Pass, member: int, took: Mapping[str, Any]) -> PodInfo | None:
    """The pod that held member ``member`` before the spare of ``took`` (a ``takeover``) took
    its place: the newest other pod of that index (still listed, or deleted lately)."""
    spare = _int(took.get("spare"))
    spare_pod = names.spare_pod_name(p.o.job, p.gang, spare) if spare is not None else None
    older = [g for g in p.member_pods(member) if g.spare is None and g.name != spare_pod]
    return max(older, key=lambda g: g.replacement) if older else None


def alive(pod: PodInfo) -> bool:
    """The pod shows Running and nothing else: no deletion, no end, no node-loss condition."""
    return pod.phase == RUNNING and not pod.deleting and not pod.disrupted


_alive = alive


def _newer(pod: PodInfo, event: Mapping[str, Any]) -> bool:
    """Whether ``pod`` was created after the coordinator's ``event`` was heard (a whole second
    later: creation times have seconds only)."""
    created, received = parse_time(pod.created), event.get("received")
    return (created is not None and isinstance(received, (int, float))
            and created.timestamp() >= float(received) + 1.0)


def back_since(v: CoordinatorView, lost: Mapping[str, Any]) -> bool:
    """Whether the member of a ``lost`` event ran again after it: a later round started with it
    (every member, or an elastic round that lists it) and all its processes ran."""
    member, seq = _int(lost.get("member")), _int(lost.get("seq"), 0) or 0
    for event in v.all_running:
        if (_int(event.get("seq"), 0) or 0) <= seq:
            continue
        started = next((e for e in reversed(v.started) if e.get("round") == event.get("round")), None)
        listed = (started or {}).get("round_members")
        if not isinstance(listed, list) or member in listed:
            return True
    return False


def of_pod(event: Mapping[str, Any], pod: PodInfo | None) -> bool:
    """Whether a coordinator's event about a member is about ``pod``: it names that pod, or none
    (an agent's hello names its pod; a pod created in its place may run already when the loss of
    the one before it is heard)."""
    named = event.get("pod")
    return not named or pod is None or named == pod.name


def silent_loss(p: Pass, member: int, pod: PodInfo | None = None) -> Mapping[str, Any] | None:
    """The coordinator's newest ``lost`` event of ``member`` (of its pod ``pod``, when given) whose
    agent fell silent and that has not run again since, if any."""
    v = view(p)
    if v is None:
        return None
    found = [e for e in v.lost if _int(e.get("member")) == member and e.get("reason") in SILENT_LOSSES
             and of_pod(e, pod)]
    return found[-1] if found and not back_since(v, found[-1]) else None


def _node_lost(p: Pass, member: int, pod: PodInfo, how: str) -> Failure:
    node = pod.node or None
    then = "the gang is recreated on other nodes"
    if p.elastic and member != 0:
        then = (f"the gang goes on without it (elastic, at least {p.spec.min_members} pods) while it is created "
                "again; it joins the gang when it is placed")
    message = (f"the agent of pod {pod.name} went silent ({how}) while the pod still shows Running: its node "
               f"{node or '(unknown)'} is lost, frozen or cut off; {then}")
    if node:
        p.lost_nodes.add(node)
    # First among the failures it explains (the agents that gave up when rank 0's node went).
    return Failure(member * p.procs_per_pod, pod.name, node, None, REASON_NODE_LOST, message, False, True, True,
                   (-1, "~", member))


def _waited(p: Pass, received: Any) -> float:
    """Seconds since an event was heard (``received``, Unix time); the wait's length if unknown."""
    return p.now.timestamp() - received if isinstance(received, (int, float)) else NODE_LOST_WAIT_SECONDS


def node_losses(p: Pass) -> tuple[list[Failure], float]:
    """Pods of the current gang lost with their node (see the module's text): a member whose agent
    the coordinator lost by silence, or rank 0's pod when the others lost their coordinator, that
    still shows Running NODE_LOST_WAIT_SECONDS later; and the seconds until a loss heard now may
    be judged so (0: none pending)."""
    if not p.in_place:
        return [], 0.0
    current = p.current()
    out: dict[int, Failure] = {}
    pending: list[float] = []
    v = view(p)
    for event in v.lost if v is not None else ():
        member = _int(event.get("member"))
        pod = current.get(member) if member is not None else None
        if member is None or pod is None or event.get("reason") not in SILENT_LOSSES or not _alive(pod):
            continue
        if pod.joins is not None and pod.joins > (_int(event.get("round"), 0) or 0):
            continue  # a replacement created after that loss
        if not of_pod(event, pod):
            continue  # the loss of a pod of the member before this one
        if v is not None and back_since(v, event):
            continue  # the member ran again since (a replacement, or the spare in its place)
        if _newer(pod, event):
            continue  # a pod created after that loss was heard: not the one lost
        if _takeover(p, member, _int(event.get("round"))) is not None:
            continue  # a hot spare took its place: nothing to recreate
        waited = _waited(p, event.get("received"))
        if waited < NODE_LOST_WAIT_SECONDS:
            pending.append(NODE_LOST_WAIT_SECONDS - waited)
            continue
        out[member] = _node_lost(p, member, pod, str(event.get("reason")))
    zero = current.get(0)
    gave_up = [pod for i, pod in current.items() if i != 0 and pod.phase == FAILED and pod.exit_code == EX_TEMPFAIL
               and rendezvous.REASON_COORDINATOR_LOST in (pod.message or "")]
    heard = v is not None and v.connected  # the operator hears the coordinator: rank 0's node answers
    if zero is not None and _alive(zero) and gave_up and 0 not in out and not heard:
        ended = [parse_time(pod.finished_at) for pod in gave_up]
        first = min((t for t in ended if t is not None), default=p.now)
        waited = (p.now - first).total_seconds()
        if waited < NODE_LOST_WAIT_SECONDS:
            pending.append(NODE_LOST_WAIT_SECONDS - waited)
        else:
            out[0] = _node_lost(p, 0, zero, f"{len(gave_up)} member(s) lost their coordinator in it")
    # A node that stopped reporting: the node controller marked its pods not ready (40 s). Not
    # while the operator hears a round running with every process (each member in it answers).
    running = (heard and v is not None and v.phase == "running" and v.round is not None
               and v.running_round(v.round) is not None)
    listed = None
    if running and v is not None:
        started = next((e for e in reversed(v.started) if e.get("round") == v.round), None)
        listed = (started or {}).get("round_members")
    for index, pod in sorted(current.items()):
        if index in out or not pod.node_silent or pod.deleting or (index == 0 and heard):
            continue  # (rank 0's coordinator heard: its node answers)
        if running and (not isinstance(listed, list) or index in listed):
            continue
        out[index] = _node_lost(p, index, pod, "its node stopped reporting: the node controller marked the pod "
                                               "not ready")
    return list(out.values()), min(pending, default=0.0)


def _record_restarts(p: Pass, v: CoordinatorView) -> bool:
    pending = sorted((e for e in v.restarts if (_int(e.get("next_round"), -1) or -1) > p.restart),
                     key=lambda e: int(e["next_round"]))
    for event in pending:
        member = _int(event.get("member"), 0) or 0
        if (event.get("reason") == REASON_MEMBER_LOST and _lost_pod(p, member, _int(event.get("round"))) is None
                and _takeover(p, member, _int(event.get("round"))) is None):
            received = event.get("received")
            age = p.now.timestamp() - received if isinstance(received, (int, float)) else LOST_WAIT_SECONDS
            # A member that fell silent: its pod may yet say why (its node is taken as lost if not).
            wait = NODE_LOST_WAIT_SECONDS if silent_loss(p, member) is not None else LOST_WAIT_SECONDS
            if age < wait:
                p.requeue.append(wait - age)
                return False
        if event.get("reason") == rendezvous.REASON_MEMBERSHIP:
            _membership_change(p, event)
            continue
        f = _failure(p, event)
        nxt = int(event["next_round"])
        failed_round = _int(event.get("round"), nxt - 1)
        at = _time(event) or p.now
        record = f.as_status(failed_round if failed_round is not None else nxt - 1, at)
        cause = f.describe()
        disruptions = int(p.new.get("disruptions") or 0)
        counted = p.restart - disruptions
        if f.permanent:
            p.fail("PermanentFailure", f"{cause}; permanent, no restart (restartPolicy as it is now)", failure=record)
            p.counts(p.current())
            return True
        if not f.disruption and counted >= p.spec.max_restarts:
            p.fail("RestartLimitExceeded", f"{cause}; restart limit {p.spec.max_restarts} reached", failure=record)
            p.counts(p.current())
            return True
        backoff = event.get("backoff_seconds")
        backoff = float(backoff) if isinstance(backoff, (int, float)) and not isinstance(backoff, bool) else 0.0
        record.update(inPlace=True, backoffSeconds=int(round(backoff)))
        if f.disruption:
            p.new["disruptions"] = disruptions + 1
            why = "a disruption, not counted against maxRestarts"
        else:
            why = f"restart {counted + 1} of at most {p.spec.max_restarts}"
        if f.lost and _takeover(p, p.index_of_rank(f.rank), failed_round) is not None:
            how = "every rank restarts in place with the spare in its place"
        elif f.lost:
            how = (f"the other pods restart in place and wait for pod {f.pod} to be created again alone"
                   if p.index_of_rank(f.rank) != 0 else "restarting in place")
        else:
            how = "restarting in place"
        if backoff > 0:
            how += f"; restart {nxt} starts after a back-off of {backoff:g}s, at {format_time(at + dt.timedelta(seconds=backoff))}"
        message = f"{cause}; {why}, {how}"
        p.new.update(phase=RESTARTING, restarts=nxt, gangRestart=p.gang, failure=record)
        p.condition(RESTARTING, "True", "RestartingInPlace", message)
        p.clear(RUNNING, "RestartingInPlace", f"the gang restarts in place (restart {nxt})")
        p.event(EVENT_WARNING, "Restarting", message)
        badnodes.record(p, f, at)  # a counted failure (a disruption is not) on its node
        p.restart = nxt
    return False


def _size(p: Pass, v: CoordinatorView) -> None:
    """status.size of an elastic job: the pods of the newest round its coordinator started."""
    if not p.elastic:
        return
    started = [e for e in v.started if isinstance(e.get("round_members"), list)]
    if not started:
        return
    members = [m for m in started[-1]["round_members"] if isinstance(m, int) and not isinstance(m, bool)]
    p.new["size"] = {"pods": len(members), "procs": len(members) * p.procs_per_pod, "members": members}


def _membership_change(p: Pass, event: Mapping[str, Any]) -> None:
    """An elastic gang restarts to take in a pod that is ready again (it grows): a disruption, not
    a failure (status.failure keeps the last one)."""
    nxt = int(event["next_round"])
    disruptions = int(p.new.get("disruptions") or 0)
    p.new["disruptions"] = disruptions + 1
    member = _int(event.get("member"), 0) or 0
    pod = p.current().get(member)
    name = pod.name if pod is not None else names.pod_name(p.o.job, p.gang, member)
    message = (f"pod {name} is ready: every rank restarts in place with it (restart {nxt}, the gang grows; a "
               "membership change, not counted against maxRestarts)")
    p.new.update(phase=RESTARTING, restarts=nxt, gangRestart=p.gang)
    p.condition(RESTARTING, "True", "Resizing", message)
    p.clear(RUNNING, "Resizing", f"the gang restarts in place with more pods (restart {nxt})")
    p.event(EVENT_NORMAL, "Resizing", message)
    p.restart = nxt


def _running_again(p: Pass, v: CoordinatorView) -> None:
    """The current round's processes all run (``all_running``): the job is Running again."""
    if p.new.get("phase") != RESTARTING or not p.in_place_round:
        return
    if v.round != p.restart or v.phase != "running":
        return  # a newer failure is being handled, or the coordinator is not there yet
    event = v.running_round(p.restart)
    if event is None:
        return
    seconds = event.get("seconds_since_failure")
    after = f", {float(seconds):.1f}s after the failure" if isinstance(seconds, (int, float)) else ""
    size = p.new.get("size") if p.elastic else None
    procs = f"all {p.spec.world_size} procs are"
    if isinstance(size, Mapping) and size.get("procs") != p.spec.world_size:
        procs = (f"the {size.get('procs')} procs of {size.get('pods')} of its {p.pods_per_attempt} pods (elastic, at "
                 f"least {p.spec.min_members}) are")
    message = f"{procs} running again (restart {p.restart}, in place{after})"
    p.new["phase"] = RUNNING
    p.condition(RUNNING, "True", "AllProcsRunning", message)
    p.clear(RESTARTING, "AllProcsRunning", f"restart {p.restart} is running")
    p.event(EVENT_NORMAL, "Running", message)


def _progress(p: Pass, v: CoordinatorView) -> None:
    """status.lastProgressTime from the latest ``progress`` event of the running round."""
    event = v.progress
    if event is None or not v.connected or v.phase != "running" or event.get("round") != v.round:
        return
    at, idle = _time(event), event.get("seconds_since_progress")
    if at is None or not isinstance(idle, (int, float)) or isinstance(idle, bool):
        return
    last = at - dt.timedelta(seconds=max(0.0, float(idle)))
    stored = parse_time(p.o.status.get("lastProgressTime"))
    if stored is None or (last - stored).total_seconds() >= PROGRESS_STATUS_SECONDS:
        p.new["lastProgressTime"] = format_time(last)


# --- failures of the gang's pods ------------------------------------------------------------------


def replace_lost(p: Pass, found: list[Failure]) -> bool:
    """Replaces lost pods (not rank 0's) alone while the coordinator takes them back; True if it
    did or waits for one to end; False when the gang must be recreated or the job fail instead."""
    v = view(p)
    if v is None or not v.connected or v.final is not None or v.open_round() is None:
        return False
    current = p.current()
    zero = current.get(0)
    if zero is None or zero.phase != RUNNING or zero.deleting:
        return False
    todo: list[int] = []
    waiting: list[PodInfo] = []
    for f in found:
        index = p.index_of_rank(f.rank)
        pod = current.get(index)
        took = _takeover(p, index)
        if index != 0 and took is not None and not _of_spare(p, f, took):
            # A hot spare took its place (spares.tend adopts its pod), however many rounds ago:
            # the operator may hear of two takeovers in two rounds in one pass. A failure of the
            # spare's own pod is a later loss, answered by the coordinator's next ``lost``.
            continue
        if p.elastic and index != 0 and not f.permanent and f.reason in NODE_LOSS_REASONS and pod is not None \
                and pod.name == f.pod:
            # An elastic gang goes on without it: a new pod (a new name) is created for its place at
            # once, the lost one deleted (it ends when its node answers); the agents never wait for it.
            p.stop([pod])
            todo.append(index)
            continue
        if index == 0 or f.permanent or f.reason in NODE_LOSS_REASONS:
            return False
        if pod is not None and pod.phase == SUCCEEDED and not pod.deleting and _lost_lately(v, index):
            # Its ranks ended well, yet the coordinator lost its agent first (cut off, its node
            # frozen as the round ended) and waits for it in the next round: created again alone.
            todo.append(index)
            continue
        if pod is not None and (pod.phase in (PENDING, SUCCEEDED, "Unknown") and not pod.deleting):
            return False  # one that cannot start, or ended well: not a lost member
        # (A pod whose agent gave up (75) while the coordinator, heard now, gave no verdict was cut
        # off from it alone: it is replaced like any lost member.)
        if pod is not None and pod.deleting and not pod.finished and overdue(p, pod):
            # Deleted, yet its kubelet never ended it: its node does not answer (frozen, cut
            # off). Its agent fenced itself (or will, once it runs again); its place is taken now.
            if pod.node:
                p.lost_nodes.add(pod.node)
            todo.append(index)
            continue
        if (pod is None or pod.finished) and _spare_may_come(p, v, index, pod):
            p.requeue.append(1.0)  # a ready spare is given the place by the coordinator first
            p.counts(current)
            return True
        if pod is None or pod.finished:
            todo.append(index)
        elif pod.deleting:
            waiting.append(pod)  # its containers may still run: replaced once they ended
        else:
            return False
    round_ = v.open_round()
    assert round_ is not None
    for index in todo:
        p.replace_pod(index, p.next_replacement(index), round_)
    if p.new.get("phase") == RESTARTING:
        replaced = ", ".join(names.pod_name(p.o.job, p.gang, i, n) for i, n in p.replace)
        parts = [f"creating {replaced} alone" if replaced else "",
                 f"waiting for {', '.join(w.name for w in waiting)} to terminate before it is replaced" if waiting else ""]
        before = next((c for c in p.conditions if c.get("type") == RESTARTING), {})
        if before.get("reason") not in ("RestartingInPlace", "Resizing"):
            before = {}  # another wait's words (the old pods of a recreated gang): not this one's
        text = "; ".join(x for x in parts if x)
        if text and text not in (before.get("message") or ""):
            p.condition(RESTARTING, "True", before.get("reason") or "RestartingInPlace",
                        f"{before.get('message') or 'restarting in place'}; {text}"[-2048:])
    p.counts(current)
    p.pods_lost = bool(todo or waiting)
    return True


#: How many of a gang's restarts the agents counted, in their verdict line (payload.agent).
_COUNTED: Final = re.compile(r"; (\d+) of its (\d+) restarts counted")
#: Seconds past its grace period after which a pod being deleted that still shows Running is
#: taken for one on a node that does not answer: its kubelet would have killed it by then.
DELETE_OVERDUE_SECONDS: Final = 10.0


def overdue(p: Pass, pod: PodInfo) -> bool:
    """A pod deleted more than its grace period (the stop grace) and DELETE_OVERDUE_SECONDS ago
    that still shows Running: its node's kubelet is not answering. (A pod deleted, not yet
    overdue, asks the pass to be woken when it will be.)"""
    asked = parse_time(pod.deleted_at)
    if asked is None or pod.finished or pod.phase != RUNNING:
        return False
    left = policy.stop_grace(p.spec) + DELETE_OVERDUE_SECONDS - (p.now - asked).total_seconds()
    if left >= 0:
        p.requeue.append(left + 0.1)
        return False
    return True


def ended_but_lost(p: Pass, current: Mapping[int, PodInfo]) -> list[Failure]:
    """Members whose pod Succeeded while the coordinator, its round not over, lost their agent
    first (cut off as the round ended: its node froze) and waits for them in the next round:
    each is a lost member (a disruption), created again alone by :func:`replace_lost`."""
    v = view(p)
    if v is None or v.final is not None or v.open_round() is None:
        return []
    return [Failure(index * p.procs_per_pod, pod.name, pod.node, 0, REASON_MEMBER_LOST,
                    "its ranks exited 0, but the coordinator lost its agent before hearing so and waits for it "
                    "in the next round", False, True, True, (1, "~", index))
            for index, pod in sorted(current.items())
            if index != 0 and pod.phase == SUCCEEDED and not pod.deleting and _lost_lately(v, index)]


def _losses_lately(v: CoordinatorView, member: int) -> list[Mapping[str, Any]]:
    """The coordinator's ``lost`` events of ``member`` in the round that runs or the one before."""
    return [e for e in v.lost if _int(e.get("member")) == member and recent(v, e)]


def _lost_lately(v: CoordinatorView, member: int) -> bool:
    """Whether the coordinator said it lost ``member`` in the round that runs or the one before."""
    return bool(_losses_lately(v, member))


def _spare_may_come(p: Pass, v: CoordinatorView, member: int, pod: PodInfo | None) -> bool:
    """Whether a lost member's place may yet go to a hot spare, so no pod is created for it now.

    The coordinator gives the place to a ready spare with the loss (its ``lost`` and ``takeover``
    events come together), or, when none was ready, to the first spare whose agent says hello
    while the member still waits. So: before the loss is heard, wait while spares are ready or
    starting, for at most LOST_WAIT_SECONDS after the pod ended; once a loss came without a
    takeover, wait only while a spare pod is on its way (more live spare pods than the
    coordinator has ready), for at most SPARE_ARRIVAL_SECONDS after the loss was heard. A pod
    created while a spare is about to take the place would be turned away."""
    live = sum(1 for s in p.o.spares if s.restart == p.gang and not s.finished and not s.deleting)
    ready = v.spares_ready or 0
    if p.spec.spares <= 0 or not (ready or live):
        return False
    losses = _losses_lately(v, member)
    if losses:
        if live <= ready:
            return False  # every spare there is was ready at the loss, and none took the place
        return _waited(p, losses[-1].get("received")) < SPARE_ARRIVAL_SECONDS
    ended = parse_time(pod.finished_at) if pod is not None else None
    return ended is not None and (p.now - ended).total_seconds() < LOST_WAIT_SECONDS


@dataclass(frozen=True)
class Verdict:
    """How the gang's agents ended it (the coordinator's ``failed``): its root cause, the round it
    came in, whether it asks for the gang to be recreated (``fallback``), and how long to wait for
    the root cause's pod to end first (its termination message is then the record)."""

    failure: Failure
    round: int | None
    fallback: bool
    wait: float = 0.0
    #: Restarts up to ``round`` that were disruptions, as the agents counted them (None: unsaid).
    disruptions: int | None = None


def verdict(p: Pass) -> Verdict | None:
    """The agents' final verdict on the current gang, or None.

    From the coordinator when the operator heard it; else from the pods: every agent's last line
    (and termination message) names the root cause's rank, exit code and round
    (:data:`.status.VERDICT_LINE`), so a gang that ended before the operator connected (or while
    it was away) is still judged by its root cause, not by which pod ended first.
    """
    if not p.in_place:
        return None
    current = p.current()
    v = view(p)
    final = v.final if v is not None and v.final is not None and v.final.get("type") == "failed" else None
    if final is not None and _int(final.get("rank")) is not None:
        f = _failure(p, final)
        f = dataclasses.replace(f, exit_code=_int(final.get("rank_exit_code"), f.exit_code))
        pod = current.get(p.index_of_rank(f.rank))
        wait = 0.0
        if pod is not None and pod.finished and pod.message and not final.get("tail"):
            # The agent's report came without the rank's last lines: its pod's termination message
            # (the agent's record, or the kubelet's tail of the log) says more.
            f = dataclasses.replace(f, message=_verdict_first(policy.failure_text(p.spec, pod.message)) or f.message)
        if pod is not None and pod.finished and pod.reason not in (None, "Completed") \
                and f.reason in ("Error", "Signal"):
            # The kubelet's word once the pod ended, as when the verdict is read from the pods (and
            # with RecreatePods): it may know more (OOMKilled by the container's cgroup); a rank
            # killed by a signal is still named by its exit code (137, SIGKILL).
            f = dataclasses.replace(f, reason=pod.reason)
        elif pod is not None and not pod.finished and not pod.deleting:
            received = final.get("received")
            age = p.now.timestamp() - received if isinstance(received, (int, float)) else VERDICT_WAIT_SECONDS
            wait = max(0.0, VERDICT_WAIT_SECONDS - age)
        at, counted = _int(final.get("round")), _int(final.get("counted"))
        disruptions = at - counted if at is not None and counted is not None and 0 <= counted <= at else None
        return Verdict(f, at, bool(final.get("fallback")), wait, disruptions)
    for index, pod in sorted(current.items()):
        if pod.phase != FAILED or not pod.message:
            continue
        found = [m for m in map(VERDICT_LINE.match, pod.message.splitlines()) if m]
        if not found:
            continue
        rank, code, round_, outcome = int(found[-1][1]), int(found[-1][2]), int(found[-1][3]), found[-1][4]
        root = current.get(p.index_of_rank(rank))
        told = root if root is not None and root.finished and root.message else pod
        reason = root.reason if root is not None and root.finished and root.reason else "Error"
        fallback = outcome.startswith("the gang must be recreated")
        f = Failure(rank, root.name if root is not None else names.pod_name(p.o.job, p.gang, p.index_of_rank(rank)),
                    root.node if root is not None else pod.node, code, reason,
                    _verdict_first(policy.failure_text(p.spec, told.message)),
                    not fallback and policy.is_permanent(p.spec, code, reason), False, False, (0, "~", index))
        counted = _COUNTED.search(outcome)
        disruptions = round_ - int(counted[1]) if counted and int(counted[2]) == round_ else None
        return Verdict(f, round_, fallback, disruptions=disruptions)
    return None


def connecting(p: Pass, found: list[Failure]) -> float:
    """Seconds to wait for the first connection to the coordinator before judging lost pods (0:
    judge now): only until it was first heard, briefly (a refused connection is normal while the
    rank-0 pod's agent starts), and only for losses it could take back (not rank 0's pod)."""
    v = view(p)
    if v is None or v.heard or v.since is None:
        return 0.0
    zero = p.current().get(0)
    if zero is None or zero.phase != RUNNING or zero.deleting:
        return 0.0
    if any(p.index_of_rank(f.rank) == 0 or f.permanent or f.reason in NODE_LOSS_REASONS for f in found):
        return 0.0
    return max(0.0, CONNECT_WAIT_SECONDS - (p.now.timestamp() - v.since))


def verdict_pending(p: Pass) -> float:
    """Seconds to wait for the agents' verdict before judging the gang by which pod ended first.

    After a verdict every agent ends its pod with the root cause's code, the failing rank's pod
    not always first; until some pod's last line names the root cause, a pod that ended Failed
    (not lost: not deleted, disrupted or given up with 75) while others still run is given
    VERDICT_WAIT_SECONDS from its end for that word to come. 0: judge now.
    """
    if not p.in_place:
        return 0.0
    current = p.current().values()
    ended = [pod for pod in current if pod.phase == FAILED and not pod.deleting and not pod.disrupted
             and pod.exit_code not in (None, EX_TEMPFAIL)]
    if not ended or not any(pod.phase == RUNNING and not pod.deleting for pod in current):
        return 0.0
    times = [parse_time(pod.finished_at) for pod in ended]
    if any(t is None for t in times):
        return 0.0
    age = (p.now - max(t for t in times if t is not None)).total_seconds()
    return max(0.0, VERDICT_WAIT_SECONDS - age)


def _verdict_first(message: str | None) -> str | None:
    """A pod's message with the agents' verdict lines first: its last line is then the rank's own
    (what one-line summaries show), the verdict still in the record."""
    if not message:
        return message
    lines = message.splitlines()
    said = [line for line in lines if VERDICT_LINE.match(line)]
    return "\n".join([*said, *(line for line in lines if not VERDICT_LINE.match(line))])


def round_started(p: Pass) -> bool:
    """Whether the coordinator said the current round's barrier closed."""
    v = view(p)
    return v is not None and v.round_started(p.restart)


def lost_node(p: Pass) -> str | None:
    """The node the current failure was lost with (status.failure, reason NodeLost), if any."""
    failure = p.new.get("failure") or {}
    node = failure.get("node")
    return str(node) if failure.get("reason") == REASON_NODE_LOST and node else None


def unstarted_round(p: Pass) -> bool:
    """A restart in place was recorded for the current round, whose processes never started (its
    gang never came together): recreating the gang completes that restart, not a new one."""
    if not p.in_place_round or p.phase != RESTARTING:
        return False
    v = view(p)
    return v is not None and v.heard and not v.round_started(p.restart)
