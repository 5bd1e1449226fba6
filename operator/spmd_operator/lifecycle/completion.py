"""Success: the job succeeds when every rank of the current attempt exited 0."""

from __future__ import annotations

from .model import EVENT_NORMAL, RESTARTING, RUNNING, SUCCEEDED, format_time
from .status import Pass


def succeeded(p: Pass) -> bool:
    """Marks the job Succeeded if every pod of the current attempt succeeded; True if so."""
    current = p.current()
    n = p.pods_per_attempt
    if len(current) != n or not all(pod.phase == SUCCEEDED for pod in current.values()):
        return False
    procs = p.spec.world_size
    p.new.update(phase=SUCCEEDED, completionTime=format_time(p.now))
    p.condition(SUCCEEDED, "True", "AllRanksSucceeded", f"all {procs} ranks exited 0")
    p.clear(RUNNING, "AllRanksSucceeded", "the job finished")
    p.clear(RESTARTING, "AllRanksSucceeded", "the job finished")
    p.event(EVENT_NORMAL, "Succeeded", f"all {procs} ranks exited 0")
    p.counts(current)
    if p.spec.ttl_seconds_after_finished is not None:
        p.requeue.append(float(p.spec.ttl_seconds_after_finished))
    return True
