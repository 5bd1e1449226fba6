"""monarch_spmd.kubernetes without a cluster: which pods are a job's Monarch hosts, in which order.

The cluster side (real API server, real Monarch over TCP between pods) is
tests/e2e/test_monarch_mode.py; attaching to local worker loops is tests/lib/test_monarch_attach.py.
"""

from __future__ import annotations

import sys

import pytest

from monarch_spmd.kubernetes import JobHosts, MonarchJobError, hosts_of

UID = "0e47754d-ff72-4362-8192-56b96745af35"


def job(phase="Running", restarts=0, mode="Monarch", mesh=(("hosts", 2), ("gpus", 2)), **status):
    return {"metadata": {"name": "mon", "namespace": "ns", "uid": UID},
            "spec": {"mode": mode, "podLayout": "PerHost", "mesh": [{"name": n, "size": s} for n, s in mesh]},
            "status": {"phase": phase, "restarts": restarts, **status}}


def pod(index, restart=0, ip=None, ready=True, phase="Running", uid=UID, deleting=False, port=26600, per_host=2):
    meta = {"name": f"mon-0e477-r{restart}-{index}", "labels": {
        "spmd.monarch.dev/job": "mon", "spmd.monarch.dev/job-uid": uid,
        "spmd.monarch.dev/rank": str(index * per_host), "spmd.monarch.dev/restart": str(restart)}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta,
            "spec": {"containers": [{"name": "trainer", "ports": [{"name": "monarch", "containerPort": port}]}]},
            "status": {"phase": phase, "podIP": ip or f"10.244.0.{10 + index}",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_the_hosts_of_the_current_attempt_in_host_order():
    hosts = hosts_of(job(restarts=1), [pod(1, 1), pod(0, 0), pod(0, 1, ip="fd00::7"), pod(1, 0)])
    assert hosts == JobHosts(name="mon", namespace="ns", uid=UID, restart=1, mesh=(("hosts", 2), ("gpus", 2)),
                             pods=("mon-0e477-r1-0", "mon-0e477-r1-1"),
                             addresses=("tcp://[fd00::7]:26600", "tcp://10.244.0.11:26600"))
    assert (hosts.host_mesh, hosts.per_host) == ((("hosts", 2),), {"gpus": 2})


@pytest.mark.parametrize("pods", [
    [pod(0)],                                  # one host missing
    [pod(0), pod(1, ready=False)],             # its worker loop does not listen yet
    [pod(0), pod(1, deleting=True)],           # being deleted: the gang is about to be replaced
    [pod(0), pod(1, uid="another-job")],       # a namesake's pod
    [pod(0), pod(1, phase="Pending")],
])
def test_no_hosts_until_every_host_serves(pods):
    assert hosts_of(job(), pods) is None


def test_no_hosts_while_the_job_is_not_running():
    for phase in ("Pending", "Restarting", "Suspended", None):
        assert hosts_of(job(phase=phase), [pod(0), pod(1)]) is None


def test_a_three_dimension_mesh_has_one_host_per_point_of_the_first_two():
    mesh = (("dp", 2), ("pp", 3), ("gpus", 4))
    hosts = hosts_of(job(mesh=mesh), [pod(i, per_host=4, port=4000 + i) for i in reversed(range(6))])
    assert hosts.pods == tuple(f"mon-0e477-r0-{i}" for i in range(6))
    assert hosts.addresses[5] == "tcp://10.244.0.15:4005", "the port the pod declares"
    assert (hosts.host_mesh, hosts.per_host) == ((("dp", 2), ("pp", 3)), {"gpus": 4})


def test_a_program_job_or_an_ended_one_is_an_error_saying_why():
    with pytest.raises(MonarchJobError, match="spec.mode is Program, not Monarch"):
        hosts_of(job(mode="Program"), [])
    failure = {"rank": 2, "pod": "mon-0e477-r3-1", "reason": "PodDeleted"}
    with pytest.raises(MonarchJobError, match=r"the job ended \(phase Failed, reason RestartLimitExceeded.*"
                                              r"rank 2 \(mon-0e477-r3-1\) PodDeleted"):
        hosts_of(job(phase="Failed", reason="RestartLimitExceeded", failure=failure), [])


def test_importing_it_loads_neither_kubernetes_nor_monarch():
    import subprocess

    code = "import sys, monarch_spmd.kubernetes; print('kubernetes' in sys.modules, 'monarch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
