"""Unit tests of `monarch-spmd status`' pure parts: ages, the REASON column, the table, the one-job
view and the arguments. Jobs and Events are plain dicts shaped as the API server returns them."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest

from monarch_spmd import status

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def ago(seconds: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(name: str, phase: str | None, *, namespace: str = "team", created: float = 300, **status_fields) -> dict:
    body = {
        "apiVersion": "spmd.monarch.dev/v1alpha1", "kind": "SPMDJob",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "creationTimestamp": ago(created)},
        "spec": {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 2}], "args": ["-m", "train"]},
    }
    if phase is not None:
        body["status"] = {"phase": phase, "mesh": "hosts=2,gpus=2", "procs": 4, **status_fields}
    return body


TRACEBACK = "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nRuntimeError: NCCL timeout\n\n"
FAILED = job("gpt", "Failed", running=0, restarts=3, reason="RestartLimitExceeded",
             message="rank 1 exited with 1; restart limit 3 reached",
             failure={"rank": 1, "pod": "gpt-r3-1", "node": "gpu-7", "exitCode": 1, "reason": "Error",
                      "message": TRACEBACK, "restart": 3, "permanent": False, "time": ago(60)},
             completionTime=ago(60), startTime=ago(290),
             conditions=[{"type": "Created", "status": "True", "reason": "Created", "message": "4 pods",
                          "lastTransitionTime": ago(299)},
                         {"type": "Failed", "status": "True", "reason": "RestartLimitExceeded",
                          "message": "rank 1 exited with 1; restart limit 3 reached", "lastTransitionTime": ago(60)}])
RUNNING = job("bert", "Running", running=4, restarts=1, reason="AllProcsRunning", message="4 of 4 procs running")
PENDING = job("llama", "Pending", running=1, reason="Unschedulable",
              message="3 pods wait: 0/5 nodes are available: 5 Insufficient nvidia.com/gpu.")


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (59, "59s"), (119, "119s"), (120, "2m"), (200, "3m20s"), (599, "9m59s"), (600, "10m"),
    (179 * 60, "179m"), (3 * 3600, "3h"), (5 * 3600 + 30 * 60, "5h30m"), (8 * 3600, "8h"), (47 * 3600, "47h"),
    (48 * 3600, "2d"), (3 * 86400 + 5 * 3600, "3d5h"), (8 * 86400, "8d"), (729 * 86400, "729d"),
    (730 * 86400, "2y"), (760 * 86400, "2y30d"), (3000 * 86400, "8y"), (-5, "0s"),
])
def test_human_age_is_kubectls(seconds, text):
    assert status.human_age(seconds) == text


def test_parse_time_accepts_what_the_api_server_writes():
    assert status.parse_time("2026-03-01T12:00:00Z") == NOW
    assert status.parse_time("2026-03-01T12:00:00.123456Z") == NOW + dt.timedelta(microseconds=123456)
    assert status.parse_time("2026-03-01T13:00:00+01:00") == NOW
    assert status.parse_time("yesterday") is None and status.parse_time(None) is None


def test_reason_of_a_failed_job_is_its_root_cause():
    assert status.reason(FAILED) == "RestartLimitExceeded: rank 1 exit 1 (Error): RuntimeError: NCCL timeout"


def test_reason_of_a_permanent_failure_needs_no_prefix():
    permanent = job("fatal", "Failed", reason="PermanentFailure", message="rank 0 exited with 42; permanent",
                    failure={"rank": 0, "exitCode": 42, "reason": "Error", "message": "bye\n"})
    assert status.reason(permanent) == "rank 0 exit 42 (Error): bye"


def test_reason_of_a_lost_pod_names_the_reason_without_an_exit_code():
    lost = job("gone", "Failed", reason="RestartLimitExceeded", message="...",
               failure={"rank": 2, "reason": "PodDeleted", "message": "the pod was deleted"})
    assert status.reason(lost) == "RestartLimitExceeded: rank 2 PodDeleted: the pod was deleted"
    oom = job("oom", "Failed", reason="PermanentFailure", failure={"rank": 0, "exitCode": 137, "reason": "OOMKilled"})
    assert status.reason(oom) == "rank 0 exit 137 (SIGKILL, OOMKilled)"


def test_reason_of_a_job_level_failure_is_the_condition():
    late = job("late", "Failed", reason="DeadlineExceeded", message="ran longer than activeDeadlineSeconds (60s)",
               failure={"reason": "DeadlineExceeded", "message": "ran longer than activeDeadlineSeconds (60s)",
                        "permanent": True})
    assert status.reason(late) == "DeadlineExceeded: ran longer than activeDeadlineSeconds (60s)"
    bare = job("bare", "Failed", failure={"reason": "InvalidSpec", "message": "container trainer sets image"})
    assert status.reason(bare) == "InvalidSpec: container trainer sets image"


def test_reason_of_other_phases_is_reason_and_message_on_one_line():
    assert status.reason(RUNNING) == "AllProcsRunning: 4 of 4 procs running"
    assert status.reason(PENDING) == "Unschedulable: 3 pods wait: 0/5 nodes are available: 5 Insufficient nvidia.com/gpu."
    multi = job("m", "Restarting", reason="Restarting", message="rank 1 exited with 3;\n  replacing the gang")
    assert status.reason(multi) == "Restarting: rank 1 exited with 3; replacing the gang"
    assert status.reason(job("q", "Succeeded", reason="Succeeded")) == "Succeeded"


def test_a_job_without_status_says_the_operator_has_not_seen_it():
    assert "operator has not seen this job" in status.reason(job("new", None))


def test_table_is_one_line_per_job_sorted_with_aligned_columns():
    text = status.table([PENDING, FAILED, RUNNING], NOW)
    lines = text.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "MESH", "RUNNING/PROCS", "RESTARTS", "AGE", "REASON"]
    assert [line.split()[0] for line in lines[1:]] == ["bert", "gpt", "llama"]
    assert lines[1].split()[:6] == ["bert", "Running", "hosts=2,gpus=2", "4/4", "1", "5m"]
    assert lines[2].split()[:6] == ["gpt", "Failed", "hosts=2,gpus=2", "0/4", "3", "5m"]
    assert lines[3].split()[:6] == ["llama", "Pending", "hosts=2,gpus=2", "1/4", "0", "5m"]
    starts = {line.index(line.split()[6]) for line in lines}  # REASON starts in one column
    assert len(starts) == 1
    assert lines[2].endswith("RestartLimitExceeded: rank 1 exit 1 (Error): RuntimeError: NCCL timeout")


def test_table_with_all_namespaces_leads_with_the_namespace():
    other = job("bert", "Running", namespace="alpha", procs=2, running=2, reason="AllProcsRunning")
    lines = status.table([RUNNING, other], NOW, all_namespaces=True).splitlines()
    assert lines[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert [line.split()[:2] for line in lines[1:]] == [["alpha", "bert"], ["team", "bert"]]


def test_table_of_a_job_without_status_uses_the_spec():
    (line,) = status.table([job("new", None, created=10)], NOW).splitlines()[1:]
    assert line.split()[:6] == ["new", "<none>", "hosts=2,gpus=2", "-", "0", "10s"]


def test_table_cuts_only_the_reason_to_the_terminal_width():
    lines = status.table([FAILED, RUNNING], NOW, width=110).splitlines()
    assert all(len(line) <= 110 for line in lines)
    assert lines[2].split()[:6] == ["gpt", "Failed", "hosts=2,gpus=2", "0/4", "3", "5m"]
    assert lines[2].endswith("...") and "RestartLimitExceeded: rank 1" in lines[2]
    assert not lines[1].endswith("...")  # bert's reason fits
    narrow = status.table([FAILED], NOW, width=40).splitlines()
    assert narrow[1].split()[:6] == ["gpt", "Failed", "hosts=2,gpus=2", "0/4", "3", "5m"]  # never cut
    assert narrow[1].endswith("   RestartLimitExcee...")  # REASON keeps REASON_MIN characters, "..." included
    assert not status.table([FAILED], NOW, width=500).splitlines()[1].endswith("...")


def event(reason: str, seconds_ago: float, kind: str = "Normal", message: str = "", count: int = 1) -> dict:
    return {"type": kind, "reason": reason, "message": message, "count": count, "lastTimestamp": ago(seconds_ago),
            "metadata": {"creationTimestamp": ago(seconds_ago)}}


def test_describe_shows_counts_failure_output_conditions_and_events():
    events = [event("Restarting", 200, "Warning", "rank 1 exited with 1", count=3),
              event("Created", 299, message="created 4 pods"),
              event("RestartLimitExceeded", 60, "Warning", "rank 1 exited with 1; restart limit 3 reached")]
    text = status.describe(FAILED, events, NOW)
    lines = text.splitlines()
    assert lines[0] == "Name:        gpt" and lines[1] == "Namespace:   team"
    assert lines[2] == "Phase:       Failed   (RestartLimitExceeded: rank 1 exit 1 (Error): RuntimeError: NCCL timeout)"
    assert "Mesh:        hosts=2,gpus=2   (4 procs: 0 running, 0 succeeded, 0 failed)" in lines
    assert "Restarts:    3 of at most 3" in lines
    assert "Completed:   60s ago (" + ago(60) + ")" in lines
    assert ("Failure:     rank 1 exit 1 (Error), pod gpt-r3-1 on node gpu-7 (attempt 3, retryable)") in lines
    out = lines.index("  last 3 lines of its output:")
    assert lines[out + 1:out + 4] == ["    Traceback (most recent call last):", '      File "train.py", line 9, in <module>',
                                      "    RuntimeError: NCCL timeout"]
    conditions = lines.index("Conditions:")
    assert lines[conditions + 1].split() == ["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]
    assert lines[conditions + 3].split()[:4] == ["Failed", "True", "RestartLimitExceeded", "60s"]
    start = lines.index("Events (oldest first):")
    assert [line.split()[2] for line in lines[start + 2:]] == ["Created", "Restarting", "RestartLimitExceeded"]
    assert lines[start + 3].endswith("rank 1 exited with 1 (x3)")


def test_describe_keeps_the_newest_events_and_the_last_output_lines():
    events = [event(f"E{i}", 100 - i) for i in range(15)]
    long_output = "\n".join(f"line {i}" for i in range(30))
    failing = job("f", "Failed", failure={"rank": 0, "exitCode": 1, "reason": "Error", "message": long_output})
    lines = status.describe(failing, events, NOW).splitlines()
    assert f"Events (oldest first, newest {status.EVENTS_SHOWN} of 15):" in lines
    assert lines[-1].split()[2] == "E14" and not any(line.split()[2:3] == ["E4"] for line in lines)
    assert f"    line 29" in lines and f"    line {30 - status.FAILURE_LINES}" in lines
    assert f"    line {29 - status.FAILURE_LINES}" not in lines


def test_describe_a_new_job_and_disruptions():
    lines = status.describe(job("new", None), [], NOW).splitlines()
    assert lines[2].startswith("Phase:       <none>   (no status yet")
    assert "Mesh:        hosts=2,gpus=2" in lines and lines[-1] == "Events:      none"
    disrupted = job("d", "Running", restarts=2, disruptions=2)
    disrupted["spec"]["restartPolicy"] = {"maxRestarts": 0}
    text = status.describe(disrupted, [], NOW)
    assert "Restarts:    2 of at most 0 (2 after disruptions, not counted against the limit)" in text


def test_arguments():
    opts = status.parse_args([])
    assert (opts.job, opts.namespace, opts.all_namespaces, opts.kubeconfig) == (None, None, False, None)
    assert (opts.output, opts.watch) == (None, False)
    opts = status.parse_args(["-o", "wide", "-w"])
    assert (opts.output, opts.watch) == ("wide", True)
    assert status.parse_args(["--output", "json"]).output == "json" and status.parse_args(["-o", "yaml"]).output == "yaml"
    opts = status.parse_args(["gpt", "-n", "team", "--kubeconfig", "/k"])
    assert (opts.job, opts.namespace, opts.kubeconfig) == ("gpt", "team", "/k")
    assert status.parse_args(["-A"]).all_namespaces


@pytest.mark.parametrize("argv, message", [
    (["gpt", "-A"], "JOB (gpt) names one job of one namespace: give -n NAMESPACE instead of -A"),
    (["-A", "-n", "x"], "not allowed with argument"),
    (["a", "b"], "unrecognized arguments: b"),
    (["-o", "table"], "argument -o/--output: invalid choice: 'table'"),
])
def test_bad_arguments_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        status.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_import_stays_stdlib_only():
    code = "import sys, monarch_spmd.status; print(sorted(m for m in ('kubernetes', 'yaml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_kubeconfig_that_cannot_be_read_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope"
    result = subprocess.run([sys.executable, "-m", "monarch_spmd.status", "--kubeconfig", str(missing)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("monarch-spmd status: error: cannot load kubeconfig") and str(missing) in result.stderr


# --- exit codes with signal names, and the per-rank table of a failed job -----------------------


@pytest.mark.parametrize("code, text", [
    (1, "1"), (0, "0"), (-9, "-9 (SIGKILL)"), (-15, "-15 (SIGTERM)"), (137, "137 (SIGKILL)"),
    (143, "143 (SIGTERM)"), (130, "130 (SIGINT)"), (128, "128"), (64, "64"), (255, "255"), (None, "None"),
])
def test_exit_codes_carry_the_signals_name_as_torchrun_prints_them(code, text):
    assert status.exit_text(code) == text


def test_a_signal_joins_the_reason_in_the_one_line_summary():
    killed = job("k", "Failed", reason="RestartLimitExceeded",
                 failure={"rank": 3, "exitCode": 143, "reason": "Error", "message": "bye"})
    assert status.reason(killed) == "RestartLimitExceeded: rank 3 exit 143 (SIGTERM, Error): bye"


UID = "uid-gpt"


def trainer_pod(name: str, rank: int, restart: int, *, uid: str = UID, code: int | None = None,
                reason: str = "", message: str = "", running: bool = False, procs: int | None = None,
                owner: str | None = None, node: str = "gpu-1") -> dict:
    labels = {"spmd.monarch.dev/job": "gpt", "spmd.monarch.dev/job-uid": uid, "spmd.monarch.dev/rank": str(rank),
              "spmd.monarch.dev/restart": str(restart)}
    if procs is not None:
        labels["spmd.monarch.dev/procs"] = str(procs)
    if code is not None:
        state = {"terminated": {"exitCode": code, "reason": reason, "message": message}}
    else:
        state = {"running": {}} if running else {"waiting": {"reason": "ContainerCreating"}}
    refs = [{"uid": owner or uid, "controller": True, "kind": "SPMDJob", "name": "gpt"}]
    return {"metadata": {"name": name, "labels": labels, "ownerReferences": refs},
            "spec": {"nodeName": node},
            "status": {"phase": "Failed" if code else "Running",
                       "containerStatuses": [{"name": "trainer", "state": state}]}}


def failed_job(**spec_fields) -> dict:
    body = job("gpt", "Failed", running=0, restarts=1, reason="RestartLimitExceeded",
               failure={"rank": 1, "pod": "gpt-1a2b3-r1-1", "node": "gpu-7", "exitCode": 1, "reason": "Error",
                        "message": "RuntimeError: NCCL timeout", "restart": 1})
    body["spec"].update(spec_fields)
    return body


def test_the_per_rank_table_of_a_failed_job_marks_the_first_failure_and_ends_naming_its_rank():
    pods = [trainer_pod("gpt-1a2b3-r1-0", 0, 1, code=143, reason="Error"),
            trainer_pod("gpt-1a2b3-r1-1", 1, 1, code=1, reason="Error", node="gpu-7"),
            trainer_pod("gpt-1a2b3-r1-2", 2, 1, code=-9),  # as a runtime reporting the signal would
            trainer_pod("gpt-1a2b3-r0-3", 3, 0, code=1, reason="Error")]  # an older attempt: not shown
    lines = status.rank_table(failed_job(), pods)
    assert lines[0] == "Ranks of attempt 1:"
    assert lines[1].split() == ["RANK", "LOCAL_RANK", "POD", "NODE", "EXIT", "CODE", "REASON"]
    rows = [line.split() for line in lines[2:6]]
    assert rows[0] == ["0", "0", "gpt-1a2b3-r1-0", "gpu-1", "143", "(SIGTERM)", "Error"]
    assert rows[1] == ["1", "1", "gpt-1a2b3-r1-1", "gpu-7", "1", "Error", "<-", "first", "failure"]
    assert rows[2] == ["2", "0", "gpt-1a2b3-r1-2", "gpu-1", "-9", "(SIGKILL)", "-"]
    assert rows[3] == ["3", "1", "-", "-", "pod", "gone", "-"]  # rank 3's pod of attempt 1 is gone
    assert lines[-1] == ("spmdjob gpt failed: rank 1 (local rank 1, pod gpt-1a2b3-r1-1 on node gpu-7) failed first: "
                         "exit code 1 (Error)")


def test_the_root_causes_row_says_why_the_worker_failed_it_where_the_container_says_error():
    """A hung rank ends with SIGABRT (its stack taken): the container says Error, the worker knew
    it was NoProgress; the other ranks keep their containers' reasons."""
    body = failed_job()
    body["status"]["failure"].update(exitCode=134, reason="NoProgress")
    pods = [trainer_pod("gpt-1a2b3-r1-0", 0, 1, code=1, reason="Error"),
            trainer_pod("gpt-1a2b3-r1-1", 1, 1, code=134, reason="Error", node="gpu-7")]
    rows = {r.rank: r for r in status.rank_rows(body, pods)}
    assert (rows[1].reason, rows[1].first) == ("NoProgress", True)
    assert (rows[0].exit, rows[0].reason) == ("1", "Error")
    body["status"]["failure"]["reason"] = "Error"
    assert status.rank_rows(body, pods)[1].reason == "Error"


def test_the_per_rank_table_reads_only_pods_of_this_jobs_uid():
    """A namesake's pods (deleted with --cascade=orphan: same name, same labels but the uid) never count."""
    old = [trainer_pod("gpt-9f9f9-r1-1", 1, 1, uid="uid-old", code=0, reason="Completed"),
           trainer_pod("gpt-9f9f9-r1-0", 0, 1, uid="uid-old", running=True)]
    stolen = trainer_pod("gpt-77777-r1-0", 0, 1, owner="uid-other", running=True)  # our label, another owner
    rows = status.rank_rows(failed_job(), old + [stolen])
    assert [(r.rank, r.pod, r.exit) for r in rows] == [
        (0, "-", "pod gone"), (1, "gpt-1a2b3-r1-1", "1"), (2, "-", "pod gone"), (3, "-", "pod gone")]
    assert status.owned_by(trainer_pod("p", 0, 0), UID) and not status.owned_by(old[0], UID)
    assert not status.owned_by(stolen, UID) and not status.owned_by(trainer_pod("p", 0, 0), None)


def test_a_perhost_pods_worker_names_the_failed_rank_and_its_siblings_were_stopped():
    line = "monarch-spmd worker: rank 3 exited with code 137 (local rank 1); stopped the other local ranks"
    pods = [trainer_pod("gpt-1a2b3-r1-0", 0, 1, procs=2, code=143, reason="Error"),
            trainer_pod("gpt-1a2b3-r1-2", 2, 1, procs=2, code=137, reason="Error", message="oom\n" + line)]
    body = failed_job(podLayout="PerHost")
    body["status"]["failure"] = {"rank": 3, "pod": "gpt-1a2b3-r1-2", "exitCode": 137, "reason": "Error", "restart": 1}
    rows = status.rank_rows(body, pods)
    assert [(r.rank, r.local_rank, r.exit, r.first) for r in rows] == [
        (0, 0, "143 (SIGTERM)", False), (1, 1, "143 (SIGTERM)", False),
        (2, 0, "stopped", False), (3, 1, "137 (SIGKILL)", True)]
    assert rows[2].reason == "by its worker after rank 3 failed"
    assert status.rank_table(body, pods)[-1].startswith(
        "spmdjob gpt failed: rank 3 (local rank 1, pod gpt-1a2b3-r1-2 on node gpu-1) failed first: exit code 137 (SIGKILL, Error)")


def test_pods_of_one_rank_each_read_the_gangs_verdict_and_show_their_ranks_stopped():
    """Restart in place, one proc per pod: every agent exits with the verdict's code and line (rank
    1 hung), so pods 0 and 2 show 134 too; their ranks were stopped, not failed."""
    line = "monarch-spmd worker: rank 1 exited with code 134 in restart 1; job failed: no restarts allowed"
    for message in (line, ""):  # a kubelet with the worker's termination message; one with the log's tail
        pods = [trainer_pod(f"gpt-1a2b3-r1-{r}", r, 1, code=134, reason="Error", message=message) for r in range(3)]
        _one_rank_pods_after_a_hang(pods)
    recreated = failed_job(restartPolicy={"mode": "RecreatePods"})
    recreated["status"]["failure"] = {"rank": 1, "pod": "gpt-1a2b3-r1-1", "exitCode": 134, "reason": "NoProgress",
                                      "restart": 1}
    rows = status.rank_rows(recreated, [trainer_pod(f"gpt-1a2b3-r1-{r}", r, 1, code=134, reason="Error")
                                        for r in range(3)])
    assert [r.exit for r in rows[:3]] == ["134 (SIGABRT)"] * 3, "without a gang's verdict the pods say it"


def _one_rank_pods_after_a_hang(pods: list) -> None:
    body = failed_job()
    body["status"]["failure"] = {"rank": 1, "pod": "gpt-1a2b3-r1-1", "exitCode": 134, "reason": "NoProgress",
                                 "restart": 1}
    rows = status.rank_rows(body, pods)
    assert [(r.rank, r.exit, r.reason, r.first) for r in rows[:3]] == [
        (0, "stopped", "by its worker after rank 1 failed", False), (1, "134 (SIGABRT)", "NoProgress", True),
        (2, "stopped", "by its worker after rank 1 failed", False)]


def test_local_rank_is_zero_where_each_pod_is_its_own_node():
    pods = [trainer_pod(f"gpt-1a2b3-r1-{r}", r, 1, code=1 if r == 1 else 143) for r in range(4)]
    rows = status.rank_rows(failed_job(gpusPerProc=1), pods)
    assert [r.local_rank for r in rows] == [0, 0, 0, 0]
    assert [r.local_rank for r in status.rank_rows(failed_job(), pods)] == [0, 1, 0, 1]


def test_a_long_per_rank_table_shows_the_ranks_that_did_not_end_well():
    big = job("gpt", "Failed", restarts=0, failure={"rank": 37, "exitCode": 1, "reason": "Error", "restart": 0})
    big["spec"]["mesh"] = [{"name": "procs", "size": 64}]
    pods = [trainer_pod(f"gpt-1a2b3-r0-{r}", r, 0, code=1 if r == 37 else 0 if r < 40 else None, running=r >= 40)
            for r in range(64)]
    lines = status.rank_table(big, pods)
    assert [line.split()[0] for line in lines[2:-2]] == ["37"]
    assert lines[-2] == "  ... and 63 more rank(s): 39 0, 24 running"
    assert lines[-1].startswith("spmdjob gpt failed: rank 37 ")


def test_a_job_level_failure_names_no_rank():
    late = job("late", "Failed", restarts=0, reason="DeadlineExceeded",
               failure={"reason": "DeadlineExceeded", "message": "ran longer than activeDeadlineSeconds (60s)"})
    lines = status.rank_table(late, [trainer_pod("late-1-r0-0", 0, 0, uid="uid-late", code=143)])
    assert lines[-1] == "spmdjob late failed: DeadlineExceeded, not a rank: ran longer than activeDeadlineSeconds (60s)"


def test_describe_of_a_failed_job_ends_with_the_per_rank_table():
    pods = [trainer_pod("gpt-1a2b3-r1-1", 1, 1, code=1, reason="Error", node="gpu-7")]
    text = status.describe(failed_job(), [], NOW, pods)
    assert "Ranks of attempt 1:" in text and text.splitlines()[-1].startswith("spmdjob gpt failed: rank 1 ")
    assert "Ranks of attempt" not in status.describe(failed_job(), [], NOW)  # no pods read: no table


def test_wide_adds_columns_and_never_cuts_the_reason():
    lines = status.table([FAILED, RUNNING], NOW, width=60, wide=True).splitlines()
    assert lines[0].split() == list(status.WIDE_HEADERS)
    assert lines[1].split()[:11] == ["bert", "Running", "hosts=2,gpus=2", "PerProc", "4/4", "0", "0", "1", "0", "5m", "-"]
    assert lines[2].endswith("RestartLimitExceeded: rank 1 exit 1 (Error): RuntimeError: NCCL timeout")


def test_json_and_yaml_print_what_the_api_server_returned():
    import json

    import yaml

    assert json.loads(status.dump(FAILED, "json")) == FAILED
    assert yaml.safe_load(status.dump(FAILED, "yaml")) == FAILED
    listed = json.loads(status.dump(status.as_list([RUNNING]), "json"))
    assert (listed["kind"], listed["apiVersion"], listed["items"]) == ("List", "v1", [RUNNING])


def test_a_watch_prints_the_header_once_and_a_line_per_change():
    import argparse
    import io

    out = io.StringIO()
    opts = argparse.Namespace(output=None, job=None)
    watcher = status.Watcher(opts, "team", out, lambda: NOW)
    watcher.show(PENDING)
    watcher.show(RUNNING)
    watcher.show(RUNNING, deleted=True)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == list(status.HEADERS)
    assert [line.split()[:2] for line in lines[1:]] == [["llama", "Pending"], ["bert", "Running"], ["bert", "Running"]]
    assert lines[-1].endswith("   deleted") and watcher.seen == {"uid-llama": PENDING}


def test_describe_shows_a_refusal_of_the_api_server():
    refused = job("open", "Pending", running=0, reason="PodSecurity", message="0/4 pods created; ...",
                  refusal={"reason": "PodSecurity", "kind": "Pod", "name": "open-1a2b3-r0-0", "code": 403,
                           "retries": 5, "since": ago(40),
                           "message": 'violates Pod Security "restricted:latest":\n allowPrivilegeEscalation != false'})
    lines = status.describe(refused, [], NOW).splitlines()
    at = lines.index("Refused:     PodSecurity: the API server refuses Pod open-1a2b3-r0-0, 5 time(s) since 40s ago "
                     "(403); retried with back-off")
    assert lines[at + 1] == '  violates Pod Security "restricted:latest": allowPrivilegeEscalation != false'
    assert not any(line.startswith("Refused:") for line in status.describe(RUNNING, [], NOW).splitlines())


def test_a_ranks_row_shows_its_newest_pod_whatever_the_listing_order():
    """A pod created alone in place of a lost one, or a hot spare adopted as its replacement,
    stands for its rank however the API server lists the two."""
    lost = trainer_pod("gpt-1a2b3-r1-2", 2, 1, code=143, reason="Error")
    spare = trainer_pod("gpt-1a2b3-r1-s0", 2, 1, running=True)
    spare["metadata"]["labels"]["spmd.monarch.dev/replacement"] = "1"
    for pods in ([lost, spare], [spare, lost]):
        body = failed_job()
        body["status"]["failure"] = {"rank": 0, "pod": "gpt-1a2b3-r1-0", "exitCode": 1, "reason": "Error", "restart": 1}
        row = next(r for r in status.rank_rows(body, pods) if r.rank == 2)
        assert (row.pod, row.exit) == ("gpt-1a2b3-r1-s0", "running")
