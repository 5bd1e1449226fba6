"""End-to-end: restart in place (restartPolicy.mode InPlace, the default) on the process node, with
real processes, real gloo all_reduces and the real operator watching each gang's coordinator.

What a user sees is asserted: the job's status, its Events, its pods (the same uids across a
restart in place, a new one only in place of a pod that was lost), and what each rank printed
(TORCHELASTIC_RESTART_COUNT, its pid, the all_reduce after the restart). The training script,
tests/programs/train_steps.py, is written as torchrun users write one; a hung gang's stacks and
its culprit run tests/programs/stuck_rank.py in one pod of several procs (PerHost), as `monarch-spmd
status` and `monarch-spmd logs` show them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from devcluster.localcluster import REPO_ROOT
from spmd_operator import names
from tests.e2e.conftest import (apply, get_job, job_events, job_manifest, job_pods, job_ref, operator_args,
                                pod_names, wait_job, wait_phase, wait_until)

pytestmark = pytest.mark.cluster
PROGRAM = ["-m", "tests.programs.train_steps"]


def manifest(name: str, procs: int, *args: str, env: dict[str, str] | None = None, **restart_policy):
    m = job_manifest(name, [("procs", procs)], [*PROGRAM, *args], restartPolicy=restart_policy)
    trainer = m["spec"]["template"]["spec"]["containers"][0]
    trainer["env"].extend({"name": k, "value": v} for k, v in (env or {}).items())
    m["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 5
    return m


def uids(c, namespace: str, name: str) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid for p in job_pods(c, namespace, name)}


def reasons(c, namespace: str, name: str) -> list[str]:
    return [e.reason for e in job_events(c, namespace, name)]


def started(log: str) -> dict[int, int]:
    """restart -> pid of the process that printed its first line in that restart."""
    return {int(r): int(pid) for pid, r in re.findall(r"train_steps rank \d+ pid (\d+) restart (\d+)", log)}


def test_a_failed_rank_restarts_the_gang_in_place_same_pods_new_processes_and_gloo_works(running_operator, namespace):
    c = running_operator
    apply(c, namespace, manifest("inplace", 3, "--steps", "8", "--fail", "0:3", "--fail-rank", "1", "--code", "3",
                                 maxRestarts=2))
    running = wait_phase(c, namespace, "inplace", "Running", timeout=180)
    before = uids(c, namespace, "inplace")
    assert sorted(before) == pod_names(running, 0, 3)
    job = wait_phase(c, namespace, "inplace", "Succeeded", timeout=180)
    status = job["status"]
    assert status["restarts"] == 1 and status.get("gangRestart") == 0, status
    failure = status["failure"]
    assert (failure["rank"], failure["exitCode"], failure["reason"], failure["restart"]) == (1, 3, "Error", 0), failure
    assert failure["pod"] == pod_names(job, 0, 3)[1] and failure["inPlace"] is True
    assert "failing with code 3 at step 3" in failure["message"], "the rank's last lines"
    assert uids(c, namespace, "inplace") == before, "the same pods (uids) from start to end"
    assert status["masterAddr"] == names.master_addr(job_ref(job), 0)
    for pod in before:
        log = c.pod_log(namespace, pod)
        pids = started(log)
        assert set(pids) == {0, 1} and pids[0] != pids[1], (pod, log[-2000:])  # new processes, restart count seen
        rank = int(re.search(r"train_steps rank (\d+)", log).group(1))
        assert f"train_steps rank {rank} done restart 1 sum 108" in log, log[-2000:]  # 8 steps of gloo in restart 1
    events = reasons(c, namespace, "inplace")
    assert events.count("Restarting") == 1 and events.count("Running") == 2 and "Succeeded" in events, events
    restarting = next(e for e in job_events(c, namespace, "inplace") if e.reason == "Restarting")
    assert "rank 1" in restarting.message and "restart 1 of at most 2" in restarting.message, restarting.message


def test_a_permanent_exit_code_fails_in_place_without_a_restart(running_operator, namespace):
    c = running_operator
    apply(c, namespace, manifest("fatal", 2, "--steps", "30", "--fail", "0:1", "--fail-rank", "1", "--code", "42",
                                 maxRestarts=3, permanentExitCodes=[42]))
    job = wait_phase(c, namespace, "fatal", "Failed", timeout=180)
    status = job["status"]
    assert status["restarts"] == 0 and status["failure"]["exitCode"] == 42 and status["failure"]["rank"] == 1
    assert status["failure"]["permanent"] is True
    assert next(c for c in status["conditions"] if c["type"] == "Failed")["reason"] == "PermanentFailure"
    assert "Restarting" not in reasons(c, namespace, "fatal")
    wait_until(lambda: all(p.status.phase == "Failed" for p in job_pods(c, namespace, "fatal")), 60,
               "every pod ended by its agent")
    assert sorted(uids(c, namespace, "fatal")) == pod_names(job, 0, 2), "ended, not deleted: their logs stay"


def test_max_restarts_used_up_in_place_fails_the_job_with_its_root_cause(running_operator, namespace):
    c = running_operator
    apply(c, namespace, manifest("doomed", 2, "--steps", "30", "--fail", "0:1,1:1", "--fail-rank", "1", "--code", "7",
                                 maxRestarts=1, backoffSeconds=0))
    job = wait_phase(c, namespace, "doomed", "Failed", timeout=180)
    status = job["status"]
    assert status["restarts"] == 1, status
    assert next(c for c in status["conditions"] if c["type"] == "Failed")["reason"] == "RestartLimitExceeded"
    failure = status["failure"]
    assert (failure["rank"], failure["exitCode"], failure["restart"]) == (1, 7, 1), failure
    assert failure["pod"] == pod_names(job, 0, 2)[1]
    assert "failing with code 7 at step 1 (restart 1)" in failure["message"], failure
    assert reasons(c, namespace, "doomed").count("Restarting") == 1
    assert sorted(uids(c, namespace, "doomed")) == pod_names(job, 0, 2), "no pod was recreated, none deleted"
    assert "failing with code 7 at step 1 (restart 1)" in c.pod_log(namespace, failure["pod"])


def test_a_lost_pod_other_than_rank_zeros_is_replaced_alone(running_operator, namespace):
    c = running_operator
    apply(c, namespace, manifest("victim", 3, "--steps", "40", "--step-seconds", "0.25", maxRestarts=2))
    job = wait_phase(c, namespace, "victim", "Running", timeout=180)
    before = uids(c, namespace, "victim")
    lost = names.pod_name(job_ref(job), 0, 2)
    wait_until(lambda: "step 2 restart 0" in c.pod_log(namespace, lost), 60, "the gang training")
    c.kubectl("delete", "pod", lost, "-n", namespace, "--wait=false")
    replacement = names.pod_name(job_ref(job), 0, 2, 1)
    job = wait_job(c, namespace, "victim", lambda j: j["status"].get("restarts") == 1 and j["status"]["phase"] == "Running",
                   timeout=120, what="restart 1 in place, Running again")
    now = uids(c, namespace, "victim")
    kept = {n: u for n, u in before.items() if n != lost}
    assert {n: now[n] for n in kept} == kept, "the other pods keep their uids"
    assert replacement in now, now
    failure = job["status"]["failure"]
    # A pod deleted is the cluster's act (docs/what-counts.md): a disruption, not counted.
    assert (failure["pod"], failure["reason"], failure["rank"], failure["disruption"]) == (lost, "PodDeleted", 2, True)
    assert job["status"].get("disruptions") == 1, job["status"]
    job = wait_phase(c, namespace, "victim", "Succeeded", timeout=180)
    log = c.pod_log(namespace, replacement)
    assert "restart 1" in log and "train_steps rank 2 done restart 1" in log, log[-2000:]
    zero = names.pod_name(job_ref(job), 0, 0)
    assert set(started(c.pod_log(namespace, zero))) == {0, 1}, "rank 0 restarted in place and met the new pod"
    assert sorted(n for n in uids(c, namespace, "victim")) == sorted([*kept, replacement]), "the lost pod is gone"


def test_the_watchdog_kills_a_hung_rank_and_the_gang_restarts_in_place(running_operator, namespace):
    c = running_operator
    apply(c, namespace, manifest("watched", 2, "--steps", "6", "--fail", "0:2", "--hang-rank", "1", "--hang", "watchdog",
                                 "--timeout", "3", env={"TORCHELASTIC_ENABLE_FILE_TIMER": "1"}, maxRestarts=1))
    job = wait_phase(c, namespace, "watched", "Succeeded", timeout=180)
    failure = job["status"]["failure"]
    assert (failure["rank"], failure["reason"], job["status"]["restarts"]) == (1, "WatchdogTimeout", 1), failure
    assert "watchdog timer 'step2' of rank 1" in failure["message"], failure
    restarting = next(e for e in job_events(c, namespace, "watched") if e.reason == "Restarting")
    assert "WatchdogTimeout" in restarting.message and "rank 1" in restarting.message


def test_the_progress_timeout_restarts_a_silent_rank_naming_its_last_line(running_operator, namespace):
    c = running_operator
    # A timeout longer than importing torch and joining the gloo group take on a loaded machine.
    # Rank 0 waits for the stopped rank 1 in silence: the gang writes nothing, and that is a hang
    # (a rank that logs while it waits is progress of the gang: the watchdog covers that case).
    apply(c, namespace, manifest("silent", 2, "--steps", "8", "--step-seconds", "0.5", "--fail", "0:2",
                                 "--hang-rank", "1", "--hang", "stop", "--quiet-wait", maxRestarts=1,
                                 progressTimeoutSeconds=12))
    job = wait_phase(c, namespace, "silent", "Succeeded", timeout=180)
    failure = job["status"]["failure"]
    assert (failure["rank"], failure["reason"], job["status"]["restarts"]) == (1, "NoProgress", 1), failure
    assert re.search(r"wrote nothing for 1\ds", failure["message"]), failure
    assert "last line: train_steps rank 1: hanging at step 2" in failure["message"], failure
    assert job["status"].get("lastProgressTime"), "the job's last progress, from the agents' reports"


def test_a_restart_during_a_restart(running_operator, namespace):
    """Rank 1 fails in restart 0 (restart 1 starts at once) and again as restart 1 starts (restart
    2 waits a back-off of 6 s); during that back-off a pod is deleted: it is replaced alone, joins
    restart 2, and the loss costs no restart of its own."""
    c = running_operator
    apply(c, namespace, manifest("twice", 3, "--steps", "8", "--fail", "0:2,1:0", "--fail-rank", "1",
                                 maxRestarts=3, backoffSeconds=6))
    job = wait_phase(c, namespace, "twice", "Running", timeout=180)
    before = uids(c, namespace, "twice")
    backing_off = wait_job(c, namespace, "twice", lambda j: j["status"].get("restarts") == 2, timeout=120,
                           what="restart 2 recorded")
    assert backing_off["status"]["phase"] == "Restarting" and backing_off["status"]["failure"]["backoffSeconds"] == 6
    assert "back-off of 6s" in next(x for x in backing_off["status"]["conditions"] if x["type"] == "Restarting")["message"]
    lost = names.pod_name(job_ref(job), 0, 2)
    c.kubectl("delete", "pod", lost, "-n", namespace, "--wait=false")
    job = wait_phase(c, namespace, "twice", "Succeeded", timeout=180)
    assert job["status"]["restarts"] == 2, job["status"]
    now = uids(c, namespace, "twice")
    assert names.pod_name(job_ref(job), 0, 2, 1) in now
    assert {n: now[n] for n in before if n != lost} == {n: u for n, u in before.items() if n != lost}
    assert reasons(c, namespace, "twice").count("Restarting") == 2


def test_an_operator_restart_in_the_middle_of_restarts_in_place_counts_each_once(running_operator, namespace):
    """The operator is killed while the gang runs, the gang restarts twice without it (the second
    with a back-off), it comes back (the coordinator's history tells it), is killed again right
    after recording them and comes back again: the job ends right, each restart counted once."""
    c = running_operator
    apply(c, namespace, manifest("through", 2, "--steps", "8", "--fail", "0:4,1:0", "--fail-rank", "1",
                                 maxRestarts=2, backoffSeconds=8))
    job = wait_phase(c, namespace, "through", "Running", timeout=180)
    before = uids(c, namespace, "through")

    def kill() -> None:
        os.killpg(c.operator_process.pid, signal.SIGKILL)
        c.operator_process.wait(timeout=30)
        c.operator_process = None

    kill()
    zero = names.pod_name(job_ref(job), 0, 0)
    wait_until(lambda: "restart 1" in c.pod_log(namespace, zero), 60, "restart 1, in place, with no operator")
    c.start_operator(*operator_args())
    recorded = wait_job(c, namespace, "through", lambda j: j["status"].get("restarts") == 2, timeout=60,
                        what="both restarts recorded from the coordinator's history")
    assert recorded["status"]["phase"] == "Restarting"
    kill()
    time.sleep(1)
    c.start_operator(*operator_args())
    job = wait_phase(c, namespace, "through", "Succeeded", timeout=180)
    assert job["status"]["restarts"] == 2
    assert reasons(c, namespace, "through").count("Restarting") == 2, reasons(c, namespace, "through")
    assert uids(c, namespace, "through") == before


def test_recreate_pods_still_recreates_the_gang(running_operator, namespace):
    c = running_operator
    apply(c, namespace, manifest("recreated", 2, "--steps", "4", "--fail", "0:1", "--fail-rank", "1",
                                 mode="RecreatePods", maxRestarts=1))
    job = wait_phase(c, namespace, "recreated", "Succeeded", timeout=180)
    assert job["status"]["restarts"] == 1
    pods = job_pods(c, namespace, "recreated")
    assert sorted(p.metadata.name for p in pods if p.metadata.labels["spmd.monarch.dev/restart"] == "1") == \
        pod_names(job, 1, 2)
    env = {e.name for e in pods[0].spec.containers[0].env}
    assert "MONARCH_SPMD_AGENT_PORT" not in env
    assert "inPlace" not in job["status"]["failure"]


#: What the last line of ``status.failure.message`` must begin with for each way rank 1 of stuck_rank.py hangs
#: while ranks 0 and 2 wait for it in an all_reduce (tests/lib/test_hang_blame.py runs the same).
HANGS = {
    "sleep": r"rank 1 is not in a collective \(at stuck_rank\.py:\d+ in main\); ranks 0, 2 wait in all_reduce",
    "spin": r"rank 1 is not in a collective \(at stuck_rank\.py:\d+ in spin\); ranks 0, 2 wait in all_reduce",
    "skip": (r"rank 1 waits in barrier \(at stuck_rank\.py:\d+ in main\), apart from its peers; "
             r"ranks 0, 2 wait in all_reduce"),
}
#: Where each kind runs: three pods of one proc (the coordinator judges the ranks of every pod) or one
#: pod of three procs (PerHost: its agent's ranks).
HANG_LAYOUTS = {"sleep": (3, 1), "spin": (1, 3), "skip": (3, 1)}
#: Longer than three ranks importing torch and joining the gloo group take on a loaded machine.
HANG_TIMEOUT = 30
#: Runs of each kind (MONARCH_SPMD_HANG_RUNS=10 for the rate the docs quote; CI runs each once).
HANG_RUNS = int(os.environ.get("MONARCH_SPMD_HANG_RUNS", "1"))


def cli(c, *args: str) -> subprocess.CompletedProcess:
    """``monarch-spmd <args>`` as a user runs it, with the test cluster's kubeconfig."""
    return subprocess.run([sys.executable, "-m", "monarch_spmd", *args, "--kubeconfig", str(c.kubeconfig)],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def hung(name: str, kind: str) -> dict:
    """Three ranks, rank 1 hangs at step 2; no restart, so the first hang fails the job."""
    hosts, procs = HANG_LAYOUTS[kind]
    m = job_manifest(name, [("hosts", hosts), ("procs", procs)], ["-m", "tests.programs.stuck_rank", "--hang", kind],
                     podLayout="PerHost", restartPolicy={"maxRestarts": 0, "progressTimeoutSeconds": HANG_TIMEOUT})
    m["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 5
    return m


def _misnamed(c, namespace: str, kind: str, job: dict) -> str | None:
    """Why a failed hang job does not name rank 1 as a user must see it, or None: status.failure,
    `monarch-spmd status` and every rank's dump in `monarch-spmd logs`."""
    name = job["metadata"]["name"]
    hosts, procs = HANG_LAYOUTS[kind]
    pod = names.pod_name(job_ref(job), 0, 1 if hosts == 3 else 0)  # rank 1's pod
    failure = job["status"].get("failure") or {}
    got = (failure.get("rank"), failure.get("reason"), failure.get("exitCode"), failure.get("pod"))
    if got != (1, "NoProgress", 134, pod):
        return f"status.failure {got}: {failure.get('message', '')[-600:]}"
    verdict = failure["message"].splitlines()[-1]  # after the rank's last lines of output
    if not re.match(HANGS[kind], verdict) or "last line: stuck_rank rank 1 step 2" not in verdict:
        return f"verdict {verdict!r}"
    frames = re.search(r"; innermost frames of rank 1: (.*)$", verdict)
    if not frames or "stuck_rank.py:" not in frames.group(1):
        return f"no frames in {verdict!r}"
    described = cli(c, "status", name, "-n", namespace)
    print(described.stdout)
    node = "proc-node-0"
    if described.returncode != 0 or "rank 1 exit 134 (SIGABRT, NoProgress)" not in described.stdout \
            or not re.search(HANGS[kind], described.stdout) \
            or not re.search(rf"^  1 +{1 if hosts == 1 else 0} +{pod} +{node} +134 \(SIGABRT\) .*<- first failure$",
                             described.stdout, re.M):
        return f"status said {described.stdout[-2000:]!r} {described.stderr[-500:]!r}"
    if described.stdout.count("after rank 1 failed") != 2:
        return f"ranks 0 and 2 not shown stopped after rank 1: {described.stdout[-2000:]!r}"
    logged = cli(c, "logs", name, "-n", namespace)
    if logged.returncode != 0:
        return f"logs: {logged.stderr[-500:]}"
    for rank in range(3):
        dump = logged.stdout.split(f"[rank {rank}] Fatal Python error: Aborted\n", 1)
        if len(dump) != 2 or not re.search(rf'^\[rank {rank}\]   File ".*stuck_rank\.py", line \d+ in main$',
                                           dump[1], re.M):
            return f"no dump of rank {rank} in the logs: {logged.stdout[-3000:]!r}"
        if rank == 1:
            print("\n".join(line for line in dump[1].splitlines() if line.startswith("[rank 1]"))[:1500])
    return None


def test_a_hung_gang_fails_naming_the_rank_that_hangs_it_with_every_ranks_stack_in_its_log(running_operator,
                                                                                         namespace):
    """Rank 1 sleeps, spins in a busy loop, or skips to the final barrier (one job each, in three
    pods or in one) while its peers wait in an all_reduce: the progress timeout takes every rank's
    stack (SIGABRT, faulthandler), the job fails with rank 1 named and its frames in
    ``status.failure``, `status` says so, and `logs` shows each rank's dump. The jobs start one
    after the other, as the previous one's ranks finished importing torch, so a loaded machine's
    imports do not add up. With HANG_RUNS > 1, 9 in 10 of each kind must name rank 1."""
    c = running_operator
    misses: dict[str, list[str]] = {kind: [] for kind in HANGS}

    def imported(name: str) -> bool:
        logs = "".join(c.pod_log(namespace, p.metadata.name) for p in job_pods(c, namespace, name))
        return len(set(re.findall(r"stuck_rank rank (\d) step 0", logs))) == 3 or \
            get_job(c, namespace, name).get("status", {}).get("phase") == "Failed"

    began = time.monotonic()
    for run in range(HANG_RUNS):
        jobs = {kind: f"hang-{kind}-{run}" for kind in HANGS}
        for kind, name in jobs.items():
            apply(c, namespace, hung(name, kind))
            wait_until(lambda: imported(name), 240, f"{name}: every rank imported torch and joined the group")
        for kind, name in jobs.items():
            job = wait_phase(c, namespace, name, "Failed", timeout=180)
            print(f"{name}: status.failure {json.dumps(job['status'].get('failure'), indent=1)}")
            why = _misnamed(c, namespace, kind, job)
            if why is not None:
                misses[kind].append(f"{name}: {why}")
            c.kubectl("delete", "spmdjob", name, "-n", namespace, "--wait=false")
    needed = HANG_RUNS if HANG_RUNS < 10 else HANG_RUNS * 9 // 10
    rates = {kind: f"{HANG_RUNS - len(m)}/{HANG_RUNS}" for kind, m in misses.items()}
    print(f"rank 1 named on the cluster: {rates} in {time.monotonic() - began:.0f}s")
    assert all(HANG_RUNS - len(m) >= needed for m in misses.values()), (rates, misses)


def test_a_hot_spare_takes_a_lost_pods_place_at_once_uncounted_and_a_new_spare_follows(running_operator, namespace):
    """spec.spares 1, maxRestarts 0: pod 2 is deleted mid-training; the spare's pod takes its place
    (no pod created for it, no restart counted), is labelled pod 2's replacement, trains rank 2
    to the end, and a new spare is created; the gang's other pods keep their uids."""
    c = running_operator
    m = manifest("spared", 3, "--steps", "40", "--step-seconds", "0.25", maxRestarts=0)
    m["spec"]["spares"] = 1
    apply(c, namespace, m)
    job = wait_phase(c, namespace, "spared", "Running", timeout=180)
    ref = job_ref(job)
    spare0, spare1 = names.spare_pod_name(ref, 0, 0), names.spare_pod_name(ref, 0, 1)
    wait_job(c, namespace, "spared", lambda j: (j["status"].get("spares") or {}).get("ready") == 1, timeout=120,
             what="the spare ready at the coordinator")
    before = uids(c, namespace, "spared")
    assert spare0 in before and len(before) == 4, before
    lost = names.pod_name(ref, 0, 2)
    wait_until(lambda: "step 2 restart 0" in c.pod_log(namespace, lost), 60, "the gang training")
    c.kubectl("delete", "pod", lost, "-n", namespace, "--wait=false")
    job = wait_job(c, namespace, "spared", lambda j: j["status"].get("restarts") == 1 and j["status"]["phase"] == "Running",
                   timeout=120, what="restart 1 in place with the spare, Running again")
    status = job["status"]
    assert (status["disruptions"], status.get("gangRestart"), status["spares"]["used"]) == (1, 0, 1), status
    failure = status["failure"]
    assert (failure["pod"], failure["rank"], failure["disruption"]) == (lost, 2, True), failure
    assert f"hot spare pod {spare0} took its place" in failure["message"], failure
    pods = {p.metadata.name: p for p in job_pods(c, namespace, "spared")}
    adopted = pods[spare0].metadata.labels
    assert (adopted.get(names.LABEL_RANK), adopted.get(names.LABEL_REPLACEMENT)) == ("2", "1"), adopted
    assert names.LABEL_SPARE not in adopted
    assert names.pod_name(ref, 0, 2, 1) not in pods, "no pod created alone for rank 2: the spare is it"
    wait_until(lambda: spare1 in uids(c, namespace, "spared"), 60, "a new spare")
    now = uids(c, namespace, "spared")
    assert {n: now[n] for n in before if n != lost} == {n: u for n, u in before.items() if n != lost}
    job = wait_phase(c, namespace, "spared", "Succeeded", timeout=180)
    log = c.pod_log(namespace, spare0)
    assert "hot spare 0 takes the place of member 2" in log and "train_steps rank 2 done restart 1" in log, log[-2000:]
    assert job["status"]["restarts"] == 1 and job["status"]["disruptions"] == 1


def test_an_elastic_job_shrinks_when_a_pod_is_lost_and_grows_back_when_it_is_created_again(running_operator, namespace,
                                                                                        tmp_path):
    """mesh nodes=3 (minSize 2) x procs=2, PerHost, elasticWaitSeconds 10: pod 2 is deleted while the
    gang trains; the next round runs with pods 0 and 1 after the wait (WORLD_SIZE 4), the operator creates
    pod 2 again alone, and when it is ready every rank restarts with it (WORLD_SIZE 6), a
    membership change that is not counted. The script reshards from its checkpoint each round and
    ends with the model a fixed-size run would give. A replacement pod's init container holds it
    until the test has seen the smaller gang train (as a node that takes a while to come back)."""
    c = running_operator
    name = "elastic"
    m = job_manifest(name, [("nodes", 3), ("procs", 2)],
                     ["-m", "monarch_spmd.examples.elastic_train", "--checkpoint-dir", str(tmp_path), "--steps", "200",
                      "--step-seconds", "0.05"],
                     podLayout="PerHost", restartPolicy={"maxRestarts": 1, "elasticWaitSeconds": 10})
    m["spec"]["mesh"][0]["minSize"] = 2
    gate = tmp_path / "replacement-may-start"
    hold = ("import os, sys, time\n"
            "while os.environ.get('REPLACEMENT') and not os.path.exists(sys.argv[1]):\n"
            "    time.sleep(0.2)\n")
    m["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=5, initContainers=[{
        "name": "hold", "image": "python:3.11-slim", "command": ["python3", "-c", hold, str(gate)],
        "env": [{"name": "REPLACEMENT", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.labels['{names.LABEL_REPLACEMENT}']"}}}]}])
    apply(c, namespace, m)
    job = wait_phase(c, namespace, name, "Running", timeout=180)
    ref = job_ref(job)
    zero, lost = names.pod_name(ref, 0, 0), names.pod_name(ref, 0, 2)
    wait_until(lambda: "world 6" in c.pod_log(namespace, zero, "trainer"), 120, "the gang training at full size")
    c.kubectl("delete", "pod", lost, "-n", namespace, "--wait=false")
    job = wait_job(c, namespace, name, lambda j: (j["status"].get("size") or {}).get("pods") == 2, timeout=120,
                   what="a round of 2 pods")
    assert job["status"]["size"] == {"pods": 2, "procs": 4, "members": [0, 1]}, job["status"]
    wait_until(lambda: "world 4" in c.pod_log(namespace, zero, "trainer"), 120, "the smaller gang training")
    gate.touch()  # pod 2's replacement may start
    job = wait_job(c, namespace, name, lambda j: (j["status"].get("size") or {}).get("pods") == 3
                   and j["status"].get("restarts", 0) >= 2, timeout=180, what="the gang grown back to 3 pods")
    status = job["status"]
    # The delete and the grow back: both disruptions, neither counted (docs/what-counts.md).
    assert (status["restarts"], status["disruptions"], status.get("gangRestart")) == (2, 2, 0), \
        [(e.reason, e.message) for e in job_events(c, namespace, name)]
    assert status["failure"]["pod"] == lost and status["failure"]["reason"] == "PodDeleted", status["failure"]
    assert "Resizing" in reasons(c, namespace, name)
    replacement = names.pod_name(ref, 0, 2, 1)
    job = wait_phase(c, namespace, name, "Succeeded", timeout=240)
    log = c.pod_log(namespace, zero, "trainer")
    done = re.search(r"elastic_train done at step 200: w matches a run at one fixed size \((.*)\)", log)
    assert done and "4 ranks from step" in done.group(1) and "6 ranks from step" in done.group(1), log[-3000:]
    starts = [json.loads(s)["env"] for s in re.findall(r"elastic_train start (\{.*\})", c.pod_log(namespace, replacement, "trainer"))]
    assert {(e["RANK"], e["GROUP_RANK"], e["WORLD_SIZE"]) for e in starts} == {("4", "2", "6"), ("5", "2", "6")}, starts
