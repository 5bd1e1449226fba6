"""End-to-end: `monarch-spmd status` (and `logs`) against the real API server, with the real operator.

Three jobs in one namespace, each in another phase for another reason: one that fails for real
on the process node (a module that does not exist: exit 1, Python's own message as the last
line), one Running on kwok nodes, one Pending because no node matches its selector. The command
runs as a user runs it (`python -m monarch_spmd.cli status`, the test cluster's kubeconfig) and
must agree with `kubectl get`, with the reason on every line. Then: a job re-created under the
name of one deleted with --cascade=orphan shows only its own pods; a failed job's view and log end
with the per-rank table and the rank that failed first; -o json|yaml|wide, -w, and `kubectl spmd`.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading

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


# --- a job's children by its uid, the per-rank table, -o, -w and the kubectl plugin -------------


def logs_cmd(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_spmd", "logs", *args, "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def said(text: str) -> list[str]:
    """The lines tests.programs.say printed (the worker's own start line aside)."""
    return sorted(line for line in text.splitlines() if "-job rank " in line)


def say(name: str, word: str, procs: int = 2, **spec) -> dict:
    return job_manifest(name, [("procs", procs)], ["-m", "tests.programs.say", word], **spec)


def test_logs_and_status_never_show_the_pods_of_a_deleted_namesake(running_operator, namespace):
    """A job deleted with --cascade=orphan leaves its pods (with its name label); a new job under
    the same name must show only its own pods: before any exist, and once they ran."""
    c = running_operator
    apply(c, namespace, say("again", "old-job"))
    wait_phase(c, namespace, "again", "Succeeded", timeout=180)
    first = logs_cmd(c, "again", "-n", namespace)
    assert first.returncode == 0 and said(first.stdout) == [
        "[rank 0] old-job rank 0", "[rank 1] old-job rank 1"], first.stdout + first.stderr
    c.kubectl("delete", "spmdjob", "again", "-n", namespace, "--cascade=orphan", "--wait=true", timeout=120)
    orphans = c.kubectl("get", "pods", "-n", namespace, "-l", "spmd.monarch.dev/job=again", "-o", "name").stdout.split()
    assert len(orphans) == 2, "the old job's pods stay, orphaned"

    apply(c, namespace, say("again", "new-job", suspend=True, restartPolicy={"maxRestarts": 0}))
    wait_phase(c, namespace, "again", "Suspended", timeout=60)
    before = logs_cmd(c, "again", "-n", namespace)
    assert "old-job" not in before.stdout + before.stderr
    assert before.returncode == 1 and before.stderr == "monarch-spmd logs: error: spmdjob again has no pods yet\n"
    described = status_cmd(c, "again", "-n", namespace, "-o", "wide")
    assert described.returncode == 0, described.stderr
    assert not any(o.split("/")[1] in described.stdout for o in orphans), described.stdout

    c.kubectl("patch", "spmdjob", "again", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    wait_phase(c, namespace, "again", "Succeeded", timeout=180)
    after = logs_cmd(c, "again", "-n", namespace)
    assert after.returncode == 0, after.stderr
    assert said(after.stdout) == ["[rank 0] new-job rank 0", "[rank 1] new-job rank 1"]
    assert "old-job" not in after.stdout + after.stderr


def test_a_failed_job_ends_with_a_per_rank_table_naming_the_rank_that_failed_first(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("crash", [("procs", 2)], ["-m", "tests.programs.say", "hi", "--kill-rank", "1"],
                                     restartPolicy={"maxRestarts": 0}))
    job = wait_phase(c, namespace, "crash", "Failed", timeout=180)
    pod = job["status"]["failure"]["pod"]
    last = (f"spmdjob crash failed: rank 1 (local rank 1, pod {pod} on node proc-node-0) failed first: "
            "exit code 137 (SIGKILL, Error)")

    described = status_cmd(c, "crash", "-n", namespace)
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    print(described.stdout)
    assert lines[-1] == last
    table = lines.index("Ranks of attempt 0:")
    assert lines[table + 1].split() == ["RANK", "LOCAL_RANK", "POD", "NODE", "EXIT", "CODE", "REASON"]
    assert lines[table + 2].split()[:2] == ["0", "0"]  # exit 0, or stopped by the operator once rank 1 failed
    assert lines[table + 3].split() == ["1", "1", pod, "proc-node-0", "137", "(SIGKILL)", "Error", "<-", "first",
                                        "failure"]
    listed = status_cmd(c, "-n", namespace)
    assert "RestartLimitExceeded: rank 1 exit 137 (SIGKILL, Error)" in listed.stdout, listed.stdout

    logged = logs_cmd(c, "crash", "-n", namespace)
    assert logged.returncode == 0, logged.stderr
    assert "[rank 1] hi rank 1" in logged.stdout.splitlines()
    assert logged.stderr.splitlines()[0] == "Ranks of attempt 0:" and logged.stderr.splitlines()[-1] == last
    followed = logs_cmd(c, "crash", "-n", namespace, "-f")
    assert followed.returncode == 0 and followed.stderr.splitlines()[-1] == last, followed.stderr


def test_output_formats_watch_and_the_kubectl_plugin(running_operator, namespace, tmp_path):
    c = running_operator
    apply(c, namespace, job_manifest("seen", [("procs", 2)], ["-m", "train"], kwok=True))
    wait_phase(c, namespace, "seen", "Running", timeout=120)
    as_json = status_cmd(c, "-n", namespace, "-o", "json")
    listed = json.loads(as_json.stdout)
    assert listed["kind"] == "List" and [j["metadata"]["name"] for j in listed["items"]] == ["seen"]
    as_yaml = status_cmd(c, "seen", "-n", namespace, "-o", "yaml")
    import yaml

    assert yaml.safe_load(as_yaml.stdout)["status"]["phase"] == "Running"
    wide = status_cmd(c, "-n", namespace, "-o", "wide")
    assert wide.stdout.splitlines()[0].split()[:4] == ["NAME", "PHASE", "MESH", "LAYOUT"]
    assert wide.stdout.splitlines()[1].split()[:5] == ["seen", "Running", "procs=2", "PerProc", "2/2"]

    # -w: the list, then a line per change, until Ctrl-C.
    watcher = subprocess.Popen([sys.executable, "-m", "monarch_spmd", "status", "-n", namespace, "-w",
                                "--kubeconfig", str(c.kubeconfig)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=REPO_ROOT)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in watcher.stdout], daemon=True).start()  # type: ignore[union-attr]

    def next_line(timeout: float = 60) -> str:
        return lines.get(timeout=timeout)

    try:
        assert next_line().split()[0] == "NAME"
        assert next_line().split()[:2] == ["seen", "Running"]
        apply(c, namespace, job_manifest("late", [("procs", 2)], ["-m", "train"], kwok=True))
        seen = []
        while not seen or seen[-1][:2] != ["late", "Running"]:
            seen.append(next_line().split())
        assert seen[0][0] == "late" and all(cells[0] == "late" for cells in seen)
        c.kubectl("delete", "spmdjob", "seen", "-n", namespace, "--wait=true", timeout=120)
        while True:
            cells = next_line().split()
            if cells[0] == "seen" and cells[-1] == "deleted":
                break
    finally:
        watcher.send_signal(signal.SIGINT)
        code = watcher.wait(timeout=30)
    assert code == 130, watcher.stderr.read()  # type: ignore[union-attr]

    # The kubectl plugin: kubectl finds kubectl-spmd on PATH (the script pip writes for [project.scripts]).
    plugin = tmp_path / "kubectl-spmd"
    plugin.write_text(f"#!{sys.executable}\nimport sys\nfrom monarch_spmd.cli import kubectl_main\n"
                      "sys.exit(kubectl_main())\n")
    plugin.chmod(0o755)
    env = {**c.env, "PATH": f"{tmp_path}{os.pathsep}{c.env.get('PATH', os.environ['PATH'])}",
           "KUBECONFIG": str(c.kubeconfig), "PYTHONPATH": str(REPO_ROOT)}
    kubectl = str(c.bin_dir / "kubectl")
    found = subprocess.run([kubectl, "plugin", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert str(plugin) in found.stdout, found.stdout + found.stderr
    result = subprocess.run([kubectl, "spmd", "status", "-n", namespace], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split()[:2] == ["late", "Running"]
    bad = subprocess.run([kubectl, "spmd", "run", "x.py"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "kubectl spmd: unknown command 'run'" in bad.stderr
