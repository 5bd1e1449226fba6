"""Restart in place on a cluster: in place vs recreating the pods vs JobSet, a lost pod, and hangs.

    python -m benchmarks.inplace_cluster [--procs 16 64 256] [--per-host 8] [--reps 3]
        [--systems inplace recreate jobset] [--lost-procs 256] [--hang-procs 16] [--hang-timeout 5]
        [--kubeconfig PATH --state-dir DIR] [--json PATH]

Real processes on the test cluster's process node (``devcluster``: a real control plane, pods run
as local processes in network namespaces of their own). Without ``--kubeconfig`` a cluster is
started here (root needed, as for the test suite); with one, it must have the process node
``proc-node-0`` and no SPMDJob operator of its own running (the benchmark starts one).

Every job is N procs in the PerHost layout, ``--per-host`` procs per pod (so 256 procs are 32
pods of 8; two cores cannot start 512 interpreters of one-proc pods in a useful time), running the
trivial program of benchmarks/inplace_program.py (``--mode sleep``: it creates
``<ready dir>/<restart>.<rank>`` and turns into ``sleep``), the ready folder being a hostPath
volume this process reads. The systems:

- **inplace**: an SPMDJob, restartPolicy.mode InPlace (back-off 0: it is a policy, not
  coordination); the agents restart the processes in the same pods;
- **recreate**: the same SPMDJob with mode RecreatePods: every pod deleted, the gang created again
  (podReplacementPolicy Failed, the default: once the old pods are gone);
- **jobset**: a JobSet v0.12.0 (built by benchmarks/build-jobset.sh) of one replicated job of
  N / per-host single-pod Jobs (backoffLimit 0), failurePolicy.maxRestarts: a failed pod fails its
  Job and JobSet recreates every Job. Its pods run the same worker (no coordinator: it stops its
  procs and exits with the failing code, as under RecreatePods) with the restart attempt and job
  index from JobSet's labels.

Restart: once every rank runs, one rank's process (of a pod other than the first, a different one
each repetition) is SIGKILLed; measured from the kill to **every rank's new process started**
(the newest ready file of the next attempt) and to **the job Running with the restart counted**
(SPMDJob: phase Running and status.restarts raised; JobSet: status.restarts raised and every pod
of the new attempt Running). Medians of ``--reps``, one job per system and size.

Lost pod (``--lost-procs``): one pod other than the first is deleted (``kubectl delete pod``):
InPlace replaces that pod alone (the others restart in place and wait for it) against
RecreatePods recreating the whole gang; same two figures.

Hangs (``--hang-procs``, ``--mode steps``: a line every 0.5 s): one rank is SIGSTOPped; measured
from the stop to the restart counted in the job's status, with torchrun's watchdog
(TORCHELASTIC_ENABLE_FILE_TIMER=1, a ``--hang-timeout`` timer around each step) and with
restartPolicy.progressTimeoutSeconds = ``--hang-timeout``; the target is within the timeout + 2 s.

JSON goes to ``benchmarks/out/inplace_cluster.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import kube
from benchmarks.common import REPO, machine, machine_line, median, table, write_json

SYSTEMS = ("inplace", "recreate", "jobset")
PROCESS_NODE = "proc-node-0"
PROGRAM = "benchmarks.inplace_program"
SPMD = "/apis/spmd.monarch.dev/v1alpha1"
JOBSET = "/apis/jobset.x-k8s.io/v1alpha2"
POLL = 0.05
#: A restart that takes longer than this is reported as a failure of the benchmark.
TIMEOUT = 300.0


def run_id_of(environ: bytes) -> dict[str, str]:
    out = {}
    for item in environ.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in (b"RANK", b"TORCHELASTIC_RUN_ID", b"TORCHELASTIC_RESTART_COUNT"):
            out[key.decode()] = value.decode(errors="replace")
    return out


def rank_pids(run_id: str, restart: int) -> dict[int, int]:
    """rank -> pid of the training processes of ``run_id``'s attempt ``restart`` on this machine
    (the process node's pods are local processes: their environment is in /proc)."""
    out: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = run_id_of(f.read())
        except OSError:
            continue
        if env.get("TORCHELASTIC_RUN_ID") == run_id and env.get("TORCHELASTIC_RESTART_COUNT") == str(restart) \
                and "RANK" in env:
            out[int(env["RANK"])] = int(entry.name)
    return out


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = POLL) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached in {timeout:g}s: {what}")
        time.sleep(interval)


def started_at(folder: Path, restart: int, ranks: int) -> float | None:
    """When the last rank's process of attempt ``restart`` started (its ready file), or None yet."""
    times = []
    for rank in range(ranks):
        try:
            times.append((folder / f"{restart}.{rank}").stat().st_mtime)
        except FileNotFoundError:
            return None
    return max(times)


# --- the systems ----------------------------------------------------------------------------------


def _pod_spec(folder: Path, env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "nodeSelector": {"kubernetes.io/hostname": PROCESS_NODE},
        "volumes": [{"name": "ready", "hostPath": {"path": str(folder)}}],
        "containers": [{"name": "trainer", "env": [{"name": "PYTHONPATH", "value": str(REPO)}, *(env or [])],
                        "volumeMounts": [{"name": "ready", "mountPath": str(folder)}]}],
    }


def spmdjob(name: str, hosts: int, per_host: int, folder: Path, mode: str, args: list[str],
            env: list[dict[str, Any]] | None = None, **restart: Any) -> dict[str, Any]:
    return {
        "apiVersion": "spmd.monarch.dev/v1alpha1", "kind": "SPMDJob", "metadata": {"name": name},
        "spec": {"mesh": [{"name": "hosts", "size": hosts}, {"name": "procs", "size": per_host}],
                 "podLayout": "PerHost", "image": "python:3.11-slim",
                 "args": ["-m", PROGRAM, *args],
                 "restartPolicy": {"mode": mode, "maxRestarts": 100, "backoffSeconds": 0, **restart},
                 "template": {"spec": _pod_spec(folder, env)}},
    }


def jobset(name: str, hosts: int, per_host: int, folder: Path) -> dict[str, Any]:
    label = lambda key: {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['jobset.sigs.k8s.io/{key}']"}}}  # noqa: E731
    env = [
        {"name": "MONARCH_SPMD_MESH", "value": f"hosts={hosts},procs={per_host}"},
        {"name": "MONARCH_SPMD_POD_LAYOUT", "value": "PerHost"},
        {"name": "MONARCH_SPMD_COORDS", **label("job-index")},
        {"name": "MONARCH_SPMD_RESTART_COUNT", **label("restart-attempt")},
        {"name": "MONARCH_SPMD_MASTER_ADDR", "value": "127.0.0.1"},  # the program is trivial: no rendezvous
        {"name": "MONARCH_SPMD_MASTER_PORT", "value": "29500"},
        {"name": "MONARCH_SPMD_MAX_RESTARTS", "value": "100"},
        {"name": "MONARCH_SPMD_RUN_ID", "value": f"jobset-{name}"},
    ]
    pod = _pod_spec(folder, env)
    pod["restartPolicy"] = "Never"
    pod["containers"][0].update(image="python:3.11-slim", command=[
        "python", "-m", "monarch_spmd.payload.worker", "--", "-m", PROGRAM, "--mode", "sleep", "--ready-dir", str(folder)])
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
        "spec": {"failurePolicy": {"maxRestarts": 100}, "replicatedJobs": [{
            "name": "w", "replicas": hosts,
            "template": {"spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                                  "template": {"spec": pod}}}}]},
    }


class Trial:
    """One job of one system: create it, wait for its gang, fail a rank, measure, delete it."""

    def __init__(self, admin: kube.Kube, ns: str, system: str, procs: int, per_host: int, root: Path,
                 body: dict[str, Any] | None = None) -> None:
        self.admin, self.ns, self.system = admin, ns, system
        self.procs, self.per_host, self.hosts = procs, per_host, procs // per_host
        self.name = f"{system}-{procs}-{uuid.uuid4().hex[:4]}"
        self.folder = root / self.name
        self.folder.mkdir(parents=True)
        os.chmod(self.folder, 0o777)
        if body is not None:
            self.body = body
        elif system == "jobset":
            self.body = jobset(self.name, self.hosts, per_host, self.folder)
        else:
            self.body = spmdjob(self.name, self.hosts, per_host, self.folder,
                                "InPlace" if system == "inplace" else "RecreatePods",
                                ["--mode", "sleep", "--ready-dir", str(self.folder)])
        self.body["metadata"]["name"] = self.name
        self.run_id = ""
        self.restart = 0

    @property
    def url(self) -> str:
        api, plural = (JOBSET, "jobsets") if self.system == "jobset" else (SPMD, "spmdjobs")
        return f"{api}/namespaces/{self.ns}/{plural}/{self.name}"

    def create(self) -> None:
        api, plural = (JOBSET, "jobsets") if self.system == "jobset" else (SPMD, "spmdjobs")
        made = self.admin.create(f"{api}/namespaces/{self.ns}/{plural}", self.body)
        self.run_id = f"jobset-{self.name}" if self.system == "jobset" else made["metadata"]["uid"]

    def status(self) -> dict[str, Any]:
        return (self.admin.get(self.url) or {}).get("status") or {}

    def pods(self) -> list[dict[str, Any]]:
        selector = (f"jobset.sigs.k8s.io/jobset-name={self.name}" if self.system == "jobset"
                    else f"spmd.monarch.dev/job={self.name}")
        return self.admin.get(f"/api/v1/namespaces/{self.ns}/pods", query={"labelSelector": selector})["items"]

    def running(self, restart: int) -> bool:
        """The job is Running with ``restart`` restarts counted."""
        st = self.status()
        if self.system != "jobset":
            return st.get("phase") == "Running" and int(st.get("restarts") or 0) == restart
        if int(st.get("restarts") or 0) != restart:
            return False
        pods = [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")
                and (p["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/restart-attempt") == str(restart)]
        return len(pods) == self.hosts and all((p.get("status") or {}).get("phase") == "Running" for p in pods)

    def wait_started(self, restart: int, timeout: float = TIMEOUT) -> tuple[float, float]:
        """Waits until every rank of ``restart`` started and the job is Running with it counted;
        returns (when the last process started, when the job was seen Running) as Unix times."""
        began = wait_for(lambda: started_at(self.folder, restart, self.procs), timeout,
                         f"{self.name}: every rank of attempt {restart} started")
        wait_for(lambda: self.running(restart), timeout, f"{self.name}: Running with {restart} restarts", 0.1)
        return began, time.time()

    def stepping(self, restart: int) -> bool:
        """Every rank of attempt ``restart`` printed a step (``--mode steps``: its watchdog timer is
        armed, its output flows): what a hang is measured from."""
        seen: set[int] = set()
        for pod in self.pods():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            log = self.admin.get(f"/api/v1/namespaces/{self.ns}/pods/{pod['metadata']['name']}/log")
            if not isinstance(log, str):
                continue
            began: dict[str, bool] = {}
            for line in log.splitlines():
                line = line.split("] ", 1)[-1]
                words = line.split()
                if len(words) >= 6 and words[0] == "rank" and words[2] == "pid":
                    began[words[1]] = words[5] == str(restart)
                elif len(words) >= 4 and words[0] == "rank" and words[2] == "step" and began.get(words[1]):
                    seen.add(int(words[1]))
        return len(seen) == self.procs

    def victim_rank(self, rep: int) -> int:
        """A rank of a pod other than the first, another pod each repetition."""
        pod = 1 + rep % max(1, self.hosts - 1) if self.hosts > 1 else 0
        return pod * self.per_host + (rep % self.per_host)

    def kill_rank(self, rank: int, sig: int = signal.SIGKILL) -> float:
        pids = wait_for(lambda: rank_pids(self.run_id, self.restart).get(rank), 30,
                        f"{self.name}: rank {rank}'s process of attempt {self.restart}")
        t0 = time.time()
        os.kill(pids, sig)
        return t0

    def delete_pod(self, host: int) -> tuple[float, str]:
        pod = next(p for p in self.pods() if int((p["metadata"].get("labels") or {}).get("spmd.monarch.dev/rank", -1))
                   == host * self.per_host and not p["metadata"].get("deletionTimestamp"))
        name = pod["metadata"]["name"]
        t0 = time.time()
        self.admin.delete(f"/api/v1/namespaces/{self.ns}/pods/{name}")
        return t0, name

    def delete(self) -> None:
        with contextlib.suppress(Exception):
            self.admin.delete(self.url, {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"})
        with contextlib.suppress(Exception):
            wait_for(lambda: not self.pods(), 180, f"{self.name}'s pods gone", 0.5)
        shutil.rmtree(self.folder, ignore_errors=True)


# --- the measurements -----------------------------------------------------------------------------


def restarts(admin: kube.Kube, ns: str, system: str, procs: int, per_host: int, reps: int, root: Path) -> dict:
    trial = Trial(admin, ns, system, procs, per_host, root)
    trial.create()
    row: dict[str, Any] = {"system": system, "procs": procs, "pods": trial.hosts, "per_host": per_host,
                           "killed_ranks": [], "started_s": [], "running_s": []}
    try:
        trial.wait_started(0)
        for rep in range(reps):
            rank = trial.victim_rank(rep)
            t0 = trial.kill_rank(rank)
            trial.restart += 1
            began, running = trial.wait_started(trial.restart)
            row["killed_ranks"].append(rank)
            row["started_s"].append(round(began - t0, 3))
            row["running_s"].append(round(running - t0, 3))
            print(f"  {system:8} N={procs:<4} rep {rep + 1}: rank {rank} killed -> every new process "
                  f"{began - t0:.2f}s, Running {running - t0:.2f}s", flush=True)
    finally:
        trial.delete()
    return row


def lost_pod(admin: kube.Kube, ns: str, system: str, procs: int, per_host: int, reps: int, root: Path) -> dict:
    trial = Trial(admin, ns, system, procs, per_host, root)
    trial.create()
    row: dict[str, Any] = {"system": system, "procs": procs, "pods": trial.hosts, "deleted": [], "started_s": [],
                           "running_s": [], "pods_created": []}
    try:
        trial.wait_started(0)
        for rep in range(reps):
            host = 1 + rep % max(1, trial.hosts - 1)
            before = {p["metadata"]["uid"] for p in trial.pods()}
            t0, name = trial.delete_pod(host)
            trial.restart += 1
            began, running = trial.wait_started(trial.restart)
            created = len({p["metadata"]["uid"] for p in trial.pods()} - before)
            row["deleted"].append(name)
            row["started_s"].append(round(began - t0, 3))
            row["running_s"].append(round(running - t0, 3))
            row["pods_created"].append(created)
            print(f"  {system:8} N={procs:<4} rep {rep + 1}: pod {name} deleted -> every new process "
                  f"{began - t0:.2f}s, Running {running - t0:.2f}s, {created} pod(s) created", flush=True)
    finally:
        trial.delete()
    return row


def hang(admin: kube.Kube, ns: str, detector: str, procs: int, per_host: int, reps: int, timeout: int,
         root: Path) -> dict:
    # The ranks step together through files in a folder of this trial's own (as a collective makes
    # them): one rank stopped silences the gang, which is what the progress timeout judges.
    shared = root / f"hang-{detector}-{uuid.uuid4().hex[:6]}"
    shared.mkdir(parents=True)
    os.chmod(shared, 0o777)
    folder_args = ["--mode", "steps", "--step", "0.5", "--ready-dir", str(shared)]
    env: list[dict[str, Any]] = []
    restart: dict[str, Any] = {}
    if detector == "watchdog":
        folder_args += ["--watchdog", str(timeout)]
        env = [{"name": "TORCHELASTIC_ENABLE_FILE_TIMER", "value": "1"}]
    else:
        restart["progressTimeoutSeconds"] = timeout
    body = spmdjob("x", procs // per_host, per_host, shared, "InPlace", folder_args, env, **restart)
    trial = Trial(admin, ns, "inplace", procs, per_host, root, body=body)
    trial.create()
    row: dict[str, Any] = {"detector": detector, "procs": procs, "timeout_s": timeout, "restart_s": [], "reasons": []}
    try:
        wait_for(lambda: trial.running(0) and trial.stepping(0), TIMEOUT, f"{trial.name}: every rank stepping")
        for rep in range(reps):
            rank = trial.victim_rank(rep)
            t0 = trial.kill_rank(rank, signal.SIGSTOP)
            trial.restart += 1
            wait_for(lambda: int(trial.status().get("restarts") or 0) >= trial.restart, timeout + 120,
                     f"{trial.name}: restart {trial.restart} counted", 0.1)
            seen = time.time() - t0
            reason = (trial.status().get("failure") or {}).get("reason")
            row["restart_s"].append(round(seen, 3))
            row["reasons"].append(reason)
            print(f"  hang/{detector:8} N={procs:<4} rep {rep + 1}: rank {rank} stopped -> restart counted "
                  f"{seen:.2f}s ({reason})", flush=True)
            wait_for(lambda: trial.running(trial.restart) and trial.stepping(trial.restart), TIMEOUT,
                     f"{trial.name}: every rank of restart {trial.restart} stepping")
    finally:
        trial.delete()
    return row


# --- the cluster ----------------------------------------------------------------------------------


@contextlib.contextmanager
def cluster(kubeconfig: str | None, state_dir: Path) -> Iterator[tuple[Any, kube.Kube, Path | None]]:
    """(the LocalCluster started here or None, an admin client, the binaries' folder)."""
    if kubeconfig:
        bin_dir = os.environ.get("MONARCH_SPMD_K8S_BIN")
        yield None, kube.Kube(kubeconfig), Path(bin_dir) if bin_dir else None
        return
    sys.path.insert(0, str(REPO))
    from devcluster import LocalCluster

    with LocalCluster(state_dir / "cluster", kwok_nodes=0) as lc:
        yield lc, kube.Kube(lc.kubeconfig), lc.bin_dir


@contextlib.contextmanager
def spmd_operator(lc: Any, kubeconfig: Path, bin_dir: Path | None, log: Path) -> Iterator[None]:
    """The SPMDJob operator of this checkout, alone (no leader election), with the CRD applied."""
    import subprocess

    from devcluster.controlplane import free_port, stop_process_group

    kubectl = str(bin_dir / "kubectl") if bin_dir else "kubectl"
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "operator"), str(REPO)]))
    subprocess.run([kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds")], env=env,
                   check=True, capture_output=True)
    wait_for(lambda: subprocess.run([kubectl, "wait", "--for=condition=Established", "--timeout=5s", "-f",
                                     str(REPO / "crds")], env=env, capture_output=True).returncode == 0, 60,
             "the SPMDJob CRD established", 0.5)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "spmd_operator", "--all-namespaces", "--no-leader-election",
                                 f"--liveness=http://127.0.0.1:{free_port()}/healthz", "--metrics-port", "0"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield
    finally:
        stop_process_group(proc)


@contextlib.contextmanager
def jobset_operator(kubeconfig: Path, bin_dir: Path | None, state_dir: Path) -> Iterator[None]:
    from benchmarks.cluster import JobSetOperator, bench_cluster

    with bench_cluster(kubeconfig, state_dir=state_dir / "jobset", bin_dir=bin_dir) as c:
        ctl = JobSetOperator(c, state_dir / "jobset-logs")
        ctl.start()
        try:
            yield
        finally:
            ctl.stop()


def namespace(admin: kube.Kube, prefix: str) -> str:
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    return ns


# --- the report -----------------------------------------------------------------------------------


def report(data: dict) -> str:
    out = [f"Restart in place on the process node (PerHost, {data['per_host']} procs per pod, trivial program); "
           "seconds from the failure; medians of " + str(data["reps"]), machine_line(data["machine"])]
    rows = []
    for r in data["restart"]:
        rows.append([r["system"], r["procs"], r["pods"], median(r["started_s"]), median(r["running_s"]),
                     " ".join(f"{x:.2f}" for x in r["started_s"])])
    out.append(table(["system", "procs", "pods", "every rank's new process s", "job Running, restart counted s",
                      "each repetition (new processes) s"], rows))
    by = {(r["system"], r["procs"]): r for r in data["restart"]}
    procs = sorted({r["procs"] for r in data["restart"]})
    notes = []
    if ("inplace", procs[0]) in by and ("inplace", procs[-1]) in by and len(procs) > 1:
        lo, hi = median(by[("inplace", procs[0])]["started_s"]), median(by[("inplace", procs[-1])]["started_s"])
        if lo and hi:
            notes.append(f"in place, {procs[-1]} vs {procs[0]} procs: {hi / lo:.2f}x (new processes)")
    for other in ("recreate", "jobset"):
        a, b = by.get(("inplace", procs[-1])), by.get((other, procs[-1]))
        if a and b and median(a["started_s"]) and median(a["running_s"]):
            notes.append(f"{other} / in place at {procs[-1]} procs: {median(b['started_s']) / median(a['started_s']):.1f}x "
                         f"(new processes), {median(b['running_s']) / median(a['running_s']):.1f}x (Running)")
    out.extend(notes)
    if data.get("lost"):
        out.append("")
        out.append(f"A lost pod (deleted) at {data['lost'][0]['procs']} procs: replace it alone (InPlace) vs recreate "
                   "the gang (RecreatePods); seconds from the deletion")
        out.append(table(["system", "procs", "pods", "every rank's new process s", "job Running, restart counted s",
                          "pods created"],
                         [[r["system"], r["procs"], r["pods"], median(r["started_s"]), median(r["running_s"]),
                           " ".join(map(str, r["pods_created"]))] for r in data["lost"]]))
    if data.get("hang"):
        out.append("")
        out.append("Hangs: a rank SIGSTOPped; seconds to the restart counted in the job's status (target: the timeout + 2 s)")
        out.append(table(["detector", "procs", "timeout s", "restart counted s", "within timeout + 2 s", "reason"],
                         [[h["detector"], h["procs"], h["timeout_s"], median(h["restart_s"]),
                           "yes" if all(s <= h["timeout_s"] + 2 for s in h["restart_s"]) else "no",
                           ",".join(sorted(set(map(str, h["reasons"]))))] for h in data["hang"]]))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--lost-procs", type=int, default=256, help="0: no lost-pod run")
    parser.add_argument("--hang-procs", type=int, default=16, help="0: no hang run")
    parser.add_argument("--hang-timeout", type=int, default=5)
    parser.add_argument("--kubeconfig")
    parser.add_argument("--state-dir")
    parser.add_argument("--json")
    opts = parser.parse_args(argv)
    for n in [*opts.procs, opts.lost_procs or opts.per_host, opts.hang_procs or opts.per_host]:
        if n % opts.per_host or n < opts.per_host:
            parser.error(f"{n} procs is not a multiple of --per-host {opts.per_host}")
    state = Path(opts.state_dir or tempfile.mkdtemp(prefix="spmd-inplace-bench-"))
    state.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ready-", dir="/tmp"))
    data: dict[str, Any] = {"benchmark": "inplace_cluster", "command": "python -m benchmarks.inplace_cluster " + " ".join(
        sys.argv[1:] if argv is None else argv), "machine": machine(), "per_host": opts.per_host, "reps": opts.reps,
        "restart": [], "lost": [], "hang": []}
    try:
        with cluster(opts.kubeconfig, state) as (lc, admin, bin_dir):
            kubeconfig = Path(opts.kubeconfig) if opts.kubeconfig else lc.kubeconfig
            spmd_systems = [s for s in opts.systems if s != "jobset"]
            if spmd_systems or opts.lost_procs or opts.hang_procs:
                with spmd_operator(lc, kubeconfig, bin_dir, state / "operator.log"):
                    ns = namespace(admin, "bench-inplace")
                    for n in opts.procs:
                        for system in spmd_systems:
                            data["restart"].append(restarts(admin, ns, system, n, opts.per_host, opts.reps, root))
                    if opts.lost_procs:
                        for system in ("inplace", "recreate"):
                            data["lost"].append(lost_pod(admin, ns, system, opts.lost_procs, opts.per_host, opts.reps, root))
                    if opts.hang_procs:
                        for detector in ("watchdog", "progress"):
                            data["hang"].append(hang(admin, ns, detector, opts.hang_procs, opts.per_host, opts.reps,
                                                     opts.hang_timeout, root))
            if "jobset" in opts.systems:
                with jobset_operator(kubeconfig, bin_dir, state):
                    ns = namespace(admin, "bench-jobset")
                    for n in opts.procs:
                        data["restart"].append(restarts(admin, ns, "jobset", n, opts.per_host, opts.reps, root))
    except Exception:
        traceback.print_exc()
        print(f"state (logs) in {state}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    order = {s: i for i, s in enumerate(SYSTEMS)}
    data["restart"].sort(key=lambda r: (r["procs"], order[r["system"]]))
    path = write_json("inplace_cluster", data, opts.json)
    print(report(data))
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
