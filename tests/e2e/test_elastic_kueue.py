"""End-to-end: an elastic SPMDJob (mesh[0].minSize) under the real Kueue, on the process node with
real agents and gloo.

The operator's Workload asks for the job's largest size (mesh[0].size pods): Kueue admits that,
and every smaller size the job runs at lies within it. So a shrink and the grow back happen
inside one admission: the Workload stays admitted, nothing is requeued, and every pod (the lost
one's replacement too) is created only while it is admitted. A quota that covers only the
minimum admits nothing: the job waits, holding no pod.
"""

from __future__ import annotations

import datetime as dt

import pytest
from kubernetes import client

from devcluster import kueue as kueue_objects
from spmd_operator import names
from tests.e2e.conftest import apply, job_manifest, job_pods, job_ref, wait_job, wait_phase, wait_until

pytestmark = pytest.mark.cluster
POD_CPU = "100m"


def elastic_job(name: str, queue: str, checkpoints: str, gate: str) -> dict:
    m = job_manifest(name, [("nodes", 3), ("procs", 1)],
                     ["-m", "monarch_spmd.examples.elastic_train", "--checkpoint-dir", checkpoints, "--steps", "200",
                      "--step-seconds", "0.05"],
                     podLayout="PerHost", restartPolicy={"maxRestarts": 1, "elasticWaitSeconds": 10},
                     scheduling={"provider": "Kueue", "queue": queue})
    m["spec"]["mesh"][0]["minSize"] = 2
    pod = m["spec"]["template"]["spec"]
    pod["containers"][0]["resources"] = {"requests": {"cpu": POD_CPU, "memory": "64Mi"}}
    hold = ("import os, sys, time\n"
            "while os.environ.get('REPLACEMENT') and not os.path.exists(sys.argv[1]):\n"
            "    time.sleep(0.2)\n")
    pod.update(terminationGracePeriodSeconds=5, initContainers=[{
        "name": "hold", "image": "python:3.11-slim", "command": ["python3", "-c", hold, gate],
        "resources": {"requests": {"cpu": POD_CPU, "memory": "64Mi"}},
        "env": [{"name": "REPLACEMENT", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.labels['{names.LABEL_REPLACEMENT}']"}}}]}])
    return m


def workload(c, namespace: str, job: dict) -> dict:
    return client.CustomObjectsApi(c.api_client()).get_namespaced_custom_object(
        kueue_objects.API_GROUP, kueue_objects.API_VERSION, namespace, "workloads", names.workload_name(job_ref(job)))


def admitted_at(wl: dict) -> dt.datetime | None:
    for cond in (wl.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Admitted" and cond.get("status") == "True":
            return dt.datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00"))
    return None


def test_an_elastic_job_shrinks_and_grows_back_within_one_kueue_admission(running_operator, process_queue, namespace,
                                                                          tmp_path):
    c = running_operator
    gate = tmp_path / "replacement-may-start"
    apply(c, namespace, elastic_job("elastic", process_queue("300m", "elastic"), str(tmp_path), str(gate)))
    job = wait_phase(c, namespace, "elastic", "Running", timeout=180)
    wl = workload(c, namespace, job)
    assert wl["spec"]["podSets"][0]["count"] == 3, "the pod set is the largest size"
    since = admitted_at(wl)
    assert since is not None, wl.get("status")
    ref = job_ref(job)
    zero, lost = names.pod_name(ref, 0, 0), names.pod_name(ref, 0, 2)
    wait_until(lambda: "world 3" in c.pod_log(namespace, zero, "trainer"), 120, "training at 3 ranks")
    c.kubectl("delete", "pod", lost, "-n", namespace, "--wait=false")
    wait_job(c, namespace, "elastic", lambda j: (j["status"].get("size") or {}).get("pods") == 2, timeout=120,
             what="a round of 2 pods")
    wait_until(lambda: "world 2" in c.pod_log(namespace, zero, "trainer"), 120, "training at 2 ranks")
    assert admitted_at(workload(c, namespace, job)) == since, "the shrink kept the admission"
    gate.touch()
    job = wait_job(c, namespace, "elastic", lambda j: (j["status"].get("size") or {}).get("pods") == 3
                   and j["status"].get("restarts", 0) >= 2, timeout=180, what="grown back to 3 pods")
    wl = workload(c, namespace, job)
    assert admitted_at(wl) == since, "the grow back kept the admission: nothing requeued"
    assert not [x for x in wl["status"].get("conditions") or [] if x["type"] == "Evicted" and x["status"] == "True"]
    pods = job_pods(c, namespace, "elastic")
    assert names.pod_name(ref, 0, 2, 1) in {p.metadata.name for p in pods}
    assert all(p.metadata.creation_timestamp >= since for p in pods), "every pod created once admitted"
    wait_phase(c, namespace, "elastic", "Succeeded", timeout=240)


def test_a_quota_for_only_the_minimum_admits_nothing_and_no_pod_is_created(running_operator, process_queue,
                                                                           namespace, tmp_path):
    c = running_operator
    apply(c, namespace, elastic_job("small", process_queue("200m", "elastic"), str(tmp_path), str(tmp_path / "gate")))
    job = wait_job(c, namespace, "small", lambda j: "insufficient quota" in (j.get("status") or {}).get("message", ""),
                   timeout=90, what="Kueue's reason in the job's status")
    assert job["status"]["phase"] == "Suspended" and job["status"]["reason"] == "WaitingForAdmission"
    assert job_pods(c, namespace, "small") == [], "not one pod of an elastic job Kueue did not admit at its largest size"
