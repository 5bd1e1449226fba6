"""activeDeadlineSeconds: a job active longer than its deadline fails with DeadlineExceeded.

The clock runs from ``status.startTime`` (the start, or the last resume from suspension) and
includes restarts. Before the deadline the pass asks to be woken when it passes.
"""

from __future__ import annotations

from .model import parse_time
from .status import Pass

REASON: str = "DeadlineExceeded"


def expired(p: Pass) -> bool:
    """Fails the job if its deadline passed (True); else schedules a wake-up for it."""
    limit = p.spec.active_deadline_seconds
    started = parse_time(p.o.status.get("startTime"))
    if limit is None or started is None:
        return False
    left = (started - p.now).total_seconds() + limit
    if left > 0:
        p.requeue.append(left)
        return False
    message = f"the job was active longer than activeDeadlineSeconds ({limit}s)"
    p.fail(REASON, message, failure=p.failure_record(REASON, message))
    p.counts(p.current())
    return True
