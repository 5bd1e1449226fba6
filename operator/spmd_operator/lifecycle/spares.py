"""Hot spares (spec.spares): created with the gang, adopted when they take a lost pod's place.

Where it sits: a policy of :mod:`spmd_operator.lifecycle`, run last in every pass of a valid job
(:func:`tend`), beside :mod:`.inplace`, whose view of the coordinator it reads. Pure, like every
policy. docs/restart-in-place.md ("Hot spares") says what the agents do; the operator's part:

* **Created with the gang.** When the pods of an attempt are created (or while its gang runs with
  fewer spares waiting than spec.spares), spare pods ``<job>-<id>-r<attempt>-s<k>`` are created
  too, each with an index never used before in that attempt.
* **Adopted when they take a place.** The coordinator's ``takeover`` event (member m, spare k)
  makes spare k's pod member m's newest replacement: relabelled with m's rank, coordinates and
  replacement number, it is member m's pod for everything that reads pods (status, logs, the
  next lost pod). :mod:`.inplace` neither replaces member m alone nor recreates the gang for its
  lost node, and counts the restart as a disruption.
* **Gone with their attempt.** A spare of another attempt, or of a job no longer active, is
  deleted (its worker exits 0 by itself once its coordinator is gone).
* **Status.** ``status.spares``: ``ready`` (the coordinator's count of spares waiting) and
  ``used`` (places taken in the current attempt).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from typing import Any, Final

from monarch_spmd.spec import JobSpec

from .. import names
from . import gang as _gang
from . import inplace
from .model import FAILED, PENDING, RESTARTING, RUNNING, PodInfo, format_time, parse_time
from .status import Pass

_SPARE_NAME: Final = re.compile(r"-s(\d+)$")
#: The back-off before a spare pod after one crashed (doubling for each further one, at most the
#: second): as a crash loop of the program's (counting.backoff_seconds).
SPARE_BACKOFF: Final = 10.0
SPARE_MAX_BACKOFF: Final = 300.0


def tend(p: Pass) -> None:
    """Creates, adopts and deletes the job's hot spares (see the module's text)."""
    o = p.o
    valid = isinstance(o.spec, JobSpec)
    phase = p.new.get("phase")
    active = valid and phase in (PENDING, RUNNING, RESTARTING) and p.in_place and p.spec.spares > 0
    gang = p.create_restart if p.create and p.create_restart is not None else p.new_gang()
    for spare in o.spares:
        if not spare.finished and not spare.deleting and (not active or spare.restart != gang):
            p.delete_pods.append(spare.name)
    if active:
        p.delete_pods.extend(s.name for s in _gang.kept_off_needlessly(p, o.spares))
    if not active:
        if valid and p.spec.spares > 0 and "spares" in p.new and phase not in (PENDING, RUNNING, RESTARTING):
            p.new["spares"] = {**p.new["spares"], "ready": 0}
        return
    v = inplace.view(p) if gang == p.gang else None
    taken = v.taken_over() if v is not None else {}
    waiting = {s.spare: s for s in o.spares if s.restart == gang and s.spare is not None and not s.deleting}
    used = set(waiting)
    for member, event in taken.items():
        lost = inplace.member_before_takeover(p, member, event)
        silent = inplace.silent_loss(p, member, lost)
        if (silent is not None and silent.get("node") and v is not None and inplace.recent(v, event)
                and lost is not None and inplace.alive(lost)):
            # Its agent fell silent while its pod still shows Running (not deleted: a drain's
            # pods say so): its node froze just now, and the next spare keeps off it.
            p.lost_nodes.add(str(silent["node"]))
        spare = event.get("spare")
        if not isinstance(spare, int) or isinstance(spare, bool):
            continue
        used.add(spare)
        pod = waiting.pop(spare, None)
        if pod is not None and not pod.finished and 0 < member < p.pods_per_attempt:
            p.adopt.append((pod.name, member, p.next_replacement(member)))
    for pod in (*o.pods, *o.gone):
        found = _SPARE_NAME.search(pod.name) if pod.restart == gang else None
        if found:
            used.add(int(found.group(1)))  # an adopted spare's name stays its own
    first = next_index(p, gang, used)
    # Spares created by an earlier pass that the informer does not show yet: there, not missing.
    coming = [i for i in range(first) if names.spare_pod_name(o.job, gang, i) in o.creating]
    ready = v.spares_ready if v is not None and v.spares_ready is not None else 0
    record = {"ready": ready, "used": len(taken), "attempt": gang, "next": first,
              **_crashes(p, gang, waiting.values(), ready)}
    p.new["spares"] = record
    if not p.create and not any(pod.restart == gang for pod in o.pods):
        return  # the attempt's pods are not there yet: its spares come with them
    alive = sorted((s for s in waiting.values() if not s.finished), key=lambda s: s.spare or 0)
    if len(alive) > p.spec.spares:
        # More spares than spec.spares (two passes raced an informer that lagged): the newest go,
        # so the job holds no more pods than its Workload and quota count. (One still on its way
        # is judged once it is shown.)
        p.delete_pods.extend(s.name for s in alive[p.spec.spares:] if s.name not in p.delete_pods)
    missing = p.spec.spares - len(alive) - len(coming)
    retry = parse_time(record.get("retryTime"))
    if missing > 0 and retry is not None and p.now < retry:
        p.requeue.append((retry - p.now).total_seconds())  # spares crash: the next one waits
    elif missing > 0:
        p.spares.extend(range(first, first + missing))
        p.spare_restart = gang
        record["next"] = first + missing


def next_index(p: Pass, gang: int, used: Iterable[int]) -> int:
    """The index of attempt ``gang``'s next spare: above every one in use or listed, and never
    below the status's ``next``: the pods deleted long ago are no longer listed (o.gone keeps
    recent ones only), and a spare's name must never be one a pod had."""
    before = p.o.status.get("spares") or {}
    floor = before.get("next") if before.get("attempt") == gang else 0
    floor = floor if isinstance(floor, int) and not isinstance(floor, bool) else 0
    return max(max(used, default=-1) + 1, floor)


def _crashes(p: Pass, gang: int, waiting: Iterable[PodInfo], ready: int) -> dict[str, Any]:
    """Spare pods of attempt ``gang`` that ended without taking a place are deleted (none is left
    behind); those that failed count as crashes in a row, and the next spare waits a back-off
    (10 s doubling to 300 s) from the latest: a spare that fails on every start (a bad node, a
    broken image) is not replaced once a second. Every spare ready again ends the count."""
    before = p.o.status.get("spares") or {}
    same = before.get("attempt") == gang
    crashed = int(before.get("crashed") or 0) if same else 0
    retry = before.get("retryTime") if same else None
    for pod in waiting:
        if not pod.finished:
            continue
        p.delete_pods.append(pod.name)
        if pod.phase == FAILED:
            crashed += 1
            wait = min(SPARE_MAX_BACKOFF, SPARE_BACKOFF * 2 ** (crashed - 1))
            retry = format_time(p.now + dt.timedelta(seconds=wait))
    if ready >= p.spec.spares:
        crashed, retry = 0, None  # every spare is ready again: the crashes are over
    if not crashed:
        return {}
    out: dict[str, Any] = {"attempt": gang, "crashed": crashed}
    if retry is not None:
        out["retryTime"] = retry
    return out
