"""The namespaces' payload ConfigMaps: the worker every pod of a namespace mounts, one per payload.

Owns them whole: the informer that watches them (label ``spmd.monarch.dev/payload``, metadata
only: a payload carries 160 KB), their creation (once for all the jobs of a namespace that ask at
the same time: a thousand jobs submitted at once send one POST, not many), the wake-up of a
namespace's jobs when the current payload goes, and their deletion once a namespace has had no
unfinished job for a grace (the leader's sweep, in the background while it leads). A namespace's
jobs share its payload ConfigMap, so no job owns it and the garbage collector never deletes it.

Where it sits: a part of the controller (:mod:`.controller` makes one, starts its informer with
the others, asks it whether a namespace's payload exists and to create it, and starts and stops
its sweep with each leadership term); above :mod:`.informer`, :mod:`.builders`, :mod:`.kube`,
:mod:`.errors` and :mod:`.jobloop` (the jobs it reads).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from . import builders, informer, kube, lifecycle, names
from .errors import Refused, refusal_of
from .jobloop import JobKey, JobLoop

logger = logging.getLogger(__name__)

#: How long a namespace's payload ConfigMap outlives the last unfinished job there (a job
#: submitted meanwhile finds it), and how often (at most) the leader looks for ones to delete.
DEFAULT_PAYLOAD_GRACE_SECONDS: Final = 300.0
PAYLOAD_SWEEP_SECONDS: Final = 30.0


class Payloads:
    """The payload ConfigMaps of every namespace watched.

    Args:
        api: the API client.
        worker_files: the payload's files (see :func:`builders.worker_files`).
        jobs: the controller's jobs (read, never changed here): their phases keep a namespace's
            payload, and they are woken when it goes.
        namespaces: the namespaces watched (None: all).
        grace_seconds: how long a namespace's payload ConfigMap outlives its last unfinished job.
        memory_seconds: how long a payload this replica created (or found) is trusted to exist
            before the informer shows it.
        leading: whether this replica may write (the sweep deletes nothing otherwise).
        on_synced: called when the informer has listed (again).
    """

    def __init__(self, api: kube.Kube, worker_files: Mapping[str, str], jobs: Mapping[JobKey, JobLoop], *,
                 namespaces: list[str] | None, grace_seconds: float, memory_seconds: float,
                 leading: Callable[[], bool], on_synced: Callable[[], None]) -> None:
        self.api = api
        self.worker_files = dict(worker_files)
        self.hash = builders.payload_hash(self.worker_files)
        self.name = names.payload_configmap_name(self.hash)
        self.jobs = jobs
        self.grace_seconds = grace_seconds
        self.memory_seconds = memory_seconds
        self.leading = leading
        # Summarized from their metadata (lifecycle.child_info) and grouped by (namespace, hash):
        # one per namespace and payload, no job's.
        self.configmaps: informer.Informer[lifecycle.ChildInfo] = informer.Informer(
            api, kube.configmaps_url, lifecycle.child_info, namespaces=namespaces, on_change=self.changed,
            name="configmaps", on_synced=on_synced, metadata=True, label=names.LABEL_PAYLOAD,
            keep=lambda key: False)  # a deleted payload's last state is asked for by nobody
        #: Namespace -> the creation of its payload ConfigMap under way (every job there awaits
        #: the one request), and -> when this replica created it or saw it created, until the
        #: informer shows it (a thousand jobs submitted at once send one 160 KB POST, not many).
        self._creating: dict[str, asyncio.Future[None]] = {}
        self._created: dict[str, float] = {}
        #: Namespace -> when it was last seen with an unfinished job (this term), for the sweep.
        self._busy: dict[str, float] = {}
        self._sweep_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Starts the sweep (a new leadership term: the grace starts again)."""
        self._busy.clear()
        if self._sweep_task is None or self._sweep_task.done():
            self._sweep_task = asyncio.get_running_loop().create_task(self._sweep_forever(),
                                                                      name="delete unused payload ConfigMaps")

    def stop(self) -> asyncio.Future[Any]:
        """Stops the sweep at once; what it returns is done once the sweep ended."""
        tasks = [self._sweep_task] if self._sweep_task is not None else []
        self._sweep_task = None
        for task in tasks:
            task.cancel()
        return asyncio.gather(*tasks, return_exceptions=True)

    def changed(self, keys: set[JobKey]) -> None:
        """A payload ConfigMap changed: one of the current payload gone (deleted by hand, or by a
        sweep that crossed a new job) wakes the namespace's jobs, whose passes create it again."""
        for namespace, digest in keys:
            if digest != self.hash or self._shown(namespace):
                continue
            self._created.pop(namespace, None)
            for key, loop in self.jobs.items():
                if key[0] == namespace:
                    loop.wake.set()

    def _shown(self, namespace: str) -> bool:
        return any(c.name == self.name and not c.deleting for c in self.configmaps.held((namespace, self.hash)))

    def present(self, namespace: str) -> bool:
        """Whether the namespace's ConfigMap of the current payload exists: the informer shows it,
        or this replica created it (or found it) within ``memory_seconds``."""
        if self._shown(namespace):
            self._created.pop(namespace, None)
            return True
        when = self._created.get(namespace)
        return when is not None and time.monotonic() - when < self.memory_seconds

    async def ensure(self, namespace: str) -> None:
        """Creates the namespace's payload ConfigMap, once for all the jobs that ask at the same
        time; a refusal (quota, admission) reaches each of them as :class:`.errors.Refused`."""
        if self.present(namespace):
            return
        pending = self._creating.get(namespace)
        if pending is None:
            pending = self._creating[namespace] = asyncio.ensure_future(self._create(namespace))
            pending.add_done_callback(lambda f, ns=namespace: self._finished(ns, f))
        await asyncio.shield(pending)  # a job's loop cancelled does not cancel the others' creation

    def _finished(self, namespace: str, future: asyncio.Future[None]) -> None:
        if self._creating.get(namespace) is future:
            del self._creating[namespace]
        if not future.cancelled() and future.exception() is None:
            self._created[namespace] = time.monotonic()

    async def _create(self, namespace: str) -> None:
        body = builders.build_worker_configmap(namespace, self.worker_files)
        collection = kube.configmaps_url(namespace)
        try:
            created = await self.api.create(collection, body, keep=False, owner=(namespace, "")) is not None
        except kube.KubeError as e:
            refusal = refusal_of(e, body)
            if refusal is not None:
                raise Refused(refusal) from e
            raise
        if not created:
            existing = await self.api.get(f"{collection}/{self.name}", metadata=True)
            labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
            if existing is not None and labels.get(names.LABEL_PAYLOAD) != self.hash:
                raise kube.KubeError(409, f"ConfigMap {self.name} exists and is not the operator's payload "
                                     f"(its label {names.LABEL_PAYLOAD} is not {self.hash}); delete it so "
                                     "the jobs of the namespace can mount the worker", path=collection)

    async def _sweep_forever(self) -> None:
        period = min(PAYLOAD_SWEEP_SECONDS, max(self.grace_seconds / 2, 1.0))
        while True:
            await asyncio.sleep(period)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the next sweep tries again
                logger.warning("deleting unused payload ConfigMaps failed: %s; trying again in %.0f s", e, period)

    async def sweep(self) -> list[str]:
        """Deletes the payload ConfigMaps of namespaces where no job has been unfinished (Pending,
        Running, Restarting, Suspended) for ``grace_seconds`` of this term; the leader only.

        A namespace's jobs share its payload ConfigMap, so no job owns it and the garbage collector
        never deletes it; this does, once the namespace has had no unfinished job for the grace
        (a job submitted meanwhile finds it). Payloads of older operators stay as long as the
        namespace has unfinished jobs: some of their pods may still mount them.

        Returns:
            The paths deleted (for the tests and the log).
        """
        if not self.leading() or not self.configmaps.synced:
            return []
        now = time.monotonic()
        busy = {key[0] for key, loop in self.jobs.items()
                if ((loop.body.get("status") or {}).get("phase")) not in lifecycle.TERMINAL}
        for namespace in busy:
            self._busy[namespace] = now
        deleted: list[str] = []
        emptied: set[str] = set()
        for (namespace, _), held in list(self.configmaps.store.items()):
            if namespace in busy:
                continue
            since = self._busy.setdefault(namespace, now)
            if now - since < self.grace_seconds:
                continue
            for name, (_, info) in list(held.items()):
                if info.deleting or not name.startswith(names.PAYLOAD_CONFIGMAP_PREFIX):
                    continue
                path = kube.configmaps_url(namespace, name)
                await self.api.delete(path, owner=(namespace, ""))
                deleted.append(path)
                emptied.add(namespace)
        for namespace in emptied:
            self._created.pop(namespace, None)
            self._busy.pop(namespace, None)
        if deleted:
            logger.info("deleted %d payload ConfigMaps of namespaces without an unfinished SPMDJob for %.0f s: %s",
                        len(deleted), self.grace_seconds, ", ".join(deleted))
        return deleted
