"""The Helm chart against the real test cluster (the session fixture `cluster`, a
devcluster.localcluster.LocalCluster): every rendered object accepted by the API server
(server-side dry run; the optional ServiceMonitor against the Prometheus operator's own CRD), then
`helm install` with the operator running as a pod of the process node and holding its Lease,
`helm test` running the smoke SPMDJob to Succeeded, an example applied with kubectl and its logs
read back with `monarch-spmd logs`.

On the process node the image is ignored and the container's command runs on this machine, so
the operator pod is `python -m spmd_operator --namespace=<ns>` from this checkout, talking to the
API server with its ServiceAccount token, exactly as in a real cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helm_support import (CHART, KUBE_VERSION, ROOT, by_kind, helm_cmd, is_test_hook, leader_args, rendered_test_job,
                          wait_established, wait_for_lease_holder)

pytestmark = pytest.mark.cluster

def rendered(cluster, namespace: str, *args: str) -> list[dict]:
    result = helm_cmd(cluster, "template", "spmd", str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION, *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


SERVICE_MONITOR_CRD = Path(__file__).parent / "data" / "monitoring.coreos.com_servicemonitors.yaml"
#: Every optional object at once: PodDisruptionBudget, anti-affinity, ServiceMonitor, gang RBAC.
EVERYTHING = ["--set", "replicaCount=2", "--set", "metrics.serviceMonitor.enabled=true",
              "--set", "metrics.serviceMonitor.labels.release=prometheus",
              "--set", "gangScheduling.kueue.enabled=true", "--set", "gangScheduling.volcano.enabled=true",
              "--set", "gangScheduling.coscheduling.enabled=true"]


@pytest.fixture
def service_monitor_crd(cluster):
    """The Prometheus operator's ServiceMonitor CRD, for one test; removed after it, so that the
    other tests see a cluster without it (the chart must install there by default)."""
    cluster.kubectl("apply", "--server-side", "-f", str(SERVICE_MONITOR_CRD))
    wait_established(cluster, "-f", str(SERVICE_MONITOR_CRD))
    yield
    cluster.kubectl("delete", "-f", str(SERVICE_MONITOR_CRD), "--wait=true", "--timeout=60s", check=False)


@pytest.mark.parametrize(
    "values",
    [[], ["-f", str(CHART / "values-gpu.yaml")], ["namespaced"], ["--set", "rbac.create=false"],
     ["--set", "leaderElection.enabled=false", "--set", "metrics.port=0"], ["everything"], ["everything-namespaced"]],
    ids=["default", "gpu", "namespaced", "no-rbac", "no-election-no-metrics", "everything", "everything-namespaced"],
)
def test_every_rendered_object_passes_server_side_dry_run(request, cluster, namespace, crd, values):
    if values == ["namespaced"]:
        values = ["--set", f"watchNamespaces={{{namespace}}}"]
    if values and values[0].startswith("everything"):
        request.getfixturevalue("service_monitor_crd")
        scope = ["--set", f"watchNamespaces={{{namespace}}}"] if values[0].endswith("namespaced") else []
        values = [*EVERYTHING, *scope]
    objects = rendered(cluster, namespace, *values)
    if "metrics.serviceMonitor.enabled=true" in values:
        assert {"ServiceMonitor", "PodDisruptionBudget", "Service"} <= {o["kind"] for o in objects}
    assert by_kind(objects, "Deployment") and [o for o in objects if is_test_hook(o)]
    objects.append(rendered_test_job(objects))  # what the `helm test` pod creates
    # Pods name their ServiceAccount, which admission looks up: create those for real first.
    accounts = by_kind(objects, "ServiceAccount")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(accounts))
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-o", "name", "-f", "-", input=yaml.safe_dump_all(objects), check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    accepted = result.stdout.split()
    assert len(accepted) == len(objects), result.stdout
    assert "spmdjob.spmd.monarch.dev/test-spmd-monarch-spmd-0a1b2" in accepted


def test_examples_pass_server_side_dry_run(cluster, namespace, crd):
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        result = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
        assert result.returncode == 0, f"{path.name}: {result.stdout}{result.stderr}"


def test_crd_refuses_what_the_schema_forbids(cluster, namespace, crd):
    job = yaml.safe_load((ROOT / "examples/hello-gloo.yaml").read_text())
    job["spec"]["mesh"][0]["size"] = 0
    result = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(job), check=False)
    assert result.returncode != 0 and "spec.mesh[0].size" in result.stderr, result.stderr


def wait_for_phase(cluster, namespace: str, job: str, phase: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    obj: dict = {}
    while time.monotonic() < deadline:
        got = cluster.kubectl("get", "spmdjob", job, "-n", namespace, "-o", "json", check=False)
        if got.returncode == 0:
            obj = json.loads(got.stdout)
            current = (obj.get("status") or {}).get("phase")
            if current == phase:
                return obj
            if current == "Failed":
                break
        time.sleep(1)
    raise AssertionError(f"spmdjob {namespace}/{job} not {phase}: {json.dumps(obj.get('status'), indent=1)}")


@pytest.fixture(params=["namespaced", "cluster-wide"])
def installed(request, cluster, namespace, crd):
    """The chart installed in `namespace` (watching only it: a Role there; or every namespace: the
    ClusterRole), with the session's own operator (if any) stopped meanwhile so that one operator
    handles each job."""
    had_operator = getattr(cluster, "operator_process", None) is not None
    if had_operator:
        cluster.stop_operator()
    release = "spmd"
    try:
        scope = ["--set", f"watchNamespaces={{{namespace}}}"] if request.param == "namespaced" else []
        result = helm_cmd(
            cluster, "install", release, str(CHART), "-n", namespace, *scope,
            "--set", "tests.timeoutSeconds=240",
            "--wait", "--timeout", "180s",
        )
        assert result.returncode == 0, result.stdout + result.stderr
        yield release, result.stdout, request.param
    finally:
        helm_cmd(cluster, "uninstall", release, "-n", namespace, "--wait", "--timeout", "60s")
        if had_operator:
            cluster.start_operator()


def test_helm_install_then_helm_test(cluster, namespace, installed):
    release, install_output, mode = installed
    assert "STATUS: deployed" in install_output
    assert f"helm test {release} -n {namespace} --logs" in install_output  # NOTES.txt
    assert "NEVER upgrades" in install_output
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=operator", "-o", "json").stdout)
    (pod,) = pods["items"]
    assert pod["status"]["phase"] == "Running"
    scope = [f"--namespace={namespace}"] if mode == "namespaced" else ["--all-namespaces"]
    assert pod["spec"]["containers"][0]["args"] == [*scope, "--liveness=http://0.0.0.0:8080/healthz",
                                                    *leader_args(namespace)]
    # The only replica leads: it holds the release's Lease, in the release namespace.
    lease = wait_for_lease_holder(cluster, namespace, "spmd-monarch-spmd")
    assert lease["spec"]["holderIdentity"] == pod["metadata"]["name"]
    assert "monarch-spmd status -A" in install_output and "spmd-monarch-spmd-metrics" in install_output  # NOTES

    result = helm_cmd(cluster, "test", release, "-n", namespace, "--logs", "--timeout", "300s", timeout=360)
    operator_log = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], check=False)
    assert result.returncode == 0, result.stdout + result.stderr + "\noperator log:\n" + operator_log.stdout
    assert "Phase:          Succeeded" in result.stdout
    assert "phase=Succeeded" in result.stdout and "passed (job deleted)" in result.stdout
    assert "POD LOGS: spmd-monarch-spmd-test" in result.stdout


def test_example_runs_under_the_installed_operator_and_logs_merge(cluster, namespace, installed):
    cluster.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples/ddp-cpu.yaml"))
    wait_for_phase(cluster, namespace, "ddp-cpu", "Succeeded", timeout=240)
    logs_cmd = [sys.executable, "-m", "monarch_spmd.cli", "logs", "ddp-cpu", "-n", namespace, "--kubeconfig", str(cluster.kubeconfig)]
    result = subprocess.run(logs_cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank {rank}] ")]
        assert any(f"ddp_step rank {rank}/2:" in line and "params agree True" in line for line in mine), result.stdout
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in lines)
    # The rank filter, and follow mode on a finished job (streams end with the containers).
    only_one = subprocess.run([*logs_cmd, "--rank", "1", "--follow"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert only_one.returncode == 0, only_one.stderr
    assert only_one.stdout and all(line.startswith("[rank 1] ") for line in only_one.stdout.splitlines())
    # Clear errors for a job that does not exist and a rank that does not.
    missing = subprocess.run([*logs_cmd[:4], "no-such-job", *logs_cmd[5:]], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert missing.returncode == 1 and "spmdjob no-such-job not found" in missing.stderr
    bad_rank = subprocess.run([*logs_cmd, "--rank", "7"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad_rank.returncode == 1 and "no pod for rank(s) 7" in bad_rank.stderr
