"""The node-loss benchmark without a cluster (benchmarks/node_loss.py; a run needs real nodes and
minutes: ``python -m benchmarks.node_loss --runs 1``): the jobs it creates and its report."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import node_loss


def test_the_systems_parse_into_groups_that_share_a_freeze():
    assert node_loss.parse_systems("inplace, jobset+pytorchjob") == [["inplace"], ["jobset", "pytorchjob"]]
    assert {s for g in node_loss.parse_systems(node_loss.DEFAULT_SYSTEMS) for s in g} == set(node_loss.SYSTEMS)
    with pytest.raises(argparse.ArgumentTypeError):
        node_loss.parse_systems("inplace,kubeflow")


def test_every_job_runs_the_node_loss_test_s_training_loop_on_the_real_nodes():
    from tests.realnode.conftest import STOCK_IMAGE
    from tests.realnode.test_node_loss import TRAIN

    for objects in (node_loss.spmd_objects("InPlace"), node_loss.spmd_objects("RecreatePods"),
                    node_loss.jobset_objects(), node_loss.pytorchjob_objects()):
        configmap, job = objects
        assert configmap["data"]["train.py"] == TRAIN
        text = repr(job)
        assert STOCK_IMAGE in text and "podAntiAffinity" in text and "'type': 'real'" in text
    inplace, recreate = node_loss.spmd_objects("InPlace")[1], node_loss.spmd_objects("RecreatePods")[1]
    assert inplace["spec"]["restartPolicy"] == {"maxRestarts": 0}
    assert recreate["spec"]["restartPolicy"] == {"maxRestarts": 1, "mode": "RecreatePods"}
    spared = node_loss.spare_objects()[1]
    assert spared["spec"]["spares"] == 1 and spared["spec"]["restartPolicy"] == {"maxRestarts": 0}
    spread = spared["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["labelSelector"]["matchExpressions"] == [{"key": "spmd.monarch.dev/rank", "operator": "Exists"}], \
        "the ranks spread; the spare, which has no rank, goes anywhere"
    elastic = node_loss.elastic_objects()[1]["spec"]
    assert elastic["mesh"] == [{"name": "nodes", "size": 2, "minSize": 1}, {"name": "procs", "size": 1}]
    assert (elastic["podLayout"], elastic["restartPolicy"]) == ("PerHost", {"maxRestarts": 0, "elasticWaitSeconds": 5})
    assert "requiredDuringSchedulingIgnoredDuringExecution" in elastic["template"]["spec"]["affinity"]["podAntiAffinity"], \
        "one pod per node: the lost pod's replacement waits for its node, the gang shrinks"
    jobset = node_loss.jobset_objects()[1]
    env = {e["name"]: e for e in jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == "lost-workers-0-0.lost" and jobset["spec"]["failurePolicy"]["maxRestarts"] == 1
    replicas = node_loss.pytorchjob_objects()[1]["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Master": 1, "Worker": 1}
    assert {v["restartPolicy"] for v in replicas.values()} == {"OnFailure"}


def test_a_run_that_never_recovered_reads_as_such_in_the_medians():
    rows = [{"system": "inplace", "run": r, "lost_rank": r % 2, "lost_node": "real-node-1", "cap_s": 720,
             "running_again_s": 20.0 + r, "training_again_s": 22.0 + r, "timeline": [(1.0, "x")],
             "node_timeline": [(0.0, "Ready=True taints=-")]} for r in (1, 2, 3)]
    rows += [{"system": "jobset", "run": r, "lost_rank": 0, "lost_node": "real-node-1", "cap_s": 720,
              "running_again_s": None, "training_again_s": 300.0 if r == 1 else None, "timeline": [],
              "node_timeline": [], "failed_s": 130.0 if r == 3 else None} for r in (1, 2, 3)]
    summary = {s["system"]: s for s in node_loss.summarize(rows)}
    assert summary["inplace"]["running_again"] == "22.0" and summary["inplace"]["training_again"] == "24.0"
    assert summary["jobset"]["running_again"] == "did not recover in 720 s"
    assert summary["jobset"]["training_again"] == "did not recover in 720 s"
    result = {"machine": {"cpus": 2, "cpu_model": "x", "mem_gib": 1.0, "python": "3", "date": "d", "commit": "c"},
              "controller_manager_flags": ["--leader-elect=false"], "rows": rows}
    text = node_loss.render(result)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    assert ["JobSet v0.12.0", "1", "0", "not in 720", "300.0"] in cells
    assert ["JobSet v0.12.0", "3", "0", "no (Failed at 130)", "no (Failed at 130)"] in cells
    assert "median of 3" in text and "node: Ready=True" in text
