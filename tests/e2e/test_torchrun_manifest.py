"""End-to-end: what `monarch-spmd manifest` prints for a torchrun command line goes through the real
API server (server-side dry run of `kubectl apply`, field validation Strict), and runs: two nodes
of two procs on the process node, every rank checking torchrun's contract and joining gloo.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from devcluster import PROCESS_NODE
from devcluster.localcluster import REPO_ROOT
from tests.e2e.conftest import apply, job_pods, wait_phase

pytestmark = pytest.mark.cluster


def manifest(*argv: str) -> str:
    result = subprocess.run([sys.executable, "-m", "monarch_spmd.cli", "manifest", *argv], capture_output=True,
                            text=True, cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def crd_installed(cluster):
    cluster.install_crds()
    return cluster


@pytest.mark.parametrize("argv", [
    ["--image", "registry.example/train:1", "--gpus-per-proc", "1", "--", "torchrun", "--nnodes=2", "--nproc-per-node=8", "-m", "train", "--lr", "0.1"],
    ["--image", "img", "--gpus-per-proc", "0", "--", "--nnodes", "2", "--nproc_per_node", "4", "--max-restarts", "3", "--master-port", "29511",
     "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29400", "--rdzv-id", "job", "scripts/train.py", "--epochs", "1"],
    ["--image", "img", "--name", "llm", "--gpus-per-proc", "1", "--", "python", "-m", "torch.distributed.run",
     "--nnodes", "4", "--nproc-per-node", "8", "--role", "trainer", "-m", "torchtitan.train"],
    ["--image", "img", "--gpus-per-proc", "0", "--nproc-per-node", "2", "train.py"],
])
def test_the_api_server_accepts_the_manifest(crd_installed, namespace, argv):
    text = manifest(*argv)
    result = crd_installed.kubectl("apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-",
                                   input=text, check=False)
    assert result.returncode == 0, result.stderr + text
    assert "created (server dry run)" in result.stdout, result.stdout


def test_the_manifest_with_its_namespace_is_accepted_there(crd_installed, namespace):
    text = manifest("--image", "img", "--namespace", namespace, "--gpus-per-proc", "0", "--", "torchrun", "--nproc-per-node", "2", "x.py")
    result = crd_installed.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", input=text, check=False)
    assert result.returncode == 0 and "spmdjob.spmd.monarch.dev/x created (server dry run)" in result.stdout, result.stderr


def test_a_torchrun_job_runs_two_nodes_of_two_procs(running_operator, namespace):
    c = running_operator
    doc = yaml.safe_load(manifest(
        "--image", "python:3.11-slim", "--name", "tr", "--gpus-per-proc", "0", "--", "torchrun", "--nnodes", "2", "--nproc-per-node", "2",
        "--max-restarts", "1", "--role", "trainer", "-m", "tests.programs.check_env",
        "--mesh", "nodes=2,procs=2", "--role-name", "trainer", "--max-restarts", "1"))
    # What a user adds for this cluster: the process node, which runs this checkout's Python.
    pod = doc["spec"]["template"]["spec"]
    pod["nodeSelector"] = {"kubernetes.io/hostname": PROCESS_NODE}
    pod["containers"][0]["env"].append({"name": "PYTHONPATH", "value": str(REPO_ROOT)})
    apply(c, namespace, doc)
    job = wait_phase(c, namespace, "tr", "Succeeded", timeout=300)
    assert (job["status"]["procs"], job["status"]["mesh"]) == (4, "nodes=2,procs=2")
    pods = job_pods(c, namespace, "tr")
    assert len(pods) == 2, "one pod per node, as one torchrun agent per node"
    logs = "\n".join(c.pod_log(namespace, p.metadata.name) for p in pods)
    # check_env computed every variable from the mesh itself and all-gathered the ranks over gloo.
    ok = {int(r) for r in re.findall(r"^\[rank (\d)\] check_env rank \1/4: ok", logs, re.M)}
    assert ok == {0, 1, 2, 3}, logs
