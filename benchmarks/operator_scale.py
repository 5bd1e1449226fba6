"""Operator scale: an N-proc job on kwok nodes, SPMDJob against Kubeflow's PyTorchJob and the floor.

    python -m benchmarks.operator_scale [--sizes 1024 4096]
        [--actors floor spmdjob pytorchjob jobset] [--kubeconfig PATH] [--trial-timeout 1800]

For each N, in one run on one cluster, interleaved (the order of actors rotates with N):

- ``floor``: the same N pods created directly by a parallel client (32 threads, no operator);
- ``spmdjob``: an SPMDJob with a one-dimensional mesh of N procs, this project's operator;
- ``pytorchjob``: a PyTorchJob with 1 Master and N-1 Workers, Kubeflow training-operator v1.9.3;
- ``jobset``: a JobSet (v0.12.0) as its users write one for torch: one replicated Job of N pods
  (parallelism = completions = N, Indexed), a headless Service (``network.enableDNSHostnames``),
  MASTER_ADDR the index-0 pod's hostname. Its pods are made by the Job controller, which counts as
  part of this actor (see ``benchmarks.cluster.JobSetOperator``); its job Running is the
  JobSet's ``replicatedJobsStatus[].ready`` reaching 1 (the Job has N ready pods).

Each trial runs in a fresh namespace with a freshly started controller. Measured, from the moment
just before the job (or the first floor pod) is submitted: seconds until all N pods exist, until all
N pods are Running (kwok makes a bound pod Running), and until the job's own status says Running
(SPMDJob ``status.phase``; PyTorchJob condition ``Running``; JobSet: its Job ready); the number of API requests the
controller made for the job, counted at the API server (APF's dispatched-requests counter for the
controller's own FlowSchema, from submission until its requests stop for 2 s); the controller's
peak resident memory (VmHWM). Ratios are to the floor (for the job-status phase, to the floor's
all-Running time). JSON goes to ``benchmarks/out/operator_scale.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

from benchmarks import kube
from benchmarks.cluster import (KWOK_PODS_PER_NODE, Cluster, JobSetOperator, PyTorchJobOperator,
                                SpmdOperator, bench_cluster, pod_placement)
from benchmarks.common import PY, REPO, machine, machine_line, python_env, table, write_json

ACTORS = ("floor", "spmdjob", "pytorchjob", "jobset")
IMAGE = "python:3.11-slim"  # never pulled: kwok runs no containers
JOB = "scale"
FLOOR_THREADS = 32
CUSTOM = {
    "spmdjob": ("spmd.monarch.dev", "v1alpha1", "spmdjobs"),
    "pytorchjob": ("kubeflow.org", "v1", "pytorchjobs"),
    "jobset": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
}
POD_SELECTOR = {
    "spmdjob": f"spmd.monarch.dev/job={JOB}",
    "pytorchjob": f"training.kubeflow.org/job-name={JOB}",
    "floor": f"spmd-bench/job={JOB}",
    "jobset": f"jobset.sigs.k8s.io/jobset-name={JOB}",
}
JOBSET_REPLICATED_JOB = "workers"


def spmdjob(ns: str, n: int, max_restarts: int = 3) -> dict:
    return {
        "apiVersion": "spmd.monarch.dev/v1alpha1",
        "kind": "SPMDJob",
        "metadata": {"name": JOB, "namespace": ns},
        "spec": {
            "mesh": [{"name": "procs", "size": n}],
            "args": ["-m", "benchmarks.first_allreduce", "--out", "/tmp/out"],
            "image": IMAGE,
            "restartPolicy": {"maxRestarts": max_restarts},
            "template": {"spec": pod_placement()},
        },
    }


def pytorchjob(ns: str, n: int) -> dict:
    def replica(count: int) -> dict:
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {
                "containers": [{"name": "pytorch", "image": IMAGE,
                                "command": ["python", "-m", "benchmarks.first_allreduce", "--out", "/tmp/out"]}],
                **pod_placement(),
            }},
        }

    specs = {"Master": replica(1)}
    if n > 1:
        specs["Worker"] = replica(n - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": JOB, "namespace": ns},
        "spec": {"pytorchReplicaSpecs": specs},
    }


def jobset(ns: str, n: int) -> dict:
    """One replicated Job of N indexed pods behind a headless Service, as JobSet's torch examples
    write it (rank from the completion index, MASTER_ADDR the index-0 pod's DNS name)."""
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": JOB, "namespace": ns},
        "spec": {
            "network": {"enableDNSHostnames": True},
            "failurePolicy": {"maxRestarts": 3},
            "replicatedJobs": [{
                "name": JOBSET_REPLICATED_JOB,
                "replicas": 1,
                "template": {"spec": {
                    "parallelism": n,
                    "completions": n,
                    "completionMode": "Indexed",
                    "backoffLimit": 0,
                    "template": {"spec": {
                        "restartPolicy": "Never",
                        "containers": [{
                            "name": "trainer", "image": IMAGE,
                            "command": ["python", "-m", "benchmarks.first_allreduce", "--out", "/tmp/out"],
                            "env": [
                                {"name": "MASTER_ADDR", "value": f"{JOB}-{JOBSET_REPLICATED_JOB}-0-0.{JOB}"},
                                {"name": "MASTER_PORT", "value": "29500"},
                                {"name": "WORLD_SIZE", "value": str(n)},
                                {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": index}}},
                            ],
                        }],
                        **pod_placement(),
                    }},
                }},
            }],
        },
    }


#: What the floor client creates: its own minimal pods, or the pods the SPMDJob operator builds.
FLOOR_BODIES = ("plain", "operator")


def operator_pod(ns: str, i: int, n: int) -> dict:
    """Pod ``i`` as the SPMDJob operator builds it for :func:`spmdjob` (``ns``, ``n``), labelled as
    a floor pod and without the owner reference (no job owns it: the garbage collector would
    delete it). What the API server does with the operator's bodies, without the operator."""
    from spmd_operator import builders
    from spmd_operator.names import JobRef

    spec = _operator_spec(ns, n)
    pod = builders.build_pod(JobRef(name=JOB, namespace=ns, uid=FLOOR_UID), spec, i, 0)
    pod["metadata"].pop("ownerReferences", None)
    pod["metadata"]["labels"].update({"spmd-bench/job": JOB, "spmd-bench/rank": str(i)})
    return pod


FLOOR_UID = "00000000-0000-4000-8000-00000000f100"


@functools.lru_cache(maxsize=4)
def _operator_spec(ns: str, n: int):
    from monarch_spmd.spec import parse_job_spec

    return parse_job_spec(spmdjob(ns, n)["spec"], require_image=True)


def floor_pod(ns: str, i: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{JOB}-{i}", "namespace": ns,
                     "labels": {"spmd-bench/job": JOB, "spmd-bench/rank": str(i)}},
        "spec": {
            "containers": [{"name": "trainer", "image": IMAGE,
                            "command": ["python", "-m", "benchmarks.first_allreduce", "--out", "/tmp/out"]}],
            "restartPolicy": "Never",
            **pod_placement(),
        },
    }


def job_running(actor: str, obj: dict) -> bool:
    status = obj.get("status") or {}
    if actor == "spmdjob":
        return status.get("phase") == "Running"
    if actor == "pytorchjob":
        return any(c.get("type") == "Running" and c.get("status") == "True"
                   for c in status.get("conditions") or [])
    if actor == "jobset":
        return any(r.get("name") == JOBSET_REPLICATED_JOB and int(r.get("ready") or 0) >= 1
                   for r in status.get("replicatedJobsStatus") or [])
    return False


BODIES = {"spmdjob": spmdjob, "pytorchjob": pytorchjob, "jobset": jobset}


class JobTimes:
    def __init__(self, actor: str, pods: kube.PodTimes) -> None:
        self.actor, self.pods = actor, pods
        self.running_at: float | None = None
        self.last: dict = {}

    def on_event(self, obj: dict, t: float) -> None:
        with self.pods.changed:
            self.last = obj
            if self.running_at is None and job_running(self.actor, obj):
                self.running_at = t
            self.pods.changed.notify_all()


def controller_for(actor: str, cluster: Cluster, log_dir: Path):
    if actor == "spmdjob":
        return SpmdOperator(cluster, log_dir)
    if actor == "pytorchjob":
        return PyTorchJobOperator(cluster, log_dir)
    if actor == "jobset":
        return JobSetOperator(cluster, log_dir)
    return None


def start_profiler(ctl, out: Path):
    """py-spy sampling the controller (non-blocking: the process is never paused)."""
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        raise RuntimeError("--profile needs py-spy on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([pyspy, "record", "--pid", str(ctl.proc.pid), "--format", "raw",
                             "--rate", "100", "--nonblocking", "--output", str(out)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # attached before the job is submitted
    return proc, out


def stop_profiler(profiler) -> str | None:
    proc, out = profiler
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return str(out) if out.exists() else None


def trial(cluster: Cluster, actor: str, n: int, timeout: float, log_dir: Path, rep: int = 0,
          profile_dir: Path | None = None, floor_bodies: str = "plain") -> dict:
    """One job of N pods by one actor in a fresh namespace; returns its record."""
    admin = cluster.admin
    ns = f"bench-{actor}-{n}-{secrets.token_hex(3)}"
    rec: dict = {"actor": actor, "procs": n, "rep": rep, "namespace": ns, "ok": False}
    floor = profiler = None
    admin.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    ctl = controller_for(actor, cluster, log_dir / ns)
    idents = ctl.identities() if ctl else [cluster.identity("floor")]
    watchers: list[kube.Watcher] = []
    try:
        if ctl:
            ctl.start()
            rec["controller_ready_s"] = ctl.ready_s
        pods = kube.PodTimes()
        jt = JobTimes(actor, pods)
        watchers.append(kube.Watcher(admin, f"/api/v1/namespaces/{ns}/pods", pods.on_event,
                                     {"labelSelector": POD_SELECTOR[actor]}))
        if actor in CUSTOM:
            g, v, p = CUSTOM[actor]
            watchers.append(kube.Watcher(admin, f"/apis/{g}/{v}/namespaces/{ns}/{p}", jt.on_event))
        for w in watchers:
            w.start()
        for w in watchers:
            w.ready.wait(30)
            if w.error:
                raise w.error
        idents = ctl.identities() if ctl else idents  # JobSet's Job controller joins in start()
        before = kube.requests_of(admin, idents)
        before_each = {i.name: kube.requests_of(admin, i) for i in idents} if len(idents) > 1 else {}
        own_before = ctl.scrape() if hasattr(ctl, "scrape") else {}

        t0 = time.time()
        deadline = time.monotonic() + timeout
        floor = None
        if actor == "floor":
            floor = subprocess.Popen(
                [PY, "-m", "benchmarks.floor_client", "--kubeconfig", str(idents[0].kubeconfig),
                 "--namespace", ns, "--count", str(n), "--threads", str(FLOOR_THREADS), "--bodies", floor_bodies],
                cwd=REPO, env=python_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if floor.stdout.readline().strip() != "ready":
                raise RuntimeError(f"floor client did not start (exit {floor.wait()})")
        if profile_dir is not None and ctl is not None:
            profiler = start_profiler(ctl, profile_dir / f"{actor}-{n}-rep{rep}.txt")

        t0 = time.time()
        deadline = time.monotonic() + timeout
        if floor is not None:
            floor.stdin.write("go\n")
            floor.stdin.flush()
        else:
            g, v, p = CUSTOM[actor]
            body = BODIES[actor](ns, n)
            cluster.admin.create(f"/apis/{g}/{v}/namespaces/{ns}/{p}", body)
            rec["submit_s"] = time.time() - t0

        ok_created = pods.wait(lambda: len(pods.created) >= n, deadline)
        ok_running = ok_created and pods.wait(lambda: len(pods.running) >= n, deadline)
        ok_phase = True
        if actor != "floor":
            ok_phase = pods.wait(lambda: jt.running_at is not None, deadline)
        if ctl:
            ctl.check_alive()
        if floor is not None:
            out, _ = floor.communicate(timeout=max(10.0, deadline - time.monotonic()))
            res = json.loads(out.strip().splitlines()[-1])
            rec["submit_s"], rec["peak_rss_mib"] = res["submit_s"], res["peak_rss_mib"]
            if res["errors"]:
                raise RuntimeError(f"floor client: {res['errors']}")
        with pods.changed:
            if ok_created:
                rec["created_s"] = sorted(pods.created.values())[n - 1] - t0
            if ok_running:
                rec["running_s"] = sorted(pods.running.values())[n - 1] - t0
            if actor != "floor" and jt.running_at is not None:
                rec["phase_running_s"] = jt.running_at - t0
            rec["pods_seen"] = len(pods.created)
            rec["pods_running"] = len(pods.running)
        # Count the controller's requests for this job: until they stop for 2 s.
        after = kube.wait_quiet(admin, idents, quiet=2.0, limit=60.0)
        rec["api_requests"] = after - before
        if before_each:
            rec["api_requests_by_identity"] = {i.name: kube.requests_of(admin, i) - before_each[i.name] for i in idents}
        if hasattr(ctl, "scrape"):  # the operator's own count, by verb: where the requests went
            own = ctl.scrape()
            rec["operator_metrics"] = {k: v - own_before.get(k, 0.0) for k, v in own.items()
                                       if v - own_before.get(k, 0.0)}
        if ctl:
            rec["peak_rss_mib"] = ctl.peak_rss_mib()
        if isinstance(ctl, JobSetOperator):
            rec["job_controller_counted"] = ctl.job_controller_counted
            rec["job_controller_rss_mib"] = ctl.job_controller_rss_mib()
        if profiler is not None:
            rec["profile"] = stop_profiler(profiler)
            profiler = None
        rec["ok"] = ok_created and ok_running and ok_phase
        if not rec["ok"]:
            rec["error"] = (f"timed out after {timeout:.0f}s: {rec['pods_seen']}/{n} pods seen, "
                            f"{rec['pods_running']}/{n} Running, job Running: {ok_phase}; "
                            f"job status: {jt.last.get('status')}")
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc()[-3000:]
    finally:
        if profiler is not None:
            stop_profiler(profiler)
        if floor is not None and floor.poll() is None:
            floor.kill()
            floor.wait()
        for w in watchers:
            w.stop()
        # Delete while the controller still runs (it may hold finalizers), then stop it.
        rec["cleanup_s"] = kube.delete_namespace(admin, ns, timeout=max(120.0, n * 0.5),
                                                 strip=tuple(CUSTOM.values()))
        if ctl:
            ctl.stop()
    return rec


METRICS = ("created_s", "running_s", "phase_running_s", "api_requests", "peak_rss_mib", "job_controller_rss_mib")


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: list[dict], sizes: list[int], actors: list[str]) -> list[dict]:
    """Median of each metric per (actor, N) over the successful repetitions, with ratios to
    the floor's medians (the job-status phase against the floor's all-Running time)."""
    med: dict[tuple[str, int], dict] = {}
    for n in sizes:
        for a in actors:
            mine = [r for r in runs if r["actor"] == a and r["procs"] == n]
            good = [r for r in mine if r["ok"]]
            row = {"actor": a, "procs": n, "reps": len(mine), "ok_reps": len(good), "ok": bool(mine) and len(good) == len(mine)}
            for k in METRICS:
                row[k] = _median([r.get(k) for r in good])
            row["errors"] = [r.get("error") for r in mine if not r["ok"]]
            if a == "jobset":
                row["job_controller_counted"] = all(r.get("job_controller_counted") for r in good) if good else None
            med[(a, n)] = row
    rows = []
    for n in sizes:
        floor = med.get(("floor", n), {})
        for a in actors:
            row = med[(a, n)]

            def ratio(key: str, base_key: str | None = None):
                base, mine = floor.get(base_key or key), row.get(key)
                return (mine / base) if (mine is not None and base) else None

            row["created_vs_floor"] = ratio("created_s")
            row["running_vs_floor"] = ratio("running_s")
            row["phase_running_vs_floor"] = ratio("phase_running_s", "running_s")
            row["requests_vs_floor"] = ratio("api_requests")
            rows.append(row)
    return rows


def _x(v):
    return None if v is None else f"{v:.2f}x"


def rss_cell(r: dict) -> str | None:
    """Peak RSS; for JobSet the manager's plus the Job controller's (when it ran apart)."""
    if r.get("peak_rss_mib") is None:
        return None
    if r.get("job_controller_rss_mib") is not None:
        return f"{r['peak_rss_mib']:.0f} + {r['job_controller_rss_mib']:.0f}"
    return f"{r['peak_rss_mib']:.0f}"


def render(result: dict) -> str:
    m = result["machine"]
    head = (
        f"Operator scale on kwok nodes: median of {result['params']['reps']}; seconds from submission "
        "(ratio to the no-operator floor); API requests the controller made; its peak RSS\n"
        + ("the floor creates the pods the SPMDJob operator builds\n"
           if result["params"].get("floor_bodies") == "operator" else "")
        + 
        f"{machine_line(m)}\n"
    )
    rows = []
    for r in result["results"]:
        def cell(key, rk):
            return None if r.get(key) is None else (
                f"{r[key]:.2f}" + (f" ({_x(r[rk])})" if r.get(rk) is not None and r["actor"] != "floor" else ""))
        rows.append([
            r["procs"], r["actor"],
            cell("created_s", "created_vs_floor"), cell("running_s", "running_vs_floor"),
            cell("phase_running_s", "phase_running_vs_floor"),
            None if r.get("api_requests") is None else (
                f"{r['api_requests']:g}" + (f" ({_x(r['requests_vs_floor'])})" if r["actor"] != "floor" and r.get("requests_vs_floor") else "")),
            rss_cell(r),
            f"{r['ok_reps']}/{r['reps']}",
        ])
    notes = []
    if any(r["actor"] == "jobset" for r in result["results"]):
        if any(r["actor"] == "jobset" and r.get("job_controller_counted") is False for r in result["results"]):
            notes.append("jobset: the JobSet manager alone (the cluster's own Job controller made the pods, "
                         "uncounted)")
        else:
            notes.append("jobset: requests of the JobSet manager and the Job controller together; "
                         "RSS manager + Job controller")
    return head + table(["N", "actor", "all created s", "all Running s", "job Running s",
                         "API requests", "peak RSS MiB", "ok"], rows) + "".join(f"\n{x}" for x in notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--actors", nargs="+", choices=ACTORS, default=list(ACTORS))
    ap.add_argument("--kubeconfig", help="use this cluster (with kwok nodes) instead of starting one")
    ap.add_argument("--kwok-nodes", type=int, default=None,
                    help=f"kwok nodes of {KWOK_PODS_PER_NODE} pods each (default: room for the largest N, at least 4)")
    ap.add_argument("--trial-timeout", type=float, default=1800.0, help="seconds per job")
    ap.add_argument("--state-dir", help="where the cluster and controller logs go (default: a temp dir)")
    ap.add_argument("--reps", type=int, default=3, help="jobs per (actor, N); medians are reported")
    ap.add_argument("--profile", metavar="DIR",
                    help="sample the SPMDJob operator with py-spy during each of its jobs (raw stacks in DIR)")
    ap.add_argument("--json", help="output path (default benchmarks/out/operator_scale.json)")
    ap.add_argument("--floor-bodies", choices=FLOOR_BODIES, default="plain",
                    help="the floor's pods: its own minimal ones (default), or those the SPMDJob operator "
                         "builds for the same job (what the API server does with the operator's pods, without it)")
    args = ap.parse_args(argv)
    if "floor" not in args.actors:
        args.actors.insert(0, "floor")

    runs: list[dict] = []
    t_start = time.monotonic()
    if args.kwok_nodes is None:
        args.kwok_nodes = max(4, -(-max(args.sizes) // KWOK_PODS_PER_NODE) + 1)
    with bench_cluster(args.kubeconfig, args.kwok_nodes, args.state_dir) as cluster:
        print(f"  cluster ready ({cluster.kubeconfig}); state in {cluster.state_dir}", file=sys.stderr, flush=True)
        step = 0
        for rep in range(args.reps):
            for n in args.sizes:
                k = step % len(args.actors)  # rotate: no actor always goes first
                step += 1
                for actor in args.actors[k:] + args.actors[:k]:
                    rec = trial(cluster, actor, n, args.trial_timeout, cluster.state_dir / "logs", rep,
                                Path(args.profile) if args.profile and actor == "spmdjob" else None, args.floor_bodies)
                    runs.append(rec)
                    brief = (f"created {rec.get('created_s', 0):.2f}s, running {rec.get('running_s', 0):.2f}s, "
                             f"job {rec.get('phase_running_s') or 0:.2f}s, {rec.get('api_requests')} requests, "
                             f"rss {rec.get('peak_rss_mib') or 0:.0f} MiB") if rec["ok"] else f"FAILED: {rec.get('error')}"
                    print(f"  rep {rep + 1}/{args.reps} N={n} {actor}: {brief}", file=sys.stderr, flush=True)
        state = str(cluster.state_dir)

    result = {
        "benchmark": "operator_scale",
        "command": " ".join(["python", "-m", "benchmarks.operator_scale", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "params": {"sizes": args.sizes, "actors": args.actors, "reps": args.reps, "trial_timeout_s": args.trial_timeout,
                   "floor_threads": FLOOR_THREADS, "floor_bodies": args.floor_bodies, "kwok_nodes": args.kwok_nodes,
                   "kwok_pods_per_node": KWOK_PODS_PER_NODE, "pytorchjob_version": "v1.9.3",
                   "jobset_version": "v0.12.0"},
        "elapsed_s": time.monotonic() - t_start,
        "state_dir": state,
        "results": summarize(runs, args.sizes, args.actors),
        "runs": runs,
    }
    path = write_json("operator_scale", result, args.json)
    print(render(result))
    print(f"\nJSON: {path}")
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
