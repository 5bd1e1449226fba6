"""Informers: one labelled list+watch per kind of child, kept as small summaries in memory.

Where it sits: above :mod:`spmd_operator.kube`, below :mod:`spmd_operator.controller`, which
reads the stores on every pass and is woken (``on_change``) for each job whose children changed.

An informer lists the collection with the server-side label selector ``spmd.monarch.dev/job``
(only the operator's children cross the wire), then watches from the list's resourceVersion.
Every object is summarized on arrival (a :class:`~.lifecycle.PodInfo` is a few hundred bytes;
the pod body is dropped), so memory stays flat at thousands of pods.

The view is never trusted beyond what the server said last: when a watch ends with 410 Gone (the
version is too old, e.g. after an API server restart) or breaks, the informer lists again and
REPLACES its store: objects missing from the new list are dropped and their jobs woken, so no
deleted pod lives on as a ghost. A job's own periodic resync re-reads its children from the
server too (:meth:`Informer.refresh`), so even a watch that silently missed an event is corrected
within one resync period.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from . import kube, names

logger = logging.getLogger(__name__)

T = TypeVar("T")
JobKey = tuple[str, str]

#: Seconds between attempts when listing or watching fails, growing to the last.
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)
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

    Attributes:
        ready: set once every namespace was listed the first time.
    """

    def __init__(self, api: kube.Kube, collection: Callable[[str | None], str],
                 summarize: Callable[[Mapping[str, Any]], T | None], *,
                 namespaces: Iterable[str] | None, on_change: Callable[[set[JobKey]], None], name: str) -> None:
        self.api = api
        self.collection = collection
        self.summarize = summarize
        self.on_change = on_change
        self.name = name
        patterns = list(namespaces) if namespaces else []
        self.patterns = patterns
        # A plain name list is watched namespace by namespace (a Role per namespace suffices);
        # patterns or "all" need one cluster-wide watch.
        self.scopes: list[str | None] = patterns if patterns and not any("*" in p or "?" in p for p in patterns) else [None]
        self.store: dict[JobKey, dict[str, tuple[str | None, T]]] = {}
        self.tombstones: dict[JobKey, dict[str, tuple[str | None, T, float]]] = {}
        self.ready = asyncio.Event()
        self._listed: set[str | None] = set()
        self._tasks: list[asyncio.Task[None]] = []
        # One set per refresh in flight: the children the watch changed while it was listing.
        self._refreshing: list[set[tuple[JobKey, str]]] = []

    # --- reading ----------------------------------------------------------------------------

    def get(self, key: JobKey, uid: str) -> list[T]:
        """The summaries of the children of job ``key`` whose controller owner is ``uid``."""
        return [summary for owner, summary in self.store.get(key, {}).values() if owner == uid]

    def gone(self, key: JobKey, uid: str) -> list[T]:
        """The last states of deleted children of job ``key`` owned by ``uid`` (recent ones only).

        A watch's DELETED event carries the object as it was last: for a pod removed with its
        node, that is where the reason (DeletionByPodGC, "node no longer exists") is written.
        """
        now = asyncio.get_running_loop().time()
        stones = self.tombstones.get(key, {})
        for name in [n for n, (_, _, t) in stones.items() if now - t > TOMBSTONE_SECONDS]:
            del stones[name]
        return [summary for owner, summary, _ in stones.values() if owner == uid]

    def deleted_at(self, key: JobKey, name: str) -> float | None:
        """When the watch last saw the child ``name`` of job ``key`` deleted (loop time), if it did."""
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
        namespace, job = meta.get("namespace") or "", (meta.get("labels") or {}).get(names.LABEL_JOB)
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
        for touched in self._refreshing:
            touched.add((key, name))

    def _drop(self, body: Mapping[str, Any], changed: set[JobKey]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "", (meta.get("labels") or {}).get(names.LABEL_JOB) or "")
        name = str(meta.get("name", ""))
        for touched in self._refreshing:
            touched.add((key, name))
        children = self.store.get(key)
        if children is not None and children.pop(name, None) is not None:
            changed.add(key)
            if not children:
                del self.store[key]
        entry = self._entry(body)
        if entry is not None:
            self.tombstones.setdefault(key, {})[name] = (entry[2], entry[3], asyncio.get_running_loop().time())

    async def _summaries(self, path: str, label_selector: str) -> tuple[dict[JobKey, dict[str, tuple[str | None, T]]], str]:
        """The summaries of a fresh list of ``path``, page by page, and the list's resourceVersion."""
        fresh: dict[JobKey, dict[str, tuple[str | None, T]]] = {}
        version = ""
        async for items, version in self.api.pages(path, label_selector=label_selector):
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

    async def refresh(self, key: JobKey, uid: str) -> list[T]:
        """Re-reads the children of job ``key`` from the server (the resync), then returns them.

        The list is a snapshot taken when it began; a child the watch changed (or deleted) while
        the list was read keeps the watch's state, which is as new or newer: replacing it with the
        snapshot would undo an event the watch will not deliver again (at 4,096 pods, a LIST of
        two seconds turned a hundred Running pods back into Pending until the next resync).
        """
        namespace, job = key
        touched: set[tuple[JobKey, str]] = set()
        self._refreshing.append(touched)
        try:
            fresh, _ = await self._summaries(self.collection(namespace), f"{names.LABEL_JOB}={job}")
        finally:
            self._refreshing.remove(touched)
        listed = fresh.get(key, {})
        held = self.store.get(key, {})
        for name in {name for k, name in touched if k == key}:
            if name in held:
                listed[name] = held[name]
            else:
                listed.pop(name, None)
        changed = self._replace(namespace, {key: listed} if listed else {}, keys=[key])
        if changed:
            logger.info("%s of %s/%s: the server's list differed from the watch's view; corrected", self.name, *key)
        return self.get(key, uid)

    async def _run(self, scope: str | None) -> None:
        path = self.collection(scope)
        errors = 0
        version = ""
        while True:
            try:
                if not version:
                    fresh, version = await self._summaries(path, names.LABEL_JOB)
                    changed = self._replace(scope, fresh)
                    self._listed.add(scope)
                    if len(self._listed) == len(self.scopes):
                        self.ready.set()
                    if changed:
                        self.on_change(changed)
                async for kind, body in self.api.watch(path, resource_version=version, label_selector=names.LABEL_JOB):
                    errors = 0
                    changed = set()
                    if kind == "ERROR":
                        code = body.get("code")
                        logger.info("%s watch of %s ended with %s; listing again", self.name, scope or "all namespaces", code)
                        version = ""
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
                if e.status == 410:
                    version = ""
                    continue
                delay = BACKOFF_SECONDS[min(errors, len(BACKOFF_SECONDS) - 1)]
                errors += 1
                logger.warning("%s watch of %s failed (%s); listing again in %ss", self.name, scope or "all namespaces", e, delay)
                version = ""
                await asyncio.sleep(delay)
            except Exception as e:  # a broken stream: list again rather than trust what we hold
                delay = BACKOFF_SECONDS[min(errors, len(BACKOFF_SECONDS) - 1)]
                errors += 1
                logger.warning("%s watch of %s broke (%r); listing again in %ss", self.name, scope or "all namespaces", e, delay)
                version = ""
                await asyncio.sleep(delay)
