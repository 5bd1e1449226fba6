"""Kueue's admission of Workloads, on the real control plane with the real Kueue (no operator).

What the operator does for an SPMDJob in a Kueue queue, done here by hand: create one Workload
(kueue.x-k8s.io/v1beta2) with `spec.queueName` and one podSet whose `count` is the job's pod count
and whose template carries the pods' requests, owned by the job. Kueue reserves quota for the
whole gang at once or not at all; these tests watch the Workload's status as the operator will:
`status.admission` and the conditions QuotaReserved, Admitted, Evicted, Finished. The quota is
on the flavor of the kwok nodes (KWOK_FLAVOR), as the fixtures in tests/conftest.py make it.
docs/kueue.md says what an operator must do with each signal.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from devcluster import KWOK_TOLERATION, LocalCluster
from devcluster.kueue import API_GROUP, API_VERSION
from tests.conftest import KWOK_FLAVOR, KueueQueues

pytestmark = pytest.mark.cluster

#: How long a Workload that must stay pending is watched.
PENDING_SECONDS = 5


def workload(name: str, namespace: str, queue: str, count: int, *, cpu: str = "1",
             gpus: int = 0, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Workload the operator creates for a job of `count` pods, each with these requests."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    body: dict[str, Any] = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "queueName": queue,
            "podSets": [{
                "name": "main",
                "count": count,
                "template": {"spec": {
                    "restartPolicy": "Never",
                    "tolerations": [KWOK_TOLERATION],
                    "containers": [{"name": "trainer", "image": "python:3.11",
                                    "resources": resources}],
                }},
            }],
        },
    }
    if owner:
        body["metadata"]["ownerReferences"] = [{
            "apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}]
    return body


class Workloads:
    """Workloads of one namespace through the API server, as the operator sees them."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        self.api = client.CustomObjectsApi(cluster.api_client())
        self.core = client.CoreV1Api(cluster.api_client())
        self.namespace = namespace

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.api.create_namespaced_custom_object(API_GROUP, API_VERSION, self.namespace,
                                                        "workloads", body)

    def get(self, name: str) -> dict[str, Any]:
        return self.api.get_namespaced_custom_object(API_GROUP, API_VERSION, self.namespace,
                                                     "workloads", name)

    def exists(self, name: str) -> bool:
        try:
            self.get(name)
            return True
        except client.ApiException as err:
            if err.status == 404:
                return False
            raise

    def patch_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return self.api.patch_namespaced_custom_object_status(
            API_GROUP, API_VERSION, self.namespace, "workloads", name, {"status": status})

    def patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.api.patch_namespaced_custom_object(API_GROUP, API_VERSION, self.namespace,
                                                       "workloads", name, body)

    def owner(self, name: str) -> dict[str, Any]:
        """A stand-in for the SPMDJob that owns a Workload: any object the garbage collector
        follows does (the operator's owner reference names its SPMDJob)."""
        made = self.core.create_namespaced_config_map(
            self.namespace, {"metadata": {"name": name}, "data": {"stands-for": "SPMDJob"}})
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "uid": made.metadata.uid}}

    def wait(self, name: str, what: str, predicate: Callable[[dict[str, Any]], bool],
             timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            wl = self.get(name)
            if predicate(wl):
                return wl
            if time.monotonic() > deadline:
                raise AssertionError(f"workload {name} not {what} after {timeout}s: "
                                     f"{wl.get('status')}")
            time.sleep(0.2)

    def wait_admitted(self, name: str) -> dict[str, Any]:
        return self.wait(name, "admitted", admitted)


def condition(wl: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in wl.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def is_true(wl: dict[str, Any], kind: str) -> bool:
    cond = condition(wl, kind)
    return cond is not None and cond["status"] == "True"


def admitted(wl: dict[str, Any]) -> bool:
    """Kueue's admission as an operator tests it: Admitted=True (quota reserved and every
    admission check passed) and status.admission present."""
    return is_true(wl, "Admitted") and "admission" in wl.get("status", {})


def pending(wl: dict[str, Any]) -> bool:
    """Waiting for quota: QuotaReserved=False with reason Pending, no status.admission."""
    cond = condition(wl, "QuotaReserved")
    return (cond is not None and cond["status"] == "False" and cond["reason"] == "Pending"
            and "admission" not in wl.get("status", {}))


def assert_stays_pending(workloads: Workloads, name: str) -> dict[str, Any]:
    wl = workloads.wait(name, "pending", pending)
    deadline = time.monotonic() + PENDING_SECONDS
    while time.monotonic() < deadline:
        wl = workloads.get(name)
        assert pending(wl) and not is_true(wl, "Admitted"), wl.get("status")
        time.sleep(0.5)
    return wl


@pytest.fixture
def workloads(kueue_cluster: LocalCluster, namespace: str) -> Workloads:
    return Workloads(kueue_cluster, namespace)


def test_gang_admitted_whole_when_quota_allows(workloads: Workloads,
                                               kueue_queues: KueueQueues) -> None:
    queue = kueue_queues.create(cpu="8", gpus=8)
    ns = workloads.namespace
    workloads.create(workload("job-a", ns, queue, 4, cpu="2", gpus=2,
                              owner=workloads.owner("job-a")))

    wl = workloads.wait_admitted("job-a")

    assert is_true(wl, "QuotaReserved")
    admission = wl["status"]["admission"]
    assert admission["clusterQueue"] == queue
    [assignment] = admission["podSetAssignments"]
    assert assignment["name"] == "main"
    assert assignment["count"] == 4
    assert assignment["flavors"] == {"cpu": KWOK_FLAVOR, "memory": KWOK_FLAVOR,
                                     "nvidia.com/gpu": KWOK_FLAVOR}
    # resourceUsage is the whole gang's: count x per-pod requests.
    assert assignment["resourceUsage"]["nvidia.com/gpu"] == "8"
    assert assignment["resourceUsage"]["cpu"] == "8"


def test_gang_pending_when_quota_short(workloads: Workloads, kueue_queues: KueueQueues) -> None:
    """4 pods x 1 GPU in a queue of 3 GPUs: nothing is admitted, not even 3 of the 4 pods."""
    queue = kueue_queues.create(cpu="64", gpus=3)
    ns = workloads.namespace
    workloads.create(workload("big", ns, queue, 4, gpus=1))

    wl = assert_stays_pending(workloads, "big")

    assert "insufficient" in condition(wl, "QuotaReserved")["message"]


def test_competing_gangs_admitted_one_after_the_other(workloads: Workloads,
                                                      kueue_queues: KueueQueues) -> None:
    """Three gangs that each need the whole quota: the second is admitted when the first is
    marked Finished, the third when the second is deleted (with its owner, by the GC)."""
    queue = kueue_queues.create(cpu="16", gpus=4)
    ns = workloads.namespace
    for name in ("first", "second", "third"):
        workloads.create(workload(name, ns, queue, 4, gpus=1, owner=workloads.owner(name)))
        # Kueue queues in order of creationTimestamp, which has a resolution of one second:
        # two Workloads created within the same second may be admitted in either order.
        time.sleep(1.1)
    workloads.wait_admitted("first")
    assert_stays_pending(workloads, "second")
    assert pending(workloads.get("third"))

    # The job ended: its controller sets Finished on the Workload; Kueue releases the quota.
    finished = {"type": "Finished", "status": "True", "reason": "Succeeded",
                "message": "all ranks exited 0",
                "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    conditions = [c for c in workloads.get("first")["status"]["conditions"]]
    workloads.patch_status("first", {"conditions": conditions + [finished]})
    workloads.wait_admitted("second")
    assert_stays_pending(workloads, "third")
    first = workloads.get("first")
    assert is_true(first, "Finished")

    # The job is deleted: the garbage collector deletes its Workload; Kueue releases the quota.
    client.CoreV1Api(workloads.api.api_client).delete_namespaced_config_map(
        "second", ns, propagation_policy="Foreground")
    workloads.wait_admitted("third")
    assert not workloads.exists("second")


def test_preempted_gang_waits_for_its_controller_to_release_quota(
        workloads: Workloads, kueue_queues: KueueQueues) -> None:
    """A higher-priority gang evicts an admitted one: Kueue sets Evicted (reason Preempted) and
    Preempted on the victim but keeps its quota reserved until the victim's controller, having
    stopped its pods, clears status.admission; then the preemptor is admitted."""
    queue = kueue_queues.create(cpu="16", gpus=4,
                                preemption={"withinClusterQueue": "LowerPriority"})
    ns = workloads.namespace
    low = workload("low", ns, queue, 4, gpus=1)
    low["spec"]["priority"] = 0
    workloads.create(low)
    workloads.wait_admitted("low")
    high = workload("high", ns, queue, 4, gpus=1)
    high["spec"]["priority"] = 100
    workloads.create(high)

    victim = workloads.wait("low", "evicted", lambda w: is_true(w, "Evicted"))
    assert condition(victim, "Evicted")["reason"] == "Preempted"
    assert is_true(victim, "Preempted")
    # Kueue does not touch pods: until the controller says the gang stopped, the quota stays
    # with the victim and the preemptor waits.
    time.sleep(PENDING_SECONDS)
    victim = workloads.get("low")
    assert is_true(victim, "QuotaReserved") and "admission" in victim["status"]
    assert not admitted(workloads.get("high"))

    # What the job's controller does once every pod of the victim is gone (as Kueue's own job
    # integrations do): QuotaReserved=False reason Pending, Admitted=False, no admission,
    # Requeued=True (reason Preempted) so it queues again.
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    released = {"QuotaReserved": ("False", "Pending"), "Admitted": ("False", "NoReservation"),
                "Requeued": ("True", "Preempted")}
    conditions = [c for c in victim["status"]["conditions"] if c["type"] not in released]
    conditions += [{"type": kind, "status": status, "reason": reason, "lastTransitionTime": now,
                    "message": "the gang's pods were stopped"}
                   for kind, (status, reason) in released.items()]
    workloads.patch_status("low", {"conditions": conditions, "admission": None})

    workloads.wait_admitted("high")
    assert_stays_pending(workloads, "low")


def test_kueue_webhook_refuses_what_the_schema_allows(workloads: Workloads,
                                                      kueue_queues: KueueQueues) -> None:
    """Kueue's own validation runs (its webhook): `pods` is reserved in container requests."""
    queue = kueue_queues.create()
    body = workload(f"bad-{uuid.uuid4().hex[:6]}", workloads.namespace, queue, 1)
    body["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"][
        "pods"] = "1"

    with pytest.raises(client.ApiException) as refused:
        workloads.create(body)

    # A webhook's denial is a 403 naming the webhook (a schema's would be a 422).
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert 'admission webhook "vworkload.kb.io" denied the request' in message
    assert "reserved for internal kueue use" in message
