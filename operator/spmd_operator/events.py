"""Events on SPMDJobs, recorded as client-go's EventRecorder records them.

Where it sits: beside the controller (which hands it each pass's Events), above :mod:`.kube`.

* Every transition's Event is written even when a pass is cut short. The controller posts a
  pass's Events BEFORE its status patch, each under a name derived from the job's uid, the status
  the pass started from and the Event's place in the pass. A pass cut short after its Events
  (the API server restarted, the operator killed, a failover) is repeated from the same status by
  whichever replica leads next: it derives the same names, and the API server's 409 says the
  Event is there already. A pass cut short before its Events repeats them as well.
* No duplicates from retries: a retried POST of the same name gets 409 AlreadyExists, which
  counts as written.
* Repeats are aggregated: the same (type, reason, message) on the same job within
  AGGREGATE_SECONDS increments ``count`` and moves ``lastTimestamp`` on the first Event (a PATCH)
  instead of posting another. Like client-go's, this memory is the process's own: after a
  restart the next repeat starts a new Event.
* A transition's Event is not best effort: if it cannot be posted, :meth:`EventRecorder.record`
  raises and the pass stops before its status patch (it is retried, and the Event with it).
  Other Events (a failed pass's ReconcileError, NameTaken) are best effort: logged, never raised.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from . import kube, names
from .lifecycle.model import Event

logger = logging.getLogger(__name__)

#: `kubectl describe`'s "From" column of the Events the operator posts.
COMPONENT: Final = "spmdjob-operator"
EVENT_MESSAGE_CHARS: Final = 1024
#: Repeats within this many seconds are folded into one Event (client-go: 10 minutes).
AGGREGATE_SECONDS: Final = 600.0

JobKey = tuple[str, str]


@dataclass
class _Recent:
    name: str
    count: int
    first: str
    at: float


def fingerprint(status: Mapping[str, Any]) -> str:
    """A short digest of a status: the transition a pass starts from."""
    return hashlib.sha256(json.dumps(status, sort_keys=True, default=str).encode()).hexdigest()[:16]


def event_name(job: str, uid: str, *parts: object) -> str:
    """``<job>.<digest>``: the same inputs always give the same name."""
    digest = hashlib.sha256("|".join([uid, *map(str, parts)]).encode()).hexdigest()[:16]
    return f"{job}.{digest}"


class EventRecorder:
    """Posts, deduplicates and aggregates the Events of every job.

    Args:
        api: the API client (writes are fenced like every other).
        instance: ``reportingInstance``: this replica.
    """

    def __init__(self, api: kube.Kube, instance: str) -> None:
        self.api = api
        self.instance = instance
        self._posted: dict[JobKey, set[str]] = {}
        self._recent: dict[JobKey, dict[tuple[str, str, str], _Recent]] = {}

    def forget(self, key: JobKey) -> None:
        """Drops what is remembered of job ``key`` (deleted)."""
        self._posted.pop(key, None)
        self._recent.pop(key, None)

    def known(self) -> int:
        """How many jobs anything is remembered of (memory checks)."""
        return len(set(self._posted) | set(self._recent))

    async def record(self, job: Mapping[str, Any], events: Iterable[Event], *, transition: str | None = None) -> None:
        """Writes ``events`` on ``job``.

        Args:
            job: the job's object (name, namespace, uid, resourceVersion are used).
            events: in the order they happened.
            transition: the fingerprint of the status the pass started from; None for Events
                that are no transition (a failed pass), named by their content instead.
        """
        events = list(events)
        if not events:
            return
        meta = job.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        uid = str(meta.get("uid", ""))
        loop_time = asyncio.get_running_loop().time()
        recent = self._recent.setdefault(key, {})
        for k in [k for k, r in recent.items() if loop_time - r.at > AGGREGATE_SECONDS]:
            del recent[k]
        posted = self._posted.setdefault(key, set())
        failed: Exception | None = None
        for i, e in enumerate(events):
            message = e.message[:EVENT_MESSAGE_CHARS]
            if transition is not None:
                name = event_name(key[1], uid, transition, i, e.type, e.reason)
            else:
                name = event_name(key[1], uid, e.type, e.reason, message)
            if transition is not None and name in posted:
                continue  # this pass was repeated after a failure: written already
            content = (e.type, e.reason, message)
            try:
                seen = recent.get(content)
                if seen is not None and await self._aggregate(key[0], seen.name, seen.count + 1, key):
                    seen.count += 1
                    seen.at = loop_time
                else:
                    now = _now()
                    body = self._body(meta, e, message, name, now)
                    created = await self.api.create(kube.events_url(key[0]), body, keep=False, owner=key)
                    count = 1
                    if created is None and transition is None:
                        # A repeat whose first occurrence an earlier process posted: count it there.
                        count = await self._bump(key[0], name, key)
                    recent[content] = _Recent(name, count, now, loop_time)
                posted.add(name)
            except kube.Fenced as err:
                if transition is not None:
                    raise
                logger.info("SPMDJob %s/%s: Event %s not posted: %s", *key, e.reason, err)
                return
            except Exception as err:  # noqa: BLE001 - the transition's pass is retried; others are best effort
                logger.warning("SPMDJob %s/%s: could not post an Event: %s", *key, err)
                failed = failed or err
        if len(posted) > 256:  # only the newest transitions can repeat
            self._posted[key] = set(list(posted)[-64:])
        if failed is not None and transition is not None:
            raise failed

    async def _aggregate(self, namespace: str, name: str, count: int, owner: kube.Owner) -> bool:
        """Sets the Event ``name``'s count and lastTimestamp (a write of the job ``owner``); False
        when it cannot (gone, or no RBAC to patch Events): a new Event is posted instead."""
        try:
            await self.api.patch(f"{kube.events_url(namespace)}/{name}",
                                 {"count": count, "lastTimestamp": _now()[:19] + "Z"}, owner=owner)
        except kube.KubeError as e:
            if e.status in (403, 404):
                return False
            raise
        return True

    async def _bump(self, namespace: str, name: str, owner: kube.Owner) -> int:
        """Counts one more occurrence on an existing Event of an earlier process; its new count."""
        try:
            body = await self.api.get(f"{kube.events_url(namespace)}/{name}") or {}
        except kube.KubeError:  # no RBAC to read Events: the repeat is not counted
            return 1
        count = int(body.get("count") or 1) + 1
        return count if await self._aggregate(namespace, name, count, owner) else count - 1

    def _body(self, meta: Mapping[str, Any], e: Event, message: str, name: str, now: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": meta.get("namespace")},
            "involvedObject": {"apiVersion": names.API_VERSION, "kind": names.KIND, "name": meta.get("name"),
                               "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": e.type,
            "reason": e.reason,
            "message": message,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "eventTime": now,
            "action": e.reason,
            "count": 1,
        }


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
