"""SPMDJobs on real nodes, run by the operator the chart installed: containers, cgroups, CoreDNS.

What only a real node shows: the worker image's torch doing gloo between containers on two
nodes, names resolved by the cluster DNS, a stock image that knows nothing of this project,
the kernel's OOM killer, a missing image, and a gang restart whose new pods must never reach an
old one. Pods are found by the job label and the job's status is read, never a pod name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.realnode.conftest import (JOB_LABEL, ON_REAL_NODES, ROOT, STOCK_IMAGE, WORKER_IMAGE,
                                     JobWatch, apply, spmdjob)

pytestmark = pytest.mark.cluster


def coredns_answers(real_cluster, name: str) -> list[str]:
    """CoreDNS log lines (its `log` plugin) of A queries for `name` it answered with NOERROR."""
    log = Path(real_cluster.state_dir, "realnode", "coredns.log").read_text(errors="replace")
    return [line for line in log.splitlines()
            if f'"A IN {name}.cluster.local. ' in line and " NOERROR " in line]


def test_hello_gloo_example_runs_across_two_real_nodes(real_cluster, real_namespace):
    job = yaml.safe_load((ROOT / "examples" / "hello-gloo.yaml").read_text())
    job["spec"]["image"] = WORKER_IMAGE
    pod_spec = job["spec"]["template"]["spec"]
    pod_spec.update(ON_REAL_NODES)
    # One pod per node at most more than the other: the 2x2 mesh spans both real nodes.
    pod_spec["topologySpreadConstraints"] = [{
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {JOB_LABEL: job["metadata"]["name"]}}}]
    pod_spec["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    apply(real_cluster, real_namespace, job)
    watch = JobWatch(real_cluster, real_namespace, job["metadata"]["name"])
    done = watch.wait_phase("Succeeded", "Failed", timeout=420)
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)

    nodes = {pod["node"] for pod in watch.pods.values()}
    assert len(nodes) == 2 and all(n.startswith("real-node-") for n in nodes), watch.pods
    assert len(watch.logs) == 4, (watch.logs.keys(), watch.log_errors)
    for pod, log in watch.logs.items():
        assert "sum 10 (expected 10)" in log, f"{pod}:\n{log}"
    # MASTER_ADDR (a headless Service name) was resolved by the cluster DNS, to rank 0's pod.
    master = done["status"]["masterAddr"]
    answers = coredns_answers(real_cluster, master)
    assert answers, f"CoreDNS never answered {master}"


STOCK_SCRIPT = """\
import importlib.util, os, socket
import torch
import torch.distributed as dist

addr = os.environ["MASTER_ADDR"]
print(f"torch {torch.__version__}; monarch_spmd installed: "
      f"{importlib.util.find_spec('monarch_spmd') is not None}; "
      f"rank {os.environ['RANK']}/{os.environ['WORLD_SIZE']}; "
      f"MASTER_ADDR {addr} -> {socket.gethostbyname(addr)}", flush=True)
dist.init_process_group("gloo", init_method="env://")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"all_reduce sum {value.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_stock_debian_image_runs_through_the_shipped_worker(real_cluster, real_namespace):
    job, extra = spmdjob("stock", 2, ["/opt/train/train.py"], STOCK_IMAGE, script=STOCK_SCRIPT,
                         restartPolicy={"maxRestarts": 0})
    apply(real_cluster, real_namespace, *extra, job)
    watch = JobWatch(real_cluster, real_namespace, "stock")
    done = watch.wait_phase("Succeeded", "Failed", timeout=240)
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)
    assert len(watch.logs) == 2, watch.logs
    for pod, log in watch.logs.items():
        # Debian's own torch; the project is not in the image: the worker came in a ConfigMap.
        assert "torch 1.13" in log and "monarch_spmd installed: False" in log, f"{pod}:\n{log}"
        assert "all_reduce sum 3" in log, f"{pod}:\n{log}"


def test_memory_limit_exceeded_fails_the_job_with_oomkilled(real_cluster, real_namespace):
    script = "data = b'x' * (512 * 2**20)\nprint(len(data))\n"
    limits = {"resources": {"requests": {"memory": "96Mi"}, "limits": {"memory": "96Mi"}}}
    job, extra = spmdjob("oom", 1, ["/opt/train/train.py"], STOCK_IMAGE, script=script,
                         trainer=limits, restartPolicy={"maxRestarts": 0})
    apply(real_cluster, real_namespace, *extra, job)
    done = JobWatch(real_cluster, real_namespace, "oom").wait_phase("Succeeded", "Failed",
                                                                    timeout=180)
    status = done["status"]
    assert status["phase"] == "Failed", json.dumps(status, indent=1)
    failure = status["failure"]
    assert failure["reason"] == "OOMKilled", failure
    assert failure["exitCode"] == 137, failure
    assert failure["node"].startswith("real-node-"), failure


def test_missing_image_fails_the_job_with_the_image_pull_reason(real_cluster, real_namespace):
    image = "monarch-spmd.local/never-built:1"
    job, extra = spmdjob("noimage", 1, ["-m", "nothing"], image,
                         trainer={"imagePullPolicy": "Never"})
    apply(real_cluster, real_namespace, *extra, job)
    done = JobWatch(real_cluster, real_namespace, "noimage").wait_phase("Failed", "Succeeded",
                                                                        timeout=180)
    status = done["status"]
    assert status["phase"] == "Failed", json.dumps(status, indent=1)
    failure = status["failure"]
    # The kubelet's reason: with pullPolicy Never nothing will ever bring the image.
    assert failure["reason"] == "ErrImageNeverPull", failure
    assert failure.get("permanent") is True, failure
    assert image in failure.get("message", ""), failure


# Attempt 0: rank 1 fails at once (a retryable exit), rank 0 keeps serving on MASTER_PORT for a
# while after SIGTERM, as a slow-to-stop old pod does. Attempt 1: rank 0 answers every connection
# with who it is; rank 1 connects to MASTER_ADDR:MASTER_PORT and must reach attempt 1's rank 0.
RESTART_SCRIPT = """\
import json, os, signal, socket, sys, threading, time

addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
me = {"attempt": attempt, "rank": rank, "pod": socket.gethostname(),
      "ip": socket.gethostbyname(socket.gethostname())}
resolved = socket.gethostbyname(addr)
print("SEEN " + json.dumps({**me, "master_addr": addr, "resolved": resolved}), flush=True)

if rank == 0:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: threading.Timer(8, done.set).start())
    server = socket.create_server(("0.0.0.0", port))
    server.settimeout(0.5)
    deadline = time.monotonic() + 240
    while not done.is_set() and time.monotonic() < deadline:
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        with conn:
            try:
                conn.sendall((json.dumps(me) + "\\n").encode())
                if attempt > 0 and conn.recv(16) == b"bye":
                    sys.exit(0)
            except OSError:
                pass  # the worker's port probe hangs up at once
    sys.exit(0 if done.is_set() else 1)

if attempt == 0:
    time.sleep(2)
    sys.exit(3)  # the first attempt fails: the gang restarts
deadline = time.monotonic() + 60
while True:
    try:
        with socket.create_connection((addr, port), timeout=5) as conn:
            peer = json.loads(conn.makefile().readline())
            conn.sendall(b"bye")
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
print("PEER " + json.dumps(peer), flush=True)
sys.exit(0 if peer["attempt"] == attempt and peer["ip"] == resolved else 42)
"""


def test_gang_restart_reaches_only_the_new_attempts_rank_0(real_cluster, real_namespace):
    job, extra = spmdjob("regang", 2, ["/opt/train/train.py"], STOCK_IMAGE, script=RESTART_SCRIPT,
                         restartPolicy={"maxRestarts": 2, "permanentExitCodes": [42], "mode": "RecreatePods"},
                         rendezvousTimeoutSeconds=120)
    apply(real_cluster, real_namespace, *extra, job)
    watch = JobWatch(real_cluster, real_namespace, "regang")
    done = watch.wait_phase("Succeeded", "Failed", timeout=300)
    status = done["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1) + json.dumps(watch.logs)
    assert status["restarts"] == 1, status

    attempt = str(status["restarts"])
    [rank0] = [p for p in watch.pods.values()
               if p["labels"].get("spmd.monarch.dev/restart") == attempt
               and p["labels"].get("spmd.monarch.dev/rank") == "0"]
    logs = watch.pod_logs(restart=attempt)
    assert len(logs) == 2, watch.pods
    seen = [json.loads(line.split(" ", 1)[1]) for log in logs.values()
            for line in log.splitlines() if line.startswith("SEEN ")]
    peers = [json.loads(line.split(" ", 1)[1]) for log in logs.values()
             for line in log.splitlines() if line.startswith("PEER ")]
    assert sorted(s["rank"] for s in seen) == [0, 1], logs
    # Every rank of the new attempt resolved MASTER_ADDR to the new rank 0's pod IP ...
    for s in seen:
        assert s["attempt"] == int(attempt) and s["resolved"] == rank0["ip"], (s, rank0)
    # ... and what answered on MASTER_PORT was the new rank 0, never the old one.
    assert peers and all(p["attempt"] == int(attempt) and p["rank"] == 0 for p in peers), peers
    assert status["masterAddr"] == seen[0]["master_addr"], status
    assert coredns_answers(real_cluster, status["masterAddr"])
