"""The controller: one reconcile loop per SPMDJob, fed by informers, writing through :mod:`.kube`.

Where it sits: above :mod:`.lifecycle` (decides), :mod:`.builders` (builds), :mod:`.informer`
(observes) and :mod:`.kube` (writes); below :mod:`.handlers`, the kopf wiring that hands it the
SPMDJobs kopf watches.

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
* Never act on an unsynced view: a pass runs only when every informer it reads (pods, Services,
  ConfigMaps, and the job's Workloads or PodGroups) has listed since its watch last broke; until
  then the job waits and writes nothing. An optional API that is forbidden or not installed
  affects only the jobs that name it (:attr:`.lifecycle.Observed.unavailable`).
* Resyncs cost the API server nothing: every ``resync`` seconds (default 60) a job runs a pass
  from the informers' caches; once every ``check`` seconds (default 600, spread over the period)
  and after any informer had to list again, it GETs its own object (a 404 ends the loop: the job
  was deleted while no watch was looking); so does a job's first pass, unless the leader's watch
  reported the job as just ADDED (the event carries the object as created). Informers re-list only when the server says 410 or a
  watch breaks, once per informer, never per job.
* Leadership: every write passes the leader elector's fence (:mod:`.kube`); on activation every
  job is read again from the server before its first pass, and what an earlier term remembered
  (its own writes, children it created) is dropped.
* Ownership: only children whose controller owner reference is the job's uid count. A namesake's
  leftovers (still terminating, or orphaned by ``kubectl delete --cascade=orphan``) are neither
  adopted nor blamed; their names never collide with ours (the uid is in every child's name).
* Idempotence: names are deterministic, a 409 on create is checked (ours: fine; not ours: said
  in an Event), a 404 on delete is success, deletions carry the uid as a precondition, and the
  status (attempt number, phase, failure) is written before any pod is created and before any
  child is deleted, so a crash or an operator restart repeats the same pass. A pass that deletes
  nothing creates its ConfigMap, Service, PodGroup and Workload while its status goes: they are
  named after the attempt the pass decides, which a pass repeated from the same status decides
  again, and finds them. Until the job watch delivers the status the loop
  wrote, older job versions from the watch are ignored (matched by content, never by comparing
  resourceVersions, which are opaque).
* A deleted job's children are deleted by the leader at once (:meth:`Controller._collect_children`),
  not only at the garbage collector's pace; ``--cascade=orphan`` keeps them.
* A job whose namespace is being deleted is left alone: its loop stops without restarting
  anything or posting Warnings.
* Restart in place (restartPolicy.mode InPlace): while the current gang's rank-0 pod runs, the
  job's loop holds an observer connection to its coordinator (:mod:`.observer`, started and
  stopped from what each pass sees: a new gang, the pod gone, the job ended, suspended or
  deleted, leadership lost). It only listens and wakes the loop; the pass turns what it heard
  into the job's status (:mod:`.lifecycle.inplace`), one patch and one Event per restart, and
  creates a lost pod alone (``Plan.replace``).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import ctypes
import dataclasses
import datetime as dt
import gc
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from monarch_spmd import policy
from monarch_spmd.payload import rendezvous
from monarch_spmd.spec import SCHEDULING_KUEUE, SpecError, parse_stored

from . import builders, events, informer, kube, lifecycle, memory, names
from .metrics import Metrics
from .names import JobRef
from .observer import Observer

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
#: How long a child this operator created is trusted to exist before the informer shows it
#: (counted from the server's answer). A deletion the watch shows ends it at once, so one
#: deleted before the informer ever showed it is created again without waiting this long.
CREATED_MEMORY_SECONDS: Final = 30.0
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
#: How long a namespace's payload ConfigMap outlives the last unfinished job there (a job
#: submitted meanwhile finds it), and how often (at most) the leader looks for ones to delete.
DEFAULT_PAYLOAD_GRACE_SECONDS: Final = 300.0
PAYLOAD_SWEEP_SECONDS: Final = 30.0
_PROGRESS_KEYS: Final = frozenset({"running", "succeeded", "failed", "message", "conditions"})
_SETTLED_PHASES: Final = frozenset({lifecycle.SUCCEEDED, lifecycle.FAILED, lifecycle.SUSPENDED})
COMPONENT: Final = events.COMPONENT
#: Seconds after a job was forgotten before the memory freed with it is handed back to the system
#: (once per this many seconds however many jobs go: deleting 1,000 jobs trims a few times).
TRIM_DELAY_SECONDS: Final = 5.0
#: The finalizers a job's deletion options put on it (``kubectl delete --cascade=orphan`` and
#: ``--cascade=foreground``): the garbage collector's, which it removes when done.
ORPHAN_FINALIZER: Final = "orphan"
FOREGROUND_FINALIZER: Final = "foregroundDeletion"
#: Tries of a conditional update of a Kueue Workload that keeps meeting a newer version.
WORKLOAD_CONFLICT_RETRIES: Final = 5
#: Chart values that grant the RBAC rules of each optional API (helm/monarch-spmd/values.yaml).
CHART_VALUES: Final = {"workloads": "gangScheduling.kueue.enabled",
                       "scheduling.volcano.sh": "gangScheduling.volcano.enabled",
                       "scheduling.x-k8s.io": "gangScheduling.coscheduling.enabled"}

JobKey = tuple[str, str]


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


class JobGone(Exception):
    """The job no longer exists (or its namespace is being deleted): its loop ends quietly."""


class Refused(Exception):
    """The API server refused to create a child: carried to the next pass, not retried blindly."""

    def __init__(self, refusal: lifecycle.Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def refusal_of(error: object, body: Mapping[str, Any], index: int | None = None) -> lifecycle.Refusal | None:
    """The refusal a failed create means for the lifecycle (400, 403, 422), else None.

    A 403 because the namespace is being deleted is not one (the job's loop ends instead).
    """
    if not isinstance(error, kube.KubeError) or error.status not in (400, 403, 422) or error.namespace_terminating:
        return None
    return lifecycle.Refusal(
        kind=str(body.get("kind") or ""), name=str((body.get("metadata") or {}).get("name") or ""),
        code=error.status, reason=error.reason, message=error.message,
        at=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), index=index)


@dataclass
class JobLoop:
    """The reconcile loop of one SPMDJob.

    Attributes:
        key: ``(namespace, name)``.
        body: the newest version of the job known (from the watch, a resync or our own patch).
        written: the status our last patch produced, until the watch delivers it.
        rejection: the API server's latest refusal to create a child (400, 403, 422), for the
            next pass; cleared when a pass tries to create children again.
        created: child name -> when this operator created it (monotonic), so a child the
            informers have not shown yet is not POSTed again within CREATED_MEMORY_SECONDS.
        foreign_reported: names of a namesake's children already reported in an Event.
        check_now: GET the job from the server before the next pass (a listed job, activation,
            a re-list; not a job the leader's watch reported as ADDED).
        next_check: when the next periodic GET is due (loop time).
        observer: restart in place: the connection to the current gang's coordinator (or, once
            its rank-0 pod is gone, what it heard last), None when there is none.
    """

    key: JobKey
    body: dict[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    written: dict[str, Any] | None = None
    rejection: lifecycle.Refusal | None = None
    created: dict[str, float] = field(default_factory=dict)
    foreign_reported: set[str] = field(default_factory=set)
    status_written: float | None = None
    #: When this job's waiting progress-only patch may go (its turn in Controller.progress_turns).
    progress_turn: float | None = None
    check_now: bool = True
    next_check: float = 0.0
    observer: Observer | None = None
    #: Restart in place: the agent token of each attempt this process made pods for, until the
    #: pod cache shows them (an attempt's pods must all carry one token).
    tokens: dict[int, str] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return str((self.body.get("metadata") or {}).get("uid", ""))

    def accept(self, body: Mapping[str, Any]) -> None:
        """Takes ``body`` from the job watch unless it predates the status this loop wrote."""
        if self.written is not None:
            if (body.get("status") or {}) != self.written:
                return
            self.written = None
        self.body = copy.deepcopy(dict(body))

    def wrote(self, body: Mapping[str, Any]) -> None:
        """Takes the object our own status patch returned."""
        self.body = copy.deepcopy(dict(body))
        self.written = copy.deepcopy(dict(body.get("status") or {}))

    def resynced(self, body: Mapping[str, Any]) -> None:
        """Takes the object just read from the server: authoritative."""
        self.body = copy.deepcopy(dict(body))
        self.written = None

    def new_term(self) -> None:
        """Forgets what an earlier leadership term remembered: read everything again first."""
        self.written = None
        self.created.clear()
        self.status_written = None
        self.progress_turn = None
        self.check_now = True
        self.drop_observer()

    def drop_observer(self) -> None:
        """Closes the observer connection and forgets what it heard."""
        if self.observer is not None:
            self.observer.stop()
            self.observer = None


def trim_memory() -> bool:
    """Frees what the jobs that went left behind, then gives the pages the C library's allocator
    holds free back to the system (glibc's ``malloc_trim``); False where there is no such call.

    First a full collection of reference cycles: a job's cancelled loop is one (its task, the
    CancelledError, its traceback and frames refer to one another), as is much of what kopf
    kept for the object, and only the cycle collector frees them. Left to itself it runs its
    oldest generation only after many new allocations, which an idle operator never makes: the
    loops of 300 deleted jobs stayed alive for good (benchmarks/RESULTS.md, 8k). Python's small-object arenas go back
    when they empty; the decoded API objects and buffers of a busy start-up live in the C
    library's heap, which otherwise keeps its peak after the objects are freed."""
    gc.collect()
    try:
        libc = ctypes.CDLL(None)
        call = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    call.argtypes = [ctypes.c_size_t]
    call(0)
    return True


class Controller:
    """Owns the per-job loops and carries out the lifecycle's plans.

    Args:
        api: the API client.
        worker_files: the payload's files for the payload ConfigMaps (see :func:`builders.worker_files`).
        namespaces: the namespaces watched (None: all).
        resync_seconds: how often each job runs a pass from the informers' caches.
        metrics: where passes, pod writes and transitions are counted.
        check_seconds: how often each job GETs its own object from the server.
        payload_grace_seconds: how long a namespace's payload ConfigMap outlives its last
            unfinished job (:meth:`sweep_payloads`).
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
        self.isolation = isolation
        self.recycle = recycle
        #: Replaces the process (:func:`.memory.recycle`) once the policy says so.
        self.start_afresh = memory.recycle
        self.metrics = metrics or Metrics(lambda: [loop.body for loop in self.jobs.values()], self.cache_sizes,
                                          self.observer_states)
        self.worker_files = dict(worker_files)
        self.payload_hash = builders.payload_hash(self.worker_files)
        self.payload_name = names.payload_configmap_name(self.payload_hash)
        self.payload_grace_seconds = payload_grace_seconds
        self.resync_seconds = resync_seconds
        self.check_seconds = check_seconds
        self.jobs: dict[JobKey, JobLoop] = {}
        self.active = False
        self.instance = os.environ.get("POD_NAME") or socket.gethostname()
        self.events = events.EventRecorder(api, self.instance)
        ns = list(namespaces) if namespaces else None
        self.pods: informer.Informer[lifecycle.PodInfo] = self._informer(kube.pods_url, lifecycle.pod_info, "pods", ns)
        # Services and ConfigMaps are summarized from their metadata (lifecycle.child_info), so
        # that is all their informers ask for: a payload ConfigMap carries 160 KB. The payload
        # ConfigMaps (one per namespace and payload, no job's) are grouped by (namespace, hash).
        self.services: informer.Informer[lifecycle.ChildInfo] = self._informer(
            kube.services_url, lifecycle.child_info, "services", ns, metadata=True)
        self.configmaps: informer.Informer[lifecycle.ChildInfo] = informer.Informer(
            api, kube.configmaps_url, lifecycle.child_info, namespaces=ns, on_change=self._payloads_changed,
            name="configmaps", on_synced=self._relisted, metadata=True, label=names.LABEL_PAYLOAD,
            keep=lambda key: False)  # a deleted payload's last state is asked for by nobody
        self.informers: list[informer.Informer[Any]] = [self.pods, self.services, self.configmaps]
        self.namespaces = ns
        #: Informers of optional APIs (PodGroups, Kueue Workloads), started when a job first needs one.
        self.optional: dict[tuple[str, str, str], informer.Informer[Any]] = {}
        self._trim_task: asyncio.Task[None] | None = None
        #: Uids of jobs seen with the orphan finalizer: their children are left where they are.
        self._orphaning: set[str] = set()
        #: Uids of jobs whose children this replica deletes, or deleted, until the job is gone.
        self._collected: set[str] = set()
        #: The children of deleted jobs still to DELETE: (job, path, the pod's uid or None), and
        #: the tasks deleting them (at most the API client's concurrency).
        self._doomed: collections.deque[tuple[JobKey, str, str | None]] = collections.deque()
        self._collections: set[asyncio.Task[None]] = set()
        self._deleters = 0
        self.progress_turns = Turns(PROGRESS_WRITES_PER_SECOND)
        #: Namespace -> the creation of its payload ConfigMap under way (every job there awaits
        #: the one request), and -> when this replica created it or saw it created, until the
        #: informer shows it (a thousand jobs submitted at once send one 160 KB POST, not many).
        self._payload_creating: dict[str, asyncio.Future[None]] = {}
        self._payload_created: dict[str, float] = {}
        #: Namespace -> when it was last seen with an unfinished job (this term), for the sweep.
        self._payload_busy: dict[str, float] = {}
        self._sweep_task: asyncio.Task[None] | None = None

    # --- start and stop ------------------------------------------------------------------------

    async def start(self, *, activate: bool = True) -> None:
        """Starts the informers and waits for their first lists; then (``activate``) the loops.

        A standby replica starts its informers too (a warm view makes a takeover quick) but runs
        no loop until the leader elector calls :meth:`activate`.
        """
        self.metrics.bind(asyncio.get_running_loop())
        for inf in self.informers:
            inf.start()
        await asyncio.gather(*(inf.ready.wait() for inf in self.informers))
        if activate:
            self.activate()

    def activate(self) -> None:
        """Starts a loop for every known job (this replica may write); each loop first reads its
        job again from the server and forgets what an earlier term remembered."""
        self.active = True
        self.metrics.leader.set(1)
        self._payload_busy.clear()  # the grace starts again with each term
        if self._sweep_task is None or self._sweep_task.done():
            self._sweep_task = asyncio.get_running_loop().create_task(self._sweep_payloads_forever(),
                                                                      name="delete unused payload ConfigMaps")
        for loop in self.jobs.values():
            loop.new_term()
            self._start_loop(loop)

    async def deactivate(self) -> None:
        """Stops every loop at once (this replica must not write any more); jobs stay known."""
        self.active = False
        self.metrics.leader.set(0)
        tasks = [loop.task for loop in self.jobs.values() if loop.task is not None] + list(self._collections)
        if self._sweep_task is not None:
            tasks.append(self._sweep_task)
            self._sweep_task = None
        self._doomed.clear()
        for loop in self.jobs.values():
            loop.task = None
            loop.drop_observer()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Stops every loop and informer (operator shutdown)."""
        await self.deactivate()
        self.jobs.clear()
        if self._trim_task is not None:
            self._trim_task.cancel()
        for inf in self.informers:
            await inf.stop()

    def _informer(self, collection: Any, summarize: Any, name: str, namespaces: list[str] | None, *,
                  metadata: bool = False) -> informer.Informer[Any]:
        return informer.Informer(self.api, collection, summarize, namespaces=namespaces, on_change=self._wake_all,
                                 name=name, on_synced=self._relisted, keep=lambda key: key in self.jobs,
                                 metadata=metadata)

    def optional_informer(self, api: tuple[str, str, str], summarize: Any) -> informer.Informer[Any]:
        """The informer of an optional API (its CRD may not even exist), started on first use."""
        inf = self.optional.get(api)
        if inf is None:
            group, version, plural = api
            inf = self.optional[api] = self._informer(lambda ns, a=api: kube.custom_url(*a, ns), summarize,
                                                      f"{plural}.{group}", self.namespaces)
            self.informers.append(inf)
            inf.start()
        return inf

    def observer_states(self) -> list[tuple[bool, float | None]]:
        """Of every observer connection: (connected, seconds since the stalest rank's last output
        while its gang runs, else None), for the metrics (read on the event loop)."""
        out = []
        for loop in self.jobs.values():
            o = loop.observer
            if o is not None and o.running:
                out.append((o.connected, o.seconds_since_progress()))
        return out

    def cache_sizes(self) -> dict[str, tuple[int, int, int]]:
        """Informer name -> (jobs, objects, tombstones) it holds; "jobs" -> the controller's own."""
        sizes = {inf.name: inf.sizes() for inf in self.informers}
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
            self._collect_children(event_type, key, meta)
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
            if self.recycle is not None:
                self.recycle.jobs_seen(len(self.jobs))
            # A job the watch reports as just ADDED, to the leader, is the server's object as
            # created: reading it back would only cost its first pass a round trip (a queued
            # one, while a large job's pods are being created). A listed job (a start, a
            # re-list) is read first; so is every job when a new term begins (activate).
            loop.check_now = not (self.active and event_type == "ADDED")
        else:
            loop.accept(body)
        if self.active:
            self._start_loop(loop)

    def _wake_all(self, keys: set[JobKey]) -> None:
        for key in keys:
            loop = self.jobs.get(key)
            if loop is not None:
                loop.wake.set()
            elif self.recycle is not None and not any(key in inf.store for inf in self._job_informers()):
                self._trim_soon()  # a deleted job's last child went: its memory may go back now

    def _job_informers(self) -> list[informer.Informer[Any]]:
        """The informers whose groups are jobs (the payload ConfigMaps' are not)."""
        return [self.pods, self.services, *self.optional.values()]

    def _children_going(self) -> bool:
        """Whether children of deleted jobs are still held that will go: owned (the garbage
        collector deletes them) or being deleted. Orphans (no owner, ``--cascade=orphan``) stay
        and do not count. A new process would list the ones that go again, only to drop them."""
        for inf in self._job_informers():
            for key, children in inf.store.items():
                if key not in self.jobs and any(owner or getattr(summary, "deleting", False)
                                                for owner, summary in children.values()):
                    return True
        return False

    def _payloads_changed(self, keys: set[JobKey]) -> None:
        """A payload ConfigMap changed: one of the current payload gone (deleted by hand, or by a
        sweep that crossed a new job) wakes the namespace's jobs, whose passes create it again."""
        for namespace, digest in keys:
            if digest != self.payload_hash or self._payload_shown(namespace):
                continue
            self._payload_created.pop(namespace, None)
            for key, loop in self.jobs.items():
                if key[0] == namespace:
                    loop.wake.set()

    def _payload_shown(self, namespace: str) -> bool:
        return any(c.name == self.payload_name and not c.deleting
                   for c in self.configmaps.held((namespace, self.payload_hash)))

    def payload_present(self, namespace: str) -> bool:
        """Whether the namespace's ConfigMap of the current payload exists: the informer shows it,
        or this replica created it (or found it) within CREATED_MEMORY_SECONDS."""
        if self._payload_shown(namespace):
            self._payload_created.pop(namespace, None)
            return True
        when = self._payload_created.get(namespace)
        return when is not None and time.monotonic() - when < CREATED_MEMORY_SECONDS

    async def _ensure_payload(self, namespace: str) -> None:
        """Creates the namespace's payload ConfigMap, once for all the jobs that ask at the same
        time; a refusal (quota, admission) reaches each of them as :class:`Refused`."""
        if self.payload_present(namespace):
            return
        pending = self._payload_creating.get(namespace)
        if pending is None:
            pending = self._payload_creating[namespace] = asyncio.ensure_future(self._create_payload(namespace))
            pending.add_done_callback(lambda f, ns=namespace: self._payload_finished(ns, f))
        await asyncio.shield(pending)  # a job's loop cancelled does not cancel the others' creation

    def _payload_finished(self, namespace: str, future: asyncio.Future[None]) -> None:
        if self._payload_creating.get(namespace) is future:
            del self._payload_creating[namespace]
        if not future.cancelled() and future.exception() is None:
            self._payload_created[namespace] = time.monotonic()

    async def _create_payload(self, namespace: str) -> None:
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
            existing = await self.api.get(f"{collection}/{self.payload_name}", metadata=True)
            labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
            if existing is not None and labels.get(names.LABEL_PAYLOAD) != self.payload_hash:
                raise kube.KubeError(409, f"ConfigMap {self.payload_name} exists and is not the operator's payload "
                                     f"(its label {names.LABEL_PAYLOAD} is not {self.payload_hash}); delete it so "
                                     "the jobs of the namespace can mount the worker", path=collection)

    async def _sweep_payloads_forever(self) -> None:
        period = min(PAYLOAD_SWEEP_SECONDS, max(self.payload_grace_seconds / 2, 1.0))
        while True:
            await asyncio.sleep(period)
            try:
                await self.sweep_payloads()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the next sweep tries again
                logger.warning("deleting unused payload ConfigMaps failed: %s; trying again in %.0f s", e, period)

    async def sweep_payloads(self) -> list[str]:
        """Deletes the payload ConfigMaps of namespaces where no job has been unfinished (Pending,
        Running, Restarting, Suspended) for ``payload_grace_seconds`` of this term; the leader only.

        A namespace's jobs share its payload ConfigMap, so no job owns it and the garbage collector
        never deletes it; this does, once the namespace has had no unfinished job for the grace
        (a job submitted meanwhile finds it). Payloads of older operators stay as long as the
        namespace has unfinished jobs: some of their pods may still mount them.

        Returns:
            The paths deleted (for the tests and the log).
        """
        if not self.active or not self.configmaps.synced:
            return []
        now = time.monotonic()
        busy = {key[0] for key, loop in self.jobs.items()
                if ((loop.body.get("status") or {}).get("phase")) not in lifecycle.TERMINAL}
        for namespace in busy:
            self._payload_busy[namespace] = now
        deleted: list[str] = []
        emptied: set[str] = set()
        for (namespace, _), held in list(self.configmaps.store.items()):
            if namespace in busy:
                continue
            since = self._payload_busy.setdefault(namespace, now)
            if now - since < self.payload_grace_seconds:
                continue
            for name, (_, info) in list(held.items()):
                if info.deleting or not name.startswith(names.PAYLOAD_CONFIGMAP_PREFIX):
                    continue
                path = kube.configmaps_url(namespace, name)
                await self.api.delete(path, owner=(namespace, ""))
                deleted.append(path)
                emptied.add(namespace)
        for namespace in emptied:
            self._payload_created.pop(namespace, None)
            self._payload_busy.pop(namespace, None)
        if deleted:
            logger.info("deleted %d payload ConfigMaps of namespaces without an unfinished SPMDJob for %.0f s: %s",
                        len(deleted), self.payload_grace_seconds, ", ".join(deleted))
        return deleted

    def _relisted(self) -> None:
        """An informer listed (again): what happened while its watch was down may include a job's
        deletion, so every job reads itself again; jobs that waited for the sync run now."""
        for loop in self.jobs.values():
            loop.check_now = True
            loop.wake.set()

    def _collect_children(self, event_type: str | None, key: JobKey, meta: Mapping[str, Any]) -> None:
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
        if not self.active:
            return  # a standby: the leader, or this replica once it leads, collects at the deletion
        if event_type != "DELETED":
            self._collected.add(uid)
        for inf in self.informers:
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
            self._trim_soon()

    def forget(self, key: JobKey) -> None:
        """Stops and drops the loop of job ``key`` (deleted, or being deleted), and what the
        informers and the Event recorder keep for it."""
        loop = self.jobs.pop(key, None)
        if loop is not None:
            loop.drop_observer()
            if loop.task is not None:
                loop.task.cancel()
            self._trim_soon()
        self._prune(key)

    def _trim_soon(self) -> None:
        """Hands freed memory back a little after jobs went (:func:`trim_memory`): what a start-up
        of many jobs took is otherwise kept by the C library's allocator for good."""
        if self._trim_task is not None and not self._trim_task.done():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._trim_task = running.create_task(self._trim(), name="trim memory")

    async def _trim(self) -> None:
        await asyncio.sleep(TRIM_DELAY_SECONDS)
        trim_memory()
        if self.recycle is None:
            return
        collecting = bool(self._doomed or self._deleters) or self._children_going()
        why = self.recycle.verdict(memory.resident_bytes(), len(self.jobs), collecting)
        if why is None:
            return
        # What stays is fragmentation, not objects (see .memory): only a new process is rid of it.
        # The loops stop first, as when the Lease is lost; the Lease keeps its holder.
        logger.warning("memory: %s; the operator starts afresh in this process to give it back "
                       "(running jobs and their pods are not touched)", why)
        await self.deactivate()
        self.start_afresh()

    def _prune(self, key: JobKey) -> None:
        if key in self.jobs:
            return
        for inf in self.informers:
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
                loop.drop_observer()
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
                    loop.drop_observer()
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

    def _unsynced(self, infs: Iterable[informer.Informer[Any]]) -> list[str]:
        return [inf.name for inf in infs if not inf.synced]

    @staticmethod
    def _unavailable(inf: informer.Informer[Any], api: tuple[str, str, str], provider: str) -> tuple[str, str] | None:
        """Why an optional API cannot be used, naming the RBAC rule or CRD and the chart value."""
        error = inf.failure
        if error is None:
            return None
        group, version, plural = api
        value = CHART_VALUES.get(plural if group.startswith("kueue") else group, "")
        if error.status == 403:
            return ("SchedulingForbidden",
                    f"spec.scheduling.provider {provider} needs {plural}.{group} (list, watch, create), which the "
                    f"operator's RBAC does not grant: install the chart with {value}=true (or add the rule to its "
                    f"ClusterRole); no pods are created until then")
        return ("SchedulingAPIMissing",
                f"spec.scheduling.provider {provider} needs the API {plural}.{group}/{version}, which this cluster "
                f"does not serve (no CustomResourceDefinition): install {provider}, or choose another provider; "
                "no pods are created until then")

    def observed(self, loop: JobLoop, now: dt.datetime | None = None) -> lifecycle.Observed | None:
        """What a pass of ``loop`` sees: its job and the children it owns; None while an informer
        the pass needs has not listed (since its watch last broke): nothing is decided then."""
        if self._unsynced(self.informers[:3]):
            return None
        body = loop.body
        meta = body.get("metadata") or {}
        job = JobRef.from_body(body)
        outdated: tuple[SpecError, ...] = ()
        try:
            spec, outdated = parse_stored(body.get("spec") or {})
        except SpecError as e:
            spec = e
        configmap = lifecycle.CONFIGMAP_CURRENT if self.payload_present(job.namespace) else lifecycle.CONFIGMAP_MISSING
        podgroups: tuple[lifecycle.ChildInfo, ...] = ()
        workload = None
        unavailable = None
        if not isinstance(spec, SpecError):
            provider = spec.scheduling_provider
            group_api = builders.PODGROUP_APIS.get(provider)
            if group_api is not None:
                inf = self.optional_informer(group_api, lifecycle.child_info)
                unavailable = self._unavailable(inf, group_api, provider)
                if unavailable is None and not inf.synced:
                    return None
                podgroups = tuple(inf.get(job.key, job.uid))
            if provider == SCHEDULING_KUEUE:
                inf = self.optional_informer(builders.KUEUE_WORKLOAD, lifecycle.workload_info)
                unavailable = self._unavailable(inf, builders.KUEUE_WORKLOAD, provider)
                if unavailable is None and not inf.synced:
                    return None
                found = inf.get(job.key, job.uid)
                workload = found[0] if found else None
        pods = tuple(self.pods.get(job.key, job.uid))
        status = body.get("status") or {}
        coordinator = None if isinstance(spec, SpecError) else self._coordinator(loop, job, spec, status, pods)
        return lifecycle.Observed(
            job=job,
            generation=meta.get("generation"),
            spec=spec,
            status=status,
            pods=pods,
            gone=tuple(self.pods.gone(job.key, job.uid)),
            services=tuple(self.services.get(job.key, job.uid)),
            configmap=configmap,
            podgroups=podgroups,
            workload=workload,
            rejection=loop.rejection,
            outdated=outdated,
            unavailable=unavailable,
            coordinator=coordinator,
            now=now or dt.datetime.now(dt.timezone.utc),
        )

    def _coordinator(self, loop: JobLoop, job: JobRef, spec: Any, status: Mapping[str, Any],
                     pods: Iterable[lifecycle.PodInfo]) -> lifecycle.CoordinatorView | None:
        """Starts, keeps or stops the job's observer connection from what the pass sees, and
        returns what it heard of the current gang's coordinator (None: nothing, or no gang
        restarting in place).

        The connection is to the current gang's rank-0 pod while it runs and declares the agent
        port; once that pod ends, what was heard last stays (the coordinator's verdict names the
        root cause); a new gang, a job that ended or is held, and RecreatePods drop it.
        """
        phase = status.get("phase")
        if not policy.restarts_in_place(spec) or phase not in (lifecycle.PENDING, lifecycle.RUNNING, lifecycle.RESTARTING):
            loop.drop_observer()
            return None
        restarts = int(status.get("restarts") or 0)
        gang = status.get("gangRestart")
        gang = gang if isinstance(gang, int) and not isinstance(gang, bool) else restarts
        zero = next((p for p in pods if p.restart == gang and p.rank == 0 and p.replacement == 0), None)
        name = names.pod_name(job, gang, 0)
        if loop.observer is not None and loop.observer.pod_name != name:
            loop.drop_observer()  # another gang's
        alive = (zero is not None and zero.phase == lifecycle.RUNNING and not zero.deleting and zero.ip
                 and zero.agent_port is not None)
        if alive:
            assert zero is not None and zero.ip is not None and zero.agent_port is not None
            target = (zero.name, zero.uid, zero.ip, zero.agent_port)
            if loop.observer is not None and loop.observer.target != target:
                loop.drop_observer()  # the same name, another pod (or address)
            if loop.observer is None:
                loop.observer = Observer((zero.name, zero.uid), zero.ip, zero.agent_port, loop.wake.set,
                                         token=zero.agent_token or "", run_id=job.uid,
                                         job=f"{job.namespace}/{job.name}")
            loop.observer.start()
        elif loop.observer is not None:
            loop.observer.stop()  # rank 0's pod is gone or ending: keep what was heard
        return loop.observer.view() if loop.observer is not None else None

    async def reconcile_once(self, loop: JobLoop, now: dt.datetime | None = None) -> float | None:
        """One pass over job ``loop``: observe, decide, then write.

        Returns:
            Seconds until a time-based transition (deadline, TTL, replacement timeout), or None.
        """
        if (loop.body.get("metadata") or {}).get("deletionTimestamp"):
            raise JobGone("it is being deleted")
        o = self.observed(loop, now)
        if o is None:
            return 1.0  # an informer is (re-)listing; its completion wakes every job too
        if loop.created:
            # What the watches show needs no memory of having been created, and what they saw
            # deleted since may be created again at once.
            for child in (*o.pods, *o.services, *o.podgroups):
                loop.created.pop(child.name, None)
            for name, when in list(loop.created.items()):
                if any((inf.deleted_at(loop.key, name) or 0.0) > when for inf in self.informers):
                    del loop.created[name]
        plan = lifecycle.reconcile(o)
        if plan.pods_lost and plan.status and await self._namespace_terminating(o.job.namespace):
            raise JobGone(f"namespace {o.job.namespace} is being deleted")
        deferred = await self._carry_out(loop, o, plan)
        waits = [t for t in (plan.requeue_after, deferred) if t is not None]
        return min(waits) if waits else None

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
            children = asyncio.ensure_future(self._create_children(loop, o, plan, group_api))
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
        pods = {p.name: p for p in o.pods}
        self.metrics.pods_deleted.inc(sum(1 for name in plan.delete_pods if name in pods))
        await self._all([
            *(self.api.delete(kube.pods_url(ns, name), owner=key) for name in plan.delete_pods if name in pods),
            *(self.api.delete(kube.services_url(ns, name), owner=key) for name in plan.delete_services),
            *(self.api.delete(kube.custom_url(*group_api, ns, name), owner=key) for name in plan.delete_podgroups
              if group_api),
            *([self._finish_workload(o)] if plan.finish_workload else []),
            *([self._release_workload(o)] if plan.release_workload else []),
        ])
        if isinstance(spec, SpecError):
            return deferred
        results = await (children if children is not None else self._create_children(loop, o, plan, group_api))
        rejected = next((r.refusal for r in results if isinstance(r, Refused)), None)
        if rejected is None:
            self._raise_first(results)
            creates = plan.create or plan.replace
            flavors = await self._flavors(o) if creates and o.workload is not None else []
            rejected = await self._create_pods(loop, job, spec, plan, flavors, o.pods) if creates else None
        if rejected is not None:
            # Refused by the API server (no pod goes without its Service and ConfigMap): the next
            # pass says why (lifecycle.refusal) or fails an invalid spec (lifecycle.admission).
            loop.rejection = rejected
            loop.wake.set()
        return deferred

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

    async def _create_children(self, loop: JobLoop, o: lifecycle.Observed, plan: lifecycle.Plan,
                               group_api: tuple[str, str, str] | None) -> list[Any]:
        """The plan's ConfigMap, Service, PodGroup and Workload, concurrently; each one's result
        or exception."""
        job, spec, ns = o.job, o.spec, o.job.namespace
        self._forget_old_creations(loop)
        writes: list[Awaitable[Any]] = []
        if plan.configmap:
            writes.append(self._ensure_payload(ns))
        if plan.service is not None:
            writes.append(self._ensure(loop, kube.services_url(ns), builders.build_service(job, spec, plan.service), job))
        if plan.podgroup is not None and group_api is not None:
            writes.append(self._ensure(loop, kube.custom_url(*group_api, ns), builders.build_podgroup(job, spec, plan.podgroup), job))
        if plan.workload:
            writes.append(self._ensure(loop, kube.custom_url(*builders.KUEUE_WORKLOAD, ns), builders.build_workload(job, spec), job))
        if self.isolation is not None and (plan.create or plan.replace):
            # Before the pods (they wait for these writes): no pod of the job runs unisolated. One
            # per job, so a later attempt's creation finds it (409, checked to be the job's own).
            isolation = builders.build_network_policy(job, spec, *self.isolation)
            if isolation is not None:
                writes.append(self._ensure(loop, kube.custom_url(*builders.NETWORK_POLICY_API, ns), isolation, job))
        if writes or plan.create or plan.replace:
            loop.rejection = None  # tried again: the next pass sees only what this one is refused
        return await asyncio.gather(*writes, return_exceptions=True)

    async def _workload_conditions(self, o: lifecycle.Observed, conditions: Mapping[str, tuple[str, str, str]],
                                   extra: Mapping[str, Any] | None = None) -> None:
        """Sets conditions (type -> status, reason, message) on the job's Workload status.

        The Workload is Kueue's object too: the patch carries the resourceVersion read, so a
        condition Kueue wrote in between is never overwritten (409 Conflict: read again, retry).
        """
        assert o.workload is not None
        now = lifecycle.format_time(o.now)
        url = kube.custom_url(*builders.KUEUE_WORKLOAD, o.job.namespace, o.workload.name)
        for attempt in range(WORKLOAD_CONFLICT_RETRIES):
            body = await self.api.get(url)
            if body is None:
                return
            kept = [c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") not in conditions]
            new = [{"type": t, "status": st, "reason": r, "message": m, "lastTransitionTime": now}
                   for t, (st, r, m) in conditions.items()]
            version = (body.get("metadata") or {}).get("resourceVersion")
            try:
                await self.api.patch(f"{url}/status", {"metadata": {"resourceVersion": version},
                                                       "status": {"conditions": kept + new, **(extra or {})}},
                                     owner=(o.job.namespace, o.job.name))
                return
            except kube.KubeError as e:
                if e.status != 409 or attempt == WORKLOAD_CONFLICT_RETRIES - 1:
                    raise
                logger.info("Workload %s/%s changed while it was being updated; reading it again",
                            o.job.namespace, o.workload.name)

    async def _finish_workload(self, o: lifecycle.Observed) -> None:
        """Tells Kueue the job ended (condition Finished on the Workload), so it frees the quota."""
        succeeded = o.status.get("phase") == lifecycle.SUCCEEDED
        outcome = "Succeeded" if succeeded else "Failed"
        await self._workload_conditions(o, {"Finished": ("True", outcome, f"the SPMDJob {outcome.lower()}")})

    async def _release_workload(self, o: lifecycle.Observed) -> None:
        """After an eviction, once every pod is gone: the quota goes back to Kueue, the job queues again."""
        assert o.workload is not None
        requeue = "True" if o.workload.evicted in ("Preempted", "NodeFailures") else "False"
        await self._workload_conditions(o, {
            "QuotaReserved": ("False", "Pending", "the gang's pods were stopped"),
            "Admitted": ("False", "NoReservation", "the gang's pods were stopped"),
            "Requeued": (requeue, o.workload.evicted or "Evicted", "the gang's pods were stopped"),
        }, extra={"admission": None})

    async def _flavors(self, o: lifecycle.Observed) -> list[dict[str, Any]]:
        """The ResourceFlavors Kueue admitted the job on (cluster-scoped; read when pods are made)."""
        if o.workload is None:
            return []
        group, version, plural = builders.KUEUE_FLAVORS
        found = await asyncio.gather(*(self.api.get(f"/apis/{group}/{version}/{plural}/{name}") for name in o.workload.flavors))
        return [f for f in found if f is not None]

    def _forget_old_creations(self, loop: JobLoop) -> None:
        clock = asyncio.get_running_loop().time()
        loop.created = {n: t for n, t in loop.created.items() if clock - t < CREATED_MEMORY_SECONDS}

    async def _ensure(self, loop: JobLoop, collection: str, body: dict[str, Any], job: JobRef) -> dict[str, Any] | None:
        """Creates a child unless this loop did within CREATED_MEMORY_SECONDS.

        Returns:
            None if it was created now or remembered; if its name was taken, the holder's
            metadata once it is known to be ours (a stranger's is an error).
        """
        name = body["metadata"]["name"]
        when = loop.created.get(name)
        if when is not None and asyncio.get_running_loop().time() - when < CREATED_MEMORY_SECONDS:
            return None
        try:
            created = await self.api.create(collection, body, keep=False, owner=loop.key) is not None
        except kube.KubeError as e:
            refusal = refusal_of(e, body)
            if refusal is not None:
                raise Refused(refusal) from e
            raise
        existing = None
        if not created:
            existing = await self.api.get(f"{collection}/{name}", metadata=True)
            if existing is not None and names.owner_uid(existing) != job.uid:
                raise kube.KubeError(409, f"{body['kind']} {name} exists and belongs to another object; "
                                     "delete it so the job can create its own", path=collection)
        loop.created[name] = asyncio.get_running_loop().time()
        return existing

    @staticmethod
    def _attempt_token(loop: JobLoop, spec: Any, restart: int, pods: Iterable[lifecycle.PodInfo]) -> str | None:
        """The agent token of attempt ``restart``'s pods: the one its pods already carry (created
        by this process or an earlier one), else a new one; None without restart in place."""
        if policy.agent_port(spec) is None:
            return None
        for old in [r for r in loop.tokens if r < restart]:
            del loop.tokens[old]
        carried = next((p.agent_token for p in pods if p.restart == restart and p.agent_token), None)
        if carried is not None:
            loop.tokens[restart] = carried
        return loop.tokens.setdefault(restart, rendezvous.new_token())

    async def _create_pods(self, loop: JobLoop, job: JobRef, spec: Any, plan: lifecycle.Plan,
                           flavors: list[dict[str, Any]],
                           pods: Iterable[lifecycle.PodInfo] = ()) -> lifecycle.Refusal | None:
        """Creates the plan's pods concurrently.

        Returns:
            The API server's refusal of the lowest-ranked pod it refused (400, 403, 422), else None.
        """
        ns = job.namespace
        wanted = [(r, 0) for r in plan.create] + list(plan.replace)
        ranks = [(r, n) for r, n in wanted if names.pod_name(job, plan.restart, r, n) not in loop.created]
        # A pod is built only when its request may go: thousands of pod bodies never sit in memory
        # at once, and the server's answer (the pod again) is not decoded.
        gate = asyncio.Semaphore(self.api.concurrency)
        token = self._attempt_token(loop, spec, plan.restart, pods) if ranks else None

        async def create(rank: int, replacement: int) -> Any:
            async with gate:
                pod = builders.build_pod(job, spec, rank, plan.restart, replacement=replacement,
                                         restart_count=plan.replace_round if replacement else None,
                                         disruptions=plan.disruptions, payload=self.payload_name, token=token,
                                         avoid_nodes=plan.avoid_nodes)
                builders.place_on_flavors(pod, flavors)
                return await self.api.create(kube.pods_url(ns), pod, keep=False, owner=loop.key)

        results = await asyncio.gather(*(create(r, n) for r, n in ranks), return_exceptions=True)
        # Remembered from the answers, not from when the pass began: under load a pod's request
        # may wait its turn among other jobs' writes for longer than the memory lasts.
        clock = asyncio.get_running_loop().time()
        taken: list[str] = []
        refused: lifecycle.Refusal | None = None
        for i, ((rank, replacement), result) in enumerate(zip(ranks, results)):
            name = names.pod_name(job, plan.restart, rank, replacement)
            refusal = refusal_of(result, {"kind": "Pod", "metadata": {"name": name}}, rank)
            if refusal is not None:
                refused = refused or refusal
                results[i] = None  # said in the next pass, not raised
                continue
            if result is None:
                taken.append(name)
            if not isinstance(result, BaseException):
                loop.created[name] = clock
                if result is not None:
                    self.metrics.pods_created.inc()
                    if replacement:
                        self.metrics.pods_replaced.inc()
        if taken:
            await self._check_taken(loop, job, taken)
        self._raise_first(results)
        return refused

    async def _check_taken(self, loop: JobLoop, job: JobRef, taken: list[str]) -> None:
        """Pods whose names were taken: ours (created by an earlier pass) or, rarely, a stranger's."""
        existing = await asyncio.gather(*(self.api.get(kube.pods_url(job.namespace, n), metadata=True) for n in taken))
        strangers = [n for n, body in zip(taken, existing) if body is not None and names.owner_uid(body) != job.uid]
        new = [n for n in strangers if n not in loop.foreign_reported]
        if new:
            loop.foreign_reported.update(new)
            await self.events.record(loop.body, [lifecycle.Event(
                lifecycle.EVENT_WARNING, "NameTaken",
                f"{len(new)} pod name(s) are held by objects this job does not own (e.g. {new[0]}); "
                "they are not counted; the job waits until they are gone")])
        for n in strangers:
            loop.created.pop(n, None)

    async def _all(self, writes: Iterable[Awaitable[Any]]) -> None:
        """Runs writes concurrently; logs every failure and raises the first."""
        results = await asyncio.gather(*writes, return_exceptions=True)
        self._raise_first(results)

    @staticmethod
    def _raise_first(results: Iterable[Any]) -> None:
        errors = [r for r in results if isinstance(r, BaseException)]
        for e in errors[1:]:
            logger.warning("a concurrent write also failed: %s", e)
        if errors:
            gone = [e for e in errors if isinstance(e, kube.KubeError) and e.namespace_terminating]
            if gone:
                raise JobGone("its namespace is being deleted") from gone[0]
            raise errors[0]
