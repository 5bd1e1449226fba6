"""Fixtures for the tests on real nodes: the chart installed with the operator image in a pod.

These run against `real_cluster` (tests/conftest.py): a control plane with two real kubelet nodes
whose pods run in containers (containerd + runc), resolve names through CoreDNS and reach the API
server at the `kubernetes` Service's address, as on any cluster. Images come from
scripts/build-images.sh (built here from Debian's packages, never pulled). Everything is done as
a user would: `helm install` of the chart, `kubectl apply` of SPMDJobs, `helm test`, and the
assertions read what a user reads: the job's status, pods, logs, and the cluster DNS's log.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devcluster import LocalCluster
from devcluster.realnode import REAL_TOLERATION

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "monarch-spmd"
VERSION = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
OPERATOR_IMAGE = "monarch-spmd/operator"
WORKER_IMAGE = f"monarch-spmd/worker-cpu:{VERSION}"
# Debian's python3 and python3-torch only: nothing of this project (images/local/).
STOCK_IMAGE = "monarch-spmd.local/debian-torch:bookworm"
GROUP, API_VERSION, PLURAL = "spmd.monarch.dev", "v1alpha1", "spmdjobs"
JOB_LABEL = "spmd.monarch.dev/job"
RANK_LABEL = "spmd.monarch.dev/rank"
RESTART_LABEL = "spmd.monarch.dev/restart"
OPERATOR_NAMESPACE = "monarch-spmd"
RELEASE = "spmd"
ON_REAL_NODES: dict[str, Any] = {"tolerations": [REAL_TOLERATION], "nodeSelector": {"type": "real"}}


def helm(cluster: LocalCluster, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig),
                           *args], env=cluster.env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def chart_values() -> dict[str, Any]:
    """Values a user of this cluster would pass: the local images, the real nodes."""
    return {
        "image": {"repository": OPERATOR_IMAGE, "tag": VERSION, "pullPolicy": "IfNotPresent"},
        **ON_REAL_NODES,
        "tests": {"image": {"repository": WORKER_IMAGE.split(":")[0], "tag": VERSION},
                  **ON_REAL_NODES, "timeoutSeconds": 300},
    }


@pytest.fixture(scope="session")
def installed_chart(real_cluster: LocalCluster) -> Iterator[dict[str, Any]]:
    """`helm install --wait` of the chart: the operator runs as a pod of a real node.

    Yields {"install": the CompletedProcess, "values": the values file}; the release is
    uninstalled after the session. A failed install fails every test that needs it.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(chart_values(), f)
    install = helm(real_cluster, "install", RELEASE, str(CHART), "-n", OPERATOR_NAMESPACE,
                   "--create-namespace", "-f", f.name, "--wait", "--timeout", "5m")
    assert install.returncode == 0, (
        f"helm install failed:\n{install.stdout}{install.stderr}\n"
        + real_cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
        + real_cluster.kubectl("describe", "pods", "-n", OPERATOR_NAMESPACE, check=False).stdout)
    yield {"install": install, "values": f.name}
    helm(real_cluster, "uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait", timeout=120)
    Path(f.name).unlink(missing_ok=True)


@pytest.fixture
def real_namespace(real_cluster: LocalCluster, installed_chart: dict[str, Any]) -> Iterator[str]:
    """A fresh namespace on the real-node cluster, with the operator installed and running."""
    name = f"rn-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(real_cluster.api_client())
    core.create_namespace({"metadata": {"name": name}})
    wait_until(lambda: _has_default_account(core, name), 30, f"ServiceAccount default in {name}")
    yield name
    core.delete_namespace(name)


def _has_default_account(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespaced_service_account("default", namespace)
        return True
    except client.ApiException:
        return False


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.5,
               diagnose: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not reached in {timeout}s: {what}" + (f"\n{diagnose()}" if diagnose else ""))


def operator_pod(cluster: LocalCluster) -> client.V1Pod:
    core = client.CoreV1Api(cluster.api_client())
    pods = core.list_namespaced_pod(OPERATOR_NAMESPACE,
                                    label_selector="app.kubernetes.io/component=operator").items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def spmdjob(name: str, procs: int, args: list[str], image: str, *,
            script: str | None = None, trainer: dict[str, Any] | None = None,
            **spec: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An SPMDJob for the real nodes and the objects it needs (a ConfigMap with `script`).

    `script` is mounted at /opt/train/train.py from a ConfigMap, as a user of a stock image does.
    """
    template: dict[str, Any] = {**ON_REAL_NODES}
    container: dict[str, Any] = {"name": "trainer", "imagePullPolicy": "IfNotPresent",
                                 **(trainer or {})}
    extra: list[dict[str, Any]] = []
    if script is not None:
        cm = f"{name}-train"
        extra.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm},
                      "data": {"train.py": script}})
        template["volumes"] = [{"name": "train", "configMap": {"name": cm}}]
        container["volumeMounts"] = [{"name": "train", "mountPath": "/opt/train",
                                      "readOnly": True}]
    template["containers"] = [container]
    job = {"apiVersion": f"{GROUP}/{API_VERSION}", "kind": "SPMDJob", "metadata": {"name": name},
           "spec": {"mesh": [{"name": "procs", "size": procs}], "args": args, "image": image,
                    "template": {"spec": template}, **spec}}
    return job, extra


def apply(cluster: LocalCluster, namespace: str, *objects: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(objects))


def get_job(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(cluster.api_client()).get_namespaced_custom_object(
        GROUP, API_VERSION, namespace, PLURAL, name)


def job_pods(cluster: LocalCluster, namespace: str, name: str) -> list[client.V1Pod]:
    core = client.CoreV1Api(cluster.api_client())
    return core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}").items


class JobWatch:
    """Polls a job until a phase, remembering every pod seen (node, IP, labels) and its logs.

    Pods may be deleted by the operator (a gang restart, or after the job finished): what the
    test needs from them is taken while they exist.
    """

    def __init__(self, cluster: LocalCluster, namespace: str, name: str) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.pods: dict[str, dict[str, Any]] = {}
        self.logs: dict[str, str] = {}
        self.log_errors: dict[str, str] = {}  # why kubectl logs failed, by pod
        self.job: dict[str, Any] = {}

    def poll(self) -> None:
        self.job = get_job(self.cluster, self.namespace, self.name)
        self.listed = []  # the pods there now (a pod gone has no log to ask for)
        for pod in job_pods(self.cluster, self.namespace, self.name):
            self.listed.append(pod.metadata.name)
            seen = self.pods.setdefault(pod.metadata.name, {})
            seen.update({"labels": pod.metadata.labels or {}, "node": pod.spec.node_name,
                         "phase": pod.status.phase})
            if pod.status.pod_ip:
                seen["ip"] = pod.status.pod_ip
            done = any(c.state and c.state.terminated for c in pod.status.container_statuses or [])
            seen["done"] = done
            if done and pod.metadata.name not in self.logs:
                log = self.cluster.kubectl("logs", "-n", self.namespace, pod.metadata.name,
                                           check=False)
                if log.returncode == 0:
                    self.logs[pod.metadata.name] = log.stdout + log.stderr
                else:
                    self.log_errors[pod.metadata.name] = log.stderr[-500:]

    def wait_phase(self, *phases: str, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if self.job.get("status", {}).get("phase") in phases:
                # The last pods' logs: the job's status can say Succeeded (its coordinator's word)
                # a moment before every pod's container has ended; once it ended, every pod still
                # there is waited for (a while) and its log taken.
                until = time.monotonic() + (30 if self.job["status"]["phase"] in ("Succeeded", "Failed") else 0)
                while True:
                    self.poll()
                    if all(name in self.logs for name in self.listed) or time.monotonic() > until:
                        return self.job
                    time.sleep(0.5)
            time.sleep(1)
        pods = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-o", "wide",
                                    check=False).stdout
        describe = self.cluster.kubectl("describe", "pods", "-n", self.namespace,
                                        check=False).stdout
        raise AssertionError(
            f"job {self.namespace}/{self.name}: not {phases} in {timeout}s\n"
            f"status: {json.dumps(self.job.get('status'), indent=1)}\npods:\n{pods}\n"
            f"{describe[-6000:]}\nlogs: {json.dumps(self.logs, indent=1)[-4000:]}")

    def pod_logs(self, **labels: str) -> dict[str, str]:
        """Logs of the pods whose labels include `labels` (label names without the prefix)."""
        want = {f"spmd.monarch.dev/{k}": v for k, v in labels.items()}
        return {name: self.logs.get(name, "") for name, pod in self.pods.items()
                if want.items() <= pod["labels"].items()}
