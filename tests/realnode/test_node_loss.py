"""Real nodes, real containers: a node frozen under a running job, and the zombies of restarts.

A real node frozen under a running job: its kubelet, containerd and shims stopped, its containers
frozen, its pods' network down (devcluster.realnode.RealNodes.freeze), as a machine that hangs,
loses power or falls off the network. docs/restart-in-place.md, "Failure cases and bounds".

The job has ``maxRestarts: 0``: the loss must be a disruption, found by the agents' own
connections in seconds, the gang recreated on the healthy node without waiting for the node
controller (minutes) or for the lost pod's deletion, and training must go on.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.realnode.conftest import (JOB_LABEL, OPERATOR_NAMESPACE, STOCK_IMAGE, JobWatch, apply, get_job, job_pods,
                                     operator_pod, spmdjob, wait_until)

pytestmark = pytest.mark.cluster

# A training loop as torchrun users write one: gloo, an all_reduce a step, a line a step.
TRAIN = """\
import os, time
from datetime import timedelta
import torch, torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for step in range(int(os.environ.get("STEPS", "400"))):
    t = torch.tensor([step + 1.0])
    dist.all_reduce(t)
    print(f"rank {rank} attempt {attempt} step {step} sum {t.item():g}", flush=True)
    time.sleep(0.25)
dist.destroy_process_group()
"""


def test_a_frozen_node_under_a_max_restarts_0_job_is_a_disruption_and_training_goes_on(real_cluster,
                                                                                        real_namespace):
    spread = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": {JOB_LABEL: "frozen"}}}}]}}
    job, extra = spmdjob("frozen", 2, ["/opt/train/train.py"], STOCK_IMAGE, script=TRAIN,
                         restartPolicy={"maxRestarts": 0}, rendezvousTimeoutSeconds=120)
    job["spec"]["template"]["spec"].update(affinity=spread, terminationGracePeriodSeconds=5)
    apply(real_cluster, real_namespace, *extra, job)
    watch = JobWatch(real_cluster, real_namespace, "frozen")
    watch.wait_phase("Running", timeout=240)
    first = wait_until(lambda: _training(watch, attempt=0), 120, "both ranks training")
    nodes = {p["labels"]["spmd.monarch.dev/rank"]: (p["node"], p["name"]) for p in first}
    assert nodes["0"][0] != nodes["1"][0], f"the two pods share a node: {nodes}"
    # The operator's node stays up (a control plane's own machines are others): the job's pod on
    # the other node is lost with it, rank 1's (the coordinator sees its agent fall silent) or
    # rank 0's (the other agents lose their coordinator), as the scheduler placed them.
    operator_node = operator_pod(real_cluster).spec.node_name
    rank, (victim_node, victim_pod) = next((r, n) for r, n in nodes.items() if n[0] != operator_node)
    healthy = operator_node
    lost = real_cluster.real.names.index(victim_node)

    frozen_at = time.monotonic()
    real_cluster.real.freeze(lost)
    try:
        running = wait_until(lambda: (j := get_job(real_cluster, real_namespace, "frozen"))["status"].get("restarts")
                             == 1 and j["status"]["phase"] == "Running" and j, 150, "Running again after the loss",
                             diagnose=lambda: _diagnose(real_cluster, real_namespace))
        back = time.monotonic() - frozen_at
        again = wait_until(lambda: _training(watch, attempt=1), 120, "both ranks training again")
        training = time.monotonic() - frozen_at
    finally:
        real_cluster.real.thaw(lost)
    status = running["status"]
    failure = status["failure"]
    assert (failure["reason"], failure["node"], failure["disruption"], failure["pod"]) == (
        "NodeLost", victim_node, True, victim_pod), failure
    assert status.get("disruptions") == 1 and status["phase"] == "Running", status
    assert {p["node"] for p in again} == {healthy}, "the new gang keeps off the lost node"
    print(f"\nnode loss (rank {rank}'s node): Running again {back:.1f}s, every rank training again "
          f"{training:.1f}s after the freeze")
    assert back < 60, f"Running again {back:.1f}s after the freeze"


def test_a_frozen_node_under_a_job_with_a_hot_spare_is_taken_over_in_place_in_seconds(real_cluster, real_namespace):
    """spec.spares 1, maxRestarts 0, two real nodes: rank 1's node is frozen while the spare waits
    on the other. The spare takes rank 1's place: the same gang (gangRestart 0, rank 0's pod kept),
    every rank training again with TORCHELASTIC_RESTART_COUNT 1, the restart a disruption, the
    spare's pod labelled rank 1's replacement."""
    operator_node = operator_pod(real_cluster).spec.node_name
    # The ranks spread over the two nodes (a preferred anti-affinity between ranked pods). The
    # operator's node must keep rank 0 (it is not the one frozen): a job whose rank 1 landed there
    # is made again; a spare that landed beside rank 1 is deleted, and the operator makes another.
    placed = None
    for _ in range(8):
        job, extra = spmdjob("spared", 2, ["/opt/train/train.py"], STOCK_IMAGE, script=TRAIN, spares=1,
                             restartPolicy={"maxRestarts": 0}, rendezvousTimeoutSeconds=120,
                             trainer={"env": [{"name": "STEPS", "value": "4000"}]})
        job["spec"]["template"]["spec"].update(affinity=SPREAD_RANKS("spared"), terminationGracePeriodSeconds=5)
        apply(real_cluster, real_namespace, *extra, job)
        placed = wait_until(lambda: _spare_placed(real_cluster, real_namespace), 240,
                            "rank 0 with a ready spare on one node, rank 1 on the other",
                            diagnose=lambda: _diagnose(real_cluster, real_namespace, "spared"))
        if placed[0]["node"] == operator_node:
            break
        real_cluster.kubectl("delete", "spmdjob", "spared", "-n", real_namespace, "--wait=true", timeout=120)
        wait_until(lambda: not job_pods(real_cluster, real_namespace, "spared"), 120, "the job's pods gone")
    assert placed is not None and placed[0]["node"] == operator_node, "rank 1 kept landing on the operator's node"
    zero, one, spare = placed
    wait_until(lambda: _steps(real_cluster, real_namespace, [zero["name"], one["name"]], attempt=0), 120,
               "both ranks training")
    lost = real_cluster.real.names.index(one["node"])
    frozen_at = time.monotonic()
    real_cluster.real.freeze(lost)
    try:
        running = wait_until(lambda: (j := get_job(real_cluster, real_namespace, "spared"))["status"].get("restarts")
                             == 1 and j["status"]["phase"] == "Running" and j, 120, "Running again with the spare",
                             diagnose=lambda: _diagnose(real_cluster, real_namespace, "spared"))
        back = time.monotonic() - frozen_at
        wait_until(lambda: _steps(real_cluster, real_namespace, [zero["name"], spare["name"]], attempt=1), 120,
                   "both ranks training again", diagnose=lambda: _diagnose(real_cluster, real_namespace, "spared"))
        training = time.monotonic() - frozen_at
    finally:
        real_cluster.real.thaw(lost)
    status = running["status"]
    assert (status.get("gangRestart"), status.get("disruptions"), status["spares"]["used"]) == (0, 1, 1), status
    assert (status["failure"]["pod"], status["failure"]["disruption"]) == (one["name"], True), status["failure"]
    wait_until(lambda: ({p.metadata.name: p.metadata.labels for p in job_pods(real_cluster, real_namespace, "spared")}
                        .get(spare["name"]) or {}).get("spmd.monarch.dev/rank") == "1", 60,
               "the spare's pod relabelled as rank 1's",
               diagnose=lambda: _diagnose(real_cluster, real_namespace, "spared"))
    print(f"\nnode loss with a hot spare: Running again {back:.1f}s, every rank training again {training:.1f}s "
          "after the freeze")
    assert training < 60, f"training again {training:.1f}s after the freeze"


def SPREAD_RANKS(name: str) -> dict:  # noqa: N802 - a constant's shape, made per job
    """The job's ranked pods spread over the nodes (a preferred anti-affinity, weight 100), and every
    pod leans towards rank 0's node (a preferred affinity, weight 50): rank 1 goes to the other
    node, a spare made once both ranks run goes beside rank 0. A spare has no rank label."""
    ranked = {"matchLabels": {JOB_LABEL: name}, "matchExpressions": [{"key": "spmd.monarch.dev/rank",
                                                                       "operator": "Exists"}]}
    zero = {"matchLabels": {JOB_LABEL: name, "spmd.monarch.dev/rank": "0"}}
    host = "kubernetes.io/hostname"
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100, "podAffinityTerm": {"topologyKey": host, "labelSelector": ranked}}]},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 50, "podAffinityTerm": {"topologyKey": host, "labelSelector": zero}}]}}


def _spare_placed(cluster, namespace: str, name: str = "spared") -> tuple[dict, dict, dict] | None:
    """(rank 0's, rank 1's and a ready spare's pod) once the ranks run on two nodes and a spare on
    rank 0's; a spare beside rank 1 is deleted (the operator makes another)."""
    pods = [p for p in job_pods(cluster, namespace, name) if not p.metadata.deletion_timestamp]
    info = [{"name": p.metadata.name, "node": p.spec.node_name, "labels": p.metadata.labels or {},
             "phase": p.status.phase} for p in pods]
    zero = next((p for p in info if p["labels"].get("spmd.monarch.dev/rank") == "0"), None)
    one = next((p for p in info if p["labels"].get("spmd.monarch.dev/rank") == "1"), None)
    spares = [p for p in info if "spmd.monarch.dev/spare" in p["labels"] and p["phase"] == "Running"]
    if zero is None or one is None or any(p["phase"] != "Running" for p in (zero, one)) or zero["node"] == one["node"]:
        return None
    for p in spares:
        if p["node"] == one["node"]:
            cluster.kubectl("delete", "pod", p["name"], "-n", namespace, "--wait=false", check=False)
    good = [p for p in spares if p["node"] == zero["node"]]
    ready = (get_job(cluster, namespace, name)["status"].get("spares") or {}).get("ready")
    return (zero, one, good[0]) if good and ready else None


def _steps(cluster, namespace: str, names: list[str], attempt: int) -> bool:
    """Every named pod's log shows a training step of ``attempt`` (TORCHELASTIC_RESTART_COUNT)."""
    for name in names:
        log = cluster.kubectl("logs", "-n", namespace, name, check=False).stdout
        if not re.search(rf"attempt {attempt} step \d+ sum", log):
            return False
    return True


def _diagnose(cluster, namespace: str, name: str = "frozen") -> str:
    job = get_job(cluster, namespace, name)
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    log = cluster.kubectl("logs", "-n", OPERATOR_NAMESPACE, operator_pod(cluster).metadata.name, "--tail=80",
                          check=False, timeout=20)
    return (f"status: {json.dumps(job.get('status'), indent=1)}\npods:\n{pods}\noperator log:\n"
            f"{log.stdout[-6000:]}{log.stderr[-500:]}")


def _training(watch: JobWatch, attempt: int) -> list[dict] | None:
    """The pods of ``attempt`` whose rank printed a step, or None until both have."""
    watch.poll()
    pods = [dict(p, name=n) for n, p in watch.pods.items()
            if p["labels"].get("spmd.monarch.dev/restart") == str(attempt) and p.get("phase") == "Running"]
    if len(pods) < 2:
        return None
    for pod in pods:
        log = watch.cluster.kubectl("logs", "-n", watch.namespace, pod["name"], check=False).stdout
        if not re.search(rf"attempt {attempt} step \d+ sum", log):
            return None
    return pods


def test_ten_restarts_in_place_leave_no_zombie_in_real_containers(real_cluster, real_namespace):
    """The worker is PID 1 of the trainer container: every process a rank leaves behind (DataLoader
    workers, a multiprocessing child, a subprocess; a rank ended by SIGTERM leaves its own) lands
    on it and must be reaped. Ten restarts in place, the same two pods throughout."""
    script = (Path(__file__).resolve().parents[1] / "programs" / "leave_orphans.py").read_text()
    job, extra = spmdjob("orphans", 2, ["/opt/train/train.py", "--restarts", "10", "--alternate"], STOCK_IMAGE,
                         script=script, restartPolicy={"maxRestarts": 10, "backoffSeconds": 0},
                         rendezvousTimeoutSeconds=120)
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 5
    apply(real_cluster, real_namespace, *extra, job)
    watch = JobWatch(real_cluster, real_namespace, "orphans")
    done = watch.wait_phase("Succeeded", "Failed", timeout=600)
    status = done["status"]
    assert status["phase"] == "Succeeded" and status["restarts"] == 10, json.dumps(status, indent=1)
    assert status.get("gangRestart") == 0, "every restart was in place: the same pods"
    logs = watch.pod_logs()
    assert len(logs) == 2, list(watch.pods)
    for name, log in logs.items():
        rank = int(re.search(r"rank (\d+)/2", log).group(1))
        left = {int(r) for r in re.findall(r"leave_orphans restart (\d+): left 4 pids", log)}
        # The failing rank of each restart always gets that far; the other may be stopped first.
        assert left >= {r for r in range(10) if r % 2 == rank}, (name, sorted(left), log[-3000:])
        final = re.search(r"leave_orphans restart 10: zombies (\d+) others (\[.*\])", log)
        assert final is not None and (final.group(1), final.group(2)) == ("0", "[]"), (name, log[-3000:])


def _elastic_placed(cluster, namespace: str, name: str) -> tuple[dict, dict] | None:
    """(pod 0, pod 1) once both run, each on its own node (a pod's rank label is its first rank)."""
    pods = [p for p in job_pods(cluster, namespace, name) if not p.metadata.deletion_timestamp]
    info = {(p.metadata.labels or {}).get("spmd.monarch.dev/rank"): {"name": p.metadata.name, "node": p.spec.node_name,
                                                                     "phase": p.status.phase} for p in pods}
    zero, one = info.get("0"), info.get("2")
    if zero is None or one is None or zero["phase"] != "Running" or one["phase"] != "Running":
        return None
    return zero, one


def _world(cluster, namespace: str, pod: str, world: int, attempt_at_least: int) -> bool:
    """Rank 0's log shows a step at ``world`` ranks in a restart of at least ``attempt_at_least``."""
    log = cluster.kubectl("logs", "-n", namespace, pod, check=False).stdout
    starts = [json.loads(m) for m in re.findall(r"elastic_train start (\{.*\})", log)]
    restart = max((int(s["env"]["TORCHELASTIC_RESTART_COUNT"]) for s in starts), default=-1)
    return restart >= attempt_at_least and re.search(rf"elastic_train step \d+ world {world}\n(?![\s\S]*elastic_train start)",
                                                     log) is not None


def test_a_frozen_node_under_an_elastic_job_shrinks_it_trains_on_and_grows_back_when_the_node_returns(
        real_cluster, real_namespace, tmp_path):
    """mesh nodes 2 (minSize 1) x procs 2, maxRestarts 0, each pod on its own node (a required
    anti-affinity): rank 1's node is frozen. The gang goes on with pod 0 alone (WORLD_SIZE 2) after
    elasticWaitSeconds, resharding from the checkpoint; the pod created in place of the lost one
    waits (it fits only where the lost pod still is); when the node returns, the lost pod ends, the
    new one runs there and the gang grows back to WORLD_SIZE 4. Neither is a counted restart."""
    name = "elastic"
    operator_node = operator_pod(real_cluster).spec.node_name
    script = (Path(__file__).resolve().parents[2] / "monarch_spmd" / "examples" / "elastic_train.py").read_text()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ckpt.chmod(0o777)
    ranked = {"matchLabels": {JOB_LABEL: name}, "matchExpressions": [{"key": "spmd.monarch.dev/rank",
                                                                       "operator": "Exists"}]}
    one_per_node = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "topologyKey": "kubernetes.io/hostname", "labelSelector": ranked}]}}
    placed = None
    for _ in range(8):
        job, extra = spmdjob(name, 2, ["/opt/train/train.py", "--checkpoint-dir", "/ckpt", "--steps", "100000",
                                       "--step-seconds", "0.2", "--report-every", "1"], STOCK_IMAGE, script=script,
                             restartPolicy={"maxRestarts": 0, "elasticWaitSeconds": 5}, rendezvousTimeoutSeconds=120,
                             podLayout="PerHost")
        job["spec"]["mesh"] = [{"name": "nodes", "size": 2, "minSize": 1}, {"name": "procs", "size": 2}]
        pod = job["spec"]["template"]["spec"]
        pod.update(affinity=one_per_node, terminationGracePeriodSeconds=5)
        pod["volumes"].append({"name": "ckpt", "hostPath": {"path": str(ckpt), "type": "Directory"}})
        pod["containers"][0]["volumeMounts"].append({"name": "ckpt", "mountPath": "/ckpt"})
        apply(real_cluster, real_namespace, *extra, job)
        placed = wait_until(lambda: _elastic_placed(real_cluster, real_namespace, name), 240, "both pods running",
                            diagnose=lambda: _diagnose(real_cluster, real_namespace, name))
        if placed[0]["node"] == operator_node:
            break
        real_cluster.kubectl("delete", "spmdjob", name, "-n", real_namespace, "--wait=true", timeout=120)
        wait_until(lambda: not job_pods(real_cluster, real_namespace, name), 120, "the job's pods gone")
    assert placed is not None and placed[0]["node"] == operator_node, "rank 0 kept landing off the operator's node"
    zero, one = placed
    wait_until(lambda: _world(real_cluster, real_namespace, zero["name"], 4, 0), 180, "training at 4 ranks",
               diagnose=lambda: _diagnose(real_cluster, real_namespace, name))
    lost = real_cluster.real.names.index(one["node"])
    frozen_at = time.monotonic()
    real_cluster.real.freeze(lost)
    try:
        wait_until(lambda: _world(real_cluster, real_namespace, zero["name"], 2, 1), 120,
                   "pod 0's ranks training alone (2 ranks)", diagnose=lambda: _diagnose(real_cluster, real_namespace, name))
        shrunk = time.monotonic() - frozen_at
        status = get_job(real_cluster, real_namespace, name)["status"]
        assert (status["size"], status["disruptions"], status.get("gangRestart")) == (
            {"pods": 1, "procs": 2, "members": [0]}, 1, 0), status
        assert (status["failure"]["reason"], status["failure"]["pod"]) == ("NodeLost", one["name"]), status["failure"]
        replacement = [p for p in job_pods(real_cluster, real_namespace, name)
                       if (p.metadata.labels or {}).get("spmd.monarch.dev/replacement") == "1"]
        assert replacement and replacement[0].status.phase == "Pending", "pod 1 created again, waiting for a node"
    finally:
        real_cluster.real.thaw(lost)
    thawed_at = time.monotonic()
    wait_until(lambda: _world(real_cluster, real_namespace, zero["name"], 4, 2), 300,
               "the gang grown back to 4 ranks after the node returned",
               diagnose=lambda: _diagnose(real_cluster, real_namespace, name))
    grown = time.monotonic() - thawed_at
    status = get_job(real_cluster, real_namespace, name)["status"]
    assert (status["size"]["pods"], status["restarts"], status["disruptions"], status["phase"]) == (
        2, 2, 2, "Running"), status
    print(f"\nelastic job, node frozen: training on at 2 ranks {shrunk:.1f}s after the freeze; grown back to 4 ranks "
          f"{grown:.1f}s after the node returned")
    assert shrunk < 60, f"training again {shrunk:.1f}s after the freeze"
