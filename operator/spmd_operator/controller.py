"""The controller: one reconcile loop per SPMDJob, fed by informers, writing through :mod:`.kube`.

Where it sits: above :mod:`.lifecycle` (decides), :mod:`.builders` (builds) and :mod:`.kube`
(writes), and above its parts, each with one concern and wired here: :mod:`.view` (the informers
and the snapshot a pass observes), :mod:`.creation` (a job's children created once each),
:mod:`.payloads` (the namespaces' payload ConfigMaps), :mod:`.collector` (the children of deleted
jobs), :mod:`.workloads` (Kueue's Workloads), :mod:`.observers` (the observer connections) and
:mod:`.memory` (trimming, starting afresh); below :mod:`.handlers`, the kopf wiring that hands it
the SPMDJobs kopf watches. What stays here is a job's loop and the writing of its plan.

Design, for jobs of thousands of pods:

* The job's children (pods, Services, ConfigMaps) come from three labelled informers; a change
  only wakes the job's loop. SPMDJob events (from kopf) record the newest object and wake too.
* Each job has one asyncio task: wait for a wake-up (or a deadline/TTL timer, or the periodic
  resync), run :func:`.lifecycle.reconcile` on the job and its observed children, and carry out
  the plan: the pass's Events (see :mod:`.events`), ONE status merge patch, then deletions, then
  the ConfigMap and Service, then pod creations (many at a time; the client's fair limiter takes
  turns between jobs and keeps a large job to a share of the writes in flight while a small
  one writes, so a small job is not queued behind a large job's thousands of pods). A
  burst of wake-ups within COALESCE_SECONDS of a pass becomes one more pass.
* Never act on an unsynced view, and count only the children the job owns (:mod:`.view`).
* Resyncs cost the API server nothing: every ``resync`` seconds (default 60) a job runs a pass
  from the informers' caches; once every ``check`` seconds (default 600, spread over the period)
  and after any informer had to list again, it GETs its own object (a 404 ends the loop: the job
  was deleted while no watch was looking); so does a job's first pass, unless the leader's watch
  reported the job as just ADDED (the event carries the object as created). Informers re-list only when the server says 410 or a
  watch breaks, once per informer, never per job.
* Leadership: every write passes the leader elector's fence (:mod:`.kube`); on activation every
  job is read again from the server before its first pass, and what an earlier term remembered
  (its own writes, children it created) is dropped.
* Idempotence: names are deterministic, a 409 on create is checked (ours: fine; not ours: said
  in an Event), a 404 on delete is success, deletions carry the uid as a precondition, and the
  status (attempt number, phase, failure) is written before any pod is created and before any
  child is deleted, so a crash or an operator restart repeats the same pass. A pass that deletes
  nothing creates its ConfigMap, Service, PodGroup and Workload while its status goes: they are
  named after the attempt the pass decides, which a pass repeated from the same status decides
  again, and finds them. Until the job watch delivers the status the loop
  wrote, older job versions from the watch are ignored (matched by content, never by comparing
  resourceVersions, which are opaque).
* A deleted job's children are deleted by the leader at once (:mod:`.collector`), not only at
  the garbage collector's pace; ``--cascade=orphan`` keeps them.
* A job whose namespace is being deleted is left alone: its loop stops without restarting
  anything or posting Warnings.
* Restart in place (restartPolicy.mode InPlace): while the current gang's rank-0 pod runs, the
  job's loop holds an observer connection to its coordinator (:mod:`.observer`), opened and
  closed by :mod:`.observers` in a step of each pass, after its snapshot is built, from what it
  sees (a new gang, the pod gone, the job ended, suspended or deleted, leadership lost). It only
  listens and wakes the loop; the pass turns what it heard into the job's status
  (:mod:`.lifecycle.inplace`), one patch and one Event per restart, and creates a lost pod alone
  (``Plan.replace``).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import logging
import os
import random
import socket
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Final

from monarch_spmd.spec import SpecError

from . import builders, creation, events, kube, lifecycle, memory, names, replicagroups
from .collector import ChildCollector
from .creation import Creator
from .errors import JobGone, Refused, raise_first
from .jobloop import JobKey, JobLoop
from .metrics import Metrics
from .observers import Observers
from .payloads import DEFAULT_PAYLOAD_GRACE_SECONDS, Payloads
from .view import View
from .workloads import Workloads

logger = logging.getLogger(__name__)

#: At most one pass per this many seconds, so a burst of child events becomes one pass.
COALESCE_SECONDS: Final = 0.3
#: A job runs a pass from the informers' caches at least this often (no API request).
DEFAULT_RESYNC_SECONDS: Final = 60.0
#: A job GETs its own object about this often: each next check at a random point of the second
#: half of the period after the last (jobs listed together, each checked on its first pass, spread
#: out instead of all checking again at once). 1,000 idle jobs: about 0.4 GETs per job per 10 min.
DEFAULT_CHECK_SECONDS: Final = 1800.0
#: How long a pass that was not allowed to write (fenced) waits before it tries again.
FENCED_RETRY_SECONDS: Final = 1.0
#: Waits after a failed pass, growing to the last one.
ERROR_BACKOFF_SECONDS: Final = (2.0, 5.0, 15.0, 30.0, 60.0)
#: A status patch that only moves progress (running counts, a waiting message) is written at most
#: this often per job; every transition (phase, attempt, failure, a condition's status or reason)
#: is written at once. Keeps the API requests of a 4,096-pod start-up near one per pod.
PROGRESS_SECONDS: Final = 5.0
#: Progress-only status patches of all jobs together go out at most this many per second, each
#: job's in turn (the first to wait goes first): when hundreds of jobs start at once, their counts
#: move thousands of times, and each patch is a write of the job and an event to every watcher of
#: SPMDJobs. Transitions never wait for it. A count may then lag by (jobs waiting) / this rate.
PROGRESS_WRITES_PER_SECOND: Final = 5.0
_PROGRESS_KEYS: Final = frozenset({"running", "succeeded", "failed", "message", "conditions"})
_SETTLED_PHASES: Final = frozenset({lifecycle.SUCCEEDED, lifecycle.FAILED, lifecycle.SUSPENDED})
COMPONENT: Final = events.COMPONENT


def only_progress(status: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether a status patch only moves progress: counts, the message, condition messages."""
    if not set(patch) <= _PROGRESS_KEYS:
        return False
    if status.get("phase") in _SETTLED_PHASES:
        return False  # a finished or suspended job's counts are final: written at once
    if "conditions" in patch:
        def gist(conditions: Any) -> dict[Any, tuple[Any, Any]]:
            return {c.get("type"): (c.get("status"), c.get("reason")) for c in conditions or []}
        if gist(status.get("conditions")) != gist(patch["conditions"]):
            return False
    return True


class Turns:
    """Turns at a shared rate: each is ``1 / rate`` seconds after the one before, or now when
    none is waiting; first asked, first served."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next = float("-inf")

    def take(self, now: float) -> float:
        """The time of a new turn (``now`` when it is free)."""
        turn = max(now, self.next)
        self.next = turn + self.interval
        return turn


class Controller:
    """Owns the per-job loops and carries out the lifecycle's plans; wires the parts: what a pass
    sees (:attr:`view`), the creation of a job's children (:attr:`creator`), the payload
    ConfigMaps (:attr:`payloads`), the children of deleted jobs (:attr:`collector`), Kueue's
    Workloads (:attr:`workloads`), the observer connections (:attr:`observers`) and memory
    (:attr:`trimmer`).

    Args:
        api: the API client.
        worker_files: the payload's files for the payload ConfigMaps (see :func:`builders.worker_files`).
        namespaces: the namespaces watched (None: all).
        resync_seconds: how often each job runs a pass from the informers' caches.
        metrics: where passes, pod writes and transitions are counted.
        check_seconds: how often each job GETs its own object from the server.
        payload_grace_seconds: how long a namespace's payload ConfigMap outlives its last
            unfinished job (:meth:`.payloads.Payloads.sweep`).
        recycle: when the process starts afresh to give memory back after jobs went
            (:mod:`.memory`); None: never.
        isolation: each job gets a NetworkPolicy letting in only its own pods and the operator
            (:func:`builders.build_network_policy`): the operator pods' (namespace, labels), the
            namespace None when the operator does not run in a pod; None: no NetworkPolicy.
    """

    def __init__(self, api: kube.Kube, worker_files: Mapping[str, str], *,
                 namespaces: Iterable[str] | None = None,
                 resync_seconds: float = DEFAULT_RESYNC_SECONDS,
                 metrics: Metrics | None = None,
                 check_seconds: float = DEFAULT_CHECK_SECONDS,
                 payload_grace_seconds: float = DEFAULT_PAYLOAD_GRACE_SECONDS,
                 recycle: memory.RecyclePolicy | None = None,
                 isolation: tuple[str | None, Mapping[str, str]] | None = None) -> None:
        self.api = api
        self.jobs: dict[JobKey, JobLoop] = {}
        self.observers = Observers(self.jobs)
        self.metrics = metrics or Metrics(lambda: [loop.body for loop in self.jobs.values()], self.cache_sizes,
                                          self.observers.states)
        self.resync_seconds = resync_seconds
        self.check_seconds = check_seconds
        self.active = False
        self.instance = os.environ.get("POD_NAME") or socket.gethostname()
        self.events = events.EventRecorder(api, self.instance)
        ns = list(namespaces) if namespaces else None
        self.payloads = Payloads(api, worker_files, self.jobs, namespaces=ns, grace_seconds=payload_grace_seconds,
                                 memory_seconds=creation.CREATED_MEMORY_SECONDS, leading=lambda: self.active,
                                 on_synced=self._relisted)
        self.view = View(api, self.jobs, self.payloads, namespaces=ns, on_change=self._wake_all,
                         on_synced=self._relisted)
        self.creator = Creator(api, self.payloads, self.events, self.metrics, isolation=isolation)
        self.trimmer = memory.Trimmer(recycle, jobs=lambda: len(self.jobs), collecting=lambda: self.collector.pending(),
                                      stop_loops=self.deactivate)
        self.collector = ChildCollector(api, self.jobs, informers=lambda: self.view.informers,
                                        leading=lambda: self.active, on_idle=self.trimmer.soon)
        self.workloads = Workloads(api)
        self.progress_turns = Turns(PROGRESS_WRITES_PER_SECOND)

    # --- start and stop ------------------------------------------------------------------------

    async def start(self, *, activate: bool = True) -> None:
        """Starts the informers and waits for their first lists; then (``activate``) the loops.

        A standby replica starts its informers too (a warm view makes a takeover quick) but runs
        no loop until the leader elector calls :meth:`activate`.
        """
        self.metrics.bind(asyncio.get_running_loop())
        await self.view.start()
        if activate:
            self.activate()

    def activate(self) -> None:
        """Starts a loop for every known job (this replica may write); each loop first reads its
        job again from the server and forgets what an earlier term remembered."""
        self.active = True
        self.metrics.leader.set(1)
        self.payloads.start()
        for loop in self.jobs.values():
            loop.new_term()
            self.observers.close(loop)
            self._start_loop(loop)

    async def deactivate(self) -> None:
        """Stops every loop at once (this replica must not write any more); jobs stay known."""
        self.active = False
        self.metrics.leader.set(0)
        tasks = [loop.task for loop in self.jobs.values() if loop.task is not None]
        for loop in self.jobs.values():
            loop.task = None
            self.observers.close(loop)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, self.collector.stop(), self.payloads.stop(), return_exceptions=True)

    async def stop(self) -> None:
        """Stops every loop and informer (operator shutdown)."""
        await self.deactivate()
        self.jobs.clear()
        await self.trimmer.stop()
        await self.view.stop()

    def cache_sizes(self) -> dict[str, tuple[int, int, int]]:
        """Informer name -> (jobs, objects, tombstones) it holds; "jobs" -> the controller's own."""
        sizes = {inf.name: inf.sizes() for inf in self.view.informers}
        sizes["controller"] = (len(self.jobs), sum(len(loop.created) for loop in self.jobs.values()),
                               self.events.known())
        return sizes

    def _start_loop(self, loop: JobLoop) -> None:
        if loop.task is None or loop.task.done():
            loop.task = asyncio.create_task(self._run(loop), name=f"spmdjob {loop.key[0]}/{loop.key[1]}")
        loop.wake.set()

    # --- inputs -------------------------------------------------------------------------------

    def observe_job(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Records a job's watch event; starts, wakes or stops its loop."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            self.collector.deleted(event_type, key, meta)
            held = self.jobs.get(key)
            # kopf hands each uid's events to a worker of its own: an old job's deletion can come
            # after its namesake's creation, and must not stop the namesake's loop.
            if held is None or not meta.get("uid") or held.uid == meta.get("uid"):
                self.forget(key)
            return
        loop = self.jobs.get(key)
        if loop is None or loop.uid != meta.get("uid"):
            self.forget(key)
            loop = self.jobs[key] = JobLoop(key=key, body=copy.deepcopy(dict(body)))
            self.trimmer.jobs_seen(len(self.jobs))
            # A job the watch reports as just ADDED, to the leader, is the server's object as
            # created: reading it back would only cost its first pass a round trip (a queued
            # one, while a large job's pods are being created). A listed job (a start, a
            # re-list) is read first; so is every job when a new term begins (activate).
            loop.check_now = not (self.active and event_type == "ADDED")
        else:
            loop.accept(body)
        if self.active:
            self._start_loop(loop)
        of = replicagroups.group_of(body)
        if of is not None:  # a replica group's job: its parent's status follows its own
            parent = self.jobs.get((key[0], of[0]))
            if parent is not None:
                parent.wake.set()

    def _wake_all(self, keys: set[JobKey]) -> None:
        for key in keys:
            loop = self.jobs.get(key)
            if loop is not None:
                loop.wake.set()
            elif self.trimmer.recycle is not None and not any(key in inf.store for inf in self.view.job_informers()):
                self.trimmer.soon()  # a deleted job's last child went: its memory may go back now

    def _relisted(self) -> None:
        """An informer listed (again): what happened while its watch was down may include a job's
        deletion, so every job reads itself again; jobs that waited for the sync run now."""
        for loop in self.jobs.values():
            loop.check_now = True
            loop.wake.set()

    def forget(self, key: JobKey) -> None:
        """Stops and drops the loop of job ``key`` (deleted, or being deleted), and what the
        informers and the Event recorder keep for it."""
        loop = self.jobs.pop(key, None)
        if loop is not None:
            self.observers.close(loop)
            if loop.task is not None:
                loop.task.cancel()
            self.trimmer.soon()
        self._prune(key)

    def _prune(self, key: JobKey) -> None:
        if key in self.jobs:
            return
        for inf in self.view.informers:
            inf.forget(key)
        self.events.forget(key)

    # --- the loop -----------------------------------------------------------------------------

    async def _run(self, loop: JobLoop) -> None:
        errors = 0
        clock = asyncio.get_running_loop().time
        if loop.next_check <= 0:
            loop.next_check = clock() + random.uniform(0, self.check_seconds)  # spread the GETs
        while True:
            if self.jobs.get(loop.key) is not loop:
                # Forgotten (its job deleted, or replaced by a namesake) while its task's
                # cancellation was lost: Python 3.11's wait_for returns the wake-up's result when
                # the cancel lands in the same turn as the event's set(). A pass from here would
                # write the namesake's status by name, and take its body as its own.
                self.observers.close(loop)
                return
            loop.wake.clear()
            started = clock()
            try:
                if loop.check_now or started >= loop.next_check:
                    await self.resync(loop)
                delay = await self.reconcile_once(loop)
                self.metrics.passes.observe(clock() - started)
                errors = 0
            except asyncio.CancelledError:
                raise
            except kube.Fenced as e:  # not leading (any more): the elector stops this loop
                logger.info("SPMDJob %s/%s: %s", *loop.key, e)
                delay = FENCED_RETRY_SECONDS
            except Exception as e:  # one bad pass must not kill the loop: log, back off, retry
                if isinstance(e, JobGone) or (isinstance(e, kube.KubeError) and e.namespace_terminating):
                    logger.info("SPMDJob %s/%s: %s; its loop ends", *loop.key,
                                e if isinstance(e, JobGone) else "its namespace is being deleted")
                    self.observers.close(loop)
                    if self.jobs.get(loop.key) is loop:
                        del self.jobs[loop.key]
                        self._prune(loop.key)
                    return
                delay = ERROR_BACKOFF_SECONDS[min(errors, len(ERROR_BACKOFF_SECONDS) - 1)]
                errors += 1
                self.metrics.errors.inc()
                logger.warning("SPMDJob %s/%s: reconcile failed (%s); retrying in %ss", *loop.key, e, delay)
                if errors == 1:
                    await self.events.record(loop.body, [lifecycle.Event(
                        lifecycle.EVENT_WARNING, "ReconcileError", f"{e}; retrying with back-off (see the operator's log)")])
                loop.check_now = True  # read the job again before the retry
            timeout = max(0.0, min(delay if delay is not None else self.resync_seconds, loop.next_check - clock()))
            try:
                await asyncio.wait_for(loop.wake.wait(), timeout=timeout)
            except asyncio.TimeoutError:
                pass
            # Leading-edge coalescing: a wake-up after a quiet spell is served at once; a burst of
            # events within COALESCE_SECONDS of the last pass becomes one more pass.
            await asyncio.sleep(max(0.0, COALESCE_SECONDS - (clock() - started)))

    async def resync(self, loop: JobLoop) -> None:
        """Reads the job from the server (one GET), replacing the cached body; its children come
        from the informers, which the watches keep current (no LIST)."""
        namespace, name = loop.key
        body = await self.api.get(kube.job_url(namespace, name))
        if body is None or (body.get("metadata") or {}).get("uid") != loop.uid:
            raise JobGone("it no longer exists on the server")
        loop.resynced(body)
        loop.check_now = False
        loop.next_check = asyncio.get_running_loop().time() + self.check_seconds * random.uniform(0.5, 1.0)

    async def reconcile_once(self, loop: JobLoop, now: dt.datetime | None = None) -> float | None:
        """One pass over job ``loop``: observe (the view's snapshot, then the job's observer
        connection tended, in steps of their own), decide, then write.

        Returns:
            Seconds until a time-based transition (deadline, TTL, replacement timeout), or None.
        """
        if (loop.body.get("metadata") or {}).get("deletionTimestamp"):
            raise JobGone("it is being deleted")
        o = self.view.observed(loop, now)
        if o is None:
            return 1.0  # an informer is (re-)listing; its completion wakes every job too
        if not isinstance(o.spec, SpecError) and o.spec.replica_groups is not None:
            await self._replica_groups(loop, o)  # a parent: its groups are jobs of their own
            return None
        if not isinstance(o.spec, SpecError):  # restart in place: what the observer connection heard
            o = dataclasses.replace(o, coordinator=self.observers.tend(loop, o))
        self.creator.shown(loop, o, self.view.informers)
        plan = lifecycle.reconcile(o)
        if loop.observer is not None and loop.observer.pod_name in plan.delete_pods:
            # The pass gives the gang up (its rank-0 pod deleted): its observer stops now, before
            # this pass awaits anything. An observer that connected only now (an operator just
            # started) would otherwise tell a coordinator isolated by a loss that the operator
            # sees it, and its next round would start beside the gang this pass creates.
            loop.observer.stop()
        if plan.pods_lost and plan.status and await self._namespace_terminating(o.job.namespace):
            raise JobGone(f"namespace {o.job.namespace} is being deleted")
        deferred = await self._carry_out(loop, o, plan)
        waits = [t for t in (plan.requeue_after, deferred) if t is not None]
        return min(waits) if waits else None

    async def _replica_groups(self, loop: JobLoop, o: lifecycle.Observed) -> None:
        """One pass over a job with replica groups (:mod:`.replicagroups`): its group jobs, its
        Lighthouse, its status from theirs."""
        job, spec = o.job, o.spec
        assert not isinstance(spec, SpecError) and spec.replica_groups is not None
        rg, ns, key = spec.replica_groups, job.namespace, loop.key
        self.creator.shown(loop, o, self.view.informers)  # a Lighthouse seen deleted may be created again at once
        children = {}
        for other in list(self.jobs.values()):
            of = replicagroups.group_of(other.body)
            if (of is not None and of[0] == job.name and other.key[0] == ns
                    and names.owner_uid(other.body) == job.uid):
                children[of[1]] = other.body
        lighthouse = replicagroups.lighthouse_name(job)
        pod = next((p for p in o.pods if p.name == lighthouse), None)
        plan = replicagroups.plan(job, spec, o.status, children, (pod.phase, pod.deleting) if pod else None,
                                  any(s.name == lighthouse for s in o.services), lifecycle.model.format_time(o.now))
        writes: list[Awaitable[Any]] = []
        for g in plan.create_groups:
            body = replicagroups.build_group_job(loop.body, job, rg, g, suspend=spec.suspend)
            writes.append(self.creator._ensure(loop, kube.jobs_url(ns), body, job))
        if plan.lighthouse:
            if self.creator.isolation is not None:
                writes.append(self.creator._ensure(loop, kube.custom_url(*builders.NETWORK_POLICY_API, ns),
                                                   replicagroups.build_lighthouse_network_policy(job), job))
            writes.append(self.creator._ensure(loop, kube.services_url(ns),
                                               replicagroups.build_lighthouse_service(job, rg), job))
            if pod is None:
                writes.append(self.creator._ensure(loop, kube.pods_url(ns),
                                                   replicagroups.build_lighthouse_pod(job, spec, rg), job))
        for name in plan.suspend_groups:
            writes.append(self.api.patch(kube.job_url(ns, name), {"spec": {"suspend": True}}, owner=key))
        for name in plan.resume_groups:
            writes.append(self.api.patch(kube.job_url(ns, name), {"spec": {"suspend": False}}, owner=key))
        if plan.delete_lighthouse or plan.restart_lighthouse:
            loop.created.pop(lighthouse, None)
            writes.append(self.api.delete(kube.pods_url(ns, lighthouse), owner=key))
        if plan.delete_lighthouse:
            writes.append(self.api.delete(kube.services_url(ns, lighthouse), owner=key))
        status = lifecycle.Plan(status=plan.status, events=tuple(lifecycle.Event(*e) for e in plan.events))
        await self._events_and_status(loop, o, status, asyncio.get_running_loop().time())
        await self._all(writes)

    async def _namespace_terminating(self, namespace: str) -> bool:
        body = await self.api.get(kube.namespace_url(namespace))
        return body is None or bool((body.get("metadata") or {}).get("deletionTimestamp"))

    async def _carry_out(self, loop: JobLoop, o: lifecycle.Observed, plan: lifecycle.Plan) -> float | None:
        """Writes the plan; returns seconds until a deferred progress-only status patch is due."""
        job = o.job
        ns = job.namespace
        clock = asyncio.get_running_loop().time()
        deferred: float | None = None
        key = loop.key
        if not plan.status:
            loop.progress_turn = None  # nothing waits to be written: no turn held
        elif only_progress(o.status, plan.status) and loop.status_written is not None:
            left = loop.status_written + PROGRESS_SECONDS - clock
            if left <= 0:  # due for this job: its turn among every job's progress writes
                if loop.progress_turn is None:
                    loop.progress_turn = self.progress_turns.take(clock)
                left = loop.progress_turn - clock
            if left > 0:
                plan, deferred = dataclasses.replace(plan, status={}), left
        spec = o.spec
        group_api = None if isinstance(spec, SpecError) else builders.PODGROUP_APIS.get(spec.scheduling_provider)
        deletes = bool(plan.delete_job or plan.delete_pods or plan.delete_services
                       or plan.delete_podgroups or plan.finish_workload or plan.release_workload)
        # A pass that deletes nothing creates its ConfigMap, Service, PodGroup and Workload while
        # its Events and status go: a new job's pods then wait for one round of writes fewer (the
        # children depend on the spec, not on the status; a job gone meanwhile takes them with
        # it by garbage collection). Pods always go after the status, and creations after
        # deletions.
        children = None
        if not deletes and not isinstance(spec, SpecError):
            children = asyncio.ensure_future(self.creator.children(loop, o, plan, group_api))
        try:
            await self._events_and_status(loop, o, plan, clock)
        except BaseException:
            if children is not None:
                children.cancel()
                await asyncio.gather(children, return_exceptions=True)
            raise
        if plan.delete_job:
            await self.api.delete(kube.job_url(ns, job.name), uid=job.uid, owner=key)
            raise JobGone("its ttlSecondsAfterFinished passed; deleted")
        for name in (*plan.delete_pods, *plan.delete_services):
            loop.created.pop(name, None)
        pods = {p.name: p for p in (*o.pods, *o.spares)}
        self.metrics.pods_deleted.inc(sum(1 for name in plan.delete_pods if name in pods))
        await self._all([
            *(self.api.delete(kube.pods_url(ns, name), owner=key) for name in plan.delete_pods if name in pods),
            *(self.api.delete(kube.services_url(ns, name), owner=key) for name in plan.delete_services),
            *(self.api.delete(kube.custom_url(*group_api, ns, name), owner=key) for name in plan.delete_podgroups
              if group_api),
            *([self.workloads.finish(o)] if plan.finish_workload else []),
            *([self.workloads.release(o)] if plan.release_workload else []),
        ])
        if isinstance(spec, SpecError):
            return deferred
        results = await (children if children is not None else self.creator.children(loop, o, plan, group_api))
        rejected = next((r.refusal for r in results if isinstance(r, Refused)), None)
        if plan.adopt:
            await self._adopt(o, plan)
        if rejected is None:
            raise_first(results)
            creates = plan.create or plan.replace or plan.spares
            flavors = await self.workloads.flavors(o) if creates and o.workload is not None else []
            rejected = await self.creator.pods(loop, job, spec, plan, flavors, o.pods) if creates else None
        if rejected is not None:
            # Refused by the API server (no pod goes without its Service and ConfigMap): the next
            # pass says why (lifecycle.refusal) or fails an invalid spec (lifecycle.admission).
            loop.rejection = rejected
            loop.wake.set()
        return deferred

    async def _adopt(self, o: lifecycle.Observed, plan: lifecycle.Plan) -> None:
        """Relabels each hot spare's pod that took a lost pod's place as that pod's replacement."""
        spec = o.spec
        assert not isinstance(spec, SpecError)
        restart = {p.name: p.restart for p in o.spares}
        patches = [self.api.patch(kube.pods_url(o.job.namespace, name),
                                  {"metadata": {"labels": builders.adopt_labels(o.job, spec, index, restart[name],
                                                                                replacement)}},
                                  owner=o.job.key)
                   for name, index, replacement in plan.adopt if name in restart]
        results = await asyncio.gather(*patches, return_exceptions=True)
        self.metrics.spare_takeovers.inc(sum(1 for r in results if not isinstance(r, BaseException)))
        raise_first([r for r in results if not (isinstance(r, kube.KubeError) and r.status == 404)])

    async def _events_and_status(self, loop: JobLoop, o: lifecycle.Observed, plan: lifecycle.Plan, clock: float) -> None:
        """The plan's Events, then its status patch.

        The Events first, named after the status this pass starts from: a pass cut short after
        them is repeated from the same status and finds them written (409); one cut short before
        them writes them when it is repeated. Either way each transition has its Event.
        """
        job = o.job
        await self.events.record(loop.body, plan.events, transition=events.fingerprint(o.status))
        if not plan.status:
            return
        if self.jobs.get(loop.key) is not loop:
            raise JobGone("its loop was replaced (the job deleted, or a namesake created)")
        url = kube.job_url(job.namespace, job.name, "status")
        try:
            # A JSON Patch whose first operation tests metadata.uid: the API server applies it
            # only to the job it was computed for, so a stale loop never writes the status of a
            # job created again under the same name, even one created while this patch waited
            # for its turn at the write limiter. (A merge patch cannot say that: the status
            # subresource ignores metadata, uid included.) The status it sets is the merge
            # patch's result on the status this pass read, which this operator alone writes.
            patched = await self.api.json_patch(url, [
                {"op": "test", "path": "/metadata/uid", "value": job.uid},
                {"op": "add", "path": "/status", "value": kube.merge_patched(o.status, plan.status)},
            ], owner=loop.key)
        except kube.KubeError as e:
            if e.status == 404:
                raise JobGone("it no longer exists on the server") from e
            if e.status == 422:
                now = await self.api.get(kube.job_url(job.namespace, job.name), metadata=True)
                if now is None or (now.get("metadata") or {}).get("uid") != job.uid:
                    raise JobGone("a namesake replaced it (its status patch's uid test failed)") from e
            raise
        loop.wrote(patched)
        loop.status_written = clock
        loop.progress_turn = None  # written (a transition takes the waiting counts with it)
        self.metrics.transition(o.status, plan.status, (loop.body.get("metadata") or {}).get("creationTimestamp"), o.now)

    async def _all(self, writes: Iterable[Awaitable[Any]]) -> None:
        """Runs writes concurrently; logs every failure and raises the first."""
        raise_first(await asyncio.gather(*writes, return_exceptions=True))
