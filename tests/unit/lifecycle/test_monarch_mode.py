"""Monarch mode (spec.mode: Monarch): pods serve a client until the job ends; never success.

A 2x2 mesh in the PerHost layout: two pods (hosts), ranks 0 and 2, each serving Monarch's worker
loop. The job is Running only when both are Ready (the worker loop listens); a pod that exits 0
is a lost host that replaces the gang, like one that fails or vanishes.
"""

from __future__ import annotations

import dataclasses

from spmd_operator import lifecycle, names
from spmd_operator.lifecycle import PodInfo

from .helpers import BASE, JOB, apply, cond, events, run, status
from monarch_spmd.spec import parse_job_spec


def monarch(**changes):
    raw = {k: v for k, v in BASE.items() if k != "args"}
    raw.update(mode="Monarch", podLayout="PerHost", **changes)
    return parse_job_spec(raw, require_image=True)


def host(index, phase="Running", restart=0, ready=True, **kw):
    return PodInfo(name=names.pod_name(JOB, restart, index), rank=index * 2, restart=restart, phase=phase,
                   node="proc-node-0", ready=ready and phase == "Running", **kw)


def hosts(phase="Running", restart=0, ready=True):
    return [host(i, phase, restart, ready) for i in range(2)]


def test_a_new_monarch_job_creates_one_pod_per_host():
    plan = run(s=monarch(), st=None)
    assert plan.create == (0, 1)
    st = apply(None, plan)
    assert (st["phase"], st["procs"], st["mesh"]) == ("Pending", 4, "hosts=2,gpus=2")


def test_running_waits_until_every_worker_loop_listens():
    st = status("Pending")
    plan = run(s=monarch(), st=st, pods=[host(0), host(1, ready=False)])
    new = apply(st, plan)
    assert new["phase"] == "Pending", "a client may attach as soon as the job says Running"
    running = cond(new, "Running")
    assert (running["status"], running["reason"]) == ("False", "WaitingForMonarchHosts")
    assert "1/2 pods Ready" in running["message"]
    assert plan.events == ()

    plan = run(s=monarch(), st=new, pods=hosts())
    ready = apply(new, plan)
    assert ready["phase"] == "Running"
    assert cond(ready, "Running")["message"] == "all 2 Monarch hosts are ready for a client (4 procs) (attempt 0)"
    assert events(plan) == [("Normal", "Running")]


def test_a_program_job_does_not_wait_for_readiness():
    st = status("Pending")
    spec = parse_job_spec({**BASE, "podLayout": "PerHost"}, require_image=True)
    assert apply(st, run(s=spec, st=st, pods=hosts(ready=False)))["phase"] == "Running"


def test_a_running_monarch_job_whose_pod_turns_unready_stays_running():
    st = status("Running")
    plan = run(s=monarch(), st=st, pods=[host(0), host(1, ready=False)])
    assert apply(st, plan)["phase"] == "Running"
    assert plan.delete_pods == () and plan.create == ()


def test_a_worker_loop_that_exits_zero_is_a_lost_host_not_success():
    st = status("Running")
    done = dataclasses.replace(host(1, "Succeeded"), exit_code=0, reason="Completed",
                               finished_at="2026-01-01T11:59:00Z")
    plan = run(s=monarch(), st=st, pods=[host(0), done])
    new = apply(st, plan)
    assert new["phase"] == "Restarting", "never Succeeded: the gang is replaced"
    assert new["restarts"] == 1
    failure = new["failure"]
    assert (failure["rank"], failure["pod"], failure["reason"], failure["exitCode"], failure["permanent"]) == (
        2, names.pod_name(JOB, 0, 1), lifecycle.model.REASON_MONARCH_HOST_EXITED, 0, False)
    assert "serves until the job is deleted" in failure["message"]
    assert set(plan.delete_pods) == {names.pod_name(JOB, 0, 0), names.pod_name(JOB, 0, 1)}


def test_every_host_exiting_zero_is_not_success_either():
    st = status("Running")
    plan = run(s=monarch(), st=st, pods=hosts("Succeeded"))
    new = apply(st, plan)
    assert new["phase"] == "Restarting"
    assert cond(new, "Succeeded") is None


def test_a_pod_deleted_under_a_running_monarch_job_restarts_the_gang():
    st = status("Running")
    gone = dataclasses.replace(host(1), deleting=True)
    plan = run(s=monarch(), st=st, pods=[host(0), gone])
    new = apply(st, plan)
    assert new["phase"] == "Restarting"
    assert new["failure"]["reason"] == "PodDeleted"
    # ... and the next attempt becomes Running like the first one, once its loops listen.
    after = run(s=monarch(), st=new, pods=hosts(restart=1))
    assert apply(new, after)["phase"] == "Running"


def test_a_failed_worker_loop_is_an_ordinary_failure():
    st = status("Running")
    failed = dataclasses.replace(host(0, "Failed"), exit_code=64, reason="Error",
                                 message="monarch-spmd worker: mode Monarch needs torchmonarch in the image")
    new = apply(st, run(s=monarch(), st=st, pods=[failed, host(1)]))
    assert new["phase"] == "Failed", "64: the image cannot import monarch, permanent"
    assert "torchmonarch" in new["failure"]["message"]
