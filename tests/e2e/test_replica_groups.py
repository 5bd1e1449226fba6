"""End-to-end: torchft replica groups (spec.replicaGroups) on the process node, with torchft's own
DDP loop (tests/programs/torchft_train.py, as torchft's examples write it), real Lighthouse, real
gloo, and the real operator.

A job of G groups is G group jobs (<job>-g<g>) and one Lighthouse pod: a rank of one group killed
restarts that group only (its pods stay, its restart counted in its own status), while the other
groups' pods, pids and attempts never change and they step on; every group ends with the same
weights. A group's pod deleted recreates that group's gang only, uncounted. The Lighthouse's pod
deleted is created again and the job still finishes. Fewer than minReplicas groups left fails the
job, suspends the rest and removes the Lighthouse.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.conftest import apply, get_job, job_events, job_manifest, job_pods, wait_job, wait_phase, wait_until

pytestmark = pytest.mark.cluster
PROGRAM = ["-m", "tests.programs.torchft_train"]


def manifest(name: str, groups: int, *args: str, min_replicas: int = 1, **spec):
    m = job_manifest(name, [("hosts", 1), ("procs", 2)], [*PROGRAM, *args], podLayout="PerHost",
                     replicaGroups={"count": groups, "minReplicas": min_replicas, "timeoutSeconds": 30}, **spec)
    m["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 5
    return m


def finished(c, namespace: str, name: str, phase: str, groups: int, timeout: float):
    """wait_phase, failing with the tail of every group pod's log."""
    try:
        return wait_phase(c, namespace, name, phase, timeout=timeout)
    except AssertionError as e:
        tails = [f"--- {pod}:\n{c.pod_log(namespace, pod)[-2500:]}" for g in range(groups)
                 for pod in group_pods(c, namespace, name, g)]
        raise AssertionError(f"{e}\n" + "\n".join(tails)) from None


def group_pods(c, namespace: str, job: str, group: int) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid for p in job_pods(c, namespace, f"{job}-g{group}")}


def steps(log: str) -> list[dict[str, float]]:
    return [{"rank": int(r), "pid": int(pid), "attempt": int(a), "step": int(s), "participants": int(n), "t": float(t),
             "w": w} for r, pid, a, s, n, t, w in re.findall(
                r"torchft_train group \d+ rank (\d+) pid (\d+) attempt (\d+) step (\d+) participants (\d+) "
                r"t ([\d.]+) w (\S+)", log)]


def test_a_killed_rank_restarts_its_group_only_and_the_others_step_on_to_the_same_weights(
        running_operator, namespace, tmp_path):
    c = running_operator
    progress = tmp_path / "progress"
    progress.mkdir()
    tmp_path.chmod(0o777)
    progress.chmod(0o777)
    apply(c, namespace, manifest("ft", 3, "--steps", "400", "--step-seconds", "0.05", "--crash-group", "1",
                                 "--crash-rank", "1", "--crash-step", "4", "--marker", str(tmp_path / "crashed"),
                                 "--progress-dir", str(progress), restartPolicy={"maxRestarts": 1}))
    wait_phase(c, namespace, "ft", "Running", timeout=180)
    lighthouse = [p for p in job_pods(c, namespace, "ft") if p.metadata.name == "ft-lighthouse"]
    assert lighthouse and lighthouse[0].spec.containers[0].command[0] == "torchft_lighthouse"
    before = {g: group_pods(c, namespace, "ft", g) for g in range(3)}
    assert all(len(pods) == 1 for pods in before.values()), before
    job = finished(c, namespace, "ft", "Succeeded", 3, timeout=300)
    status = job["status"]
    rows = {row["index"]: row for row in status["groups"]}
    assert [rows[g]["restarts"] for g in range(3)] == [0, 1, 0], status["groups"]
    assert status["replicaGroups"] == {"count": 3, "minReplicas": 1, "running": 0, "succeeded": 3, "failed": 0}
    for g in range(3):
        assert group_pods(c, namespace, "ft", g) == before[g], f"group {g}'s pod kept (restarted in place)"
        assert get_job(c, namespace, f"ft-g{g}")["status"]["phase"] == "Succeeded"
    logs = {g: c.pod_log(namespace, next(iter(before[g]))) for g in range(3)}
    crash = re.search(r"torchft_train group 1 rank 1 pid \d+ crashing at step 4 t ([\d.]+)", logs[1])
    assert crash, logs[1][-3000:]
    back_at = min(s["t"] for s in steps(logs[1]) if s["attempt"] == 1)
    for g in (0, 2):
        seen = steps(logs[g])
        assert {s["attempt"] for s in seen} == {0}, f"group {g} restarted"
        for rank in (0, 1):
            assert len({s["pid"] for s in seen if s["rank"] == rank}) == 1, f"group {g} rank {rank} changed pid"
        between = [s for s in seen if float(crash.group(1)) < s["t"] < back_at]
        assert len(between) >= 2, (g, between)  # it stepped while group 1 was down
    # Once group 1 is back in the quorum (3 participants), every group has the same weights at
    # each step: torchft healed it from a peer.
    at = {g: {(s["rank"], s["step"]): s["w"] for s in steps(logs[g])} for g in (0, 2)}
    healed = [s for s in steps(logs[1]) if s["attempt"] == 1 and s["participants"] == 3
              and all((s["rank"], s["step"]) in at[g] for g in (0, 2))]
    assert len(healed) >= 4, "group 1 trained beside the others after its restart"
    for s in healed:
        assert at[0][s["rank"], s["step"]] == at[2][s["rank"], s["step"]] == s["w"], (s, at[0][s["rank"], s["step"]])
    assert not [p for p in job_pods(c, namespace, "ft") if p.metadata.name == "ft-lighthouse"], \
        "the Lighthouse goes once the job has ended"


def test_the_lighthouse_deleted_is_created_again_and_the_job_finishes(running_operator, namespace):
    c = running_operator
    apply(c, namespace, manifest("lh", 2, "--steps", "80", "--step-seconds", "0.1", restartPolicy={"maxRestarts": 3}))
    wait_phase(c, namespace, "lh", "Running", timeout=180)
    first = group_pods(c, namespace, "lh", 0)
    wait_until(lambda: "step 5 " in c.pod_log(namespace, next(iter(first))), 120, "group 0 stepping")
    old = next(p.metadata.uid for p in job_pods(c, namespace, "lh") if p.metadata.name == "lh-lighthouse")
    c.kubectl("delete", "pod", "lh-lighthouse", "-n", namespace, "--wait=false")
    wait_until(lambda: any(p.metadata.name == "lh-lighthouse" and p.metadata.uid != old
                           and p.status.phase == "Running" for p in job_pods(c, namespace, "lh")),
               120, "a new Lighthouse pod running")
    job = finished(c, namespace, "lh", "Succeeded", 2, timeout=300)
    assert job["status"]["replicaGroups"]["succeeded"] == 2, job["status"]


def test_fewer_than_min_replicas_left_fails_the_job_and_stops_the_rest(running_operator, namespace):
    c = running_operator
    apply(c, namespace, manifest("few", 2, "--steps", "400", "--step-seconds", "0.1", "--fail-group", "1",
                                 "--fail-rank", "1", "--fail-step", "3", "--code", "7", min_replicas=2,
                                 restartPolicy={"maxRestarts": 0}))
    job = wait_phase(c, namespace, "few", "Failed", timeout=240)
    status = job["status"]
    assert status["reason"] == "TooFewReplicaGroups", status
    assert "group 1 (few-g1) failed" in status["message"] and "minReplicas 2" in status["message"], status
    assert get_job(c, namespace, "few-g1")["status"]["phase"] == "Failed"
    wait_job(c, namespace, "few-g0", lambda j: j["spec"].get("suspend") is True
             and j["status"].get("phase") == "Suspended", 60, "group 0 suspended")
    wait_until(lambda: not [p for p in job_pods(c, namespace, "few") if p.metadata.name == "few-lighthouse"]
               and not group_pods(c, namespace, "few", 0), 60, "the Lighthouse and group 0's pods gone")
    reasons = [e.reason for e in job_events(c, namespace, "few")]
    assert "TooFewReplicaGroups" in reasons and "GroupFailed" in reasons, reasons


def test_a_bad_replica_groups_field_is_refused_by_the_api_server_naming_it(running_operator, namespace):
    c = running_operator
    bad = manifest("bad", 2, "--steps", "1", min_replicas=3)
    done = apply(c, namespace, bad, check=False)
    assert done.returncode != 0 and "minReplicas" in done.stderr, done.stderr
    assert c.kubectl("get", "spmdjobs", "-n", namespace, "-o", "name", check=False).stdout.strip() == ""


def test_a_groups_pod_deleted_recreates_that_group_only_uncounted_while_the_other_steps_on(
        running_operator, namespace):
    c = running_operator
    apply(c, namespace, manifest("del", 2, "--steps", "400", "--step-seconds", "0.05", restartPolicy={"maxRestarts": 0}))
    wait_phase(c, namespace, "del", "Running", timeout=180)
    kept, victim = group_pods(c, namespace, "del", 0), group_pods(c, namespace, "del", 1)
    wait_until(lambda: "step 5 " in c.pod_log(namespace, next(iter(victim))), 120, "group 1 stepping")
    c.kubectl("delete", "pod", next(iter(victim)), "-n", namespace, "--wait=false")
    job = finished(c, namespace, "del", "Succeeded", 2, timeout=300)
    rows = {row["index"]: row for row in job["status"]["groups"]}
    assert rows[0]["restarts"] == 0 and rows[1]["disruptions"] == 1, job["status"]["groups"]
    assert group_pods(c, namespace, "del", 0) == kept, "group 0's pod kept"
    seen = steps(c.pod_log(namespace, next(iter(kept))))
    assert {s["attempt"] for s in seen} == {0} and len({s["pid"] for s in seen if s["rank"] == 0}) == 1
    assert set(group_pods(c, namespace, "del", 1)) != set(victim), "group 1's gang was created again"
    assert get_job(c, namespace, "del-g1")["status"]["phase"] == "Succeeded", "a deletion is not counted (maxRestarts 0)"
