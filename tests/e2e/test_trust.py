"""End-to-end: a gang's coordinator on a shared cluster, as a stranger meets it (docs/restart-in-place.md,
"Trust and bounds"), and the job's status as only its own loop may write it.

A pod in another namespace, with no rights at all, reaches the rank-0 pod's agent port over the
cluster network and tries every move that once drove a gang (tests/programs/stranger.py): the
victim trains on with the same pods, no restart and no Event, and the stranger reads not one
byte of the gang's output.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid

import pytest
from kubernetes import client

from monarch_spmd.payload import rendezvous
from monarch_spmd.payload.names import DEFAULT_AGENT_PORT
from spmd_operator import kube, names
from tests.e2e.conftest import (GROUP, PLURAL, PROCESS_NODE, REPO_ROOT, VERSION, apply, get_job, job_events,
                                job_manifest, job_pods, job_ref, operator_args, wait_phase, wait_until)

pytestmark = pytest.mark.cluster


def test_a_pod_in_another_namespace_can_neither_read_nor_drive_a_gang(running_operator, namespace):
    c = running_operator
    m = job_manifest("victim", [("procs", 2)], ["-m", "tests.programs.train_steps", "--steps", "80",
                                                 "--step-seconds", "0.25"], restartPolicy={"maxRestarts": 0})
    apply(c, namespace, m)
    job = wait_phase(c, namespace, "victim", "Running", timeout=180)
    zero = names.pod_name(job_ref(job), 0, 0)
    wait_until(lambda: "step 2 restart 0" in c.pod_log(namespace, zero), 90, "the gang training")
    before = {p.metadata.name: p.metadata.uid for p in job_pods(c, namespace, "victim")}
    core = client.CoreV1Api(c.api_client())
    pod = core.read_namespaced_pod(zero, namespace)
    port = next(p.container_port for ct in pod.spec.containers for p in ct.ports or []
                if p.name == names.AGENT_PORT_NAME)
    assert pod.status.pod_ip and port == DEFAULT_AGENT_PORT
    token_env = [e.name for ct in pod.spec.containers for e in ct.env or [] if e.name == "MONARCH_SPMD_AGENT_TOKEN"]
    assert token_env, "the gang's pods carry their attempt's token"

    other = f"stranger-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": other, "labels": {"monarch-spmd.dev/test": "1"}}})
    try:
        wait_until(lambda: core.list_namespaced_service_account(other).items, 30, "the default service account")
        core.create_namespaced_pod(other, {
            "metadata": {"name": "stranger"},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": PROCESS_NODE},
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "python:3.11-slim",
                                     "command": ["python3", "-m", "tests.programs.stranger", "--addr",
                                                 pod.status.pod_ip, "--port", str(port)],
                                     "env": [{"name": "PYTHONPATH", "value": str(REPO_ROOT)}]}]}})
        wait_until(lambda: core.read_namespaced_pod("stranger", other).status.phase in ("Succeeded", "Failed"), 120,
                   "the stranger's moves")
        log = c.pod_log(other, "stranger")
        lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        assert core.read_namespaced_pod("stranger", other).status.phase == "Succeeded", log
    finally:
        core.delete_namespace(other)
    moves = {line["move"]: line for line in lines if "move" in line}
    assert set(moves) == {"observe", "claim-member-and-fail", "disruptions-lots", "disruptions-huge", "guessed-token",
                          "oversized", "silent"}, log
    for name, line in moves.items():
        if name == "oversized":  # refused, or closed before the refusal could be read: nothing either way
            assert line["answer"] is None or line["answer"]["type"] == "refused", line
        elif name != "silent":
            assert line["answer"]["type"] == "refused", line
            assert set(line["answer"]) == {"type", "reason", "versions"}, line
    assert moves["silent"]["closed"] and moves["silent"]["seconds"] < rendezvous.HELLO_TIMEOUT + 5, moves["silent"]
    summary = lines[-1]
    assert summary["output_seen"] is False and summary["received"] < 4096, summary

    # The job's NetworkPolicy (what an enforcing network plugin would apply): the gang's own pods only.
    policy = client.NetworkingV1Api(c.api_client()).read_namespaced_network_policy(
        names.network_policy_name(job_ref(job)), namespace)
    selected = policy.spec.pod_selector.match_labels
    assert selected == {"spmd.monarch.dev/job": "victim", "spmd.monarch.dev/job-uid": job["metadata"]["uid"]}
    assert all(selected.items() <= p.metadata.labels.items() for p in job_pods(c, namespace, "victim"))
    assert [[peer.pod_selector.match_labels for peer in rule._from] for rule in policy.spec.ingress] == [[selected]], \
        "only the job's own pods (the operator runs outside any pod here)"
    assert policy.metadata.owner_references[0].uid == job["metadata"]["uid"]

    job = wait_phase(c, namespace, "victim", "Succeeded", timeout=180)
    status = job["status"]
    assert status["restarts"] == 0 and not status.get("disruptions") and not status.get("failure"), status
    assert {p.metadata.name: p.metadata.uid for p in job_pods(c, namespace, "victim")} == before
    assert "Restarting" not in [e.reason for e in job_events(c, namespace, "victim")]
    assert "train_steps rank 1 done restart 0" in c.pod_log(namespace, names.pod_name(job_ref(job), 0, 1))


def test_the_operators_status_patch_is_refused_for_a_namesake_by_the_real_api_server(running_operator, namespace,
                                                                                     monkeypatch):
    """What the operator's status patches rely on: a JSON Patch that tests metadata.uid first is
    refused whole for a job created again under the same name, so a loop that outlived its job
    never writes the namesake's status. (A merge patch naming the uid is not refused: the status
    subresource ignores metadata; the API server is asked here, not assumed.)"""
    cluster = running_operator
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    apply(cluster, namespace, job_manifest("namesake", [("procs", 1)], ["train.py"], suspend=True))
    job = get_job(cluster, namespace, "namesake")
    stale_uid = "0d9c0ffe-0000-4000-8000-000000000000"
    url = kube.job_url(namespace, "namesake", "status")

    async def patches() -> tuple[int | None, dict, dict]:
        api = kube.Kube(kube.login())
        try:
            refused = None
            try:
                await api.json_patch(url, [{"op": "test", "path": "/metadata/uid", "value": stale_uid},
                                           {"op": "add", "path": "/status", "value": {"message": "from a stale loop"}}])
            except kube.KubeError as e:
                refused = e.status
            merged = await api.patch(url, {"metadata": {"uid": stale_uid}, "status": {"reason": "merge-patched"}})
            own = await api.json_patch(url, [{"op": "test", "path": "/metadata/uid", "value": job["metadata"]["uid"]},
                                             {"op": "add", "path": "/status",
                                              "value": {**merged.get("status", {}), "message": "from its own loop"}}])
            return refused, merged, own
        finally:
            await api.close()

    refused, merged, own = asyncio.run(patches())
    assert refused == 422, refused
    assert merged["metadata"]["uid"] == job["metadata"]["uid"] and merged["status"]["reason"] == "merge-patched", \
        "a merge patch's uid is ignored: no precondition at all"
    assert own["status"]["message"] == "from its own loop"


def test_a_long_history_of_long_lines_is_seen_whole_after_the_operator_was_killed(running_operator, namespace,
                                                                                  tmp_path):
    """Four restarts in place whose ranks printed 50 lines of 20,000 characters, all while the
    operator was down: its welcome once came to 4.4 MB against the protocol's 1 MiB line, and the
    operator reconnected forever with the status frozen. Now the history fits, and the operator
    records every restart (counted once) and sees the gang running again."""
    c = running_operator
    go = tmp_path / "go"
    tmp_path.chmod(0o777)
    m = job_manifest("chatty", [("procs", 2)], ["-m", "tests.programs.long_lines", "--fail", "0:1,1:0,2:1,3:0",
                                                "--go-file", str(go)],
                     restartPolicy={"maxRestarts": 10, "backoffSeconds": 0})
    m["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 3
    apply(c, namespace, m)
    job = wait_phase(c, namespace, "chatty", "Running", timeout=180)
    os.killpg(c.operator_process.pid, signal.SIGKILL)
    c.operator_process.wait()
    c.operator_process = None
    go.touch()  # the ranks fail only now: every restart happens while the operator is down
    zero = names.pod_name(job_ref(job), 0, 0)
    wait_until(lambda: "long_lines rank 0 steady at restart 4" in c.pod_log(namespace, zero), 180,
               "four restarts in place while the operator is down")
    assert get_job(c, namespace, "chatty")["status"]["restarts"] == 0, "the operator saw none of them"
    c.start_operator(*operator_args())
    job = wait_until(lambda: (j := get_job(c, namespace, "chatty"))["status"].get("restarts") == 4
                     and j["status"]["phase"] == "Running" and j, 60, "the four restarts seen, Running again")
    status = job["status"]
    assert status["failure"]["restart"] == 3 and status["failure"]["rank"] == 0, status["failure"]
    assert len(status["failure"].get("message") or "") <= 2048
    assert not [x for x in status.get("conditions") or [] if x["type"] == "CoordinatorReachable"]
    log = (c.state_dir / "operator.log").read_text(errors="replace")
    assert "longer than" not in log, "no line over the limit"
    c.kubectl("delete", "spmdjob", "chatty", "-n", namespace, "--wait=false")
