"""Interactive iteration: N runs of a gloo program on one Monarch-mode job vs a new SPMDJob per run.

    python -m benchmarks.monarch_iteration [--runs 5] [--kubeconfig K] [--json PATH]

Both sides run the same module (``benchmarks/first_allreduce.py``: join a gloo group, one
all_reduce, write ``rank-<RANK>.json``) on the same mesh, [hosts=2, gpus=2] in the PerHost layout
(two pods of two procs), on the test cluster's process node (real processes in per-pod network
namespaces, real gloo between them):

- Monarch mode: ONE SPMDJob with ``mode: Monarch``; this process is its client
  (``monarch_spmd.kubernetes.proc_mesh``, then ``SPMDActor`` as in the README). Timed once: the
  job's creation until it is Running, and ``proc_mesh`` (attach and spawn). Timed per run: from
  just before ``SPMDActor.main.call(...)`` until the last rank's first all_reduce returned, and
  until the call returned.
- Program mode: a NEW SPMDJob per run (``args: [-m, benchmarks.first_allreduce, ...]``), timed
  from just before its create request until the last rank's first all_reduce returned, and until
  its status said Succeeded (the operator's poll, as ``kubectl wait`` would see it). Each job is
  deleted, and its pods waited out, before the next run (not timed).

The runs alternate (Monarch run i, then Program run i), so both see the same machine. Without
``--kubeconfig`` the benchmark starts the test cluster (devcluster: control plane, one process
node, the operator) and stops it at the end; with one, the cluster must have a process node and
the operator running (``python -m devcluster up --operator``). Needs root, as the test cluster does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, fmt, machine, machine_line, median, table, write_json

GROUP, VERSION, PLURAL = "spmd.monarch.dev", "v1alpha1", "spmdjobs"
MESH = [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 2}]
PROCS = 4
PROCESS_NODE = "proc-node-0"
NAME = "monarch_iteration"


def job_body(name: str, mode: str, out: Path | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "mesh": MESH, "image": "python:3.11-slim", "podLayout": "PerHost", "mode": mode,
        "restartPolicy": {"maxRestarts": 0},
        "template": {"spec": {
            "nodeSelector": {"kubernetes.io/hostname": PROCESS_NODE},
            # The process node runs this machine's Python: the pods import benchmarks/ from here.
            "containers": [{"name": "trainer", "env": [{"name": "PYTHONPATH", "value": str(REPO)}]}],
        }},
    }
    if mode == "Program":
        spec["args"] = ["-m", "benchmarks.first_allreduce", "--out", str(out)]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SPMDJob", "metadata": {"name": name}, "spec": spec}


class Kube:
    """The few API calls the benchmark makes."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        self.api_client = config.new_client_from_config(config_file=kubeconfig)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)

    def create_namespace(self) -> str:
        name = f"bench-monarch-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name}})
        deadline = time.monotonic() + 30
        while True:  # pods are refused until the service-account controller made `default`
            try:
                self.core.read_namespaced_service_account("default", name)
                return name
            except Exception:  # noqa: BLE001
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def phase(self, namespace: str, name: str) -> tuple[str | None, dict[str, Any]]:
        job = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        status = job.get("status") or {}
        return status.get("phase"), status

    def wait_phase(self, namespace: str, name: str, phase: str, timeout: float, poll: float = 0.1) -> float:
        """Waits for ``phase``; returns ``time.time()`` when it was seen."""
        deadline = time.monotonic() + timeout
        while True:
            seen, status = self.phase(namespace, name)
            if seen == phase:
                return time.time()
            if seen == "Failed" or time.monotonic() > deadline:
                raise RuntimeError(f"SPMDJob {namespace}/{name}: {phase} not reached ({seen}): "
                                   f"{json.dumps(status.get('failure') or status.get('message'))}")
            time.sleep(poll)

    def delete_and_wait(self, namespace: str, name: str, timeout: float = 120) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                    propagation_policy="Foreground")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = self.core.list_namespaced_pod(namespace, label_selector=f"{GROUP}/job={name}").items
            if not pods:
                return
            time.sleep(0.2)

    def delete_namespace(self, namespace: str) -> None:
        self.core.delete_namespace(namespace)


def last_allreduce(out: Path, procs: int, timeout: float = 60) -> float:
    """The wall-clock time the last rank's first all_reduce returned (from its rank file)."""
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(out.glob("rank-*.json"))
        if len(files) == procs:
            records = [json.loads(f.read_text()) for f in files]
            if any(r["sum"] != float(procs) for r in records):
                raise RuntimeError(f"all_reduce gave {[r['sum'] for r in records]}, expected {procs}")
            return max(r["t_first_allreduce"] for r in records)
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(files)} of {procs} ranks wrote to {out}")
        time.sleep(0.05)


@contextlib.contextmanager
def cluster(kubeconfig: str | None) -> Iterator[str]:
    """A kubeconfig of a cluster with a process node and the operator (started here if not given)."""
    if kubeconfig:
        yield kubeconfig
        return
    from devcluster import LocalCluster

    state = Path(tempfile.mkdtemp(prefix="spmd-bench-monarch-"))
    with LocalCluster(state, kwok_nodes=0) as running:
        running.start_operator("--resync-seconds", "10")
        try:
            yield str(running.kubeconfig)
        finally:
            running.stop_operator()
    shutil.rmtree(state / "etcd", ignore_errors=True)


def run(runs: int, kubeconfig: str | None, work: Path) -> dict[str, Any]:
    with cluster(kubeconfig) as config:
        kube = Kube(config)
        namespace = kube.create_namespace()
        try:
            return measure(kube, config, namespace, runs, work)
        finally:
            kube.delete_namespace(namespace)


def measure(kube: Kube, kubeconfig: str, namespace: str, runs: int, work: Path) -> dict[str, Any]:
    from monarch_spmd import SPMDActor
    from monarch_spmd.kubernetes import proc_mesh

    setup: dict[str, float] = {}
    t0 = time.time()
    kube.create(namespace, job_body("interactive", "Monarch"))
    setup["job_running_s"] = kube.wait_phase(namespace, "interactive", "Running", 180) - t0
    t1 = time.time()
    mesh = proc_mesh("interactive", namespace, timeout=180, kubeconfig=kubeconfig)
    actors = mesh.spawn("_SPMDActor", SPMDActor)
    addr, port = actors.slice(hosts=0, gpus=0).get_host_port.call_one(None).get()
    setup["proc_mesh_s"] = time.time() - t1
    print(f"Monarch-mode job Running in {setup['job_running_s']:.2f}s, proc_mesh in {setup['proc_mesh_s']:.2f}s",
          file=sys.stderr, flush=True)

    samples: list[dict[str, Any]] = []
    for i in range(runs):
        out = work / f"monarch-{i}"
        t = time.time()
        returned = [v for _, v in actors.main.call(addr, port, ["-m", "benchmarks.first_allreduce", "--out", str(out)])
                    .get().items()]
        done = time.time()
        if returned != [True] * PROCS:
            raise RuntimeError(f"SPMDActor.main returned {returned}")
        samples.append({"mode": "Monarch", "run": i + 1, "allreduce_s": last_allreduce(out, PROCS) - t,
                        "done_s": done - t})

        out = work / f"program-{i}"
        name = f"program-{i}"
        t = time.time()
        kube.create(namespace, job_body(name, "Program", out))
        done = kube.wait_phase(namespace, name, "Succeeded", 300)
        samples.append({"mode": "Program", "run": i + 1, "allreduce_s": last_allreduce(out, PROCS) - t,
                        "done_s": done - t})
        kube.delete_and_wait(namespace, name)
        print(f"run {i + 1}: Monarch {samples[-2]['done_s']:.2f}s, new SPMDJob {samples[-1]['done_s']:.2f}s",
              file=sys.stderr, flush=True)
    return {"setup": setup, "samples": samples}


def summary(result: dict[str, Any]) -> str:
    samples = result["samples"]
    rows = []
    for i in sorted({s["run"] for s in samples}):
        m = next(s for s in samples if s["run"] == i and s["mode"] == "Monarch")
        p = next(s for s in samples if s["run"] == i and s["mode"] == "Program")
        rows.append([i, m["allreduce_s"], m["done_s"], p["allreduce_s"], p["done_s"], f"{p['done_s'] / m['done_s']:.1f}x"])
    med = {(mode, k): median([s[k] for s in samples if s["mode"] == mode])
           for mode in ("Monarch", "Program") for k in ("allreduce_s", "done_s")}
    later = {mode: median([s["done_s"] for s in samples if s["mode"] == mode and s["run"] > 1])
             for mode in ("Monarch", "Program")}
    rows.append(["median", med["Monarch", "allreduce_s"], med["Monarch", "done_s"], med["Program", "allreduce_s"],
                 med["Program", "done_s"], f"{med['Program', 'done_s'] / med['Monarch', 'done_s']:.1f}x"])
    if later["Monarch"] is not None:
        rows.append(["median, runs 2+", None, later["Monarch"], None, later["Program"],
                     f"{later['Program'] / later['Monarch']:.1f}x"])
    setup = result["setup"]
    head = (f"Interactive iteration: {result['runs']} runs of benchmarks.first_allreduce on mesh hosts=2,gpus=2 "
            f"(PerHost: 2 pods of 2 procs, gloo), from just before the run was asked for\n"
            f"Monarch mode: one job, Running {fmt(setup['job_running_s'])}s after its create, proc_mesh "
            f"{fmt(setup['proc_mesh_s'])}s, then each run is SPMDActor.main on the same pods. "
            f"Program mode: a new SPMDJob per run.\n{machine_line(result['machine'])}\n")
    return head + table(["run", "Monarch: all_reduce s", "Monarch: main returned s", "new job: all_reduce s",
                         "new job: Succeeded s", "new job / Monarch"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs on each side (default 5)")
    parser.add_argument("--kubeconfig", help="a running cluster with a process node and the operator "
                                             "(default: start the test cluster here)")
    parser.add_argument("--json", help=f"where to write the samples (default benchmarks/out/{NAME}.json)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: at least 1")
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    work = Path(tempfile.mkdtemp(prefix="spmd-bench-iter-"))
    try:
        result = run(args.runs, args.kubeconfig, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"benchmark": NAME, "command": "python -m benchmarks.monarch_iteration " + " ".join(argv or sys.argv[1:]),
              "machine": machine(), "runs": args.runs, "mesh": "hosts=2,gpus=2", "layout": "PerHost", **result}
    path = write_json(NAME, result, args.json)
    print(summary(result))
    print(f"\nsamples: {path}")
    sys.stdout.flush()
    os._exit(0)  # skip Monarch's shutdown at exit: its hosts went with the namespace


if __name__ == "__main__":
    sys.exit(main())
