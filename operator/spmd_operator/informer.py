"""Informers: one labelled list+watch per kind of child, kept as small summaries in memory.

Where it sits: above :mod:`spmd_operator.kube`, below the controller's parts that make them
(:mod:`spmd_operator.view`, :mod:`spmd_operator.payloads`), whose stores every pass reads, and the
controller, which is woken (``on_change``) for each job whose children changed.

An informer lists the collection with the server-side label selector ``spmd.monarch.dev/job``
(only the operator's children cross the wire), then watches from the list's resourceVersion.
Every object is summarized on arrival (a :class:`~.lifecycle.PodInfo` is a few hundred bytes;
the pod body is dropped), so memory stays flat at thousands of pods.

The view is never trusted beyond what the server said last, and never before the server said it:

* :attr:`Informer.synced` is False until every watched scope was listed once, and again from the
  moment a watch ends with 410 Gone (the version is too old, e.g. after an API server restart) or
  breaks until the list that follows has been read. The controller runs no pass of a job that
  needs an unsynced informer: an empty store before the first list is not "nothing exists".
* A re-list REPLACES the store: objects missing from the new list are dropped and their jobs
  woken, so no deleted pod lives on as a ghost. A watch the server closes at its timeout is
  simply opened again from the last resourceVersion (bookmarks keep it fresh): no LIST.
* A list that fails (403: the RBAC rule is missing; 404: the API, e.g. a CRD, is not installed)
  is kept in :attr:`Informer.failure` for the jobs that need this informer to report; retries
  back off, up to a minute for those two.

Memory is bounded: a job's entry goes with its last child; the last states of deleted children
(tombstones) are kept only for jobs the controller still knows (``keep``) and at most
TOMBSTONE_SECONDS, and :meth:`Informer.forget` drops a deleted job's at once.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from . import kube, names

logger = logging.getLogger(__name__)

T = TypeVar("T")
JobKey = tuple[str, str]

#: Seconds between attempts when listing or watching fails, growing to the last.
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)
#: The same when the list is forbidden (403) or the API does not exist (404): a slow retry, so a
#: missing RBAC rule or CRD costs the API server little, yet a fix is noticed within a minute.
ABSENT_BACKOFF_SECONDS = (2.0, 5.0, 15.0, 30.0, 60.0)
#: How long the last state of a deleted object is kept (see :meth:`Informer.gone`).
TOMBSTONE_SECONDS = 600.0


class Informer(Generic[T]):
    """A list+watch cache of one kind of child, grouped by job.

    Args:
        api: the API client.
        collection: a function of a namespace (None: all namespaces) giving the collection's
            path, e.g. :func:`kube.pods_url`.
        summarize: object -> summary (None: not ours, ignored).
        namespaces: the namespaces to watch; None or a pattern with ``*`` watches every
            namespace (and keeps the matching ones).
        on_change: called with the job keys whose children changed.
        name: for logs.
        on_synced: called after every completed list (the first, and each re-list).
        keep: whether tombstones of job key are worth keeping (the job is still known).
        metadata: list and watch the objects' metadata only (``summarize`` reads nothing else):
            what a large object carries besides is then neither sent nor decoded.
        label: the label selected on (it must exist) and grouped by: the job's name for a job's
            children; :data:`names.LABEL_PAYLOAD` groups the payload ConfigMaps by their hash.

    Attributes:
        ready: set once every namespace was listed the first time.
        failure: the error of the last failed list, until a list succeeds.
        lists: how many lists completed (a re-list after a broken watch counts).
    """

    def __init__(self, api: kube.Kube, collection: Callable[[str | None], str],
                 summarize: Callable[[Mapping[str, Any]], T | None], *,
                 namespaces: Iterable[str] | None, on_change: Callable[[set[JobKey]], None], name: str,
                 on_synced: Callable[[], None] | None = None, keep: Callable[[JobKey], bool] | None = None,
                 metadata: bool = False, label: str = names.LABEL_JOB) -> None:
        self.api = api
        self.metadata = metadata
        self.label = label
        self.collection = collection
        self.summarize = summarize
        self.on_change = on_change
        self.name = name
        self.on_synced = on_synced
        self.keep = keep
        patterns = list(namespaces) if namespaces else []
        self.patterns = patterns
        # A plain name list is watched namespace by namespace (a Role per namespace suffices);
        # patterns or "all" need one cluster-wide watch.
        self.scopes: list[str | None] = patterns if patterns and not any("*" in p or "?" in p for p in patterns) else [None]
        self.store: dict[JobKey, dict[str, tuple[str | None, T]]] = {}
        self.tombstones: dict[JobKey, dict[str, tuple[str | None, T, float]]] = {}
        self.ready = asyncio.Event()
        self.failure: kube.KubeError | None = None
        self.lists = 0
        self._listed: set[str | None] = set()
        self._stale: set[str | None] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._swept = 0.0

    @property
    def synced(self) -> bool:
        """Every scope listed, and no watch broken since its last list."""
        return len(self._listed) == len(self.scopes) and not self._stale

    def sizes(self) -> tuple[int, int, int]:
        """(jobs with children, children, tombstones) held: for the memory metrics and tests."""
        return (len(self.store), sum(len(c) for c in self.store.values()),
                sum(len(t) for t in self.tombstones.values()))

    # --- reading ----------------------------------------------------------------------------

    def get(self, key: JobKey, uid: str) -> list[T]:
        """The summaries of the children of job ``key`` whose controller owner is ``uid``."""
        return [summary for owner, summary in self.store.get(key, {}).values() if owner == uid]

    def held(self, key: JobKey) -> list[T]:
        """The summaries of every object of group ``key``, whoever owns it."""
        return [summary for _, summary in self.store.get(key, {}).values()]

    def gone(self, key: JobKey, uid: str) -> list[T]:
        """The last states of deleted children of job ``key`` owned by ``uid`` (recent ones only).

        A watch's DELETED event carries the object as it was last: for a pod removed with its
        node, that is where the reason (DeletionByPodGC, "node no longer exists") is written.
        """
        self._sweep()
        stones = self.tombstones.get(key, {})
        return [summary for owner, summary, _ in stones.values() if owner == uid]

    def forget(self, key: JobKey) -> None:
        """Drops the tombstones of job ``key`` (deleted: nobody will ask for them)."""
        self.tombstones.pop(key, None)

    def _sweep(self) -> None:
        """Drops tombstones older than TOMBSTONE_SECONDS or of jobs no longer known (every 10 s at most)."""
        now = time.monotonic()
        if now - self._swept < 10.0:
            return
        self._swept = now
        for key in list(self.tombstones):
            stones = self.tombstones[key]
            if self.keep is not None and not self.keep(key):
                del self.tombstones[key]
                continue
            for name in [n for n, (_, _, t) in stones.items() if now - t > TOMBSTONE_SECONDS]:
                del stones[name]
            if not stones:
                del self.tombstones[key]

    def deleted_at(self, key: JobKey, name: str) -> float | None:
        """When the watch last saw the child ``name`` of job ``key`` deleted (``time.monotonic``,
        the clock of asyncio's loop), if it did."""
        stone = self.tombstones.get(key, {}).get(name)
        return stone[2] if stone else None

    def foreign(self, key: JobKey, uid: str) -> list[str]:
        """Names of children labelled with job ``key`` but not owned by ``uid`` (a namesake's)."""
        return [name for name, (owner, _) in self.store.get(key, {}).items() if owner != uid]

    # --- running ----------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(scope), name=f"informer {self.name} {scope or '*'}")
                       for scope in self.scopes]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _wanted(self, namespace: str) -> bool:
        return not self.patterns or any(fnmatch.fnmatchcase(namespace, p) for p in self.patterns)

    def _entry(self, body: Mapping[str, Any]) -> tuple[JobKey, str, str | None, T] | None:
        meta = body.get("metadata") or {}
        namespace, job = meta.get("namespace") or "", (meta.get("labels") or {}).get(self.label)
        if not job or not self._wanted(namespace):
            return None
        summary = self.summarize(body)
        if summary is None:
            return None
        return (namespace, job), str(meta.get("name", "")), names.owner_uid(body), summary

    def _put(self, body: Mapping[str, Any], changed: set[JobKey]) -> None:
        entry = self._entry(body)
        if entry is None:
            return
        key, name, owner, summary = entry
        children = self.store.setdefault(key, {})
        if children.get(name) != (owner, summary):
            children[name] = (owner, summary)
            changed.add(key)

    def _drop(self, body: Mapping[str, Any], changed: set[JobKey]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "", (meta.get("labels") or {}).get(self.label) or "")
        name = str(meta.get("name", ""))
        children = self.store.get(key)
        if children is not None and children.pop(name, None) is not None:
            changed.add(key)
            if not children:
                del self.store[key]
        entry = self._entry(body)
        if entry is not None and (self.keep is None or self.keep(key)):
            self.tombstones.setdefault(key, {})[name] = (entry[2], entry[3], time.monotonic())
        self._sweep()

    async def _summaries(self, path: str, label_selector: str) -> tuple[dict[JobKey, dict[str, tuple[str | None, T]]], str]:
        """The summaries of a fresh list of ``path``, page by page, and the list's resourceVersion."""
        fresh: dict[JobKey, dict[str, tuple[str | None, T]]] = {}
        version = ""
        async for items, version in self.api.pages(path, label_selector=label_selector, metadata=self.metadata):
            for body in items:
                entry = self._entry(body)
                if entry is not None:
                    key, name, owner, summary = entry
                    fresh.setdefault(key, {})[name] = (owner, summary)
        return fresh, version

    def _replace(self, scope: str | None, fresh: dict[JobKey, dict[str, tuple[str | None, T]]],
                 keys: Iterable[JobKey] | None = None) -> set[JobKey]:
        """Makes the store hold exactly ``fresh`` for ``scope`` (or only for ``keys``)."""
        if keys is not None:
            affected = set(keys)
        else:
            affected = {k for k in self.store if scope is None or k[0] == scope} | set(fresh)
        changed = set()
        for key in affected:
            new = fresh.get(key, {})
            if self.store.get(key, {}) != new:
                changed.add(key)
            if new:
                self.store[key] = new
            else:
                self.store.pop(key, None)
        return changed

    async def _run(self, scope: str | None) -> None:
        path = self.collection(scope)
        errors = 0
        version = ""
        while True:
            try:
                if not version:
                    fresh, version = await self._summaries(path, self.label)
                    changed = self._replace(scope, fresh)
                    self.failure = None
                    self.lists += 1
                    self._listed.add(scope)
                    self._stale.discard(scope)
                    if len(self._listed) == len(self.scopes):
                        self.ready.set()
                    if changed:
                        self.on_change(changed)
                    if self.on_synced is not None and self.synced:
                        self.on_synced()
                async for kind, body in self.api.watch(path, resource_version=version, label_selector=self.label,
                                                       metadata=self.metadata):
                    errors = 0
                    changed = set()
                    if kind == "ERROR":
                        code = body.get("code")
                        logger.info("%s watch of %s ended with %s; listing again", self.name, scope or "all namespaces", code)
                        version = ""
                        self._stale.add(scope)
                        break
                    version = str((body.get("metadata") or {}).get("resourceVersion") or version)
                    if kind == "BOOKMARK":
                        continue
                    if kind == "DELETED":
                        self._drop(body, changed)
                    else:
                        self._put(body, changed)
                    if changed:
                        self.on_change(changed)
            except asyncio.CancelledError:
                raise
            except kube.KubeError as e:
                self._stale.add(scope)
                if e.status == 410:
                    version = ""
                    continue
                absent = e.status in (403, 404) and not version
                if absent:
                    self.failure = e
                table = ABSENT_BACKOFF_SECONDS if absent else BACKOFF_SECONDS
                delay = table[min(errors, len(table) - 1)]
                errors += 1
                log = logger.info if absent and errors > 1 else logger.warning
                log("%s %s of %s failed (%s); listing again in %ss", self.name, "list" if not version else "watch",
                    scope or "all namespaces", e, delay)
                version = ""
                await asyncio.sleep(delay)
            except Exception as e:  # a broken stream: list again rather than trust what we hold
                self._stale.add(scope)
                delay = BACKOFF_SECONDS[min(errors, len(BACKOFF_SECONDS) - 1)]
                errors += 1
                logger.warning("%s watch of %s broke (%r); listing again in %ss", self.name, scope or "all namespaces", e, delay)
                version = ""
                await asyncio.sleep(delay)
