"""End-to-end: gang scheduling on the real control plane with kwok nodes.

Kueue (built from the Go module proxy, tests/conftest.py's kueue fixtures) admits whole SPMDJobs
on quota: a gang larger than the quota never starts a pod, where without Kueue the scheduler binds
as many pods as fit and the rest wait forever; two gangs competing for one quota run one after the
other. For Volcano and scheduler-plugins' coscheduling, which are not run here, the PodGroups the
operator writes are checked by the real API server against those projects' published CRD schemas
(tests/data/crds), and the pods carry what each scheduler needs to join their group.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from kubernetes import client

from devcluster import KWOK_TOLERATION
from devcluster.kwoknodes import fake_node
from spmd_operator import builders, names
from tests.e2e.conftest import (apply, get_job, job_events, job_manifest, job_pods, job_ref, wait_job,
                                wait_phase, wait_until)

pytestmark = pytest.mark.cluster
CPU = {"resources": {"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}}}


def kwok_job(name, procs, **spec):
    manifest = job_manifest(name, [("procs", procs)], ["-m", "train"], kwok=True, **spec)
    manifest["spec"]["template"]["spec"]["containers"] = [{"name": "trainer", **CPU}]
    return manifest


def finish(c, namespace, name):
    """kwok keeps pods Running; the test plays the program that exits 0 on every rank."""
    core = client.CoreV1Api(c.api_client())
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for pod in job_pods(c, namespace, name):
        terminated = {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
        core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "trainer", "image": "img", "imageID": "", "ready": False, "restartCount": 0,
                                   "state": {"terminated": terminated}}]}})


def fail(c, namespace, pod):
    """Plays a rank that exits 1."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    client.CoreV1Api(c.api_client()).patch_namespaced_pod_status(pod, namespace, {"status": {
        "phase": "Failed",
        "containerStatuses": [{"name": "trainer", "image": "img", "imageID": "", "ready": False, "restartCount": 0,
                               "state": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now,
                                                        "finishedAt": now}}}]}})


def test_a_gang_larger_than_its_kueue_quota_never_starts_a_pod(running_operator, kueue_queues, namespace):
    c = running_operator
    queue = kueue_queues.create(cpu=48, memory="64Gi")
    apply(c, namespace, kwok_job("toobig", 64, scheduling={"provider": "Kueue", "queue": queue}))
    job = wait_job(c, namespace, "toobig", lambda j: "insufficient quota" in j.get("status", {}).get("message", ""),
                   timeout=60, what="Kueue's reason in the job's status")
    assert job["status"]["phase"] == "Suspended" and job["status"]["reason"] == "WaitingForAdmission"
    time.sleep(5)
    assert job_pods(c, namespace, "toobig") == [], "not one pod of a gang Kueue did not admit"
    row = c.kubectl("get", "spmdjob", "toobig", "-n", namespace, "-o", "wide", "--no-headers").stdout
    assert "WaitingForAdmission" in row and "insufficient quota" in row, row


def test_without_a_gang_admission_the_scheduler_binds_what_fits_and_the_rest_waits(running_operator, namespace):
    c = running_operator
    core = client.CoreV1Api(c.api_client())
    node = f"kwok-48-{uuid.uuid4().hex[:6]}"
    core.create_node(fake_node(node, cpu="48", memory="64Gi", pods=200, gpus=0))
    try:
        manifest = kwok_job("nogang", 64)
        manifest["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        apply(c, namespace, manifest)
        job = wait_job(c, namespace, "nogang", lambda j: j.get("status", {}).get("running") == 48, timeout=120,
                       what="48 of 64 procs running")
        assert job["status"]["phase"] == "Pending"
        assert job["status"]["reason"] == "Unschedulable" and "Insufficient cpu" in job["status"]["message"]
        assert ("Warning", "Unschedulable") in [(e.type, e.reason) for e in job_events(c, namespace, "nogang")]
    finally:
        c.kubectl("delete", "spmdjob", "nogang", "-n", namespace, "--wait=false")
        core.delete_node(node)


def test_two_gangs_competing_for_one_quota_run_one_after_the_other(running_operator, kueue_queues, namespace):
    c = running_operator
    queue = kueue_queues.create(cpu=48, memory="64Gi")
    kueue = {"provider": "Kueue", "queue": queue}
    apply(c, namespace, kwok_job("first", 32, scheduling=kueue))
    time.sleep(1.2)  # Kueue orders a queue by creation time, to the second
    apply(c, namespace, kwok_job("second", 32, scheduling=kueue))
    both = []
    stop = threading.Event()

    def active(name):  # a finished job keeps its finished pods for their logs
        return [p for p in job_pods(c, namespace, name) if p.status.phase not in ("Succeeded", "Failed")]

    def watch():
        while not stop.is_set():
            if active("first") and active("second"):
                both.append(time.monotonic())
            time.sleep(0.3)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        wait_phase(c, namespace, "first", "Running", timeout=120)
        # The second job's first pass may still be on its way (a busy operator, CI's long-lived cluster):
        # its status is waited for, then it must hold no pod while the first runs.
        second = wait_phase(c, namespace, "second", "Suspended", timeout=60)
        assert second["status"]["reason"] == "WaitingForAdmission", second["status"]
        assert not job_pods(c, namespace, "second")
        finish(c, namespace, "first")
        wait_phase(c, namespace, "first", "Succeeded", timeout=60)
        wait_phase(c, namespace, "second", "Running", timeout=120)
        finish(c, namespace, "second")
        wait_phase(c, namespace, "second", "Succeeded", timeout=60)
    finally:
        stop.set()
        thread.join(5)
    assert not both, "pods of both gangs ran at once"
    reasons = [e.reason for e in job_events(c, namespace, "second")]
    assert "WaitingForAdmission" in reasons and "Admitted" in reasons, reasons


@pytest.mark.parametrize("provider", ["Volcano", "Coscheduling"])
def test_each_attempt_gets_a_podgroup_the_real_schema_accepts(running_operator, podgroup_crds, namespace, provider):
    c = running_operator
    spec = {"provider": provider, "timeoutSeconds": 600}
    if provider == "Volcano":
        spec["queue"] = "training"
    manifest = kwok_job("grouped", 6, scheduling=spec, restartPolicy={"maxRestarts": 2})
    manifest["spec"]["template"]["spec"]["priorityClassName"] = "system-cluster-critical"
    apply(c, namespace, manifest)
    group_api = builders.PODGROUP_APIS[provider]
    custom = client.CustomObjectsApi(c.api_client())

    def group(restart):
        job = get_job(c, namespace, "grouped")
        try:
            return custom.get_namespaced_custom_object(*group_api[:2], namespace, group_api[2],
                                                       names.podgroup_name(job_ref(job), restart))
        except client.ApiException:
            return None

    pg = wait_until(lambda: group(0), 60, "the PodGroup of attempt 0")
    assert pg["spec"]["minMember"] == 6
    if provider == "Volcano":
        assert (pg["spec"]["queue"], pg["spec"]["priorityClassName"]) == ("training", "system-cluster-critical")
    else:
        assert pg["spec"]["scheduleTimeoutSeconds"] == 600
    assert pg["metadata"]["ownerReferences"][0]["uid"] == get_job(c, namespace, "grouped")["metadata"]["uid"]
    pods = wait_until(lambda: len(job_pods(c, namespace, "grouped")) == 6 and job_pods(c, namespace, "grouped"), 60,
                      "the pods")
    for pod in pods:
        assert pod.spec.scheduler_name == builders.scheduler_name(get_job_spec(c, namespace))
        if provider == "Volcano":
            assert pod.metadata.annotations[builders.VOLCANO_GROUP_ANNOTATION] == pg["metadata"]["name"]
        else:
            assert pod.metadata.labels[builders.COSCHEDULING_GROUP_LABEL] == pg["metadata"]["name"]
    # No such scheduler runs here: the pods wait, and the job says so.
    assert get_job(c, namespace, "grouped")["status"]["phase"] == "Pending"
    # A PodGroup deleted by hand comes back; a new attempt gets its own and the old one goes.
    custom.delete_namespaced_custom_object(*group_api[:2], namespace, group_api[2], pg["metadata"]["name"])
    wait_until(lambda: (g := group(0)) and g["metadata"]["uid"] != pg["metadata"]["uid"], 30, "the PodGroup repaired")
    fail(c, namespace, pods[0].metadata.name)  # a rank fails: the gang is replaced
    wait_until(lambda: group(1), 60, "the PodGroup of attempt 1")
    wait_until(lambda: group(0) is None, 60, "the PodGroup of attempt 0 deleted")


def get_job_spec(c, namespace):
    from monarch_spmd.spec import parse_job_spec

    return parse_job_spec(get_job(c, namespace, "grouped")["spec"], require_image=True)
