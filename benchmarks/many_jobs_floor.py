"""The many-jobs floor: every job's pods created directly by a parallel client, no operator.

Where it sits: run by ``benchmarks.many_jobs`` as a process of its own (as the controllers it is
compared with are), the way ``benchmarks.floor_client`` serves ``operator_scale``:

    python -m benchmarks.many_jobs_floor --kubeconfig K --namespace NS --plan PLAN.json [--threads 32] [--services]

PLAN.json is a list of ``[job name, procs]``. The client loads, builds every pod body (job by job,
rank by rank, in the plan's order), prints ``ready``, waits for one line on stdin (the start
signal, sent right after the caller took its start timestamp), creates the pods from a thread pool
and prints one JSON line: ``{"created": n, "errors": [...], "submit_s": s, "peak_rss_mib": m}``.

With ``--services`` each job's pods follow a headless Service named after the job that selects its
rank 0 (what the env contract's MASTER_ADDR needs, and what the operator creates per job): the
floor of the same load with the one object per job the contract asks for besides the pods.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import resource
import sys
import time
from pathlib import Path

from benchmarks import kube
from benchmarks.cluster import pod_placement

#: The label naming a floor pod's job (the controllers' pods carry their own job labels).
LABEL_JOB = "spmd-bench/job"
IMAGE = "python:3.11-slim"  # never pulled: kwok runs no containers


def floor_pod(namespace: str, job: str, rank: int) -> dict:
    """Rank ``rank`` of floor job ``job``: a bare pod, as a plain client would make it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job}-{rank}", "namespace": namespace,
                     "labels": {LABEL_JOB: job, "spmd-bench/rank": str(rank)}},
        "spec": {
            "containers": [{"name": "trainer", "image": IMAGE,
                            "command": ["python", "-m", "benchmarks.first_allreduce", "--out", "/tmp/out"]}],
            "restartPolicy": "Never",
            **pod_placement(),
        },
    }


def floor_service(namespace: str, job: str) -> dict:
    """Floor job ``job``'s headless Service, selecting its rank 0."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": job, "namespace": namespace, "labels": {LABEL_JOB: job}},
        "spec": {"clusterIP": "None", "selector": {LABEL_JOB: job, "spmd-bench/rank": "0"},
                 "ports": [{"name": "master", "port": 29500}], "publishNotReadyAddresses": True},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--plan", required=True, help="JSON list of [job name, procs]")
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--services", action="store_true", help="a headless Service per job before its pods")
    args = ap.parse_args(argv)

    plan = [(str(name), int(procs)) for name, procs in json.loads(Path(args.plan).read_text())]
    client = kube.Kube(args.kubeconfig, pool=args.threads)
    base = f"/api/v1/namespaces/{args.namespace}"
    bodies = []
    for job, procs in plan:
        if args.services:
            bodies.append(floor_service(args.namespace, job))
        bodies.extend(floor_pod(args.namespace, job, rank) for rank in range(procs))
    errors: list[str] = []

    def create(body: dict) -> None:
        try:
            client.create(f"{base}/{body['kind'].lower()}s", body)
        except Exception as e:  # noqa: BLE001 - reported
            errors.append(f"{body['kind']} {body['metadata']['name']}: {e}")

    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.time()
    with cf.ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(create, bodies))
    out = {"created": len(bodies) - len(errors), "errors": errors[:10], "submit_s": time.time() - t0,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print(json.dumps(out), flush=True)
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
