"""The example manifests in examples/: each SPMDJob passes the spec checks the operator and the
local runner use, and the CPU ones run to success with the local runner (real processes, gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from monarch_spmd import spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def job_of(path: Path) -> dict:
    jobs = [d for d in documents(path) if d.get("kind") == spec.KIND]
    assert len(jobs) == 1, f"{path.name}: expected one SPMDJob, found {len(jobs)}"
    return jobs[0]


def test_the_three_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"hello-gloo.yaml", "ddp-cpu.yaml", "gpu-multihost.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_the_spec_checks(path):
    doc = job_of(path)
    name, namespace, job = spec.load_manifest(doc, require_image=True)
    assert name == path.stem
    assert namespace == "default"  # no namespace in the file: `kubectl apply -n` chooses it
    assert job.image and ":" in job.image and not job.image.endswith(":latest")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_document_is_a_known_kind(path):
    for doc in documents(path):
        assert (doc["apiVersion"], doc["kind"]) in {(spec.API_VERSION, spec.KIND), ("v1", "ConfigMap")}
        assert "namespace" not in doc["metadata"]


def test_hello_gloo_is_a_two_by_two_cpu_allreduce():
    _, _, job = spec.load_manifest(job_of(ROOT / "examples/hello-gloo.yaml"))
    assert [(d.name, d.size) for d in job.mesh] == [("hosts", 2), ("gpus", 2)]
    assert job.args == ("-m", "monarch_spmd.examples.allreduce")
    assert job.gpus_per_proc == 0
    assert job.image.startswith("monarch-spmd/worker-cpu:")


def test_gpu_example_needs_nothing_installed_in_a_stock_image():
    path = ROOT / "examples/gpu-multihost.yaml"
    doc = job_of(path)
    _, _, job = spec.load_manifest(doc, require_image=True)
    assert [(d.name, d.size) for d in job.mesh] == [("hosts", 2), ("gpus", 8)]
    assert job.gpus_per_proc == 1 and job.pod_layout == "PerHost" and job.shm_size == "16Gi"
    assert job.template["spec"]["priorityClassName"]
    assert job.image.startswith("pytorch/pytorch:")
    pod = job.template["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    trainer = next(c for c in pod["containers"] if c["name"] == spec.TRAINER_CONTAINER)
    assert {e["name"] for e in trainer["env"]} >= {"NCCL_DEBUG", "NCCL_SOCKET_IFNAME"}
    # The script is the ConfigMap of the same file, mounted where args point.
    configmap = next(d for d in documents(path) if d["kind"] == "ConfigMap")
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == configmap["metadata"]["name"])
    mount = next(m for m in trainer["volumeMounts"] if m["name"] == volume["name"])
    script = job.args[0]
    assert os.path.dirname(script) == mount["mountPath"]
    source = configmap["data"][os.path.basename(script)]
    compile(source, script, "exec")
    assert 'init_process_group("nccl"' in source and 'os.environ["LOCAL_RANK"]' in source


def run_locally(path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "monarch_spmd.cli", "run", "-f", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_hello_gloo_runs_locally():
    result = run_locally(ROOT / "examples/hello-gloo.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(4):
        assert f"allreduce rank {rank}/4: sum 10 (expected 10)" in result.stdout, result.stdout + result.stderr


def test_ddp_cpu_runs_locally():
    result = run_locally(ROOT / "examples/ddp-cpu.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"ddp_step rank {rank}/2:" in result.stdout
    assert result.stdout.count("grads agree True, params agree True") == 2, result.stdout + result.stderr


@pytest.mark.parametrize(("name", "provider"), [("gang-kueue", "Kueue"), ("gang-volcano", "Volcano"),
                                                ("gang-coscheduling", "Coscheduling")])
def test_one_example_per_gang_scheduler(name, provider):
    _, _, job = spec.load_manifest(job_of(ROOT / f"examples/{name}.yaml"), require_image=True)
    assert job.scheduling_provider == provider and job.pod_layout == "PerHost"
