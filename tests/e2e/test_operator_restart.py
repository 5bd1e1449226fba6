"""End-to-end: the operator killed (SIGKILL) and started again, under running jobs and in the
middle of creating one.

Restarts are invisible to running jobs: a Kueue job (real Kueue), a PodGroup job and a plain job
keep their pods (same uids), phase and restart count across a SIGKILL and a new start, whose
first passes must not act on informers that have not listed yet.

Killed in the middle of creating a 64-proc job (one request at a time, over a slow path to the
API server: a proxy that holds each request 50 ms, so creation lasts seconds and is interrupted
whatever the machine's speed), deterministic pod names and 409-tolerant creation must leave
exactly one pod per proc: no duplicates, no orphans, and the job reaches Running.

Started afresh to give memory back (``--memory-recycle-factor``, set here to fire on any growth):
once most of its jobs are deleted the operator replaces its process (exec: same pid, same Lease
holder); the job that stays keeps its pods, phase, restart count and Events, and the new process
leads again at once (a job submitted after it runs).

The jobs' pods go to kwok nodes (simulated, no processes).
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import pytest

from devcluster.controlplane import stop_process_group
from devcluster.localcluster import StallableProxy
from tests.e2e import survival
from tests.e2e.conftest import (RESYNC_SECONDS, apply, free_port, get_job, job_events, job_manifest, job_pods,
                                operator_args, pod_names, wait_phase, wait_until)
from tests.e2e.test_leader_fencing import holder

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


def test_the_operator_started_afresh_to_give_memory_back_leaves_the_remaining_job_alone(operator, namespace):
    c = operator
    c.stop_operator()
    metrics_port = free_port()
    # Its own namespace only: it waits for the children of every deleted job it sees to go, and
    # the module's earlier tests leave theirs to the garbage collector (on a loaded machine they
    # were still there after the 120 s this test waits, and it never started afresh).
    proc = c.start_replica("recycler", "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1",
                           "--resync-seconds", str(RESYNC_SECONDS), "--metrics-port", str(metrics_port),
                           "--memory-recycle-factor", "0.01", "--memory-recycle-min-mib", "0",
                           lease_namespace=namespace, scope=(f"--namespace={namespace}",))
    log = c.state_dir / "operator-recycler.log"

    def recycles() -> float | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        return next(float(line.split()[1]) for line in text.splitlines() if line.startswith("spmdjob_memory_recycles "))

    try:
        gone = [f"gone-{i}" for i in range(7)]
        for name in [*gone, "stays"]:
            apply(c, namespace, job_manifest(name, [("procs", 2)], ["-m", "train"], kwok=True))
        for name in [*gone, "stays"]:
            wait_phase(c, namespace, name, "Running", timeout=180)
        assert holder(c, namespace) == "recycler"
        assert recycles() == 0
        job = get_job(c, namespace, "stays")
        before = (job["status"]["phase"], job["status"]["restarts"],
                  {p.metadata.name: p.metadata.uid for p in job_pods(c, namespace, "stays")})
        reasons = [e.reason for e in job_events(c, namespace, "stays")]
        offset = log.stat().st_size
        c.kubectl("delete", "spmdjob", *gone, "-n", namespace, "--wait=false")
        # A factor under 1 with no least excess: what 8 small jobs leave is a few MiB, and a trim can
        # take the process under its start; the jobs that went (and their children gone) decide.
        try:
            wait_until(lambda: "starts afresh" in log.read_text()[offset:], 120,
                       "the operator started afresh once 7 of its 8 jobs went")
        except AssertionError as e:
            said = [line for line in log.read_text()[offset:].splitlines() if "memory:" in line]
            raise AssertionError(f"{e}; what the operator said of its memory:\n" + "\n".join(said[-10:])) from None
        afresh = time.monotonic()
        wait_until(lambda: recycles() == 1, 60, "the new process serves its metrics, counting one recycle")
        assert proc.poll() is None, "the same process (exec), not an exit"
        print(f"metrics served again {time.monotonic() - afresh:.1f} s after the log line")
        assert "starts afresh" not in log.read_text()[offset:].split("starts afresh", 1)[1], "once, not in a loop"
        assert holder(c, namespace) == "recycler", "the Lease kept its holder"
        # Two resync periods of the new process's passes: nothing about the job that stays moves.
        deadline = time.monotonic() + 2 * RESYNC_SECONDS + 5
        while time.monotonic() < deadline:
            job = get_job(c, namespace, "stays")
            now = (job["status"]["phase"], job["status"]["restarts"],
                   {p.metadata.name: p.metadata.uid for p in job_pods(c, namespace, "stays")})
            assert now == before, f"the job that stays was disturbed:\nbefore {before}\nafter  {now}"
            time.sleep(1.0)
        assert [e.reason for e in job_events(c, namespace, "stays")] == reasons, "no new Events"
        apply(c, namespace, job_manifest("after", [("procs", 2)], ["-m", "train"], kwok=True))
        wait_phase(c, namespace, "after", "Running", timeout=120)
        assert proc.poll() is None
    finally:
        stop_process_group(proc, 10)
        c.start_operator(*operator_args())
