"""Many jobs at once: 1,000 small jobs (and a mixed load) started together, left idle, deleted.

    python -m benchmarks.many_jobs [--scenarios many mixed fairness]
        [--jobs 1000] [--procs 4] [--mixed-jobs 200] [--mixed-sizes 1 2 4 8 16 32 64 128 256]
        [--actors floor spmdjob pytorchjob jobset] [--idle 600] [--mixed-idle S]
        [--fairness-large 4096] [--fairness-small 4] [--fairness-delay 1]
        [--kubeconfig PATH] [--state-dir DIR] [--scale-json PATH] [--json PATH]
        [--operator-tree DIR] [--operator-flag=--FLAG=VALUE] [--operator-env NAME=VALUE] [--profile DIR]
        [--floor-services]

Where it sits: the command; it starts the cluster and the controllers (``benchmarks.cluster``),
drives the trials, sees them through ``benchmarks.many_jobs_watch`` and prints through
``benchmarks.many_jobs_report``; the floor's client is ``benchmarks.many_jobs_floor``.

Scenarios, each actor in a fresh namespace with a freshly started controller, one after another:

- ``many``: ``--jobs`` jobs of ``--procs`` procs each (1,000 x 4), all submitted at once (32
  threads), as SPMDJobs, PyTorchJobs (training-operator v1.9.3: 1 Master + P-1 Workers) and JobSets
  (v0.12.0: one indexed Job of P pods; its pods come from a Job controller counted with it, see
  ``benchmarks.cluster``); the ``floor`` creates the same pods (``<job>-<rank>``, labelled with
  their job) from a plain 32-thread client (``benchmarks.many_jobs_floor``) and has no job object;
  with ``--floor-services`` it also creates each job's headless Service (selecting rank 0) before
  its pods: the one object per job the env contract needs besides the pods.
- ``mixed``: ``--mixed-jobs`` jobs whose sizes cycle through ``--mixed-sizes`` (200 jobs of
  1, 2, 4 ... 256 procs: 11,245 pods).
- ``fairness``: a ``--fairness-large``-proc job (4,096) is submitted, and ``--fairness-delay``
  seconds later (1 s) a ``--fairness-small``-proc one (4): how long until the small job's pods
  exist and until it is Running, against the same small job submitted alone just before (after a
  first small job, so that "alone" is not also the controller's first job); floor and SPMDJob by
  default (``--fairness-actors``). The kube-scheduler places pods in the order
  they were created (at most 50 bindings/s here), so the small job's Running waits for the large
  job's pods whoever creates them: the floor's row shows that part.

Phases of a ``many``/``mixed`` trial and what is measured (times from just before the first job,
or the floor's first pod, is submitted):

1. Start-up: until every pod exists, every pod is Running (kwok makes a bound pod Running), and
   every job's own status says Running (SPMDJob ``status.phase``, PyTorchJob's ``Running``
   condition, JobSet's Job ready; the floor: its job's last pod Running). Ratios are to the
   floor's all-jobs-Running time. Also the cores each control-plane process (API server, etcd,
   scheduler, kwok, controller-manager: /proc of the processes this benchmark started) and the
   controller used meanwhile, and the API server's requests from every client by verb and
   resource (``startup_apiserver_top``: the controller-manager's and the scheduler's too).
2. Settle (``--settle`` s, 15): the start-up's last status writes land; counted apart.
3. Idle (``--idle`` s, 600): nothing is submitted. Requests the controller makes, **counted by the
   API server**: each controller runs as its own ServiceAccount, whose requests a FlowSchema per
   verb routes (``benchmarks.kube.Identity.count_by_verb``), so
   ``apiserver_flowcontrol_dispatched_requests_total`` of those schemas is the count by verb (the
   operator's own metrics are recorded apart, never used for the count). Also the controller's
   CPU seconds and resident memory, from /proc of its process tree (``benchmarks.procstat``), and
   the API server's ``apiserver_request_total`` by verb and resource over every client (the
   busiest entries: which resources the requests were for).
4. Deletion: every job object is deleted (the floor: every pod), 32 threads, propagation
   Background; until every pod, Service, ConfigMap and batch Job of the namespace and every job
   object is gone. Children are removed by the garbage collector of kube-controller-manager
   (default flags: 20 requests/s) unless the controller deletes them itself.
5. ``--after-delete`` s (30) later, the controller's resident memory, against its memory when it
   was ready (before any job).

The controller's memory and CPU are sampled every ``--sample-seconds`` (10) through the whole
trial, with its request count (``samples`` in the JSON, for plots). Targets (issue 23) are
printed met/missed; the one-large-job target (pods created <= 1.2x the floor at 4,096) is read
from an ``operator_scale`` JSON given with ``--scale-json``. ``--operator-tree`` runs the SPMDJob
operator from another checkout (a ``git worktree`` of an older commit: before and after a change);
``--operator-flag`` and ``--operator-env`` give it one more flag or environment variable each
(repeatable; both are recorded in the JSON's ``operator`` and named in the report's header);
``--profile`` samples it with py-spy through each start-up and idle window
(``python -m benchmarks.profile_summary DIR/*.txt`` aggregates the stacks). JSON goes to
``benchmarks/out/many_jobs.json``; ``python -m benchmarks.report`` prints the tables again.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from benchmarks import kube, procstat
from benchmarks.cluster import KWOK_PODS_PER_NODE, Cluster, SpmdOperator, bench_cluster
from benchmarks.common import PY, REPO, machine, python_env, write_json
from benchmarks.many_jobs_report import render, scale_target, summarize, targets
from benchmarks.many_jobs_watch import (ListWatch, Meter, Tracker, apiserver_delta, controller_pids, per_process,
                                        phase_requests, sum_usage)
from benchmarks.operator_scale import BODIES, CUSTOM, JOBSET_REPLICATED_JOB
from benchmarks.operator_scale import controller_for as _controller_for
from benchmarks.operator_scale import stop_profiler

ACTORS = ("floor", "spmdjob", "pytorchjob", "jobset")
SCENARIOS = ("many", "mixed", "fairness")
CONTROLLERS = ("spmdjob", "pytorchjob", "jobset")
#: The ServiceAccounts whose requests count as each actor's (benchmarks.cluster's identities).
IDENTITIES = {
    "floor": ("floor",),
    "spmdjob": ("spmd-operator",),
    "pytorchjob": ("pytorchjob-operator",),
    "jobset": ("jobset-controller", "job-controller"),
}
#: What else, besides pods, a controller may make for a job (the deletion waits for these too).
CHILD_KINDS = {
    "services": "/api/v1/namespaces/{ns}/services",
    "configmaps": "/api/v1/namespaces/{ns}/configmaps",
    "jobs.batch": "/apis/batch/v1/namespaces/{ns}/jobs",
}
#: Every namespace has this ConfigMap (the API server's CA); it is nobody's child.
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
#: Nor is the SPMDJob operator's payload ConfigMap, which the namespace's jobs share (the operator
#: deletes it once the namespace has had no unfinished job for its grace, 5 minutes).
PAYLOAD_LABEL = "spmd.monarch.dev/payload"
THREADS = 32
MIXED_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


# --- what is submitted ------------------------------------------------------------------------

def many_plan(jobs: int, procs: int) -> list[tuple[str, int]]:
    """``jobs`` jobs of ``procs`` procs: [(name, procs)]."""
    return [(f"job-{i:04d}", procs) for i in range(jobs)]


def mixed_plan(jobs: int, sizes: Iterable[int]) -> list[tuple[str, int]]:
    """``jobs`` jobs whose sizes cycle through ``sizes``."""
    sizes = list(sizes)
    return [(f"mix-{i:03d}", sizes[i % len(sizes)]) for i in range(jobs)]


def job_body(actor: str, namespace: str, name: str, procs: int) -> dict:
    """The job as ``benchmarks.operator_scale`` submits it, named ``name``."""
    body = BODIES[actor](namespace, procs)
    body["metadata"]["name"] = name
    if actor == "jobset":  # MASTER_ADDR names the index-0 pod through the JobSet's name
        for rj in body["spec"]["replicatedJobs"]:
            for c in rj["template"]["spec"]["template"]["spec"]["containers"]:
                for e in c.get("env", []):
                    if e["name"] == "MASTER_ADDR":
                        e["value"] = f"{name}-{JOBSET_REPLICATED_JOB}-0-0.{name}"
    return body


def job_collection(actor: str, namespace: str) -> str:
    g, v, p = CUSTOM[actor]
    return f"/apis/{g}/{v}/namespaces/{namespace}/{p}"


# --- which operator -------------------------------------------------------------------------

#: Where ``python -m spmd_operator`` is imported from (``--operator-tree``); None: this checkout.
OPERATOR_TREE: Path | None = None
#: More flags for the SPMDJob operator (``--operator-flag``), e.g. ``--concurrency=16``.
OPERATOR_FLAGS: tuple[str, ...] = ()
#: More environment for the SPMDJob operator (``--operator-env``), e.g. ``MALLOC_ARENA_MAX=2``.
OPERATOR_ENV: tuple[tuple[str, str], ...] = ()


class TreeOperator(SpmdOperator):
    """The SPMDJob operator imported from another checkout (e.g. a ``git worktree`` of an older
    commit, to measure before and after a change with the same benchmark)."""

    def __init__(self, cluster: Cluster, log_dir: Path, tree: Path) -> None:
        super().__init__(cluster, log_dir)
        self.tree = tree

    def command(self):
        cmd, env = super().command()
        env["PYTHONPATH"] = os.pathsep.join([str(self.tree / "operator"), str(self.tree), env.get("PYTHONPATH", "")])
        return cmd, env


def controller_for(actor: str, cluster: Cluster, log_dir: Path):
    if actor == "spmdjob" and OPERATOR_TREE is not None:
        ctl = TreeOperator(cluster, log_dir, OPERATOR_TREE)
    else:
        ctl = _controller_for(actor, cluster, log_dir)
    if isinstance(ctl, SpmdOperator):
        ctl.extra_flags = OPERATOR_FLAGS
        ctl.extra_env = OPERATOR_ENV
    return ctl


def operator_source(tree: Path | None) -> dict:
    """The checkout the operator ran from: its path, commit and whether ``operator/`` (or
    ``monarch_spmd/``, which it imports) had uncommitted changes when the run began."""
    root = tree or REPO

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30,
                                  check=True).stdout.strip()
        except Exception:  # noqa: BLE001 - not a git checkout
            return None

    status = git("status", "--porcelain", "--", "operator", "monarch_spmd")
    return {"path": str(root), "commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted_changes": None if status is None else bool(status),
            "changed_files": None if not status else [line[3:] for line in status.splitlines()]}


# --- driving a trial --------------------------------------------------------------------------

def submit_all(fn: Callable[[object], None], items: list) -> list[str]:
    """Runs ``fn`` on every item from THREADS threads; returns the errors (at most 10)."""
    errors: list[str] = []

    def one(item) -> None:
        try:
            fn(item)
        except Exception as e:  # noqa: BLE001 - reported
            errors.append(f"{item}: {e}")

    with cf.ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, items))
    return errors[:10]


class FloorClient:
    """A ``benchmarks.many_jobs_floor`` process, loaded and waiting for its start signal."""

    def __init__(self, cluster: Cluster, namespace: str, plan: list[tuple[str, int]], folder: Path, *,
                 services: bool = False) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        plan_file = folder / f"floor-plan-{secrets.token_hex(3)}.json"
        plan_file.write_text(json.dumps(plan))
        ident = cluster.identity("floor")
        self.proc = subprocess.Popen(
            [PY, "-m", "benchmarks.many_jobs_floor", "--kubeconfig", str(ident.kubeconfig),
             "--namespace", namespace, "--plan", str(plan_file), "--threads", str(THREADS),
             *(["--services"] if services else [])],
            cwd=REPO, env=python_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the floor client did not start (exit {self.proc.wait()})")

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict:
        out, _ = self.proc.communicate(timeout=timeout)
        res = json.loads(out.strip().splitlines()[-1])
        if res["errors"]:
            raise RuntimeError(f"floor client: {res['errors']}")
        return res

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def submit_jobs(cluster: Cluster, actor: str, namespace: str, plan: list[tuple[str, int]]) -> list[str]:
    path = job_collection(actor, namespace)
    bodies = [job_body(actor, namespace, name, procs) for name, procs in plan]
    return submit_all(lambda body: cluster.admin.create(path, body), bodies)


def children_left(admin: kube.Kube, namespace: str) -> dict[str, bool]:
    """{kind: whether any is left} for the non-pod children of a namespace (one small LIST each)."""
    out = {}
    for kind, path in CHILD_KINDS.items():
        query = {"limit": "2"}
        if kind == "configmaps":
            query["fieldSelector"] = f"metadata.name!={ROOT_CA_CONFIGMAP}"
            query["labelSelector"] = f"!{PAYLOAD_LABEL}"
        try:
            items = admin.get(path.format(ns=namespace), query=query).get("items", [])
        except kube.ApiError as e:
            if e.status == 404:  # e.g. no batch API: nothing of that kind
                items = []
            else:
                raise
        out[kind] = bool(items)
    return out


#: The operator's own gauges recorded (never counted as requests): what it holds in memory.
HELD_GAUGES = ("spmdjob_jobs", "spmdjob_cache_entries", "spmdjob_memory_recycles")


def operator_holds(ctl) -> dict[str, float]:
    """The SPMDJob operator's gauges of what it holds (jobs by phase, informer entries), from its
    /metrics; {} for another controller or an operator without them."""
    port = getattr(ctl, "metrics_port", None)
    if not port:
        return {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith(HELD_GAUGES):
            key, _, value = line.rpartition(" ")
            if float(value):
                out[key] = float(value)
    return out


def start_profile(pid: int, out: Path):
    """py-spy sampling a process (non-blocking: it is never paused), raw stacks to ``out``; for
    ``benchmarks.operator_scale.stop_profiler``."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(pyspy).exists():
        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([pyspy, "record", "--pid", str(pid), "--format", "raw", "--rate", "100",
                             "--nonblocking", "--output", str(out)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # attached before what it should see begins
    return proc, out


def plane_cpu(cluster: Cluster) -> dict:
    """Now, and the CPU seconds each control-plane process has used so far."""
    return {"t": time.time(), "cpu_s": {name: procstat.cpu_seconds(pid) for name, pid in cluster.plane_pids().items()}}


def startup_cores(plane_a: dict, plane_b: dict, a: dict, b: dict) -> dict[str, float]:
    """Cores each control-plane process and the controller used between two readings (the
    start-up): CPU seconds over wall seconds. On a machine of few cores this shows who had them
    while the jobs started (the API server, and what was left to the scheduler and kwok)."""
    seconds = max(1e-9, plane_b["t"] - plane_a["t"])
    out = {name: round((plane_b["cpu_s"][name] - used) / seconds, 3)
           for name, used in plane_a["cpu_s"].items()
           if used is not None and plane_b["cpu_s"].get(name) is not None}
    before, after = sum_usage(a, "cpu_s"), sum_usage(b, "cpu_s")
    if before is not None and after is not None:
        out["controller"] = round((after - before) / max(1e-9, b["t"] - a["t"]), 3)
    return out


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


class Trial:
    """One actor's namespace, controller, watches and meter (a context manager)."""

    def __init__(self, cluster: Cluster, actor: str, scenario: str, sizes: dict[str, int],
                 log_dir: Path, sample_seconds: float) -> None:
        self.cluster, self.actor, self.scenario = cluster, actor, scenario
        self.ns = f"mj-{scenario}-{actor}-{secrets.token_hex(3)}"
        self.log_dir = log_dir / self.ns
        self.tracker = Tracker(actor, sizes)
        self.sample_seconds = sample_seconds
        self.ctl = None
        self.watches: list[ListWatch] = []
        self.meter: Meter | None = None
        self.floors: list[FloorClient] = []

    def __enter__(self) -> Trial:
        self.cluster.admin.create("/api/v1/namespaces", {"metadata": {"name": self.ns}})
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        admin = self.cluster.admin
        self.ctl = controller_for(self.actor, self.cluster, self.log_dir)
        if self.ctl is not None:
            self.ctl.start()
        idents = self.ctl.identities() if self.ctl else [self.cluster.identity("floor")]
        self.meter = Meter(self.cluster, idents, controller_pids(self.ctl), self.sample_seconds)
        t = self.tracker
        self.watches.append(ListWatch(admin, f"/api/v1/namespaces/{self.ns}/pods", t.pods_listed, t.pod_event))
        if self.actor in CUSTOM:
            self.watches.append(ListWatch(admin, job_collection(self.actor, self.ns), t.jobs_listed, t.job_event))
        for w in self.watches:
            w.start()
        for w in self.watches:
            w.ready.wait(60)
            if w.error:
                raise w.error

    def floor(self, plan: list[tuple[str, int]], *, services: bool = False) -> FloorClient:
        client = FloorClient(self.cluster, self.ns, plan, self.log_dir, services=services)
        self.floors.append(client)
        return client

    def submit(self, plan: list[tuple[str, int]]) -> list[str]:
        return submit_jobs(self.cluster, self.actor, self.ns, plan)

    def watch_trouble(self) -> dict[str, int]:
        """How often the benchmark's own watches had to list again (times seen then are late)."""
        return {"relists": sum(w.relists for w in self.watches), "broken": sum(w.broken for w in self.watches)}

    def check(self) -> None:
        if self.ctl is not None:
            self.ctl.check_alive()
        for w in self.watches:
            if w.error:
                raise RuntimeError(f"the benchmark's watch of {w.path} failed: {w.error}")

    def __exit__(self, *exc: object) -> None:
        if self.meter is not None:
            self.meter.stop()
        for f in self.floors:
            f.kill()
        for w in self.watches:
            w.stop()
        try:
            # Delete while the controller still runs (it may hold finalizers), then stop it.
            kube.delete_namespace(self.cluster.admin, self.ns, timeout=900.0, strip=tuple(CUSTOM.values()))
        finally:
            if self.ctl is not None:
                self.ctl.stop()


def load_trial(cluster: Cluster, actor: str, scenario: str, plan: list[tuple[str, int]], *, idle: float,
               settle: float, after_delete: float, timeout: float, sample_seconds: float, log_dir: Path,
               profile_dir: Path | None = None, floor_services: bool = False) -> dict:
    """One actor under one load: start-up, settle, idle, deletion (see the module docstring).
    With ``floor_services`` the floor creates a headless Service per job too (``--floor-services``).
    With ``profile_dir``, the SPMDJob operator is sampled by py-spy through the start-up and
    through the idle window (one raw-stacks file each)."""
    sizes = dict(plan)
    total = sum(sizes.values())
    jobs = len(plan)
    rec: dict = {"scenario": scenario, "actor": actor, "jobs": jobs, "pods": total, "ok": False,
                 "idle_s": idle if actor != "floor" else None,
                 "floor_services": floor_services if actor == "floor" else None}
    try:
        with Trial(cluster, actor, scenario, sizes, log_dir, sample_seconds) as tr:
            rec["namespace"] = tr.ns
            trk, meter, admin = tr.tracker, tr.meter, cluster.admin
            if tr.ctl is not None:
                rec["controller_ready_s"] = tr.ctl.ready_s
            floor = tr.floor(plan, services=floor_services) if actor == "floor" else None
            ready = meter.reading(apiserver=True)
            plane_ready = plane_cpu(cluster)
            profiling = profile_dir is not None and actor == "spmdjob"
            if profiling:
                profiler = start_profile(tr.ctl.proc.pid, profile_dir / f"{scenario}-spmdjob-start.txt")

            # 1. start-up
            t0 = time.time()
            deadline = time.monotonic() + timeout
            meter.start(t0, ready)
            if floor is not None:
                floor.go()
            else:
                errors = tr.submit(plan)
                if errors:
                    raise RuntimeError(f"submitting the jobs: {errors}")
            rec["submit_s"] = time.time() - t0
            ok_created = trk.wait(lambda: len(trk.pod_seen) >= total, deadline, tr.check)
            ok_running = ok_created and trk.wait(lambda: len(trk.pod_running) >= total, deadline, tr.check)
            ok_jobs = ok_running and trk.wait(lambda: trk.jobs_running() >= jobs, deadline, tr.check)
            tr.check()
            if floor is not None:
                res = floor.result(timeout=max(10.0, deadline - time.monotonic()))
                rec["submit_s"], rec["floor_client_rss_mib"] = res["submit_s"], res["peak_rss_mib"]
            running = meter.reading(apiserver=True)
            rec["startup_apiserver_top"] = apiserver_delta(ready, running, top=25)
            rec["startup_cores"] = startup_cores(plane_ready, plane_cpu(cluster), ready, running)
            if profiling:
                rec.setdefault("profiles", {})["start"] = stop_profiler(profiler)
            with trk.cond:
                rec["pods_seen"], rec["pods_running"] = len(trk.pod_seen), len(trk.pod_running)
                rec["jobs_running"] = sum(1 for j in sizes if trk.running_at(j) is not None)
                if ok_created:
                    rec["created_s"] = max(trk.pod_seen.values()) - t0
                if ok_running:
                    rec["pods_running_s"] = max(trk.pod_running.values()) - t0
                times = sorted(trk.running_at(j) - t0 for j in sizes if trk.running_at(j) is not None)
            rec["job_running_times"] = [round(x, 3) for x in times]
            if ok_jobs:
                rec["jobs_running_s"] = times[-1]
                rec["job_running_p50_s"], rec["job_running_p90_s"] = percentile(times, 0.5), percentile(times, 0.9)
            if not ok_jobs:
                with trk.cond:
                    stuck = [j for j in sizes if trk.running_at(j) is None][:3]
                    raise TimeoutError(
                        f"after {timeout:.0f}s: {rec['pods_seen']}/{total} pods seen, {rec['pods_running']}/{total} "
                        f"Running, {rec['jobs_running']}/{jobs} jobs Running; e.g. {stuck}: "
                        f"{[trk.job_status.get(j) for j in stuck]}")
            rec["requests"] = {"start": phase_requests(meter, ready, running)}

            # 2.-3. settle, then idle (controllers only: the floor has nothing left to do)
            if tr.ctl is not None:
                time.sleep(settle)
                idle_start = meter.reading(apiserver=True)
                events_before = trk.events
                own_before = tr.ctl.scrape() if hasattr(tr.ctl, "scrape") else {}
                idle_left = idle
                if profiling:
                    profiler = start_profile(tr.ctl.proc.pid, profile_dir / f"{scenario}-spmdjob-idle.txt")
                    idle_left = max(0.0, idle - 1.0)  # the profiler's start took a second of it
                trk.wait(lambda: False, time.monotonic() + idle_left, tr.check)  # the idle time, watching the controller
                tr.check()
                idle_end = meter.reading(apiserver=True)
                rec["operator_holds"] = {"idle": operator_holds(tr.ctl)}
                if profiling:
                    rec["profiles"]["idle"] = stop_profiler(profiler)
                rec["requests"]["settle"] = phase_requests(meter, running, idle_start)
                reqs = phase_requests(meter, idle_start, idle_end)
                rec["requests"]["idle"] = reqs
                seconds = idle_end["t"] - idle_start["t"]
                cpu = sum_usage(idle_end, "cpu_s") - sum_usage(idle_start, "cpu_s")
                rec["idle"] = {
                    "seconds": seconds,
                    "requests": reqs["total"], "writes": reqs["writes"],
                    "per_job_per_10min": reqs["total"] / jobs * 600.0 / seconds,
                    "cpu_s": cpu, "cpu_percent": 100.0 * cpu / seconds,
                    "watch_events": trk.events - events_before,
                    "apiserver_top": apiserver_delta(idle_start, idle_end),
                }
                if own_before:
                    own = tr.ctl.scrape()
                    rec["idle"]["operator_metrics"] = {k: v - own_before.get(k, 0.0) for k, v in own.items()
                                                       if v - own_before.get(k, 0.0)}
            else:
                idle_start = idle_end = running

            # 4. deletion
            del_start = meter.reading()
            td = time.time()
            deadline = time.monotonic() + timeout
            if actor == "floor":
                names = [f"pods/{job}-{rank}" for job, procs in plan for rank in range(procs)]
                if floor_services:
                    names += [f"services/{job}" for job, _ in plan]
                errors = submit_all(lambda n: admin.delete(f"/api/v1/namespaces/{tr.ns}/{n}",
                                                           {"propagationPolicy": "Background"}), names)
            else:
                path = job_collection(actor, tr.ns)
                errors = submit_all(lambda n: admin.delete(f"{path}/{n}", {"propagationPolicy": "Background"}),
                                    list(sizes))
            if errors:
                raise RuntimeError(f"deleting: {errors}")
            rec["delete"] = {"submit_s": time.time() - td}
            kinds_gone: dict[str, float] = {}
            while time.monotonic() < deadline:
                tr.check()
                left = children_left(admin, tr.ns)
                now = time.time()
                for kind, any_left in left.items():
                    if any_left:
                        kinds_gone.pop(kind, None)
                    else:
                        kinds_gone.setdefault(kind, now)
                with trk.cond:
                    pods_gone, jobs_gone = not trk.pods_live, not trk.jobs_live
                if pods_gone and jobs_gone and len(kinds_gone) == len(CHILD_KINDS):
                    break
                time.sleep(0.5)
            else:
                raise TimeoutError(f"deletion: after {timeout:.0f}s {len(trk.pods_live)} pods, {len(trk.jobs_live)} jobs "
                                   f"left; other kinds gone: {sorted(kinds_gone)}")
            gone = meter.reading()
            d = rec["delete"]
            d["pods_gone_s"] = (trk.last_pod_gone or td) - td
            if actor != "floor":
                d["jobs_gone_s"] = (trk.last_job_gone or td) - td
            for kind, t in kinds_gone.items():
                d[f"{kind}_gone_s"] = max(0.0, t - td)
            d["children_gone_s"] = max(v for k, v in d.items() if k.endswith("_gone_s"))
            rec["requests"]["delete"] = phase_requests(meter, del_start, gone)

            # 5. memory after the deletion
            if tr.ctl is not None:
                time.sleep(after_delete)
                tr.check()
                after = meter.reading()
                rec.setdefault("operator_holds", {})["after_delete"] = operator_holds(tr.ctl)
                # The peak is the highest read in any phase: VmHWM starts again when the operator
                # starts afresh (exec, --memory-recycle-factor), and the kernel updates it lazily
                # (a peak given back by malloc_trim can be missing from it: 103 MiB after an
                # idle RSS of 138 in one run).
                readings = (running, idle_end, gone, after)
                rec["rss_mib"] = {"start": sum_usage(ready, "rss_mib"), "running": sum_usage(running, "rss_mib"),
                                  "idle_end": sum_usage(idle_end, "rss_mib"), "deleted": sum_usage(gone, "rss_mib"),
                                  "after_delete": sum_usage(after, "rss_mib"),
                                  "peak": max(max(sum_usage(r, "hwm_mib"), sum_usage(r, "rss_mib")) for r in readings)}
                rec["recycles"] = rec["operator_holds"]["after_delete"].get("spmdjob_memory_recycles", 0)
                rec["rss_after_vs_start"] = rec["rss_mib"]["after_delete"] / rec["rss_mib"]["start"]
                rec["cpu_s"] = {"start": sum_usage(running, "cpu_s") - sum_usage(ready, "cpu_s"),
                                "delete": sum_usage(gone, "cpu_s") - sum_usage(del_start, "cpu_s")}
                rec["processes"] = {name: {"rss_start_mib": per_process(ready, "rss_mib")[name],
                                           "rss_idle_mib": per_process(idle_end, "rss_mib")[name],
                                           "rss_after_delete_mib": per_process(after, "rss_mib")[name],
                                           "peak_mib": max(max(per_process(r, key)[name] for key in ("hwm_mib", "rss_mib"))
                                                           for r in readings),
                                           "idle_cpu_s": round(per_process(idle_end, "cpu_s")[name]
                                                               - per_process(idle_start, "cpu_s")[name], 2)}
                                    for name in meter.pids}
                rec["job_controller_counted"] = ("job-controller" in meter.pids) if actor == "jobset" else None
            meter.stop()
            rec["samples"] = meter.samples
            rec["watch"] = tr.watch_trouble()
            rec["ok"] = True
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc()[-3000:]
    return rec


def fairness_trial(cluster: Cluster, actor: str, large: int, small: int, delay: float, *, timeout: float,
                   sample_seconds: float, log_dir: Path) -> dict:
    """A ``small``-proc job alone (after a first, warm-up one), then a ``large``-proc job and
    ``delay`` s later the same small job."""
    sizes = {"warm-up": small, "small-alone": small, "large": large, "small": small}
    rec: dict = {"scenario": "fairness", "actor": actor, "large_procs": large, "small_procs": small, "delay_s": delay,
                 "ok": False}
    try:
        with Trial(cluster, actor, "fair", sizes, log_dir, sample_seconds) as tr:
            rec["namespace"] = tr.ns
            trk = tr.tracker
            floors = {name: tr.floor([(name, sizes[name])]) for name in sizes} if actor == "floor" else {}

            def submit(name: str) -> float:
                t = time.time()
                if floors:
                    floors[name].go()
                else:
                    errors = tr.submit([(name, sizes[name])])
                    if errors:
                        raise RuntimeError(f"submitting {name}: {errors}")
                return t

            def done(name: str) -> Callable[[], bool]:
                return lambda: name in trk.job_pods_seen and trk.running_at(name) is not None

            deadline = time.monotonic() + timeout
            # A first job, so "alone" is not also the controller's first job (connections, caches).
            submit("warm-up")
            if not trk.wait(done("warm-up"), deadline, tr.check):
                raise TimeoutError("the warm-up job did not run")
            t_alone = submit("small-alone")
            if not trk.wait(done("small-alone"), deadline, tr.check):
                raise TimeoutError("the small job alone did not run")
            t_large = submit("large")
            time.sleep(max(0.0, t_large + delay - time.time()))
            t_small = submit("small")
            ok = trk.wait(done("small"), deadline, tr.check) and trk.wait(done("large"), deadline, tr.check)
            tr.check()
            for f in floors.values():
                f.result(timeout=max(10.0, deadline - time.monotonic()))
            def since(t: float | None, t0: float) -> float | None:
                return None if t is None else t - t0

            with trk.cond:
                for job, t0 in (("small-alone", t_alone), ("small", t_small), ("large", t_large)):
                    rec[job.replace("-", "_")] = {
                        "first_pod_s": since(trk.job_first_seen.get(job), t0),
                        "created_s": since(trk.job_pods_seen.get(job), t0),
                        "pods_running_s": since(trk.job_pods_running.get(job), t0),
                        "running_s": since(trk.running_at(job), t0),
                    }
                rec["submitted_apart_s"] = t_small - t_large
            a, s = rec["small_alone"], rec["small"]
            if ok:
                rec["created_delay_s"] = s["created_s"] - a["created_s"]
                rec["running_delay_s"] = s["running_s"] - a["running_s"]
            else:
                raise TimeoutError(f"after {timeout:.0f}s: small {s}, large {rec['large']}")
            rec["watch"] = tr.watch_trouble()
            rec["ok"] = True
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc()[-3000:]
    return rec


# --- the command ------------------------------------------------------------------------------

def prepare_identities(cluster: Cluster, actors: list[str], timeout: float = 60.0) -> None:
    """Every actor's ServiceAccounts with their per-verb FlowSchemas, in effect before any trial
    (the API server reports a FlowSchema it applied as not ``Dangling``)."""
    names = [n for a in actors for n in IDENTITIES[a] if n != "job-controller" or cluster.control_plane is not None]
    idents = [cluster.identity(n) for n in names]
    for ident in idents:
        ident.count_by_verb(cluster.admin)
    schemas = [i.verb_schema(v) for i in idents for v in (*kube.VERBS, kube.NON_RESOURCE)]
    deadline = time.monotonic() + timeout
    for name in schemas:
        while True:
            fs = cluster.admin.get(f"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/{name}")
            conds = {c["type"]: c["status"] for c in (fs.get("status") or {}).get("conditions") or []}
            if conds.get("Dangling") == "False":
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"FlowSchema {name} not in effect after {timeout:.0f}s")
            time.sleep(0.2)
    time.sleep(1.0)  # the dispatcher's copy of the configuration follows the status write


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    ap.add_argument("--actors", nargs="+", choices=ACTORS, default=list(ACTORS),
                    help="actors of the many and mixed loads (the floor is always one)")
    ap.add_argument("--jobs", type=int, default=1000, help="jobs of the 'many' load")
    ap.add_argument("--procs", type=int, default=4, help="procs per job of the 'many' load")
    ap.add_argument("--mixed-jobs", type=int, default=200)
    ap.add_argument("--mixed-sizes", type=int, nargs="+", default=list(MIXED_SIZES))
    ap.add_argument("--idle", type=float, default=600.0, help="seconds idle with every job Running")
    ap.add_argument("--mixed-idle", type=float, default=None, help="idle seconds of the mixed load (default --idle)")
    ap.add_argument("--settle", type=float, default=15.0, help="seconds between all jobs Running and the idle window")
    ap.add_argument("--after-delete", type=float, default=30.0,
                    help="seconds after every child is gone before the memory reading")
    ap.add_argument("--floor-services", action="store_true",
                    help="the floor of the many and mixed loads also creates a headless Service per job (selecting "
                         "its rank 0), as the env contract needs and the operator creates: what that object costs")
    ap.add_argument("--fairness-actors", nargs="+", choices=ACTORS, default=["floor", "spmdjob"])
    ap.add_argument("--fairness-large", type=int, default=4096)
    ap.add_argument("--fairness-small", type=int, default=4)
    ap.add_argument("--fairness-delay", type=float, default=1.0)
    ap.add_argument("--sample-seconds", type=float, default=10.0)
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per phase (start-up, deletion)")
    ap.add_argument("--kubeconfig", help="use this cluster (with kwok nodes) instead of starting one")
    ap.add_argument("--kwok-nodes", type=int, default=None,
                    help=f"kwok nodes of {KWOK_PODS_PER_NODE} pods (default: room for the largest load, at least 4)")
    ap.add_argument("--state-dir", help="where the cluster and controller logs go (default: a temp dir)")
    ap.add_argument("--profile", metavar="DIR",
                    help="sample the SPMDJob operator with py-spy through each load's start-up and idle window")
    ap.add_argument("--operator-tree", metavar="DIR",
                    help="run the SPMDJob operator from this checkout (e.g. a git worktree of another commit)")
    ap.add_argument("--operator-flag", action="append", default=[], metavar="FLAG",
                    help="one more flag for the SPMDJob operator, e.g. --operator-flag=--concurrency=16 (repeatable)")
    ap.add_argument("--operator-env", action="append", default=[], metavar="NAME=VALUE",
                    help="one more environment variable for the SPMDJob operator's process (repeatable)")
    ap.add_argument("--scale-json", help="an operator_scale JSON whose largest SPMDJob row fills the one-large-job target")
    ap.add_argument("--json", help="output path (default benchmarks/out/many_jobs.json)")
    args = ap.parse_args(argv)
    if "floor" not in args.actors:
        args.actors.insert(0, "floor")
    if args.mixed_idle is None:
        args.mixed_idle = args.idle
    for flag in ("jobs", "procs", "mixed_jobs", "fairness_large", "fairness_small"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be at least 1")
    if min(args.mixed_sizes) < 1:
        ap.error("--mixed-sizes must all be at least 1")
    global OPERATOR_TREE
    if args.operator_tree:
        OPERATOR_TREE = Path(args.operator_tree).resolve()
        if not (OPERATOR_TREE / "operator" / "spmd_operator" / "__main__.py").exists():
            ap.error(f"--operator-tree: {OPERATOR_TREE} has no operator/spmd_operator/__main__.py")
    source = operator_source(OPERATOR_TREE)
    global OPERATOR_FLAGS
    for flag in args.operator_flag:
        if not flag.startswith("--"):
            ap.error(f"--operator-flag: {flag!r} is not a flag (write it as --operator-flag=--name=value)")
    OPERATOR_FLAGS = tuple(args.operator_flag)
    source["flags"] = list(OPERATOR_FLAGS)
    global OPERATOR_ENV
    env = []
    for item in args.operator_env:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier():
            ap.error(f"--operator-env: {item!r} is not NAME=VALUE (e.g. --operator-env MALLOC_ARENA_MAX=2)")
        env.append((name, value))
    OPERATOR_ENV = tuple(env)
    source["env"] = dict(OPERATOR_ENV)

    plans = {"many": many_plan(args.jobs, args.procs), "mixed": mixed_plan(args.mixed_jobs, args.mixed_sizes)}
    largest = max([sum(dict(plans[s]).values()) for s in plans if s in args.scenarios]
                  + ([args.fairness_large + 2 * args.fairness_small] if "fairness" in args.scenarios else []))
    if args.kwok_nodes is None:
        args.kwok_nodes = max(4, -(-largest // KWOK_PODS_PER_NODE) + 1)
    runs: list[dict] = []
    fairness: list[dict] = []
    t_start = time.monotonic()
    with bench_cluster(args.kubeconfig, args.kwok_nodes, args.state_dir) as cluster:
        print(f"  cluster ready ({cluster.kubeconfig}); state in {cluster.state_dir}", file=sys.stderr, flush=True)
        prepare_identities(cluster, sorted(set(args.actors) | set(args.fairness_actors)))
        log_dir = cluster.state_dir / "logs"
        for k, scenario in enumerate(s for s in ("many", "mixed") if s in args.scenarios):
            order = args.actors[k % len(args.actors):] + args.actors[:k % len(args.actors)]
            for actor in order:
                rec = load_trial(cluster, actor, scenario, plans[scenario],
                                 idle=args.idle if scenario == "many" else args.mixed_idle, settle=args.settle,
                                 after_delete=args.after_delete, timeout=args.timeout,
                                 sample_seconds=args.sample_seconds, log_dir=log_dir,
                                 profile_dir=Path(args.profile) if args.profile else None,
                                 floor_services=args.floor_services)
                runs.append(rec)
                # Each trial's record is kept as it ends: a run stopped later still has it.
                kept = log_dir / f"{scenario}-{actor}.json"
                kept.write_text(json.dumps(rec, indent=1, default=str))
                idle = (rec.get("requests") or {}).get("idle") or {}
                brief = (f"jobs Running {rec.get('jobs_running_s', 0):.1f}s, idle {idle.get('total')} "
                         f"requests {idle.get('by_verb')}, gone {(rec.get('delete') or {}).get('children_gone_s', 0):.1f}s"
                         if rec["ok"] else f"FAILED: {rec.get('error')}")
                print(f"  {scenario} {actor}: {brief} ({kept})", file=sys.stderr, flush=True)
        if "fairness" in args.scenarios:
            for actor in args.fairness_actors:
                rec = fairness_trial(cluster, actor, args.fairness_large, args.fairness_small, args.fairness_delay,
                                     timeout=args.timeout, sample_seconds=args.sample_seconds, log_dir=log_dir)
                fairness.append(rec)
                brief = (f"small job created {rec['created_delay_s']:+.2f}s, Running {rec['running_delay_s']:+.2f}s "
                         "against alone" if rec["ok"] else f"FAILED: {rec.get('error')}")
                print(f"  fairness {actor}: {brief}", file=sys.stderr, flush=True)
        state = str(cluster.state_dir)

    result = {
        "benchmark": "many_jobs",
        "command": " ".join(["python", "-m", "benchmarks.many_jobs", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "operator": source,
        "params": {"scenarios": args.scenarios, "actors": args.actors, "jobs": args.jobs, "procs": args.procs,
                   "mixed_jobs": args.mixed_jobs, "mixed_sizes": args.mixed_sizes, "idle_s": args.idle,
                   "mixed_idle_s": args.mixed_idle, "settle_s": args.settle, "after_delete_s": args.after_delete,
                   "fairness_actors": args.fairness_actors, "fairness_large": args.fairness_large,
                   "fairness_small": args.fairness_small, "fairness_delay_s": args.fairness_delay,
                   "kwok_nodes": args.kwok_nodes, "kwok_pods_per_node": KWOK_PODS_PER_NODE, "threads": THREADS,
                   "pytorchjob_version": "v1.9.3", "jobset_version": "v0.12.0"},
        "elapsed_s": time.monotonic() - t_start,
        "state_dir": state,
        "results": summarize(runs),
        "fairness": fairness,
        "scale": scale_target(args.scale_json) if args.scale_json else None,
        "runs": runs,
    }
    result["targets"] = targets(result)
    path = write_json("many_jobs", result, args.json)
    print(render(result))
    print(f"\nJSON: {path}")
    return 0 if all(r["ok"] for r in runs + fairness) else 1


if __name__ == "__main__":
    raise SystemExit(main())
