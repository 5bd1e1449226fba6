"""spec.suspend: no pods while true (the convention Kueue uses to admit jobs); resume after.

Suspending deletes every pod and sets phase Suspended (startTime is dropped, so the deadline
clock restarts at the resume). Resuming waits until the suspended gang's pods are gone, then
creates the same attempt again with a new startTime.
"""

from __future__ import annotations

from .model import EVENT_NORMAL, PENDING, SUSPENDED, format_time
from .status import Pass


def handle(p: Pass) -> bool:
    """Suspends, holds, or resumes the job; True when this pass is about suspension."""
    pods = list(p.o.pods)
    if p.spec.suspend:
        p.delete_pods.extend(pod.name for pod in pods if not pod.deleting)
        if p.phase != SUSPENDED:
            p.new["phase"] = SUSPENDED
            p.new.pop("startTime", None)
            p.condition(SUSPENDED, "True", "Suspended", f"spec.suspend is true; {len(pods)} pods deleted")
            p.clear("Running", "Suspended", "the job is suspended")
            p.event(EVENT_NORMAL, "Suspended", f"job suspended; deleting its {len(pods)} pods")
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
    p.condition("Created", "True", "PodsCreated", f"created {pods} pods for mesh {p.new['mesh']}")
    p.condition(SUSPENDED, "False", "Resumed", "spec.suspend is false")
    p.event(EVENT_NORMAL, "Resumed", f"job resumed; creating {pods} pods (attempt {p.restart})")
    p.create_pods(range(pods), p.restart)
    p.counts({})
    return True
