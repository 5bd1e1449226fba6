"""End-to-end: Monarch mode on the process node, with real Monarch over TCP between pod namespaces.

An SPMDJob with ``mode: Monarch`` and mesh [hosts=2, gpus=2] runs two pods (PerHost), each
serving Monarch's worker loop. A client process on this machine (tests/e2e/monarch_client.py, as
a user would write one) reaches the pods' IPs on the process node's bridge, gets a proc mesh
shaped as the job's mesh from ``monarch_spmd.kubernetes.proc_mesh``, and runs
``setup_torch_elastic_env``, a gloo all_reduce across the pods and ``SPMDActor.main`` on it again
and again, on the same pods. A pod deleted under an attached client gives the client Monarch's
error naming the lost host (not a hang), the job a gang restart, and a new ``proc_mesh`` works on
the new pods. The same client also runs as a pod of the cluster, with its service account's
credentials.

The process node has no probes: it reports a pod Ready as soon as its container runs, so
``proc_mesh`` also waits for each worker loop's port to accept connections (a kubelet's TCP
readiness probe on the port does that on real nodes; tests/unit/test_builders.py checks the probe).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from kubernetes import client

from devcluster.localcluster import PROCESS_NODE, REPO_ROOT
from monarch_spmd import spec
from tests.e2e.conftest import apply, get_job, job_manifest, job_pods, pod_names, wait_job, wait_phase

pytestmark = pytest.mark.cluster
MESH = [("hosts", 2), ("gpus", 2)]


def monarch_job(name: str, **spec: Any) -> dict[str, Any]:
    """A Monarch-mode job on the process node: no args, PerHost."""
    body = job_manifest(name, MESH, [], **{"mode": "Monarch", "podLayout": "PerHost", **spec})
    del body["spec"]["args"]
    return body


class Client:
    """The client program as a subprocess: its RESULT lines, and its STEP lines as they come."""

    def __init__(self, cluster: Any, scenario: str, job: str, namespace: str) -> None:
        env = {**os.environ, **cluster.env, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.e2e.monarch_client", scenario, job, namespace],
                                     cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.results: dict[str, Any] = {}
        self.steps: dict[str, float] = {}
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            kind, _, value = line.rstrip("\n").partition(" ")
            if kind == "RESULT":
                self.results.update(json.loads(value))
            elif kind == "STEP":
                self.steps[json.loads(value)] = time.monotonic()

    def wait_step(self, step: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while step not in self.steps:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.finish(5)
                raise AssertionError(f"client: no step {step!r} in {timeout}s; results {self.results}\n{self.log()}")
            time.sleep(0.1)
        return self.steps[step]

    def finish(self, timeout: float) -> dict[str, Any]:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        return self.results

    def log(self) -> str:
        return "".join(line for line in self.stderr if not line.startswith("Monarch internal logs"))[-6000:]


def test_a_client_runs_gloo_across_two_pods_again_and_again_on_the_same_pods(running_operator, namespace):
    c = running_operator
    apply(c, namespace, monarch_job("mon"))
    job = wait_phase(c, namespace, "mon", "Running", timeout=120)
    status = job["status"]
    assert (status["mesh"], status["procs"], status["restarts"]) == ("hosts=2,gpus=2", 4, 0)
    assert "2 Monarch hosts are ready" in status["message"]
    pods = job_pods(c, namespace, "mon")
    assert sorted(p.metadata.name for p in pods) == pod_names(job, 0, 2), "one pod per host"
    before = {p.metadata.name: p.metadata.uid for p in pods}
    ip = {int(p.metadata.labels["spmd.monarch.dev/coord-hosts"]): p.status.pod_ip for p in pods}
    for pod in pods:
        [trainer] = pod.spec.containers
        assert trainer.command == ["python3", "/opt/monarch-spmd/payload/worker.py"]
        assert [(p.name, p.container_port) for p in trainer.ports] == [("monarch", 26600)]
        assert trainer.readiness_probe.tcp_socket.port == "monarch"

    client = Client(c, "runs", "mon", namespace)
    client.wait_step("done", 300)
    out = client.finish(30)
    assert client.proc.returncode == 0, client.log()
    assert (out["sizes"], out["labels"]) == ({"hosts": 2, "gpus": 2}, ["hosts", "gpus"])
    by_coords = {(w["coords"]["hosts"], w["coords"]["gpus"]): w for w in out["where"]}
    assert sorted(by_coords) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    names = pod_names(job, 0, 2)
    for (h, g), w in by_coords.items():
        assert w["pod"] == names[h], "host h's procs run in the pod of coordinate hosts=h"
        env = w["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"],
                env["GROUP_WORLD_SIZE"], env["TORCHELASTIC_RESTART_COUNT"]) == (
            str(2 * h + g), "4", str(g), "2", str(h), "2", "0")
        assert env["MASTER_ADDR"] == ip[0], "rank 0's pod IP, which the other pod reaches"
        assert w["inputs"] == [], "the procs see no worker input, as procs on one machine"
    assert len({w["pid"] for w in by_coords.values()}) == 4
    for pod in pods:
        assert f"serving Monarch's worker loop at tcp://{pod.status.pod_ip}:26600" in c.pod_log(namespace, pod.metadata.name)
    assert out["allreduce"] == [10.0] * 4, "gloo across the two pods' network namespaces"
    assert out["returned"] == [True] * 4 and out["main"] == 1, "SPMDActor.main twice"

    job = get_job(c, namespace, "mon")
    assert (job["status"]["phase"], job["status"]["restarts"]) == ("Running", 0)
    after = {p.metadata.name: p.metadata.uid for p in job_pods(c, namespace, "mon")}
    assert after == before, "the runs used the same pods: nothing rescheduled"


def test_a_pod_lost_under_an_attached_client_is_an_error_a_gang_restart_then_a_new_mesh(running_operator, namespace):
    c = running_operator
    apply(c, namespace, monarch_job("lose"))
    job = wait_phase(c, namespace, "lose", "Running", timeout=120)
    first = pod_names(job, 0, 2)
    client = Client(c, "lost", "lose", namespace)
    client.wait_step("calling", 180)
    time.sleep(2)
    deleted = time.monotonic()
    c.kubectl("delete", "pod", "-n", namespace, first[1], "--wait=false")
    client.wait_step("done", 300)
    out = client.finish(30)
    assert client.proc.returncode == 0, client.log()
    assert out["before"] == first
    assert out["error"] == "SupervisionError", out
    # The gang restart takes the other pod away too, so either host may be the one named.
    assert "Supervision event" in out["message"] and "{'hosts': " in out["message"], out["message"]
    assert out["seconds"] < 60, f"an error, not a hang: {out['seconds']:.0f}s after the call began"
    job = get_job(c, namespace, "lose")
    failure = job["status"]["failure"]
    assert (failure["pod"], failure["reason"], failure["restart"]) == (first[1], "PodDeleted", 0)
    assert job["status"]["restarts"] == 1 and job["status"]["phase"] == "Running"
    assert out["after"] == pod_names(job, 1, 2), "the new mesh is on the new attempt's pods"
    assert out["sizes"] == {"hosts": 2, "gpus": 2} and out["allreduce"] == [10.0] * 4
    print(f"lost host: client error {out['seconds']:.1f}s after the call began "
          f"({client.steps['done'] - deleted:.1f}s from the deletion to the end), new mesh in {out['again_seconds']:.1f}s")


def test_a_client_in_a_pod_of_the_cluster(running_operator, namespace):
    """The same client as a pod: in-cluster credentials (its service account, allowed to get
    spmdjobs and list pods by a Role), the pods reached, and reaching it, on the pod network."""
    c = running_operator
    rbac = client.RbacAuthorizationV1Api(c.api_client())
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "monarch-client"},
        "rules": [{"apiGroups": ["spmd.monarch.dev"], "resources": ["spmdjobs"], "verbs": ["get"]},
                  {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "monarch-client"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "monarch-client"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]})
    apply(c, namespace, monarch_job("inpod"))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
           "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": PROCESS_NODE},
                    "containers": [{"name": "client", "image": "python:3.11-slim",
                                    "command": ["python3", "-m", "tests.e2e.monarch_client", "runs", "inpod", namespace],
                                    "env": [{"name": "PYTHONPATH", "value": str(REPO_ROOT)},
                                            {"name": "PYTHONUNBUFFERED", "value": "1"}]}]}}
    c.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    core = client.CoreV1Api(c.api_client())
    deadline = time.monotonic() + 300
    while (phase := core.read_namespaced_pod("client", namespace).status.phase) not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, f"client pod still {phase}"
        time.sleep(1)
    log = c.pod_log(namespace, "client")
    assert phase == "Succeeded", log[-6000:]
    out: dict[str, Any] = {}
    for line in log.splitlines():
        if line.startswith("RESULT "):
            out.update(json.loads(line[len("RESULT "):]))
    assert out["sizes"] == {"hosts": 2, "gpus": 2}
    assert out["allreduce"] == [10.0] * 4 and out["returned"] == [True] * 4
    client_ip = core.read_namespaced_pod("client", namespace).status.pod_ip
    assert {w["env"]["MASTER_ADDR"] for w in out["where"]} != {client_ip}, "the master is a host, not the client"


def test_a_client_is_told_what_a_job_it_cannot_use_is(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("prog", MESH, ["unused.py"], podLayout="PerHost", suspend=True))
    env = {**os.environ, **c.env, "PYTHONPATH": str(REPO_ROOT)}
    code = ("from monarch_spmd.kubernetes import proc_mesh\n"
            "import sys\n"
            "try:\n    proc_mesh(sys.argv[1], sys.argv[2], timeout=5)\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    for job, expected in [("prog", "MonarchJobError SPMDJob {ns}/prog: spec.mode is Program, not Monarch"),
                          ("absent", "MonarchJobError SPMDJob {ns}/absent: not found")]:
        done = subprocess.run([sys.executable, "-c", code, job, namespace], env=env, capture_output=True,
                              text=True, timeout=120)
        assert expected.format(ns=namespace) in done.stdout, done.stdout + done.stderr


def test_the_api_server_refuses_a_monarch_job_with_args_or_one_pod_per_proc(running_operator, namespace):
    c = running_operator
    with_args = monarch_job("bad1")
    with_args["spec"]["args"] = ["-m", "train"]
    per_proc = monarch_job("bad2", podLayout="PerProc")
    for manifest, field, words in [(with_args, "spec.args", "not allowed with mode Monarch"),
                                   (per_proc, "spec.podLayout", "mode Monarch needs podLayout PerHost")]:
        done = apply(c, namespace, manifest, check=False)
        assert done.returncode != 0
        assert field in done.stderr and words in done.stderr, done.stderr
    apply(c, namespace, monarch_job("fixed", suspend=True))
    changed = monarch_job("fixed", suspend=True)
    changed["spec"].update(mode="Program", args=["x.py"])
    done = apply(c, namespace, changed, check=False)
    assert done.returncode != 0 and "spec.mode is immutable" in done.stderr, done.stderr
    wait_job(c, namespace, "fixed", lambda j: j.get("status", {}).get("phase") == "Suspended", 60, "Suspended")


@pytest.mark.parametrize(("changes", "valid"), [
    ({}, True),
    ({"args": ["-m", "train"]}, False),
    ({"args": []}, False),
    ({"args": None}, True),                        # null is pruned: no args
    ({"podLayout": "PerProc"}, False),
    ({"podLayout": None}, False),                  # defaults to PerProc
    ({"mode": "Program"}, False),                  # Program needs args
    ({"mode": "Program", "args": ["x.py"]}, True),
    ({"mode": None, "args": ["x.py"], "podLayout": None}, True),   # the defaults: Program, PerProc
    ({"mode": "monarch"}, False),
    ({"mesh": [{"name": "gpus", "size": 4}]}, True),                # one host, no host dimension
    ({"template": {"spec": {"containers": [{"name": "trainer", "args": ["x"]}]}}}, False),
])
def test_the_validator_and_the_api_server_agree_on_monarch_mode(operator, namespace, changes, valid):
    """The parity test (test_spec_parity.py) starts from Program-mode manifests; these start from
    Monarch mode's. A server-side dry run: nothing is created."""
    manifest = monarch_job("agree")
    manifest["spec"].update(changes)

    _, errors = spec.check_manifest(manifest)
    server = operator.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(manifest),
                              check=False)
    assert (not errors) == valid, [str(e) for e in errors]
    assert (server.returncode == 0) == valid, server.stderr
