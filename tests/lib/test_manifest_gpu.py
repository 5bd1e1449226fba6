"""`monarch-spmd manifest` GPU-ready: the GPU choice explicit, CPU and memory requests, the GPU
toleration and a sized /dev/shm; every bad value refused naming its flag, with nothing on stdout.
(tests/e2e/test_manifest_gpu.py sends the pods the operator builds from it to a real API server.)"""

from __future__ import annotations

import os

import pytest
import yaml

from monarch_spmd import cli

from .conftest import cli_cmd, run

TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def manifest(*argv: str) -> tuple[dict, str]:
    result = run(cli_cmd("manifest", *argv))
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout), result.stderr


def test_nproc_per_node_gpu_counts_a_nodes_gpus_and_gives_each_proc_one():
    doc, err = manifest("--image", "img", "--node-gpus", "8", "--cpu", "90", "--memory", "1000Gi", "--",
                        "torchrun", "--nnodes", "4", "--nproc-per-node", "gpu", "-m", "train")
    spec = doc["spec"]
    assert spec["mesh"] == [{"name": "nodes", "size": 4}, {"name": "procs", "size": 8}]
    assert (spec["gpusPerProc"], spec["podLayout"], spec["shmSize"]) == (1, "PerHost", "500Gi")
    pod = spec["template"]["spec"]
    assert pod["tolerations"] == [TOLERATION]
    assert pod["containers"] == [{"name": "trainer", "resources": {"requests": {"cpu": "90", "memory": "1000Gi"},
                                                                    "limits": {"memory": "1000Gi"}}}]
    assert "the CUDA devices of this machine" not in err  # the count is the node's, as given


def test_an_explicit_gpu_count_per_proc_and_a_cpu_only_job():
    gpu, _ = manifest("--image", "img", "--gpus-per-proc", "2", "--shm-size", "16Gi", "--nproc-per-node", "4", "x.py")
    assert (gpu["spec"]["gpusPerProc"], gpu["spec"]["shmSize"]) == (2, "16Gi")
    assert gpu["spec"]["template"] == {"spec": {"tolerations": [TOLERATION]}}
    cpu, _ = manifest("--image", "img", "--gpus-per-proc", "0", "--memory", "3Mi", "--nproc-per-node", "4", "x.py")
    assert "gpusPerProc" not in cpu["spec"] and cpu["spec"]["shmSize"] == "1536Ki"
    assert "tolerations" not in cpu["spec"]["template"]["spec"]  # no GPU: no GPU node's taint to tolerate


@pytest.mark.parametrize("argv, message", [
    (["--nproc-per-node", "8", "x.py"], "--gpus-per-proc: required with --nproc-per-node 8: give 1 for a GPU per "
                                        "proc, 0 for CPUs only"),
    (["x.py"], "--gpus-per-proc: required with --nproc-per-node 1"),
    (["--", "torchrun", "--nproc-per-node", "gpu", "x.py"], "--nproc-per-node gpu: one proc per GPU of a cluster "
                                                              "node, but this machine has no GPU to count: give --node-gpus N"),
    (["--node-gpus", "8", "--gpus-per-proc", "1", "--nproc-per-node", "8", "x.py"], "--node-gpus: only counts for "
                                                                                    "--nproc-per-node gpu"),
    (["--node-gpus", "0", "--nproc-per-node", "gpu", "x.py"], "--node-gpus: 0 is not valid"),
    (["--gpus-per-proc", "0", "--cpu", "lots", "x.py"], "--cpu: 'lots' is not valid; expected a CPU quantity above 0"),
    (["--gpus-per-proc", "0", "--cpu", "0", "x.py"], "--cpu: '0' is not valid"),
    (["--gpus-per-proc", "0", "--memory", "64GB", "x.py"], "--memory: '64GB' is not valid; expected a memory quantity"),
    (["--gpus-per-proc", "0", "--shm-size", "0", "x.py"], "--shm-size: '0' is not valid"),
    (["--gpus-per-proc", "0", "--shm-size", "2Ti", "x.py"], "--shm-size: '2Ti' is not valid; expected a memory "
                                                            "quantity from 1Mi to 1Ti (spec.shmSize)"),
    (["--gpus-per-proc", "0", "--shm-size", "512Ki", "x.py"], "--shm-size: '512Ki' is not valid"),
])
def test_bad_gpu_and_resource_choices_are_refused_naming_the_flag(argv, message):
    result = run(cli_cmd("manifest", "--image", "img", *argv), env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and result.stdout == ""


@pytest.mark.parametrize("size, half", [("64Gi", "32Gi"), ("1G", "500M"), ("3Mi", "1536Ki"), ("1.5Gi", "768Mi"),
                                        ("1", "0"), ("3", "1"), ("2k", "1k"), ("1Ki", "512")])
def test_half_memory(size, half):
    assert cli.half_memory(size) == half


@pytest.mark.parametrize("memory, shm", [(None, "8Gi"), ("64Gi", "32Gi"), ("4Ti", "1Ti"), ("1Mi", "1Mi"), ("3Mi", "1536Ki")])
def test_the_default_shm_is_half_the_memory_within_the_specs_range(memory, shm):
    assert cli.shm_default(memory) == shm
