"""Success: the job succeeds when every rank of the current attempt exited 0.

A Monarch-mode job never succeeds: its pods serve a client until the job is deleted, suspended or
out of time, and a pod that exits 0 is a lost host (:mod:`.failure`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from .. import names
from . import inplace
from .model import EVENT_NORMAL, RESTARTING, RUNNING, SUCCEEDED, PodInfo, format_time
from .status import Pass


def succeeded(p: Pass) -> bool:
    """Marks the job Succeeded if every pod of the current attempt succeeded, or (restart in
    place) its coordinator said every rank of its last round exited 0 (an elastic round smaller
    than the job: a pod that was not in it is stopped); True if so."""
    if p.spec.mode == names.MODE_MONARCH:
        return False
    current = p.current()
    n = p.pods_per_attempt
    members = _finished(p, current)
    if members is None and (len(current) != n or not all(pod.phase == SUCCEEDED for pod in current.values())):
        return False
    if members is not None:
        # The last round's members end by themselves (their agents got ``finish``); a pod of an
        # elastic job that was not in it waits for a coordinator that is gone: it is stopped.
        p.stop(pod for index, pod in current.items() if index not in members)
    procs = p.spec.world_size
    p.new.update(phase=SUCCEEDED, completionTime=format_time(p.now))
    p.condition(SUCCEEDED, "True", "AllRanksSucceeded", f"all {procs} ranks exited 0")
    p.clear(RUNNING, "AllRanksSucceeded", "the job finished")
    p.clear(RESTARTING, "AllRanksSucceeded", "the job finished")
    p.event(EVENT_NORMAL, "Succeeded", f"all {procs} ranks exited 0")
    p.counts(current)
    if members is not None:
        # The coordinator's word (or an agent's line): every rank of the last round exited 0. Its
        # pods may still show Running while their agents end: their procs succeeded all the same.
        p.new["succeeded"] = p.procs_per_pod * len(members & set(current))
        p.new["running"] = 0
    if p.spec.ttl_seconds_after_finished is not None:
        p.requeue.append(float(p.spec.ttl_seconds_after_finished))
    return True


#: An agent's termination message after ``finish`` (payload.agent.finished_line).
FINISHED_LINE: Final = re.compile(r"monarch-spmd worker: the gang finished in restart \d+: every rank of pods "
                                  r"([\d,]+) exited 0")


def _finished(p: Pass, current: Mapping[int, PodInfo]) -> set[int] | None:
    """The pods of the gang's last round, when its coordinator said it finished (restart in
    place): in what the operator heard, or in the termination message of a pod that succeeded
    (the operator was away, and the coordinator is gone); else None."""
    if not p.in_place:
        return None
    v = inplace.view(p)
    if v is not None and v.final is not None and v.final.get("type") == "succeeded":
        started = [e for e in v.started if isinstance(e.get("round_members"), list)]
        return set(started[-1]["round_members"]) if started else set(current)
    for pod in current.values():
        found = FINISHED_LINE.search(pod.message or "") if pod.phase == SUCCEEDED else None
        if found:
            return {int(m) for m in found[1].split(",")}
    return None
