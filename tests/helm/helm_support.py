"""Helpers shared by the Helm chart tests: the operator's RBAC rules and flags as the chart must
render them, and picking objects out of rendered manifests."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "monarch-spmd"
#: The test cluster's Kubernetes version; helm built from source assumes v1.20 without it.
KUBE_VERSION = "v1.34.4"
CRD_NAME = "spmdjobs.spmd.monarch.dev"


# The operator's RBAC: what operator/README.md ("What it needs from the API") lists, and nothing more.
NAMESPACED_RULES = [
    {"apiGroups": ["spmd.monarch.dev"], "resources": ["spmdjobs"], "verbs": ["get", "list", "watch", "delete", "create", "patch"]},
    {"apiGroups": ["spmd.monarch.dev"], "resources": ["spmdjobs/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    # networkPolicy.enabled (the default): one NetworkPolicy per job.
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "create"]},
]
# With gangScheduling.<name>.enabled: namespaced rules, and cluster-scoped ones (Kueue's flavors).
GANG_RULES = {
    "kueue": [
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch", "create"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["patch"]},
    ],
    "volcano": [
        {"apiGroups": ["scheduling.volcano.sh"], "resources": ["podgroups"], "verbs": ["get", "list", "watch", "create", "delete"]},
    ],
    "coscheduling": [
        {"apiGroups": ["scheduling.x-k8s.io"], "resources": ["podgroups"], "verbs": ["get", "list", "watch", "create", "delete"]},
    ],
}
GANG_CLUSTER_RULES = {
    "kueue": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors"], "verbs": ["get"]}],
    "volcano": [],
    "coscheduling": [],
}
CRD_RULE = {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]}
NAMESPACE_GET_RULE = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}
NAMESPACES_RULE = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
LEASE_RULE = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}


def leader_args(namespace: str = "ops", lease: str = "spmd-monarch-spmd", release: str = "spmd") -> list[str]:
    """The operator's metrics, leader-election and isolation flags as the chart renders them by default."""
    return [
        "--metrics-port=9090",
        "--leader-election",
        f"--leader-election-namespace={namespace}",
        f"--lease-name={lease}",
        "--lease-duration=10",
        "--renew-deadline=7",
        "--retry-period=2",
        "--network-policy",
        f"--operator-pod-labels=app.kubernetes.io/name=monarch-spmd,app.kubernetes.io/instance={release}",
    ]


LEADER_ARGS = leader_args()


def by_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: Sequence[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def is_test_hook(obj: dict[str, Any]) -> bool:
    return (obj["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"


def rendered_test_job(objects: Sequence[dict[str, Any]], uid: str = "0a1b2c3d-0000") -> dict[str, Any]:
    """The SPMDJob the `helm test` pod creates, named as the pod names it for pod uid `uid`."""
    pod = one([o for o in objects if is_test_hook(o)], "Pod")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    job = json.loads(env["SPMD_TEST_JOB_MANIFEST"])
    job["metadata"]["name"] = f"{env['SPMD_TEST_JOB_PREFIX']}-{uid[:5]}"
    return job


def helm_cmd(cluster: Any, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real helm binary against the test cluster (never raises on failure)."""
    return subprocess.run(
        [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args],
        env=cluster.env, capture_output=True, text=True, timeout=timeout, check=False,
    )


def wait_for_lease_holder(cluster: Any, namespace: str, name: str, *, other_than: str = "", timeout: float = 60) -> dict:
    """The Lease once some replica (other than `other_than`) holds it."""
    deadline = time.monotonic() + timeout
    lease: dict = {}
    while time.monotonic() < deadline:
        got = cluster.kubectl("get", "lease", name, "-n", namespace, "-o", "json", check=False)
        if got.returncode == 0:
            lease = json.loads(got.stdout)
            holder = lease["spec"].get("holderIdentity") or ""
            if holder and holder != other_than:
                return lease
        time.sleep(0.2)
    raise AssertionError(f"no replica holds Lease {namespace}/{name} (other than {other_than!r}): {lease}")


def wait_established(cluster: Any, *target: str, timeout: float = 60) -> None:
    """Waits for a CRD (`crd/NAME` or `-f FILE`) to be Established. `kubectl wait` fails outright
    on a CRD created a moment ago, before it has any condition."""
    deadline = time.monotonic() + timeout
    while True:
        got = cluster.kubectl("get", *target, "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                              check=False)
        if got.stdout.strip() == "True":
            return
        assert time.monotonic() < deadline, f"{' '.join(target)} not Established: {got.stdout}{got.stderr}"
        time.sleep(0.2)
