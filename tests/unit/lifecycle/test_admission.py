"""Admission (lifecycle.admission): an invalid spec or a refused pod fails the job once."""

from __future__ import annotations

from monarch_spmd.spec import SpecError

from .helpers import apply, cond, events, gang, run, status


def test_invalid_spec_fails_without_creating_anything():
    error = SpecError("spec.template.spec.restartPolicy", "'Always' is not allowed")
    plan = run(s=error, st=None)
    new = apply(None, plan)
    assert new["phase"] == "Failed"
    failed = cond(new, "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.template.spec.restartPolicy" in failed["message"]
    assert new["failure"]["reason"] == "InvalidSpec"
    assert (plan.create, plan.service, plan.configmap) == ((), None, False)
    assert events(plan) == [("Warning", "InvalidSpec")]
    again = run(s=error, st=new)
    assert (again.status, again.events, again.create) == ({}, (), ())


def test_a_pod_refused_by_the_api_server_fails_the_job_in_the_next_pass():
    st = status("Pending")
    refusal = "the API server rejected pod hello-3fa9c-r0-0: spec.containers[1].image: Required value"
    plan = run(st=st, pods=gang("Pending")[:1], rejection=refusal)
    new = apply(st, plan)
    assert new["phase"] == "Failed"
    assert cond(new, "Failed")["reason"] == "InvalidSpec"
    assert "spec.containers[1].image" in new["failure"]["message"]
    assert plan.create == ()
    assert plan.delete_pods == ("hello-3fa9c-r0-0",), "what was created before the refusal is stopped"
    assert events(plan) == [("Warning", "InvalidSpec")]
