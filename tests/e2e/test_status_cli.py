"""End-to-end: `monarch-spmd status` against the real API server, with the real operator.

Three jobs in one namespace, each in another phase for another reason: one that fails for real
on the process node (a module that does not exist: exit 1, Python's own message as the last
line), one Running on kwok nodes, one Pending because no node matches its selector. The command
runs as a user runs it (`python -m monarch_spmd.cli status`, the test cluster's kubeconfig) and
must agree with `kubectl get`, with the reason on every line.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devcluster.localcluster import REPO_ROOT
from tests.e2e.conftest import apply, job_manifest, wait_job, wait_phase

pytestmark = pytest.mark.cluster


def status_cmd(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_spmd.cli", "status", *args,
                           "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)


def test_status_lists_jobs_with_why_and_describes_one(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("broken", [("procs", 2)], ["-m", "tests.programs.no_such_module"],
                                     restartPolicy={"maxRestarts": 0}))
    apply(c, namespace, job_manifest("long", [("hosts", 2), ("gpus", 2)], ["-m", "train"], kwok=True))
    stuck = job_manifest("stuck", [("procs", 2)], ["-m", "train"], kwok=True)
    stuck["spec"]["template"]["spec"]["nodeSelector"] = {"type": "no-such-node"}
    apply(c, namespace, stuck)
    wait_phase(c, namespace, "broken", "Failed", timeout=180)
    wait_phase(c, namespace, "long", "Running", timeout=120)
    wait_job(c, namespace, "stuck", lambda j: (j.get("status") or {}).get("reason") == "Unschedulable", 120,
             "stuck Pending as Unschedulable")

    listed = status_cmd(c, "-n", namespace)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    print(listed.stdout)
    assert lines[0].split() == ["NAME", "PHASE", "MESH", "RUNNING/PROCS", "RESTARTS", "AGE", "REASON"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert sorted(rows) == ["broken", "long", "stuck"]
    assert rows["broken"].split()[1:5] == ["Failed", "procs=2", "0/2", "0"]
    assert "RestartLimitExceeded: rank " in rows["broken"] and " exit 1 (Error): " in rows["broken"]
    assert rows["broken"].endswith("No module named tests.programs.no_such_module")
    assert rows["long"].split()[1:5] == ["Running", "hosts=2,gpus=2", "4/4", "0"]
    assert "AllProcsRunning" in rows["long"]
    assert rows["stuck"].split()[1:5] == ["Pending", "procs=2", "0/2", "0"]
    assert "Unschedulable: " in rows["stuck"] and "node(s) didn't match" in rows["stuck"]
    # The same phases and counts as kubectl's own columns.
    kubectl = json.loads(c.kubectl("get", "spmdjobs", "-n", namespace, "-o", "json").stdout)["items"]
    for job in kubectl:
        cells = rows[job["metadata"]["name"]].split()
        assert cells[1] == job["status"]["phase"]
        assert cells[3] == f"{job['status']['running']}/{job['status']['procs']}"
        assert cells[4] == str(job["status"]["restarts"])

    everywhere = status_cmd(c, "-A")
    assert everywhere.returncode == 0, everywhere.stderr
    assert everywhere.stdout.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]
    mine = [line.split() for line in everywhere.stdout.splitlines()[1:] if line.split()[0] == namespace]
    assert sorted(cells[1] for cells in mine) == ["broken", "long", "stuck"]

    described = status_cmd(c, "broken", "-n", namespace)
    assert described.returncode == 0, described.stderr
    text = described.stdout
    print(text)
    assert text.startswith(f"Name:        broken\nNamespace:   {namespace}\nPhase:       Failed   (RestartLimitExceeded: ")
    assert "Restarts:    0 of at most 0" in text
    assert "Failure:     rank " in text and "exit 1 (Error), pod broken-" in text
    assert "exit 1 (Error), pod broken-" in text and "on node proc-node-0 (attempt 0, retryable)" in text
    output = text.split("lines of its output:\n")[1].split("Conditions:")[0]
    assert output.splitlines()[-1].endswith("No module named tests.programs.no_such_module")
    assert "Conditions:" in text and "Events (oldest first" in text
    events = text.split("Events (oldest first")[1]
    assert "RestartLimitExceeded" in events and "Warning" in events


def test_status_errors_are_clear(running_operator, namespace):
    c = running_operator
    missing = status_cmd(c, "nope", "-n", namespace)
    assert missing.returncode == 1
    assert missing.stderr == (f"monarch-spmd status: error: spmdjob nope not found in namespace {namespace} "
                              f"(monarch-spmd status -n {namespace} lists them)\n")
    empty = status_cmd(c, "-n", namespace)
    assert empty.returncode == 0 and empty.stdout == ""
    assert empty.stderr == f"No SPMDJobs in namespace {namespace}.\n"
    both = status_cmd(c, "nope", "-A")
    assert both.returncode == 2 and "give -n NAMESPACE instead of -A" in both.stderr
