"""The kopf handlers of the SPMDJob operator: watches in, one reconcile loop per job, API writes out.

Where it sits: the top of ``spmd_operator`` (only ``__main__`` is above it). It wires kopf to the
pure layers below: :mod:`spmd_operator.lifecycle` decides, :mod:`spmd_operator.builders` builds,
:mod:`spmd_operator.kube` writes. Run it with ``python -m spmd_operator`` or, equivalently,
``kopf run -m spmd_operator.handlers --standalone -A``.

Design, for jobs of thousands of pods:

* Pods are watched with the server-side label selector ``spmd.monarch.dev/job`` (no other pod of
  the cluster reaches the operator) and kept in memory as small :class:`~.lifecycle.PodInfo`
  summaries by the kopf index ``pods_by_job``, keyed by ``(namespace, job)``. kopf fills the
  index from the initial listing before any handler runs, so a restarted operator never mistakes
  "not listed yet" for "missing".
* A pod event only sets its job's wake-up flag; it never writes anything. SPMDJob events only
  record the latest object and set the flag too.
* Each job has one asyncio task (its reconcile loop): wait for the flag (or a deadline/TTL timer,
  or a periodic resync), sleep briefly so a burst of pod events becomes one pass, then run
  :func:`~.lifecycle.reconcile` on the job, its status and the index's pods, and carry out the
  plan: ONE status merge patch, then deletions, then creations, many at a time (a shared
  semaphore), then Events (``kopf.event``) for the transitions.
* Idempotence: pod names are deterministic (``<job>-r<restart>-<rank>``), a 409 on create and a
  404 on delete count as success, and the status (the decisions: attempt number, phase, failure)
  is written before the pods are touched, so a crash or an operator restart in the middle repeats
  the same pass instead of doing something new. The loop uses the status returned by its own
  patch until the watch catches up, so it never acts twice on a stale status.
* No finalizers and no kopf annotations are put on SPMDJobs (only event handlers and an index are
  used), so deleting a job never waits for the operator; children go by garbage collection.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from monarch_spmd.spec import SpecError, parse_job_spec

from . import builders, kube, lifecycle, names

logger = logging.getLogger(__name__)

#: At most one pass per this many seconds, so a burst of pod events becomes one pass.
COALESCE_SECONDS: Final = 0.3
#: A job is reconciled at least this often even without events.
RESYNC_SECONDS: Final = 60.0
#: How long a pod this operator created is trusted to exist before the index shows it.
CREATED_MEMORY_SECONDS: Final = 30.0
#: Waits after a failed pass, growing to the last one.
ERROR_BACKOFF_SECONDS: Final = (2.0, 5.0, 15.0, 30.0, 60.0)

JobKey = tuple[str, str]


def _resource_version(body: Mapping[str, Any]) -> int | None:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion"))
    except (TypeError, ValueError):
        return None


@dataclass
class JobLoop:
    """The reconcile loop of one SPMDJob.

    Attributes:
        key: ``(namespace, name)``.
        body: the newest version of the job seen (from the watch or from our own status patch).
        wake: set to run a pass soon.
        task: the loop's asyncio task.
        worker_files_shipped: whether the ConfigMap was brought up to date by this operator.
        service_restart: the attempt the Service was last pointed at by this operator.
        created: pod name -> when this operator created it (monotonic), so a pod the index has
            not caught up with yet is not POSTed again within CREATED_MEMORY_SECONDS.
    """

    key: JobKey
    body: dict[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    worker_files_shipped: bool = False
    service_restart: int | None = None
    created: dict[str, float] = field(default_factory=dict)

    def accept(self, body: Mapping[str, Any]) -> None:
        """Takes ``body`` as the newest version unless it is older than the one held."""
        new, held = _resource_version(body), _resource_version(self.body)
        if new is None or held is None or new >= held:
            self.body = copy.deepcopy(dict(body))


class Controller:
    """Owns the per-job loops and carries out the lifecycle's plans.

    Args:
        api: the API writer.
        worker_files: the worker's files for the ConfigMaps (see :func:`builders.worker_files`).
    """

    def __init__(self, api: kube.Kube, worker_files: Mapping[str, str]) -> None:
        self.api = api
        self.worker_files = dict(worker_files)
        self.pods: Any = None  # kopf's index "pods_by_job", handed over by the first job event
        self.jobs: dict[JobKey, JobLoop] = {}

    # --- inputs -------------------------------------------------------------------------------

    def observe_job(self, event_type: str | None, body: Mapping[str, Any], pods_index: Any) -> None:
        """Records a job's watch event; starts, wakes or stops its loop."""
        if pods_index is not None:
            self.pods = pods_index
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            self.stop_job(key)
            return
        loop = self.jobs.get(key)
        if loop is None or (loop.body.get("metadata") or {}).get("uid") != meta.get("uid"):
            self.stop_job(key)
            loop = self.jobs[key] = JobLoop(key=key, body=copy.deepcopy(dict(body)))
            loop.task = asyncio.create_task(self._run(loop), name=f"spmdjob {key[0]}/{key[1]}")
        else:
            loop.accept(body)
        loop.wake.set()

    def wake(self, key: JobKey) -> None:
        """Asks the loop of job ``key`` (if any) for a pass soon; called on every pod event."""
        loop = self.jobs.get(key)
        if loop is not None:
            loop.wake.set()

    def stop_job(self, key: JobKey) -> None:
        """Stops the loop of job ``key`` (deleted, or being deleted)."""
        loop = self.jobs.pop(key, None)
        if loop is not None and loop.task is not None:
            loop.task.cancel()

    async def stop(self) -> None:
        """Stops every loop (operator shutdown)."""
        tasks = [loop.task for loop in self.jobs.values() if loop.task is not None]
        self.jobs.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def pods_of(self, key: JobKey) -> list[lifecycle.PodInfo]:
        """The indexed pods of job ``key``."""
        if self.pods is None:
            return []
        return [p for p in self.pods.get(key, []) if isinstance(p, lifecycle.PodInfo)]

    # --- the loop -----------------------------------------------------------------------------

    async def _run(self, loop: JobLoop) -> None:
        errors = 0
        clock = asyncio.get_running_loop().time
        while True:
            loop.wake.clear()
            started = clock()
            try:
                delay = await self.reconcile_once(loop)
                errors = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:  # one bad pass must not kill the loop: log, back off, retry
                delay = ERROR_BACKOFF_SECONDS[min(errors, len(ERROR_BACKOFF_SECONDS) - 1)]
                errors += 1
                logger.warning("SPMDJob %s/%s: reconcile failed (%s); retrying in %ss", *loop.key, e, delay)
                if errors == 1:
                    kopf.event(loop.body, type=lifecycle.EVENT_WARNING, reason="ReconcileError",
                               message=f"{e}; retrying with back-off (see the operator's log)")
                if isinstance(e, kube.KubeError) and e.status == 404:
                    return  # the job is gone; its DELETED event ends the loop anyway
            timeout = RESYNC_SECONDS if delay is None else max(0.0, min(delay, RESYNC_SECONDS))
            try:
                await asyncio.wait_for(loop.wake.wait(), timeout=timeout)
            except asyncio.TimeoutError:
                pass
            # Leading-edge coalescing: a wake-up after a quiet spell is served at once; a burst of
            # pod events within COALESCE_SECONDS of the last pass becomes one more pass.
            await asyncio.sleep(max(0.0, COALESCE_SECONDS - (clock() - started)))

    async def reconcile_once(self, loop: JobLoop, now: dt.datetime | None = None) -> float | None:
        """One pass over job ``loop``: decide, then write status, delete, create, post Events.

        Returns:
            Seconds until a time-based transition (deadline, TTL), or None.
        """
        body = loop.body
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return None
        job = builders.JobRef.from_body(body)
        try:
            spec: Any = parse_job_spec(body.get("spec") or {}, require_image=True)
        except SpecError as e:
            spec = e
        plan = lifecycle.reconcile(
            name=job.name,
            namespace=job.namespace,
            generation=meta.get("generation"),
            spec=spec,
            status=body.get("status") or {},
            pods=self.pods_of(loop.key),
            now=now or dt.datetime.now(dt.timezone.utc),
        )
        await self._carry_out(loop, job, spec, plan)
        if plan.create and not isinstance(spec, SpecError):
            rejected = await self._create(loop, job, spec, plan)
            if rejected is not None:
                # The API server refused a pod built from the template: what CEL could not see.
                failed = lifecycle.reconcile(
                    name=job.name,
                    namespace=job.namespace,
                    generation=meta.get("generation"),
                    spec=SpecError("spec.template", rejected),
                    status=loop.body.get("status") or {},
                    pods=self.pods_of(loop.key),
                    now=now or dt.datetime.now(dt.timezone.utc),
                )
                await self._carry_out(loop, job, spec, failed)
                return None
        return plan.requeue_after

    async def _carry_out(self, loop: JobLoop, job: builders.JobRef, spec: Any, plan: lifecycle.Plan) -> None:
        if plan.status:
            patched = await self.api.patch(kube.job_url(job.namespace, job.name, "status"), {"status": plan.status})
            if patched:
                loop.accept(patched)
        for event in plan.events:
            kopf.event(loop.body, type=event.type, reason=event.reason, message=event.message)
        if plan.delete_job:
            await self.api.delete(kube.job_url(job.namespace, job.name))
            return
        for name in plan.delete:
            loop.created.pop(name, None)
        results = await _gather(self.api.delete(kube.pods_url(job.namespace, name)) for name in plan.delete)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def _create(self, loop: JobLoop, job: builders.JobRef, spec: Any, plan: lifecycle.Plan) -> str | None:
        """Ensures the ConfigMap and Service, then creates the plan's pods concurrently.

        Returns:
            The API server's message if it rejected a pod as invalid (400/422), else None.
        """
        ns = job.namespace
        clock = asyncio.get_running_loop().time()
        loop.created = {n: t for n, t in loop.created.items() if clock - t < CREATED_MEMORY_SECONDS}
        ranks = [r for r in plan.create if names.pod_name(job.name, plan.restart, r) not in loop.created]
        if not ranks:
            return None
        configmap = builders.build_worker_configmap(job, self.worker_files)
        if not await self.api.create(kube.configmaps_url(ns), configmap) and not loop.worker_files_shipped:
            await self.api.patch(kube.configmaps_url(ns, names.configmap_name(job.name)), {"data": configmap["data"]})
        loop.worker_files_shipped = True
        if loop.service_restart != plan.restart:
            service = builders.build_service(job, spec, plan.restart)
            if not await self.api.create(kube.services_url(ns), service):
                await self.api.patch(
                    kube.services_url(ns, names.service_name(job.name)),
                    {"spec": {"selector": service["spec"]["selector"], "ports": service["spec"]["ports"]}},
                )
            loop.service_restart = plan.restart
        pods = [builders.build_pod(job, spec, rank, plan.restart) for rank in ranks]
        results = await _gather(self.api.create(kube.pods_url(ns), pod) for pod in pods)
        for pod, result in zip(pods, results):
            if isinstance(result, kube.KubeError) and result.status in (400, 422):
                return f"the API server rejected pod {pod['metadata']['name']}: {result.message}"
            if not isinstance(result, BaseException):
                loop.created[pod["metadata"]["name"]] = clock
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        return None


async def _gather(coros: Iterable[Any]) -> list[Any]:
    """Runs ``coros`` concurrently (the Kube semaphore bounds them); errors are returned, not raised."""
    return list(await asyncio.gather(*coros, return_exceptions=True))


# --- kopf wiring ------------------------------------------------------------------------------


class _QuietEventHandlers(logging.Filter):
    """Drops kopf's "Handler 'pod_event' succeeded." lines: one per pod event is noise at scale."""

    _HANDLERS: Final = ("pods_by_job", "pod_event", "job_event")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        message = record.getMessage()
        return not any(message == f"Handler {h!r} succeeded." for h in self._HANDLERS)


class _NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, never built: no handler here reacts to field changes.

    Every handler is an ``on.event`` or an index, so diffs are never read; kopf would still
    deep-copy every pod body on every watch event to build one (16% of the operator's CPU while
    a 1,024-proc job starts, by profile).
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """The kopf settings the operator relies on (also applied under ``kopf run``)."""
    objects_logger = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietEventHandlers) for f in objects_logger.filters):
        objects_logger.addFilter(_QuietEventHandlers())
    # Handler log lines become Events only from WARNING up; transitions are posted explicitly.
    settings.posting.level = logging.WARNING
    # `kubectl describe spmdjob` shows this in its Events' "From" column.
    settings.posting.reporting_component = "spmdjob-operator"
    settings.posting.reporting_instance = os.environ.get("POD_NAME") or socket.gethostname()
    # Nothing of kopf's goes into status (the schema would prune it); keep it in annotations.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    settings.persistence.diffbase_storage = _NoDiffBase(prefix=names.GROUP)
    settings.persistence.finalizer = f"{names.GROUP}/finalizer"
    # Watches end on the server side before proxies cut them; the client gives a little more.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 30
    # Only our pods cross the wire: the label selector is applied by the API server.
    selectors = getattr(settings.watching, "label_selectors", None)
    if selectors is not None:
        selectors[("v1", "pods")] = names.LABEL_JOB


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Applies the settings, reads the worker's files and creates the controller."""
    configure_settings(settings)
    concurrency = int(getattr(memo, "concurrency", kube.DEFAULT_CONCURRENCY))
    memo.controller = Controller(kube.Kube(settings, logger, concurrency), builders.worker_files())


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stops every job loop."""
    controller = getattr(memo, "controller", None)
    if controller is not None:
        await controller.stop()


@kopf.index("v1", "pods", labels={names.LABEL_JOB: kopf.PRESENT})
async def pods_by_job(namespace: str, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> Any:
    """Index: ``(namespace, job) -> PodInfo`` for every pod the operator made."""
    info = lifecycle.pod_info(body)
    return {(namespace, labels[names.LABEL_JOB]): info} if info is not None else None


@kopf.on.event("v1", "pods", labels={names.LABEL_JOB: kopf.PRESENT})
async def pod_event(namespace: str, labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    """A pod changed: wake its job's loop (the index already holds the new state)."""
    controller = getattr(memo, "controller", None)
    if controller is not None:
        controller.wake((namespace, labels[names.LABEL_JOB]))


@kopf.on.event(names.GROUP, names.VERSION, names.PLURAL)
async def job_event(type: str | None, body: kopf.Body, memo: kopf.Memo, pods_by_job: kopf.Index, **_: Any) -> None:  # noqa: A002
    """An SPMDJob was listed, changed or deleted: hand it to its loop."""
    controller = getattr(memo, "controller", None)
    if controller is not None:
        controller.observe_job(type, copy.deepcopy(dict(body)), pods_by_job)
