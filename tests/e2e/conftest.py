"""Fixtures and helpers for the SPMDJob end-to-end tests.

These run the real operator (``python -m spmd_operator``) as a subprocess against the real test
control plane of tests/conftest.py, apply SPMDJob manifests with the real kubectl, and look at
what a user would see: ``kubectl get``, the job's status, its Events, its pods and their logs.
Pods on the process node run for real (gloo over per-pod network namespaces); pods that tolerate
the kwok taint land on simulated nodes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devcluster import KWOK_TOLERATION, PROCESS_NODE, LocalCluster
from devcluster import kueue as kueue_objects
from devcluster.localcluster import REPO_ROOT
from monarch_spmd import ports
from spmd_operator import names

GROUP, VERSION, PLURAL = "spmd.monarch.dev", "v1alpha1", "spmdjobs"
PROBE = str(Path(__file__).with_name("probe.py"))
JOB_LABEL = "spmd.monarch.dev/job"
#: The operator's resync period in these tests: a stale view must be corrected within it.
RESYNC_SECONDS = 10


def operator_args() -> list[str]:
    """The flags the end-to-end tests run the operator with: one replica (no leader election, so
    a restarted operator need not wait for its predecessor's Lease), ports of its own, and a
    NetworkPolicy per job as the chart installs it (the test cluster does not enforce them)."""
    return ["--liveness", f"http://127.0.0.1:{free_port()}/healthz", "--resync-seconds", str(RESYNC_SECONDS),
            "--metrics-port", str(free_port()), "--no-leader-election", "--network-policy"]


def free_port() -> int:
    return ports.free_port("127.0.0.1")


@pytest.fixture(scope="session")
def operator(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster with the SPMDJob CRD applied and the operator running (restarted if a test stopped it)."""
    cluster.start_operator(*operator_args())
    yield cluster
    cluster.stop_operator()


@pytest.fixture
def running_operator(operator: LocalCluster) -> LocalCluster:
    """`operator`, made sure to be alive (a previous test may have killed it)."""
    proc = operator.operator_process
    if proc is None or proc.poll() is not None:
        operator.start_operator(*operator_args())
    return operator


def job_manifest(name: str, mesh: list[tuple[str, int]], args: list[str], *,
                 kwok: bool = False, **spec: Any) -> dict[str, Any]:
    """An SPMDJob as a user would write it; ``kwok`` sends its pods to the simulated nodes."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SPMDJob",
        "metadata": {"name": name},
        "spec": {"mesh": [{"name": n, "size": s} for n, s in mesh], "args": args,
                 "image": "python:3.11-slim", **spec},
    }
    template = body["spec"].setdefault("template", {}).setdefault("spec", {})
    if kwok:
        template["tolerations"] = [KWOK_TOLERATION]
        template["nodeSelector"] = {"type": "kwok"}
    else:
        template["nodeSelector"] = {"kubernetes.io/hostname": PROCESS_NODE}
        # The process node runs this checkout's Python: let the pods import tests.programs.
        template["containers"] = [{"name": "trainer", "env": [{"name": "PYTHONPATH", "value": str(REPO_ROOT)}]}]
    return body


def apply(cluster: LocalCluster, namespace: str, manifest: dict[str, Any], *,
          check: bool = True) -> Any:
    """`kubectl apply -f -` of one manifest; returns the CompletedProcess."""
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest),
                           check=check)


def get_job(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    api = client.CustomObjectsApi(cluster.api_client())
    return api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def wait_job(cluster: LocalCluster, namespace: str, name: str,
             until: Callable[[dict[str, Any]], bool], timeout: float = 180,
             what: str = "condition") -> dict[str, Any]:
    """Polls the job until ``until(job)``; on timeout fails with the job and its pods."""
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = get_job(cluster, namespace, name)
        if until(job):
            return job
        time.sleep(0.5)
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    raise AssertionError(f"job {namespace}/{name}: {what} not reached in {timeout}s\n"
                         f"status: {json.dumps(job.get('status'), indent=1)}\npods:\n{pods}")


def wait_phase(cluster: LocalCluster, namespace: str, name: str, phase: str,
               timeout: float = 180) -> dict[str, Any]:
    return wait_job(cluster, namespace, name,
                    lambda j: j.get("status", {}).get("phase") == phase, timeout, f"phase {phase}")


def job_ref(job: dict[str, Any]) -> names.JobRef:
    """The identity of a job read back from the API server: what its children's names derive from."""
    return names.JobRef.from_body(job)


def pod_names(job: dict[str, Any], restart: int, count: int) -> list[str]:
    """The names the pods of attempt ``restart`` of ``job`` have (``<job>-<id>-r<restart>-<rank>``)."""
    return sorted(names.pod_name(job_ref(job), restart, r) for r in range(count))


def job_pods(cluster: LocalCluster, namespace: str, name: str) -> list[client.V1Pod]:
    core = client.CoreV1Api(cluster.api_client())
    return core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}").items


def job_events(cluster: LocalCluster, namespace: str, name: str) -> list[client.CoreV1Event]:
    core = client.CoreV1Api(cluster.api_client())
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=SPMDJob,involvedObject.name={name}").items
    return sorted(events, key=lambda e: e.metadata.creation_timestamp)


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not reached in {timeout}s: {what}")


def probe_lines(log: str, tag: str) -> list[dict[str, Any]]:
    return [json.loads(line.split(" ", 1)[1]) for line in log.splitlines() if line.startswith(tag + " ")]


#: The Kueue ResourceFlavor of the process node (where pods run for real), made by process_queue.
PROCESS_FLAVOR = "process-node"


@pytest.fixture
def process_queue(kueue_cluster: LocalCluster, namespace: str) -> Iterator[Callable[..., str]]:
    """make(cpu, prefix="queue") -> queue: a ClusterQueue with that CPU quota (and ample memory)
    on the process node's flavor (PROCESS_FLAVOR), and a LocalQueue of the same name in the
    test's namespace; the ClusterQueues are deleted after the test (the namespace takes the
    LocalQueues)."""
    api = client.CustomObjectsApi(kueue_cluster.api_client())
    group, version = kueue_objects.API_GROUP, kueue_objects.API_VERSION
    try:
        api.create_cluster_custom_object(group, version, "resourceflavors", kueue_objects.resource_flavor(
            PROCESS_FLAVOR, node_labels={"kubernetes.io/hostname": PROCESS_NODE}))
    except client.ApiException as err:
        if err.status != 409:
            raise
    made: list[str] = []

    def make(cpu: str, prefix: str = "queue") -> str:
        name = f"{prefix}-{len(made)}-{namespace[-6:]}"
        api.create_cluster_custom_object(group, version, "clusterqueues", kueue_objects.cluster_queue(
            name, PROCESS_FLAVOR, {"cpu": cpu, "memory": "4Gi"}))
        api.create_namespaced_custom_object(group, version, namespace, "localqueues",
                                            kueue_objects.local_queue(namespace, name, name))
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            api.delete_cluster_custom_object(group, version, "clusterqueues", name)
        except client.ApiException as err:
            if err.status != 404:
                raise
