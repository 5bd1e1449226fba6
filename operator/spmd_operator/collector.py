"""The children of deleted jobs: deleted by the leader at once, not at the garbage collector's pace.

Owns what happens to a job's pods, Services, PodGroups and Workloads once the job is deleted:
which deletions are asked for (``--cascade=orphan`` keeps them, ``--cascade=foreground`` is
collected as soon as it is seen, a finalizer of someone else's waits for the deletion), the
queue of children still to DELETE and the few tasks that drain it (in the background, at most
the API client's concurrency), and whether children of deleted jobs are still held that will go
(:meth:`ChildCollector.pending`: a new process would list them again only to drop them). The
garbage collector still runs; whichever comes second finds a child gone.

Where it sits: a part of the controller (:mod:`.controller` hands it every deleted job's watch
event, and stops it with each leadership term); above :mod:`.informer` (whose caches show the
children), :mod:`.kube` (the deletions) and :mod:`.jobloop`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from . import informer, kube, names
from .jobloop import JobKey, JobLoop

logger = logging.getLogger(__name__)

#: The finalizers a job's deletion options put on it (``kubectl delete --cascade=orphan`` and
#: ``--cascade=foreground``): the garbage collector's, which it removes when done.
ORPHAN_FINALIZER: Final = "orphan"
FOREGROUND_FINALIZER: Final = "foregroundDeletion"


class ChildCollector:
    """Deletes the children of deleted jobs.

    Args:
        api: the API client.
        jobs: the controller's jobs (read, never changed here).
        informers: the controller's informers (those whose groups are jobs show the children).
        leading: whether this replica may write (a standby collects nothing).
        on_idle: called when the last deletion of a batch is done (what they took goes back).
    """

    def __init__(self, api: kube.Kube, jobs: Mapping[JobKey, JobLoop], *,
                 informers: Callable[[], Iterable[informer.Informer[Any]]],
                 leading: Callable[[], bool], on_idle: Callable[[], None]) -> None:
        self.api = api
        self.jobs = jobs
        self.informers = informers
        self.leading = leading
        self.on_idle = on_idle
        #: Uids of jobs seen with the orphan finalizer: their children are left where they are.
        self._orphaning: set[str] = set()
        #: Uids of jobs whose children this replica deletes, or deleted, until the job is gone.
        self._collected: set[str] = set()
        #: The children of deleted jobs still to DELETE: (job, path, the pod's uid or None), and
        #: the tasks deleting them (at most the API client's concurrency).
        self._doomed: collections.deque[tuple[JobKey, str, str | None]] = collections.deque()
        self._collections: set[asyncio.Task[None]] = set()
        self._deleters = 0

    def stop(self) -> asyncio.Future[Any]:
        """Stops every deletion at once (this replica must not write any more); what it returns
        is done once they ended."""
        tasks = list(self._collections)
        self._doomed.clear()
        for task in tasks:
            task.cancel()
        return asyncio.gather(*tasks, return_exceptions=True)

    def pending(self) -> bool:
        """Whether children of deleted jobs are still being deleted, or still held that will go:
        owned (the garbage collector deletes them) or being deleted. Orphans (no owner,
        ``--cascade=orphan``) stay and do not count."""
        if self._doomed or self._deleters:
            return True
        for inf in self.informers():
            if inf.label != names.LABEL_JOB:
                continue  # the payload ConfigMaps: no job's
            for key, children in inf.store.items():
                if key not in self.jobs and any(owner or getattr(summary, "deleting", False)
                                                for owner, summary in children.values()):
                    return True
        return False

    def deleted(self, event_type: str | None, key: JobKey, meta: Mapping[str, Any]) -> None:
        """Deletes a deleted job's children at once, instead of leaving them to the garbage
        collector alone, which deletes at kube-controller-manager's client rate (20 requests a
        second by default): the pods of 1,000 deleted jobs of 4, and their GPUs, were all gone
        only after 424 s; 65 s with this (benchmarks/RESULTS.md, 8n).

        Only what the deletion asked for: a job deleted with ``--cascade=orphan`` (the orphan
        finalizer seen on it, now or before) keeps its children, and a job held by a finalizer
        of someone else's waits until it is gone. ``--cascade=foreground`` is collected as soon
        as it is seen. Each child is one the informers show with the job's uid as controller
        owner, deleted in the background like the collector does (a pod with its uid as a
        precondition); the collector still runs, and whichever comes second finds it gone.
        """
        uid = str(meta.get("uid") or "")
        finalizers = meta.get("finalizers") or []
        if not uid:
            return
        if ORPHAN_FINALIZER in finalizers:
            self._orphaning.add(uid)
            return
        if event_type == "DELETED":
            orphaned = uid in self._orphaning
            self._orphaning.discard(uid)
            if uid in self._collected:
                self._collected.discard(uid)
                return
            if orphaned:
                return
        elif FOREGROUND_FINALIZER not in finalizers or uid in self._collected or uid in self._orphaning:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if not self.leading():
            return  # a standby: the leader, or this replica once it leads, collects at the deletion
        if event_type != "DELETED":
            self._collected.add(uid)
        for inf in self.informers():
            for name, (owner, summary) in inf.store.get(key, {}).items():
                if owner == uid and not getattr(summary, "deleting", False):
                    self._doomed.append((key, f"{inf.collection(key[0])}/{name}", getattr(summary, "uid", None) or None))
        # A few deleters drain the queue: a thousand jobs deleted at once queue 6,000 small
        # tuples, not 6,000 waiting coroutines.
        for _ in range(min(len(self._doomed), self.api.concurrency - self._deleters)):
            self._deleters += 1
            task = running.create_task(self._delete_doomed(), name="delete the children of deleted jobs")
            self._collections.add(task)
            task.add_done_callback(self._collections.discard)

    async def _delete_doomed(self) -> None:
        failed, first = 0, None
        try:
            while self._doomed:
                key, path, uid = self._doomed.popleft()
                try:
                    await self.api.delete(path, uid=uid, owner=key)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - the garbage collector deletes it still
                    failed, first = failed + 1, first or f"{path}: {e}"
        finally:
            self._deleters -= 1
        if failed:
            logger.info("%d deletions of deleted jobs' children failed (first: %s); the garbage collector "
                        "deletes them", failed, first)
        if not self._deleters:  # the last one: what the deletions took goes back too
            self.on_idle()
