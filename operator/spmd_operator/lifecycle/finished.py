"""Finished jobs, and ttlSecondsAfterFinished.

A Succeeded or Failed job keeps the pods that finished (for their logs), stops any that still
run, drops its master Services, PodGroups and worker ConfigMap (:func:`clean`; a job that failed
before it ran, InvalidSpec, drops them too), marks its Kueue Workload finished (so Kueue frees
its quota for the next job in the queue), and is deleted (its children with it, by garbage collection)
``ttlSecondsAfterFinished`` after ``status.completionTime``.
"""

from __future__ import annotations

from .model import CONFIGMAP_MISSING, TERMINAL, parse_time
from .status import Pass


def clean(p: Pass) -> None:
    """Deletes what only a running gang needs: the master Services, PodGroups and the ConfigMap."""
    p.delete_services.extend(s.name for s in p.o.services if not s.deleting)
    p.delete_podgroups.extend(g.name for g in p.o.podgroups if not g.deleting)
    if p.o.configmap != CONFIGMAP_MISSING:
        p.delete_configmap = True
    for key in ("refusal", "startFailures"):
        p.new.pop(key, None)


def handle(p: Pass) -> bool:
    """Handles a job that already finished; True if it has."""
    if p.phase not in TERMINAL:
        return False
    p.stop(p.o.pods)
    clean(p)
    if p.o.workload is not None and not p.o.workload.finished:
        p.finish_workload = True
    p.counts(p.current())
    ttl = p.spec.ttl_seconds_after_finished
    done = parse_time(p.o.status.get("completionTime"))
    if ttl is not None and done is not None:
        left = (done - p.now).total_seconds() + ttl
        if left <= 0:
            p.delete_job = True
        else:
            p.requeue.append(left)
    return True
