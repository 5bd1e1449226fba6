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
    assert status.reason(oom) == "rank 0 exit 137 (OOMKilled)"


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
    opts = status.parse_args(["gpt", "-n", "team", "--kubeconfig", "/k"])
    assert (opts.job, opts.namespace, opts.kubeconfig) == ("gpt", "team", "/k")
    assert status.parse_args(["-A"]).all_namespaces


@pytest.mark.parametrize("argv, message", [
    (["gpt", "-A"], "JOB (gpt) names one job of one namespace: give -n NAMESPACE instead of -A"),
    (["-A", "-n", "x"], "not allowed with argument"),
    (["a", "b"], "unrecognized arguments: b"),
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
