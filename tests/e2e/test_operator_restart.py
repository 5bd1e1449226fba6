"""End-to-end: the operator killed (SIGKILL) and started again, under running jobs and in the
middle of creating one.

Restarts are invisible to running jobs: a Kueue job (real Kueue), a PodGroup job and a plain job
keep their pods (same uids), phase and restart count across a SIGKILL and a new start, whose
first passes must not act on informers that have not listed yet.

Killed in the middle of creating a 64-proc job (one request at a time, over a slow path to the
API server: a proxy that holds each request 50 ms, so creation lasts seconds and is interrupted
whatever the machine's speed), deterministic pod names and 409-tolerant creation must leave
exactly one pod per proc: no duplicates, no orphans, and the job reaches Running.

The jobs' pods go to kwok nodes (simulated, no processes).
"""

from __future__ import annotations

import os
import signal

import pytest

from devcluster.localcluster import StallableProxy
from tests.e2e import survival
from tests.e2e.conftest import (RESYNC_SECONDS, apply, job_manifest, job_pods, operator_args, pod_names, wait_phase,
                                wait_until)

pytestmark = pytest.mark.cluster
PROCS = 64


def test_running_jobs_keep_their_pods_when_the_operator_is_killed_and_started_again(
        running_operator, kueue_queues, podgroup_crds, namespace):
    c = running_operator
    before = survival.start_jobs(c, namespace, kueue_queues.create(cpu="4"))
    seen = survival.reasons(c, namespace)
    os.killpg(c.operator_process.pid, signal.SIGKILL)
    c.operator_process.wait(timeout=30)
    c.operator_process = None
    c.start_operator(*operator_args())
    # Its first passes, then two resync periods of passes from the caches.
    survival.watch_unchanged(c, namespace, before, seconds=2 * RESYNC_SECONDS + 5)
    after = survival.reasons(c, namespace)
    for name in survival.JOBS:
        new = after[name][len(seen[name]):]
        assert after[name][:len(seen[name])] == seen[name] and new == [], f"{name}: new Events {new}"


def test_operator_killed_mid_creation_leaves_exactly_one_pod_per_proc(operator, namespace):
    c = operator
    c.stop_operator()
    apply(c, namespace, job_manifest("big", [("hosts", 8), ("gpus", 8)], ["-m", "train"], kwok=True))
    proxy = StallableProxy(c.control_plane.api_port)
    proxy.slow(0.05)
    proc = c.start_operator(*operator_args(), "--concurrency", "1",
                            kubeconfig=c.kubeconfig_for("slow-operator", proxy.port))
    try:
        wait_until(lambda: len(job_pods(c, namespace, "big")) >= 8, 120,
                   "the operator started creating pods")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        at_kill = len(job_pods(c, namespace, "big"))
        print(f"pods when the operator was killed: {at_kill} of {PROCS}")
        assert at_kill < PROCS, "creation finished before the kill; the test proved nothing"
    finally:
        c.operator_process = None
        proxy.close()
        c.start_operator(*operator_args())

    job = wait_phase(c, namespace, "big", "Running", timeout=240)
    pods = job_pods(c, namespace, "big")
    names = [p.metadata.name for p in pods]
    assert sorted(names) == pod_names(job, 0, PROCS), names
    uid = job["metadata"]["uid"]
    for pod in pods:
        owners = pod.metadata.owner_references or []
        assert [(o.uid, o.controller) for o in owners] == [(uid, True)], pod.metadata.name
        assert pod.spec.node_name and pod.spec.node_name.startswith("kwok")
    assert job["status"]["procs"] == PROCS and job["status"]["restarts"] == 0
    all_pods = c.kubectl("get", "pods", "-n", namespace, "--no-headers").stdout.splitlines()
    assert len(all_pods) == PROCS, "an orphan pod exists"
    c.kubectl("delete", "spmdjob", "big", "-n", namespace, "--wait=false")
