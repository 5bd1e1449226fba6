"""The SPMDJob state machine: observed state in, a plan out, one module per policy.

Where it sits: above :mod:`spmd_operator.names`, :mod:`monarch_spmd.spec` and
:mod:`monarch_spmd.policy`, below :mod:`spmd_operator.controller`, which observes a job (its
spec, status, pods and other children), calls :func:`reconcile`, and carries out the returned
:class:`Plan` (one status patch, deletions, children, pod creations, Events). Nothing here talks
to Kubernetes or reads a clock, so every transition is a table-driven unit test.

Phases (``status.phase``) and which policy moves between them::

    (new) --gang.start: every pod of attempt 0--> Pending
    Pending/Restarting --gang.progress: every pod Running (or already Succeeded)--> Running
    active --completion: every rank exited 0--> Succeeded
    active --failure: a rank failed, retryable, restarts left (or a disruption)--> Restarting
        (every pod deleted; gang.progress creates the next attempt once the old pods are gone)
    active --inplace: the coordinator restarted the gang in place (restartPolicy.mode InPlace)--> Restarting
        (the pods stay; a lost pod other than rank 0's is created again alone)
    Restarting --inplace: the coordinator says every process of the round runs--> Running
    active --failure: permanent, or the restart limit used up--> Failed
    active --deadline: activeDeadlineSeconds passed since startTime--> Failed (DeadlineExceeded)
    active --suspend: spec.suspend--> Suspended (every pod deleted)
    Suspended --suspend: spec.suspend false, old pods gone--> Pending (same attempt)
    Succeeded/Failed --finished: ttlSecondsAfterFinished passed--> the job is deleted
    any --admission: invalid spec, or a pod refused by the API server as invalid--> Failed (InvalidSpec)
    Pending/Restarting --refusal: a child refused (403: quota, Pod Security ...)--> same phase, saying
        why, retried with back-off; an incomplete gang's pods released after a bound

While a job is active, :mod:`.children` keeps its ConfigMap and its attempt's master Service in
place. Module by module: admission, finished (and TTL), suspend, deadline, failure, completion,
gang, children; inplace (restart in place) before failure; then, in every pass, badnodes (a node
where the ranks fail again and again is kept off) and spares (hot spares) last.
"""

from __future__ import annotations

from . import admission, badnodes, children, completion, deadline, failure, finished, gang, inplace, refusal, spares, suspend
from .model import (
    CONDITION_TYPES,
    CONFIGMAP_CURRENT,
    CONFIGMAP_MISSING,
    EVENT_NORMAL,
    EVENT_WARNING,
    FAILED,
    PENDING,
    PHASES,
    REASON_POD_DELETED,
    REASON_POD_MISSING,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL,
    ChildInfo,
    CoordinatorView,
    Event,
    Observed,
    Plan,
    PodInfo,
    Refusal,
    WorkloadInfo,
    child_info,
    format_time,
    parse_time,
    pod_info,
    workload_info,
)
from .status import Pass, merge_patch, record_basics, set_condition

__all__ = [
    "CONDITION_TYPES",
    "CONFIGMAP_CURRENT",
    "CONFIGMAP_MISSING",
    "EVENT_NORMAL",
    "EVENT_WARNING",
    "FAILED",
    "PENDING",
    "PHASES",
    "REASON_POD_DELETED",
    "REASON_POD_MISSING",
    "RESTARTING",
    "RUNNING",
    "SUCCEEDED",
    "SUSPENDED",
    "TERMINAL",
    "ChildInfo",
    "CoordinatorView",
    "Event",
    "Observed",
    "Plan",
    "PodInfo",
    "Refusal",
    "WorkloadInfo",
    "child_info",
    "format_time",
    "merge_patch",
    "parse_time",
    "pod_info",
    "reconcile",
    "set_condition",
    "workload_info",
]


def reconcile(o: Observed) -> Plan:
    """Decides one reconcile pass of an SPMDJob (see the module docstring for the phases).

    Running it again with the same inputs, or with the pods it asked for already present,
    creates nothing new and emits no new Event: every decision follows from the status and the
    observed children, and their names are deterministic.
    """
    p = Pass(o)
    _decide(p)
    badnodes.tend(p)
    spares.tend(p)
    return p.plan()


def _decide(p: Pass) -> None:
    """Every policy but the spares', in order; each one that settles the pass ends it."""
    if admission.refuse(p):
        return
    record_basics(p)
    if finished.handle(p):
        return
    if suspend.handle(p):
        if p.create:
            children.ensure(p)
        return
    if p.phase is None:
        gang.start(p)
        children.ensure(p)
        return
    if deadline.expired(p):
        return
    if inplace.handle(p):
        return
    if failure.handle(p):
        if p.new.get("phase") != FAILED:
            children.ensure(p)
        return
    if completion.succeeded(p):
        return
    gang.progress(p)
    children.ensure(p)
    refusal.handle(p)
