"""End-to-end: what `monarch-spmd manifest` prints for a GPU torchrun line runs on a GPU cluster as
it is. The SPMDJob passes a server-side dry run, and so do the children the operator's own
builders make from it (the pods with their GPU limits, CPU and memory requests, the GPU
toleration and the sized /dev/shm; the worker ConfigMap; the master Service): the real API server
checks them with field validation Strict, as when the operator creates them. `monarch-spmd pods
--dry-run=server` makes the same check for a user and creates nothing.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import uuid

import pytest
import yaml

from devcluster.localcluster import REPO_ROOT
from monarch_spmd import policy, spec
from spmd_operator import builders
from spmd_operator.names import JobRef

pytestmark = pytest.mark.cluster

GPU_LINE = ["--image", "nvcr.io/nvidia/pytorch:24.05-py3", "--node-gpus", "8", "--cpu", "90", "--memory", "1000Gi",
            "--", "torchrun", "--nnodes", "2", "--nproc-per-node", "gpu", "--max-restarts", "2", "-m", "train"]


def manifest(*argv: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "monarch_spmd", "manifest", *argv], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def dry_run(cluster, namespace: str, objects: list[dict]) -> subprocess.CompletedProcess:
    body = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects})
    # Server-side: the payload ConfigMap is over the 256 KiB a client-side apply's
    # last-applied-configuration annotation may hold (the operator creates it, and never applies it).
    return cluster.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-n", namespace, "-o",
                           "json", "-f", "-", input=body, check=False)


def children(doc: dict, namespace: str) -> list[dict]:
    """What the operator creates for the job's first attempt, from its own builders."""
    parsed = spec.load_manifest(doc, require_image=True)
    job = JobRef(name=parsed.name, namespace=namespace, uid=str(uuid.uuid4()))
    pods = [builders.build_pod(job, parsed.spec, i, 0) for i in range(policy.pods_per_attempt(parsed.spec))]
    return [builders.build_worker_configmap(namespace, builders.worker_files()), builders.build_service(job, parsed.spec, 0),
            *pods]


@pytest.fixture(scope="module")
def crd_installed(cluster):
    cluster.install_crds()
    return cluster


def test_the_gpu_manifest_and_the_pods_built_from_it_pass_a_server_dry_run(crd_installed, namespace):
    doc = manifest(*GPU_LINE)
    job = crd_installed.kubectl("apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-",
                                input=yaml.safe_dump(doc), check=False)
    assert job.returncode == 0 and "spmdjob.spmd.monarch.dev/train created (server dry run)" in job.stdout, job.stderr

    result = dry_run(crd_installed, namespace, children(doc, namespace))
    assert result.returncode == 0, result.stderr
    accepted = json.loads(result.stdout)["items"]
    pods = [o for o in accepted if o["kind"] == "Pod"]
    assert [o["kind"] for o in accepted] == ["ConfigMap", "Service", "Pod", "Pod"]
    for pod in pods:  # as the API server returned them, defaults applied
        trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
        assert trainer["resources"]["limits"] == {"nvidia.com/gpu": "8", "memory": "1000Gi"}
        assert trainer["resources"]["requests"] == {"nvidia.com/gpu": "8", "cpu": "90", "memory": "1000Gi"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
        shm = next(v for v in pod["spec"]["volumes"] if v["name"] == builders.SHM_VOLUME)
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "500Gi"}
        assert {"name": builders.SHM_VOLUME, "mountPath": "/dev/shm"} in trainer["volumeMounts"]
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        assert env["MONARCH_SPMD_MESH"] == "nodes=2,procs=8" and env["MONARCH_SPMD_POD_LAYOUT"] == "PerHost"


def test_the_dry_run_refuses_what_a_gpu_node_would_not_run(crd_installed, namespace):
    """The check has teeth: a GPU request that differs from its limit (which the device plugin
    cannot honour) is refused by the same dry run, naming the field."""
    doc = manifest(*GPU_LINE)
    objects = children(doc, namespace)
    pod = objects[-1]
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "4"
    result = dry_run(crd_installed, namespace, objects)
    assert result.returncode != 0
    assert "nvidia.com/gpu" in result.stderr and "must be equal to" in result.stderr, result.stderr


def pods_command(cluster, *argv: str) -> subprocess.CompletedProcess:
    """`monarch-spmd pods ...` with the test cluster's kubeconfig, as a user runs it."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    return subprocess.run([sys.executable, "-m", "monarch_spmd", "pods", *argv], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, timeout=120)


def test_pods_dry_run_server_checks_every_pod_and_creates_nothing(crd_installed, namespace, tmp_path):
    doc = manifest(*GPU_LINE)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = pods_command(crd_installed, "-f", str(path), "--dry-run=server", "-n", namespace)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"pod/train-00000-r0-{i} accepted (server dry run in namespace {namespace}; nothing created)" for i in (0, 1)]

    # A typo under the template: the template is typed, so it is refused before any pod is sent.
    typo = copy.deepcopy(doc)
    typo["spec"]["template"]["spec"]["nodeSelectr"] = {"gpu": "h100"}
    path.write_text(yaml.safe_dump(typo))
    refused = pods_command(crd_installed, "-f", str(path), "--dry-run=server", "-n", namespace)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert "spec.template.spec.nodeSelectr: unknown field" in refused.stdout + refused.stderr

    # A value the SPMDJob's schema takes but the Pod API refuses: the API server refuses the pod,
    # and the field is named in the job's terms too.
    # (A CPU request above its limit: a rule across fields the schema cannot state; a bad enum
    # such as imagePullPolicy is refused offline now, before any pod is sent.)
    doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1"
    path.write_text(yaml.safe_dump(doc))
    refused = pods_command(crd_installed, "-f", str(path), "--dry-run=server", "-n", namespace)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    lines = refused.stdout.splitlines()
    assert lines and lines[0].startswith("pod/train-00000-r0-0 refused (422): "), refused.stdout + refused.stderr
    assert "resources.requests" in lines[0] and "cpu limit" in lines[0], lines
    assert any("spec.template.spec.containers[0].resources.requests" in line for line in lines[1:]), lines

    assert crd_installed.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout.strip() == ""
