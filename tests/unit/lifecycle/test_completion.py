"""Success (lifecycle.completion)."""

from __future__ import annotations

from .helpers import apply, cond, events, gang, pod, pod_name, run, spec, status


def test_all_ranks_exit_zero_is_success():
    st = status("Running")
    plan = run(st=st, pods=gang("Succeeded"))
    new = apply(st, plan)
    assert new["phase"] == "Succeeded"
    assert new["completionTime"] == "2026-01-01T12:00:00Z"
    assert new["succeeded"] == 4
    assert cond(new, "Succeeded")["status"] == "True"
    assert events(plan) == [("Normal", "Succeeded")]
    assert plan.delete_pods == ()


def test_some_ranks_done_others_running_stays_running():
    st = status("Running")
    plan = run(st=st, pods=gang("Succeeded")[:2] + gang("Running")[2:])
    assert apply(st, plan)["phase"] == "Running"
    assert plan.create == ()


def test_success_of_an_old_attempt_does_not_count():
    st = status("Restarting", restarts=1)
    plan = run(st=st, pods=gang("Succeeded", restart=0))
    assert apply(st, plan)["phase"] == "Restarting"


def test_an_elastic_gang_that_finished_smaller_while_the_operator_was_away_succeeds():
    # Pod 1 never ran (its node froze before it started); pod 0's round finished alone, and the
    # operator, away meanwhile, reads the verdict from the pod that succeeded: its agent's line.
    from monarch_spmd.payload.agent import finished_line

    s = spec(mesh=[{"name": "hosts", "size": 2, "minSize": 1}, {"name": "gpus", "size": 2}], podLayout="PerHost")
    st = status("Running")
    line = finished_line({"type": "finish", "round": 0, "members": [0]})
    pods = [pod(0, "Succeeded", exit_code=0, message=line), pod(2, "Pending")]
    plan = run(s=s, st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Succeeded" and plan.delete_pods == (pod_name(2),), "the pod that never ran is stopped"
    plain = run(s=s, st=st, pods=[pod(0, "Succeeded", exit_code=0), pod(2, "Pending")])
    assert apply(st, plain)["phase"] != "Succeeded", "without the agents' word a pod left is still awaited"


def test_a_gang_its_coordinator_says_finished_counts_its_procs_succeeded_while_its_pods_still_end():
    # The operator heard the coordinator's ``succeeded`` before the kubelets reported the pods
    # Succeeded (a loaded node): the job is Succeeded, and its status says 4 procs succeeded, not 0.
    from .test_inplace import view

    st = status("Running")
    plan = run(st=st, pods=gang("Running"), coordinator=view(phase="finished", final={"type": "succeeded", "round": 0}))
    new = apply(st, plan)
    assert new["phase"] == "Succeeded"
    assert (new["procs"], new["succeeded"], new["running"]) == (4, 4, 0), new
    later = apply(new, run(st=new, pods=gang("Running")))
    assert (later["phase"], later["succeeded"], later["running"]) == ("Succeeded", 4, 0), "the next pass keeps them"
    gone = apply(new, run(st=new, pods=[]))
    assert gone["succeeded"] == 4, "nor do pods deleted since"

