"""End-to-end: SPMDJobs applied with kubectl run on the process node as real processes.

What a user sees is what is asserted: kubectl's columns, the job's status and Events, the pods
and what each rank printed. Covers the gloo/DDP happy path on a 2x2 mesh, gang restarts by
recreating the pods (restartPolicy.mode RecreatePods: retryable once, always failing, a pod
deleted from under a running job), a permanent exit code, deletion by garbage collection,
suspend and resume. Restarts in place: test_restart_in_place.py.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from spmd_operator import names
from tests.e2e.conftest import (PROBE, apply, get_job, job_events, job_manifest, job_pods, job_ref,
                                pod_names, probe_lines, wait_job, wait_phase, wait_until)

pytestmark = pytest.mark.cluster
RANK = "spmd.monarch.dev/rank"
RESTART = "spmd.monarch.dev/restart"


def test_mesh_2x2_runs_gloo_all_reduce_and_ddp_then_succeeds(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("hello", [("hosts", 2), ("gpus", 2)], [PROBE]))
    job = wait_phase(c, namespace, "hello", "Succeeded", timeout=300)

    status = job["status"]
    assert (status["procs"], status["mesh"], status["restarts"]) == (4, "hosts=2,gpus=2", 0)
    # Succeeded on the gang's own word (every rank exited 0): each pod's phase follows as its worker ends.
    pods = wait_until(lambda: (found := job_pods(c, namespace, "hello"))
                      and all(p.status.phase == "Succeeded" for p in found) and found, 60, "every pod Succeeded")
    assert sorted(p.metadata.name for p in pods) == pod_names(job, 0, 4)
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 4 and None not in ips, ips
    rank0_ip = next(p.status.pod_ip for p in pods if p.metadata.labels[RANK] == "0")
    for pod in pods:
        assert pod.status.phase == "Succeeded"
        log = c.pod_log(namespace, pod.metadata.name)
        (seen,) = probe_lines(log, "PROBE")
        assert seen["RANK"] == pod.metadata.labels[RANK]
        assert seen["WORLD_SIZE"] == "4" and seen["LOCAL_WORLD_SIZE"] == "2"
        assert seen["MASTER_ADDR"] == names.master_addr(job_ref(job), 0) == status["masterAddr"]
        assert seen["master_ip"] == rank0_ip, (pod.metadata.name, seen)
        assert seen["POD_IP"] == pod.status.pod_ip
        (result,) = probe_lines(log, "RESULT")
        assert result == {"sum": 10.0, "expected": 10.0, "grads_agree": True}

    table = c.kubectl("get", "spmdjob", "hello", "-n", namespace).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert header[:6] == ["NAME", "MESH", "PROCS", "RUNNING", "PHASE", "RESTARTS"], header
    assert row[:3] == ["hello", "hosts=2,gpus=2", "4"] and row[4:6] == ["Succeeded", "0"], row
    events = job_events(c, namespace, "hello")
    reasons = [e.reason for e in events]
    for expected in ("Created", "Running", "Succeeded"):
        assert expected in reasons, reasons
    assert {e.source.component for e in events} == {"spmdjob-operator"}
    conditions = {cond["type"]: cond["status"] for cond in status["conditions"]}
    assert conditions.get("Succeeded") == "True", status["conditions"]


def test_rank_failing_once_restarts_the_whole_gang_then_succeeds(running_operator, namespace):
    c = running_operator
    args = ["-m", "tests.programs.fail_once", "--rank", "1", "--code", "3", "--sleep", "1"]
    apply(c, namespace, job_manifest("flaky", [("procs", 2)], args,
                                     restartPolicy={"maxRestarts": 2, "mode": "RecreatePods"}))
    job = wait_phase(c, namespace, "flaky", "Succeeded", timeout=240)
    assert job["status"]["restarts"] == 1
    pods = job_pods(c, namespace, "flaky")
    assert {p.metadata.labels[RESTART] for p in pods} <= {"0", "1"}
    second = sorted(p.metadata.name for p in pods if p.metadata.labels[RESTART] == "1")
    assert second == pod_names(job, 1, 2)
    assert "restart 1" in c.pod_log(namespace, second[1])
    assert "Restarting" in [e.reason for e in job_events(c, namespace, "flaky")]


def test_rank_always_failing_fails_after_the_limit_with_its_root_cause(running_operator, namespace):
    c = running_operator
    args = ["-m", "tests.programs.fail_once", "--rank", "1", "--code", "7", "--always"]
    apply(c, namespace, job_manifest("doomed", [("procs", 2)], args,
                                     restartPolicy={"maxRestarts": 1, "mode": "RecreatePods"}))
    job = wait_phase(c, namespace, "doomed", "Failed", timeout=240)
    status = job["status"]
    assert status["restarts"] == 1
    failure = status["failure"]
    assert failure["rank"] == 1 and failure["exitCode"] == 7, failure
    assert failure["pod"] == pod_names(job, 1, 2)[1], failure
    assert failure["node"] == "proc-node-0"
    assert "rank 1/2" in failure["message"], failure  # the last lines of its stderr
    row = c.kubectl("get", "spmdjob", "doomed", "-n", namespace, "--no-headers").stdout.split()
    assert "Failed" in row


def test_permanent_exit_code_fails_without_restarting(running_operator, namespace):
    c = running_operator
    args = ["-m", "tests.programs.fail_once", "--rank", "0", "--code", "42"]
    apply(c, namespace, job_manifest("fatal", [("procs", 2)], args,
                                     restartPolicy={"maxRestarts": 3, "permanentExitCodes": [42]}))
    job = wait_phase(c, namespace, "fatal", "Failed", timeout=180)
    assert job["status"]["restarts"] == 0
    assert job["status"]["failure"]["exitCode"] == 42
    assert all(p.metadata.labels[RESTART] == "0" for p in job_pods(c, namespace, "fatal"))


def test_deleting_the_job_garbage_collects_pods_service_and_configmap(running_operator, namespace):
    c = running_operator
    args = ["-m", "tests.programs.fail_once", "--rank", "9", "--sleep", "300"]
    apply(c, namespace, job_manifest("sleepy", [("procs", 2)], args))
    wait_phase(c, namespace, "sleepy", "Running", timeout=120)
    core = client.CoreV1Api(c.api_client())
    service = names.service_name(job_ref(get_job(c, namespace, "sleepy")), 0)
    assert core.read_namespaced_service(service, namespace).spec.cluster_ip == "None"
    c.kubectl("delete", "spmdjob", "sleepy", "-n", namespace, "--wait=true", timeout=120)

    def gone() -> bool:
        sel = "spmd.monarch.dev/job=sleepy"
        return not (core.list_namespaced_pod(namespace, label_selector=sel).items
                    or core.list_namespaced_service(namespace, label_selector=sel).items
                    or core.list_namespaced_config_map(namespace, label_selector=sel).items)

    wait_until(gone, 120, "pods, service and configmap of the deleted job removed")


def test_suspend_deletes_pods_and_resume_recreates_them(running_operator, namespace):
    c = running_operator
    args = ["-m", "tests.programs.fail_once", "--rank", "9", "--sleep", "300"]
    apply(c, namespace, job_manifest("pausable", [("procs", 2)], args))
    wait_phase(c, namespace, "pausable", "Running", timeout=120)
    c.kubectl("patch", "spmdjob", "pausable", "-n", namespace, "--type=merge",
              "-p", '{"spec":{"suspend":true}}')
    wait_phase(c, namespace, "pausable", "Suspended", timeout=120)
    wait_until(lambda: not job_pods(c, namespace, "pausable"), 120, "pods of the suspended job deleted")
    c.kubectl("patch", "spmdjob", "pausable", "-n", namespace, "--type=merge",
              "-p", '{"spec":{"suspend":false}}')
    job = wait_phase(c, namespace, "pausable", "Running", timeout=120)
    assert job["status"]["running"] == 2
    assert len(job_pods(c, namespace, "pausable")) == 2
    reasons = [e.reason for e in job_events(c, namespace, "pausable")]
    assert "Suspended" in reasons and "Resumed" in reasons, reasons
    c.kubectl("delete", "spmdjob", "pausable", "-n", namespace, "--wait=false")


def test_pod_deleted_from_under_a_running_job_restarts_the_gang(running_operator, namespace):
    c = running_operator
    args = ["-m", "tests.programs.fail_once", "--rank", "9", "--sleep", "300"]
    apply(c, namespace, job_manifest("victim", [("procs", 2)], args,
                                     restartPolicy={"maxRestarts": 2, "mode": "RecreatePods"}))
    first = wait_phase(c, namespace, "victim", "Running", timeout=120)
    victim = names.pod_name(job_ref(first), 0, 1)
    c.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
    job = wait_job(c, namespace, "victim",
                   lambda j: j["status"].get("restarts") == 1 and j["status"].get("phase") == "Running",
                   timeout=180, what="restarts 1 and Running again")
    second = sorted(p.metadata.name for p in job_pods(c, namespace, "victim")
                    if p.metadata.labels[RESTART] == "1")
    assert second == pod_names(job, 1, 2)
    assert job["status"]["failure"]["pod"] == victim
    assert get_job(c, namespace, "victim")["status"]["phase"] == "Running"
    c.kubectl("delete", "spmdjob", "victim", "-n", namespace, "--wait=false")


def test_active_deadline_fails_the_job_and_stops_its_pods(running_operator, namespace):
    c = running_operator
    args = ["-m", "tests.programs.fail_once", "--rank", "9", "--sleep", "300"]
    apply(c, namespace, job_manifest("late", [("procs", 2)], args, activeDeadlineSeconds=5))
    job = wait_phase(c, namespace, "late", "Failed", timeout=120)
    assert job["status"]["failure"]["reason"] == "DeadlineExceeded", job["status"]["failure"]
    wait_until(lambda: all(p.metadata.deletion_timestamp or p.status.phase in ("Succeeded", "Failed")
                           for p in job_pods(c, namespace, "late")),
               60, "the finished job's pods stopped")


def test_ttl_after_finished_deletes_the_job(running_operator, namespace):
    c = running_operator
    args = ["-m", "tests.programs.fail_once", "--rank", "9"]
    apply(c, namespace, job_manifest("brief", [("procs", 2)], args, ttlSecondsAfterFinished=2))
    wait_phase(c, namespace, "brief", "Succeeded", timeout=120)
    api = client.CustomObjectsApi(c.api_client())

    def deleted() -> bool:
        jobs = [j["metadata"]["name"] for j in api.list_namespaced_custom_object(
            "spmd.monarch.dev", "v1alpha1", namespace, "spmdjobs")["items"]]
        return "brief" not in jobs

    wait_until(deleted, 60, "the finished job deleted after its TTL")
    wait_until(lambda: not job_pods(c, namespace, "brief"), 60, "its pods garbage-collected")
