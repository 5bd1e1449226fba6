"""Finished jobs, and ttlSecondsAfterFinished.

A Succeeded or Failed job keeps the pods that finished (for their logs), stops any that still
run (restart in place: only once the agents, which end their pods themselves after the
coordinator's verdict, had the pods' stop grace and ENDING_GRACE_SECONDS to), drops its master Services and PodGroups (:func:`clean`; a job that failed
before it ran, InvalidSpec, drops them too), marks its Kueue Workload finished (so Kueue frees
its quota for the next job in the queue), and is deleted (its children with it, by garbage collection)
``ttlSecondsAfterFinished`` after ``status.completionTime``.
"""

from __future__ import annotations

from monarch_spmd import policy

from .model import SUCCEEDED, TERMINAL, parse_time
from .status import Pass


def clean(p: Pass) -> None:
    """Deletes what only a running gang needs: the master Services and PodGroups. (The payload
    ConfigMap is the namespace's, shared by its jobs; the operator deletes it once no job there
    is unfinished.)"""
    p.delete_services.extend(s.name for s in p.o.services if not s.deleting)
    p.delete_podgroups.extend(g.name for g in p.o.podgroups if not g.deleting)
    for key in ("refusal", "startFailures"):
        p.new.pop(key, None)


#: Restart in place: after the coordinator's verdict the agents end their pods themselves; a pod
#: still running this long after the job's end (and the pods' stop grace) is stopped.
ENDING_GRACE_SECONDS: float = 15.0


def handle(p: Pass) -> bool:
    """Handles a job that already finished; True if it has."""
    if p.phase not in TERMINAL:
        return False
    done = parse_time(p.o.status.get("completionTime"))
    running = [pod for pod in p.o.pods if not pod.finished and not pod.deleting]
    if p.in_place and running and done is not None:
        left = (done - p.now).total_seconds() + policy.stop_grace(p.spec) + ENDING_GRACE_SECONDS
        if left > 0:
            p.requeue.append(left)  # the agents are ending them: their logs stay
            running = []
    p.stop(running)
    clean(p)
    if p.o.workload is not None and not p.o.workload.finished:
        p.finish_workload = True
    p.counts(p.current())
    if p.phase == SUCCEEDED:
        # Every rank exited 0 (the job is not Succeeded otherwise): pods still ending, or gone
        # since, do not take back the procs recorded as succeeded.
        p.new["succeeded"] = max(p.new["succeeded"], int(p.o.status.get("succeeded") or 0))
        p.new["running"] = 0
    ttl = p.spec.ttl_seconds_after_finished
    done = parse_time(p.o.status.get("completionTime"))
    if ttl is not None and done is not None:
        left = (done - p.now).total_seconds() + ttl
        if left <= 0:
            p.delete_job = True
        else:
            p.requeue.append(left)
    return True
