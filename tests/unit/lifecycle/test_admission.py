"""Admission (lifecycle.admission): an invalid spec or a refused pod fails the job once, in the job's
terms, and its children go; a job admitted before a newer rule keeps running."""

from __future__ import annotations

from monarch_spmd.spec import SpecError, parse_stored
from spmd_operator import lifecycle, names
from spmd_operator.lifecycle import CONFIGMAP_CURRENT, ChildInfo, Refusal

from .helpers import BASE, JOB, apply, cond, events, gang, run, service, spec, status


def refused(message, code=422, index=0, name=None):
    return Refusal(kind="Pod", name=name or names.pod_name(JOB, 0, index), code=code, reason="Invalid",
                   message=message, at="2026-01-01T11:59:59.000001Z", index=index)


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


def test_a_pod_refused_by_the_api_server_fails_the_job_in_the_next_pass_naming_the_jobs_field():
    s = spec(template={"spec": {"containers": [{"name": "side", "image": "busybox"},
                                               {"name": "trainer", "resources": {"limits": {"memory": "-1"}}}]}})
    st = status("Pending")
    message = ('Pod "hello-3fa9c-r0-0" is invalid: spec.containers[1].resources.limits[memory]: '
               'Invalid value: "-1": must be greater than or equal to 0')
    plan = run(s=s, st=st, pods=gang("Pending")[:1], rejection=refused(message))
    new = apply(st, plan)
    assert new["phase"] == "Failed"
    assert cond(new, "Failed")["reason"] == "InvalidSpec"
    text = new["failure"]["message"]
    assert 'spec.template.spec.containers[1].resources.limits.memory: Invalid value: "-1"' in text, text
    assert "spec.containers[1]" not in text.replace("spec.template.spec.containers[1]", ""), "no pod terms"
    assert plan.create == ()
    assert plan.delete_pods == ("hello-3fa9c-r0-0",), "what was created before the refusal is stopped"
    assert events(plan) == [("Warning", "InvalidSpec")]


def test_a_quantity_the_server_cannot_decode_is_named_from_the_template():
    s = spec(template={"spec": {"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "10 Gi"}}]}})
    message = ("Pod in version \"v1\" cannot be handled as a Pod: quantities must match the regular expression "
               "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    new = apply(status("Pending"), run(s=s, st=status("Pending"), rejection=refused(message, code=400)))
    assert new["phase"] == "Failed"
    assert "spec.template.spec.volumes[0].emptyDir.sizeLimit: '10 Gi' is not a resource quantity" in new["failure"]["message"]


def test_a_failed_job_drops_its_service_as_a_finished_job_does_and_creates_no_configmap():
    error = SpecError("spec.mesh", "required")
    plan = run(s=error, st=status("Failed", restarts=0), services=[service(0)], configmap=CONFIGMAP_CURRENT)
    assert plan.delete_services == (names.service_name(JOB, 0),)
    st = status("Pending")
    plan = run(st=st, pods=gang("Pending")[:1], services=[service(0)], rejection=refused("Pod \"x\" is invalid: x"))
    assert plan.delete_services == (names.service_name(JOB, 0),)
    failed = apply(st, plan)
    later = run(st=failed, services=[ChildInfo(name=names.service_name(JOB, 0), restart=0, deleting=True)],
                configmap=lifecycle.CONFIGMAP_MISSING)
    assert (later.delete_services, later.configmap, later.events) == ((), False, ()), \
        "a finished job asks for no payload, even with the namespace's gone"


def outdated_spec():
    return parse_stored(dict(BASE, shmSize="0"))


def test_a_started_job_that_breaks_a_newer_rule_keeps_running_with_one_warning():
    parsed = outdated_spec()
    assert [e.field for e in parsed.outdated] == ["spec.shmSize"]
    st = status("Running")
    plan = run(s=parsed.spec, st=st, pods=gang("Running"), outdated=parsed.outdated)
    new = apply(st, plan)
    assert new["phase"] == "Running"
    assert plan.delete_pods == () and plan.delete_services == ()
    assert events(plan) == [("Warning", "OutdatedSpec")]
    assert "spec.shmSize" in plan.events[0].message and "keeps running" in plan.events[0].message
    assert new["specWarnings"] == [str(e) for e in parsed.outdated]
    again = run(s=parsed.spec, st=new, pods=gang("Running"), outdated=parsed.outdated)
    assert again.events == () and "specWarnings" not in again.status, "said once"


def test_a_job_that_never_started_is_refused_by_the_newer_rule():
    parsed = outdated_spec()
    new = apply(None, run(s=parsed.spec, st=None, outdated=parsed.outdated))
    assert new["phase"] == "Failed" and cond(new, "Failed")["reason"] == "InvalidSpec"
    assert "spec.shmSize" in new["failure"]["message"]
