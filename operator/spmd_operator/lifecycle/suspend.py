"""spec.suspend, and admission by Kueue: no pods while held; resume after.

A job is held while ``spec.suspend`` is true, or, with ``spec.scheduling.provider: Kueue``,
while its Kueue Workload is not admitted (queued for quota, or evicted: preempted by a job of
higher priority, or its queue stopped). Holding deletes every pod and sets phase Suspended
(startTime is dropped, so the deadline clock restarts at the resume); an eviction is therefore no
failure and uses up no restart. Resuming waits until the held gang's pods are gone, then creates
the same attempt again with a new startTime.

Deleting pods needs positive evidence: a Workload that exists and is not admitted, or is
evicted. A job that has pods but no Workload in the (synced) view gets its Workload created and
keeps running until Kueue says otherwise; the controller never runs a pass on an informer that
has not listed yet, so "no Workload seen" is never "the store is still empty".

A job naming an API that cannot be used (:attr:`Observed.unavailable`: the Workload or PodGroup
API forbidden by RBAC or not installed) creates nothing and deletes nothing: its status says why
(condition Created False, phase Pending) with one Warning Event; other jobs are not affected.
"""

from __future__ import annotations

import math
import re

from monarch_spmd import quantity
from monarch_spmd.spec import SCHEDULING_KUEUE

from .. import names
from .model import EVENT_NORMAL, EVENT_WARNING, PENDING, SUSPENDED, format_time
from .status import Pass

WAITING_FOR_ADMISSION: str = "WaitingForAdmission"
#: Kueue's words (v0.17, flavorassigner.fitsResourceQuota) for a pod set larger than a flavor's
#: quota of one resource can ever hold: the requests of the pod sets before it, the pod set's own
#: (its count times one pod's), and the most the ClusterQueue (and its cohort) could lend it.
_NO_FIT = re.compile(r"insufficient quota for (?P<resource>\S+) in flavor (?P<flavor>\S+), previously considered "
                     r"podsets requests \((?P<before>[^)]*)\) \+ current podset request \((?P<asked>[^)]*)\) > "
                     r"maximum capacity \((?P<capacity>[^)]*)\)")


def _hold(p: Pass) -> tuple[str, str] | None:
    """Why the job is held: (reason, message), or None when it may run."""
    if p.spec.suspend:
        return "Suspended", "spec.suspend is true"
    if p.spec.scheduling_provider != SCHEDULING_KUEUE:
        return None
    p.workload = p.o.workload is None
    w = p.o.workload
    if w is not None and w.admitted:
        return None
    if w is None and p.phase not in (None, SUSPENDED) and any(not pod.deleting for pod in p.o.pods):
        return None  # no evidence against running pods: the Workload is created, Kueue decides
    queue = p.spec.scheduling_queue
    if w is not None and w.evicted:
        return "Evicted", f"Kueue evicted the job ({w.evicted}): {w.message or 'no message'}; it waits in queue {queue} again"
    return WAITING_FOR_ADMISSION, _waiting(p.pods_per_attempt, p.spec.spares, queue, w.message if w else None)


def _waiting(members: int, spares: int, queue: str | None, message: str | None) -> str:
    """Why a job waits for Kueue, counting the pods as its Workload does (builders.build_workload:
    one pod set of the gang's pods and its hot spares, admitted together) and, where Kueue's
    message says how much of a resource its quota can ever hold, which of them do not fit."""
    total = members + spares
    pods = f"all {total} pods" + (f" ({members} of the gang and {spares} hot spare{'s' * (spares > 1)})" if spares else "")
    fit = _fitting(total, message or "")
    short = ""
    if fit is not None and fit[0] < total:
        fits, resource, flavor = fit
        if fits >= members:
            left = total - fits
            which = f"its hot spare{'s' * (spares > 1)}" if left == spares else f"{left} of its {spares} hot spares"
            short = (f"; the quota of {resource} in flavor {flavor} holds the gang's {members} pods but not {which}: "
                     "lower spec.spares or raise the quota")
        else:
            short = (f"; the quota of {resource} in flavor {flavor} holds {fits} of the {total} pods, and the gang "
                     f"alone needs {members}: raise the quota" + (" (and count the hot spares)" if spares else ""))
    detail = f": {message}" if message else ""
    return f"waiting for Kueue to admit {pods} on queue {queue}{short}{detail}"


def _fitting(count: int, message: str) -> tuple[int, str, str] | None:
    """(how many of ``count`` pods fit, the resource, the flavor) for the resource of Kueue's
    message whose quota holds the fewest of them, or None when the message says no such thing.

    One pod's request is the pod set's over its count: every pod of the set is alike."""
    fewest: tuple[int, str, str] | None = None
    for m in _NO_FIT.finditer(message):
        before, asked, capacity = (quantity.parse(m.group(k).strip()) for k in ("before", "asked", "capacity"))
        if before is None or asked is None or capacity is None or asked <= 0:
            continue
        fits = max(0, min(count, math.floor((capacity - before) * count / asked)))
        if fewest is None or fits < fewest[0]:
            fewest = (fits, m.group("resource"), m.group("flavor"))
    return fewest


def blocked(p: Pass) -> bool:
    """A job whose scheduling API cannot be used: it says why and waits; True when that is so."""
    if p.o.unavailable is None or p.spec.suspend:
        return False
    reason, message = p.o.unavailable
    before = next((c for c in p.conditions if c.get("type") == "Created"), {})
    if before.get("status") == "True":
        return True  # created before the API went away: its pods are left alone, nothing is written
    if before.get("reason") != reason:
        p.event(EVENT_WARNING, reason, message)
    if p.phase is None:
        p.new["phase"] = PENDING
    p.condition("Created", "False", reason, message)
    return True


def handle(p: Pass) -> bool:
    """Suspends, holds, or resumes the job; True when this pass is about suspension."""
    if blocked(p):
        p.counts(p.current())
        return True
    pods = list(p.o.pods)
    hold = _hold(p)
    if hold is not None:
        reason, message = hold
        p.delete_pods.extend(pod.name for pod in pods if not pod.deleting)
        before = next((c for c in p.conditions if c.get("type") == SUSPENDED), {})
        if p.phase != SUSPENDED or before.get("reason") != reason:
            p.new["phase"] = SUSPENDED
            p.new.pop("startTime", None)
            p.clear("Running", reason, "the job is held")
            deleted = f"; deleting its {len(pods)} pods" if pods else ""
            p.event(EVENT_WARNING if reason == "Evicted" else EVENT_NORMAL, reason, f"{message}{deleted}")
        p.condition(SUSPENDED, "True", reason, message)
        w = p.o.workload
        if w is not None and w.evicted and w.reserved and not pods:
            p.release_workload = True  # the gang stopped: Kueue may give its quota to another job
        p.counts({})
        return True
    if p.phase != SUSPENDED:
        return False
    if pods:
        p.delete_pods.extend(pod.name for pod in pods if not pod.deleting)
        p.condition(SUSPENDED, "True", "Resuming", f"waiting for {len(pods)} pods of the suspended gang to terminate")
        return True
    pods = p.pods_per_attempt
    p.new["phase"] = PENDING
    p.new["startTime"] = format_time(p.now)
    # A new gang of the same attempt: after restarts in place it is the current round's.
    p.new.pop("gangRestart", None)
    p.new["masterAddr"] = names.master_addr(p.o.job, p.restart)
    p.condition("Created", "True", "PodsCreated", f"created {pods} pods for mesh {p.new['mesh']}")
    admitted = p.spec.scheduling_provider == SCHEDULING_KUEUE
    p.condition(SUSPENDED, "False", "Admitted" if admitted else "Resumed",
                "Kueue admitted the job" if admitted else "spec.suspend is false")
    p.event(EVENT_NORMAL, "Admitted" if admitted else "Resumed",
            f"job {'admitted' if admitted else 'resumed'}; creating {pods} pods (attempt {p.restart})")
    p.create_pods(range(pods), p.restart)
    p.counts({})
    return True
