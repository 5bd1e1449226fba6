"""Pod and child summaries (lifecycle.model): what the policies read of an API object."""

from __future__ import annotations

from spmd_operator import lifecycle
from spmd_operator.lifecycle import PodInfo

from .helpers import T0


def pod_body(phase="Running", terminated=None, waiting=None, reason=None, deleting=False, labels=None, conditions=()):
    state = {"terminated": terminated} if terminated else {"waiting": waiting} if waiting else {"running": {}}
    body = {
        "metadata": {"name": "hello-3fa9c-r1-2", "labels": labels if labels is not None else {
            "spmd.monarch.dev/job": "hello", "spmd.monarch.dev/rank": "2", "spmd.monarch.dev/restart": "1"}},
        "spec": {"nodeName": "n7"},
        "status": {"phase": phase, "conditions": list(conditions), "containerStatuses": [
            {"name": "sidecar", "ready": True, "state": {"running": {}}},
            {"name": "trainer", "ready": phase == "Running", "state": state},
        ]},
    }
    if reason:
        body["status"]["reason"] = reason
        body["status"]["message"] = "The node was low on resource: memory."
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return body


def test_pod_info_of_a_running_pod():
    assert lifecycle.pod_info(pod_body()) == PodInfo(name="hello-3fa9c-r1-2", rank=2, restart=1, phase="Running", node="n7")


def test_pod_info_of_a_failed_pod_keeps_exit_code_reason_and_log_tail():
    info = lifecycle.pod_info(pod_body("Failed", terminated={"exitCode": 3, "reason": "Error", "message": "Traceback\nValueError: x", "finishedAt": T0}))
    assert (info.phase, info.exit_code, info.reason, info.message, info.finished_at) == ("Failed", 3, "Error", "Traceback\nValueError: x", T0)
    assert not info.disrupted


def test_pod_info_of_an_evicted_pod_uses_the_pod_reason():
    info = lifecycle.pod_info(pod_body("Failed", reason="Evicted"))
    assert (info.exit_code, info.reason, info.message) == (None, "Evicted", "The node was low on resource: memory.")


def test_pod_info_of_a_pod_removed_with_its_node_carries_the_disruption():
    gc = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC", "message": "PodGC: node no longer exists"}
    info = lifecycle.pod_info(pod_body("Failed", terminated={"exitCode": 137, "reason": "Error"}, conditions=[gc], deleting=True))
    assert (info.reason, info.message, info.disrupted, info.deleting) == ("DeletionByPodGC", "PodGC: node no longer exists", True, True)


def test_pod_info_of_a_waiting_pod_a_deleted_pod_and_an_unschedulable_one():
    info = lifecycle.pod_info(pod_body("Pending", waiting={"reason": "ImagePullBackOff"}))
    assert (info.phase, info.reason) == ("Pending", "ImagePullBackOff")
    assert lifecycle.pod_info(pod_body(deleting=True)).deleting
    sched = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/5 nodes are available: 5 Insufficient nvidia.com/gpu."}
    info = lifecycle.pod_info(pod_body("Pending", waiting={"reason": "x"}, conditions=[sched]))
    assert info.unschedulable == "0/5 nodes are available: 5 Insufficient nvidia.com/gpu."


def test_pod_info_ignores_pods_without_our_labels():
    assert lifecycle.pod_info(pod_body(labels={"spmd.monarch.dev/job": "hello"})) is None
    assert lifecycle.pod_info(pod_body(labels={"spmd.monarch.dev/rank": "x", "spmd.monarch.dev/restart": "0"})) is None


def test_child_info_reads_attempt_and_payload_hash():
    body = {"metadata": {"name": "hello-3fa9c-m2", "labels": {"spmd.monarch.dev/restart": "2"},
                         "annotations": {"spmd.monarch.dev/payload-hash": "abc"}}}
    assert lifecycle.child_info(body) == lifecycle.ChildInfo(name="hello-3fa9c-m2", restart=2, payload_hash="abc")
    assert lifecycle.child_info({"metadata": {"name": "x", "deletionTimestamp": "t"}}).deleting
