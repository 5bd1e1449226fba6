"""What the many-jobs benchmark sees and measures: its own watches of a trial's pods and jobs,
and a controller's requests (at the API server), memory and CPU.

Where it sits: below ``benchmarks.many_jobs`` (which drives the trials), above
``benchmarks.kube`` (the API client, identities and request counters) and ``benchmarks.procstat``
(/proc readings).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable

from benchmarks import kube, procstat
from benchmarks.cluster import Cluster
from benchmarks.many_jobs_floor import LABEL_JOB as FLOOR_LABEL_JOB
from benchmarks.operator_scale import job_running

#: The pod label naming the pod's job, per actor.
JOB_LABEL = {
    "floor": FLOOR_LABEL_JOB,
    "spmdjob": "spmd.monarch.dev/job",
    "pytorchjob": "training.kubeflow.org/job-name",
    "jobset": "jobset.sigs.k8s.io/jobset-name",
}


# --- what the benchmark sees ------------------------------------------------------------------

class Tracker:
    """The pods and job objects of one trial as the benchmark's own watches see them; thread safe.

    Pods are grouped by their job label; ``sizes`` gives each job's pod count, so the time a job's
    last pod was first Running is known (the floor's "job Running").
    """

    def __init__(self, actor: str, sizes: dict[str, int]) -> None:
        self.actor = actor
        self.label = JOB_LABEL[actor]
        self.sizes = dict(sizes)
        self.cond = threading.Condition()
        self.pod_seen: dict[str, float] = {}
        self.pod_running: dict[str, float] = {}
        self.seen_by_job: Counter[str] = Counter()
        self.running_by_job: Counter[str] = Counter()
        self.job_first_seen: dict[str, float] = {}     # job -> when its first pod was seen
        self.job_pods_seen: dict[str, float] = {}      # job -> when its last pod was first seen
        self.job_pods_running: dict[str, float] = {}   # job -> when its last pod was first Running
        self.job_running: dict[str, float] = {}        # job -> when its status first said Running
        self.job_status: dict[str, dict] = {}
        self.pods_live: dict[str, str] = {}            # uid -> name
        self.jobs_live: dict[str, str] = {}
        self.last_pod_gone: float | None = None
        self.last_job_gone: float | None = None
        self.events = 0

    def _pod(self, pod: dict, t: float) -> None:
        meta = pod["metadata"]
        name, job = meta["name"], (meta.get("labels") or {}).get(self.label)
        self.pods_live[meta.get("uid", name)] = name
        if name not in self.pod_seen:
            self.pod_seen[name] = t
            if job is not None:
                self.job_first_seen.setdefault(job, t)
                self.seen_by_job[job] += 1
                if self.seen_by_job[job] == self.sizes.get(job):
                    self.job_pods_seen[job] = t
        if (pod.get("status") or {}).get("phase") == "Running" and name not in self.pod_running:
            self.pod_running[name] = t
            if job is not None:
                self.running_by_job[job] += 1
                if self.running_by_job[job] == self.sizes.get(job):
                    self.job_pods_running[job] = t

    def pods_listed(self, items: list[dict], t: float) -> None:
        with self.cond:
            before, self.pods_live = self.pods_live, {}
            for pod in items:
                self._pod(pod, t)
            if set(before) - set(self.pods_live):  # deletions the broken watch did not deliver
                self.last_pod_gone = t
            self.cond.notify_all()

    def pod_event(self, kind: str, pod: dict, t: float) -> None:
        with self.cond:
            self.events += 1
            if kind == "DELETED":
                meta = pod["metadata"]
                self.pods_live.pop(meta.get("uid", meta["name"]), None)
                self.last_pod_gone = t
            else:
                self._pod(pod, t)
            self.cond.notify_all()

    def _job(self, obj: dict, t: float) -> None:
        meta = obj["metadata"]
        self.jobs_live[meta.get("uid", meta["name"])] = meta["name"]
        self.job_status[meta["name"]] = obj.get("status") or {}
        if job_running(self.actor, obj):
            self.job_running.setdefault(meta["name"], t)

    def jobs_listed(self, items: list[dict], t: float) -> None:
        with self.cond:
            before, self.jobs_live = self.jobs_live, {}
            for obj in items:
                self._job(obj, t)
            if set(before) - set(self.jobs_live):
                self.last_job_gone = t
            self.cond.notify_all()

    def job_event(self, kind: str, obj: dict, t: float) -> None:
        with self.cond:
            self.events += 1
            if kind == "DELETED":
                meta = obj["metadata"]
                self.jobs_live.pop(meta.get("uid", meta["name"]), None)
                self.last_job_gone = t
            else:
                self._job(obj, t)
            self.cond.notify_all()

    def running_at(self, job: str) -> float | None:
        """When ``job`` was first Running: its status (controllers) or its last pod (floor)."""
        return self.job_pods_running.get(job) if self.actor == "floor" else self.job_running.get(job)

    def jobs_running(self) -> int:
        """How many jobs have been Running (see :meth:`running_at`)."""
        return len(self.job_pods_running if self.actor == "floor" else self.job_running)

    def wait(self, predicate: Callable[[], bool], deadline: float,
             check: Callable[[], None] | None = None) -> bool:
        """Waits (time.monotonic() deadline) until ``predicate()``, called under the lock, holds.
        ``check`` is called about every second and ends the wait by raising (a controller under
        test that exited: its trial fails then, not at the deadline an hour later)."""
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 1.0))
                if check is not None:
                    check()
            return True


class ListWatch(threading.Thread):
    """Lists a collection, then watches it from the list's version, and again from the last
    version seen when a watch ends or breaks; lists again (replacing what the tracker holds) only
    when the watch says that version is gone."""

    def __init__(self, client: kube.Kube, path: str, on_list: Callable[[list[dict], float], None],
                 on_event: Callable[[str, dict, float], None], timeout_seconds: int = 60) -> None:
        super().__init__(daemon=True)
        self.client, self.path = client, path
        self.on_list, self.on_event = on_list, on_event
        self.timeout_seconds = timeout_seconds
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.relists = 0   # lists after the first (the watch's version was gone)
        self.broken = 0    # watches (or lists) that failed and were tried again
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        failures = 0
        rv: str | None = None
        listed = False
        while not self._stopping.is_set():
            try:
                if rv is None:
                    listing = self.client.get(self.path)
                    self.on_list(listing.get("items", []), time.time())
                    rv = listing["metadata"]["resourceVersion"]
                    self.relists += listed
                    listed = True
                    self.ready.set()
                for ev in self.client.watch(self.path, rv, timeout_seconds=self.timeout_seconds):
                    t = time.time()
                    if ev["type"] == "ERROR":
                        rv = None  # e.g. 410 Gone: list again
                        break
                    rv = ev["object"]["metadata"].get("resourceVersion", rv)
                    self.on_event(ev["type"], ev["object"], t)
                    if self._stopping.is_set():
                        break
                failures = 0
            except Exception as e:  # noqa: BLE001 - a broken stream: watch again from where it was
                failures += 1
                self.broken += 1
                if failures > 5:
                    self.error = e
                    self.ready.set()
                    return
                time.sleep(1.0)


# --- the controller's side: requests, CPU, memory ---------------------------------------------

class Meter:
    """Readings of one actor's requests (by identity and verb, at the API server) and of its
    processes' memory and CPU; a background thread takes one every ``interval`` seconds."""

    def __init__(self, cluster: Cluster, idents: list[kube.Identity], pids: dict[str, int],
                 interval: float) -> None:
        self.cluster, self.idents, self.pids = cluster, idents, pids
        self.interval = interval
        self.samples: list[dict] = []
        self.t0 = 0.0
        self.base: dict = {"flow": {}}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def reading(self, apiserver: bool = False) -> dict:
        """Now: ``{"t", "flow", "usage": {process: Usage}}`` (+ ``"requests"``, every client's
        requests by verb and resource, with ``apiserver``)."""
        snap = kube.metrics_snapshot(self.cluster.admin)
        out = {"t": time.time(), "flow": snap["flow"],
               "usage": {name: procstat.usage(pid) for name, pid in self.pids.items()}}
        if apiserver:
            out["requests"] = snap["requests"]
        return out

    def by_verb(self, a: dict, b: dict) -> dict[str, dict[str, int]]:
        """{identity: {verb: requests}} between two readings."""
        out = {}
        for ident in self.idents:
            va, vb = kube.requests_by_verb(a["flow"], ident), kube.requests_by_verb(b["flow"], ident)
            out[ident.name] = {v: vb[v] - va[v] for v in vb}
        return out

    def start(self, t0: float, base: dict) -> None:
        """Samples from now on, times from ``t0`` and requests from reading ``base`` (one taken
        just before ``t0``)."""
        self.t0, self.base = t0, base
        self._sample(base)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self, r: dict) -> None:
        usage = [u for u in r["usage"].values() if u is not None]
        self.samples.append({
            "t": round(r["t"] - self.t0, 2),
            "requests": sum(sum(v.values()) for v in self.by_verb(self.base, r).values()),
            "rss_mib": round(sum(u.rss_mib for u in usage), 1) if usage else None,
            "cpu_s": round(sum(u.cpu_s for u in usage), 2) if usage else None,
            "load1": round(os.getloadavg()[0], 2),
        })

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self._sample(self.reading())
            except Exception:  # noqa: BLE001 - a missed sample is not a failed trial
                continue

    def stop(self) -> None:
        """Stops sampling, with one last sample."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            try:
                self._sample(self.reading())
            except Exception:  # noqa: BLE001
                pass


def controller_pids(ctl) -> dict[str, int]:
    """The processes of a controller under test, by name (JobSet: its manager and the Job
    controller, when that runs apart)."""
    if ctl is None:
        return {}
    out = {ctl.name: ctl.proc.pid}
    job_proc = getattr(ctl, "job_proc", None)
    if job_proc is not None:
        out["job-controller"] = job_proc.pid
    return out


def sum_usage(reading: dict, field: str) -> float | None:
    vals = [getattr(u, field) for u in reading["usage"].values() if u is not None]
    return round(sum(vals), 2) if vals else None


def per_process(reading: dict, field: str) -> dict[str, float | None]:
    return {name: (None if u is None else round(getattr(u, field), 2)) for name, u in reading["usage"].items()}


def phase_requests(meter: Meter, a: dict, b: dict) -> dict:
    """Requests between readings ``a`` and ``b``: total, by verb (summed over the actor's
    identities), writes, and by identity."""
    per = meter.by_verb(a, b)
    verbs: Counter[str] = Counter()
    for counts in per.values():
        verbs.update(counts)
    total = sum(verbs.values())
    return {"total": total, "by_verb": {v: verbs[v] for v in verbs if verbs[v]},
            "writes": sum(verbs[v] for v in kube.WRITE_VERBS),
            "by_identity": {name: sum(c.values()) for name, c in per.items()}}


def apiserver_delta(a: dict, b: dict, top: int = 15) -> list[tuple[str, int]]:
    """The busiest (verb resource) entries of apiserver_request_total between two readings."""
    delta = {k: int(v - a["requests"].get(k, 0.0)) for k, v in b["requests"].items()}
    return sorted(((k, v) for k, v in delta.items() if v > 0), key=lambda kv: -kv[1])[:top]
