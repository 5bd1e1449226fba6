"""The operator's Prometheus metrics, served in the text format on ``/metrics``.

Where it sits: beside :mod:`.kube` (which reports every API request here), below the controller
(which reports reconcile passes, pod writes and the transitions its plans make) and the leader
elector. Built on ``prometheus_client``; ``--metrics-port`` (default 9090, 0: off) serves it.

=========================================  =========  =============================================
metric                                     type       labels / meaning
=========================================  =========  =============================================
spmdjob_jobs                               gauge      namespace, phase: the jobs this replica knows
spmdjob_jobs_created_total                 counter    jobs whose first pass ran (status written)
spmdjob_jobs_succeeded_total               counter    jobs that succeeded
spmdjob_jobs_failed_total                  counter    reason: InvalidSpec, PermanentFailure,
                                                      RestartLimitExceeded, DeadlineExceeded ...
spmdjob_gang_restarts_total                counter    cause: failure (counts against maxRestarts)
                                                      or disruption (preemption, eviction, node loss)
spmdjob_time_to_running_seconds            histogram  job creation -> every proc of the first
                                                      attempt running (or done)
spmdjob_time_to_completion_seconds         histogram  result (succeeded, failed): creation -> end
spmdjob_reconcile_duration_seconds         histogram  one pass over one job, writes included
spmdjob_reconcile_errors_total             counter    passes that failed (retried with back-off)
spmdjob_api_requests_total                 counter    verb (get, list, watch, post, patch, put,
                                                      delete), outcome (2xx, 4xx, 5xx, error)
spmdjob_pods_created_total                 counter    pods this replica created
spmdjob_pods_deleted_total                 counter    pods this replica deleted
spmdjob_leader                             gauge      1 while this replica holds the Lease
spmdjob_cache_entries                      gauge      informer (pods, services, configmaps,
                                                      workloads, podgroups), kind (jobs, objects,
                                                      tombstones): what the informers hold
spmdjob_in_place_restarts_total            counter    cause (failure, disruption): the gang
                                                      restarts counted above that were in place
spmdjob_hangs_total                        counter    reason (WatchdogTimeout, NoProgress): hung
                                                      ranks killed by the agents (restart or fail)
spmdjob_pods_replaced_total                counter    pods created alone in place of a lost one
spmdjob_spare_takeovers_total              counter    hot spares' pods adopted in place of a lost pod
spmdjob_observers                          gauge      state (connected, connecting): the
                                                      operator's connections to coordinators
spmdjob_seconds_since_progress             gauge      (a histogram over jobs) of every job whose
                                           histogram  gang runs in place: seconds since its
                                                      stalest rank last wrote output
spmdjob_seconds_since_progress_max         gauge      the largest of those: a hung rank anywhere
=========================================  =========  =============================================

Thread safety: prometheus_client scrapes on a thread of its own while the controller's asyncio
loop changes its jobs and caches. The computed gauges (spmdjob_jobs, spmdjob_cache_entries) are
therefore read on the event loop itself (:meth:`Metrics.bind`): the scrape thread asks the loop
for a snapshot and waits for it (a few seconds at most), never walking live dicts.

Cardinality is bounded: no label holds a job or pod name (the per-job "seconds since last
progress" is therefore a histogram over the jobs and their maximum, computed at each scrape from
what the observers heard; status.lastProgressTime has it per job) (a cluster runs thousands of jobs over
time; per-job series would grow without end and belong to kube-state-metrics-style exporters of
the jobs' status). Namespaces and phases, reasons, verbs and outcomes are small sets.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .lifecycle.model import parse_time

#: Seconds: from a few seconds (a small CPU job) to hours (a large gang waiting for GPUs).
SLOW_BUCKETS: Final = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
PASS_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Seconds since the stalest rank's last output: from a healthy job's few seconds to a day.
PROGRESS_BUCKETS: Final = (5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 86400)
#: Failure reasons of a hung rank (payload.rendezvous: the watchdog's and the progress timeout's).
HANG_REASONS: Final = frozenset({"WatchdogTimeout", "NoProgress"})
DEFAULT_PORT: Final = 9090


logger = logging.getLogger(__name__)
#: How long a scrape waits for the event loop's snapshot.
SNAPSHOT_TIMEOUT: Final = 5.0

Caches = Mapping[str, tuple[int, int, int]]
#: Of each observer connection: (connected, seconds since progress while its gang runs, or None).
Observers = Iterable[tuple[bool, float | None]]


class _Snapshot(Collector):
    """spmdjob_jobs and spmdjob_cache_entries, computed from a snapshot taken on the event loop."""

    def __init__(self, jobs: Callable[[], Iterable[Mapping[str, Any]]], caches: Callable[[], Caches],
                 observers: Callable[[], Observers] = lambda: ()) -> None:
        self.jobs = jobs
        self.caches = caches
        self.observers = observers
        self.loop: asyncio.AbstractEventLoop | None = None

    def take(self) -> tuple[dict[tuple[str, str], int], dict[str, tuple[int, int, int]], list[tuple[bool, float | None]]]:
        """Counts jobs by (namespace, phase), copies the cache sizes and the observers' states
        (call on the loop)."""
        counts: dict[tuple[str, str], int] = {}
        for body in list(self.jobs()):
            key = ((body.get("metadata") or {}).get("namespace", ""),
                   str((body.get("status") or {}).get("phase") or "New"))
            counts[key] = counts.get(key, 0) + 1
        return counts, dict(self.caches()), list(self.observers())

    def _on_loop(self) -> tuple[dict[tuple[str, str], int], dict[str, tuple[int, int, int]], list[tuple[bool, float | None]]]:
        loop = self.loop
        if loop is None or not loop.is_running() or _loop_thread(loop) == threading.get_ident():
            return self.take()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(self.take())
            except Exception as e:  # noqa: BLE001 - handed to the scraping thread
                done.set_exception(e)

        loop.call_soon_threadsafe(run)
        return done.result(timeout=SNAPSHOT_TIMEOUT)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("spmdjob_jobs", "SPMDJobs this replica knows, by namespace and phase",
                                 labels=["namespace", "phase"])
        caches = GaugeMetricFamily("spmdjob_cache_entries", "Entries the informers hold, by informer and kind",
                                   labels=["informer", "kind"])
        try:
            counts, sizes, observers = self._on_loop()
        except (concurrent.futures.TimeoutError, RuntimeError) as e:
            logger.warning("metrics: no snapshot from the event loop (%r); spmdjob_jobs left out of this scrape", e)
            return
        for (namespace, phase), n in sorted(counts.items()):
            jobs.add_metric([namespace, phase], n)
        for name, (keys, objects, tombstones) in sorted(sizes.items()):
            caches.add_metric([name, "jobs"], keys)
            caches.add_metric([name, "objects"], objects)
            caches.add_metric([name, "tombstones"], tombstones)
        yield jobs
        yield caches
        yield from progress_families(observers)


def progress_families(observers: Observers) -> Iterable[Any]:
    """spmdjob_observers, spmdjob_seconds_since_progress (a gauge histogram over the jobs whose
    gang runs in place) and its maximum, from the observers' states."""
    observers = list(observers)
    states = GaugeMetricFamily("spmdjob_observers", "Observer connections to restart-in-place coordinators, by state",
                               labels=["state"])
    connected = sum(1 for c, _ in observers if c)
    states.add_metric(["connected"], connected)
    states.add_metric(["connecting"], len(observers) - connected)
    yield states
    idle = sorted(s for _, s in observers if s is not None)
    buckets = [(str(float(b)), sum(1 for s in idle if s <= b)) for b in PROGRESS_BUCKETS] + [("+Inf", len(idle))]
    yield GaugeHistogramMetricFamily("spmdjob_seconds_since_progress",
                                     "Jobs whose gang runs in place, by seconds since their stalest rank last wrote output",
                                     buckets=buckets, gsum_value=sum(idle))
    peak = GaugeMetricFamily("spmdjob_seconds_since_progress_max",
                             "The most seconds any running gang's stalest rank has gone without output")
    peak.add_metric([], idle[-1] if idle else 0.0)
    yield peak


def _loop_thread(loop: asyncio.AbstractEventLoop) -> int | None:
    return getattr(loop, "_thread_id", None)


class Metrics:
    """Every metric of the operator, in one registry of its own.

    Args:
        jobs: returns the job bodies the controller knows (for spmdjob_jobs).
        caches: returns informer name -> (jobs, objects, tombstones) (for spmdjob_cache_entries).
    """

    def __init__(self, jobs: Callable[[], Iterable[Mapping[str, Any]]] = lambda: (),
                 caches: Callable[[], Caches] = lambda: {},
                 observers: Callable[[], Observers] = lambda: ()) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.created = Counter("spmdjob_jobs_created", "SPMDJobs whose first pass ran", registry=r)
        self.succeeded = Counter("spmdjob_jobs_succeeded", "SPMDJobs that succeeded", registry=r)
        self.failed = Counter("spmdjob_jobs_failed", "SPMDJobs that failed, by reason", ["reason"], registry=r)
        self.restarts = Counter("spmdjob_gang_restarts", "Gang restarts, by cause (failure or disruption)",
                                ["cause"], registry=r)
        self.to_running = Histogram("spmdjob_time_to_running_seconds",
                                    "Seconds from a job's creation to every proc of its first attempt running",
                                    buckets=SLOW_BUCKETS, registry=r)
        self.to_completion = Histogram("spmdjob_time_to_completion_seconds",
                                       "Seconds from a job's creation to its end, by result",
                                       ["result"], buckets=SLOW_BUCKETS, registry=r)
        self.passes = Histogram("spmdjob_reconcile_duration_seconds", "Seconds one reconcile pass took",
                                buckets=PASS_BUCKETS, registry=r)
        self.errors = Counter("spmdjob_reconcile_errors", "Reconcile passes that failed", registry=r)
        self.requests = Counter("spmdjob_api_requests", "Kubernetes API requests, by verb and outcome",
                                ["verb", "outcome"], registry=r)
        self.pods_created = Counter("spmdjob_pods_created", "Pods created", registry=r)
        self.pods_deleted = Counter("spmdjob_pods_deleted", "Pods deleted", registry=r)
        self.leader = Gauge("spmdjob_leader", "1 while this replica holds the leader Lease", registry=r)
        self.in_place = Counter("spmdjob_in_place_restarts", "Gang restarts done in place, by cause", ["cause"],
                                registry=r)
        self.hangs = Counter("spmdjob_hangs", "Hung ranks the agents killed, by reason", ["reason"], registry=r)
        self.recycles = Gauge("spmdjob_memory_recycles",
                              "Times this operator process started afresh to give memory back (--memory-recycle-factor)",
                              registry=r)
        self.pods_replaced = Counter("spmdjob_pods_replaced", "Pods created alone in place of a lost one",
                                     registry=r)
        self.spare_takeovers = Counter("spmdjob_spare_takeovers", "Hot spares' pods adopted in place of a lost pod",
                                       registry=r)
        self.snapshot = _Snapshot(jobs, caches, observers)
        r.register(self.snapshot)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Takes the computed gauges' snapshots on ``loop`` (the controller's) from now on."""
        self.snapshot.loop = loop

    def request(self, verb: str, outcome: str) -> None:
        """The :class:`~.kube.Kube` observer: one API request done."""
        self.requests.labels(verb, outcome).inc()

    def transition(self, status: Mapping[str, Any], patch: Mapping[str, Any], created: str | None,
                   now: dt.datetime) -> None:
        """Counts what a pass's status patch changed: creation, first Running, end, restarts.

        Args:
            status: the job's status before the pass.
            patch: the merge patch the pass wrote.
            created: the job's metadata.creationTimestamp.
            now: the time of the pass.
        """
        old, new = status.get("phase"), patch.get("phase", status.get("phase"))
        if old is None and new is not None:
            self.created.inc()
        age = _age(created, now)
        # The first attempt's procs all running, or already done (a short job may go from Pending
        # straight to Succeeded); not after a restart or a resume.
        first_start = (old == "Pending" and not status.get("restarts")
                       and not any(c.get("type") == "Suspended" for c in status.get("conditions") or []))
        if first_start and new in ("Running", "Succeeded") and age is not None:
            self.to_running.observe(age)
        if new != old and new in ("Succeeded", "Failed"):
            if new == "Succeeded":
                self.succeeded.inc()
            else:
                reason = next((c.get("reason") for c in patch.get("conditions") or []
                               if c.get("type") == "Failed" and c.get("status") == "True"), None) or "Unknown"
                self.failed.labels(reason).inc()
            if age is not None:
                self.to_completion.labels(new.lower()).observe(age)
        before, after = int(status.get("restarts") or 0), patch.get("restarts")
        changed = patch.get("failure")
        # The patch holds only what changed: the failure as written is the old one with it merged.
        failure = {k: v for k, v in {**(status.get("failure") or {}), **(changed or {})}.items() if v is not None}
        if isinstance(after, int) and after > before:
            cause = "disruption" if failure.get("disruption") else "failure"
            self.restarts.labels(cause).inc(after - before)
            if failure.get("inPlace"):
                self.in_place.labels(cause).inc(after - before)
        if changed and failure.get("reason") in HANG_REASONS:
            self.hangs.labels(failure["reason"]).inc()

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Serves /metrics on ``port`` in a thread of its own."""
        start_http_server(port, addr=address, registry=self.registry)


def _age(created: str | None, now: dt.datetime) -> float | None:
    t = parse_time(created)
    return None if t is None else max(0.0, (now - t).total_seconds())
