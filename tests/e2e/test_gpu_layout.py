"""End-to-end: the PerHost layout on the process node: one pod per host, its procs as local
processes, real gloo across pods, and a failing proc named by its rank in the job's status.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.conftest import PROBE, apply, job_manifest, job_pods, pod_names, probe_lines, wait_phase

pytestmark = pytest.mark.cluster
RANK = "spmd.monarch.dev/rank"


def test_per_host_pods_run_their_procs_and_all_reduce_across_pods(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("hosts", [("hosts", 2), ("gpus", 2)], [PROBE], podLayout="PerHost",
                                     shmSize="256Mi"))
    job = wait_phase(c, namespace, "hosts", "Succeeded", timeout=300)
    status = job["status"]
    assert (status["procs"], status["succeeded"]) == (4, 4)
    pods = job_pods(c, namespace, "hosts")
    assert sorted(p.metadata.name for p in pods) == pod_names(job, 0, 2), "one pod per host"
    ips = {p.metadata.labels[RANK]: p.status.pod_ip for p in pods}
    assert len(set(ips.values())) == 2
    for pod in pods:
        first = int(pod.metadata.labels[RANK])
        log = c.pod_log(namespace, pod.metadata.name)
        assert re.search(rf"ranks {first}\.\.{first + 1}/4 on hosts={first // 2}", log), log
        for local in range(2):
            rank = first + local
            mine = "\n".join(line[len(f"[rank {rank}] "):] for line in log.splitlines()
                             if line.startswith(f"[rank {rank}] "))
            (seen,) = probe_lines(mine, "PROBE")
            assert (seen["RANK"], seen["LOCAL_RANK"], seen["LOCAL_WORLD_SIZE"], seen["GROUP_RANK"]) == (
                str(rank), str(local), "2", str(first // 2))
            assert seen["POD_IP"] == pod.status.pod_ip
            assert seen["master_ip"] == ips["0"]
            (result,) = probe_lines(mine, "RESULT")
            assert result == {"sum": 10.0, "expected": 10.0, "grads_agree": True}
        volumes = {v.name: v for v in pod.spec.volumes}
        assert volumes["dshm"].empty_dir.medium == "Memory" and volumes["dshm"].empty_dir.size_limit == "256Mi"


def test_a_failing_proc_of_a_per_host_pod_is_named_by_its_rank(running_operator, namespace):
    c = running_operator
    args = ["-m", "tests.programs.fail_once", "--rank", "3", "--code", "9", "--always", "--no-rendezvous", "--sleep", "60"]
    manifest = job_manifest("hostfail", [("hosts", 2), ("gpus", 2)], args, podLayout="PerHost",
                            restartPolicy={"maxRestarts": 0})
    from devcluster.localcluster import REPO_ROOT

    manifest["spec"]["template"]["spec"]["containers"] = [
        {"name": "trainer", "env": [{"name": "PYTHONPATH", "value": str(REPO_ROOT)}]}]
    apply(c, namespace, manifest)
    job = wait_phase(c, namespace, "hostfail", "Failed", timeout=180)
    failure = job["status"]["failure"]
    assert (failure["rank"], failure["exitCode"]) == (3, 9), failure
    assert failure["pod"] == pod_names(job, 0, 2)[1]
    assert "rank 3 exited with code 9 (local rank 1)" in failure["message"]
