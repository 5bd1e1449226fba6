"""The namespace's payload ConfigMap and the per-attempt master Services (lifecycle.children)."""

from __future__ import annotations

from spmd_operator import lifecycle

from .helpers import gang, run, service, spec, status


def test_a_new_job_gets_its_configmap_and_the_first_attempts_service():
    plan = run(st=None, configmap=lifecycle.CONFIGMAP_MISSING)
    assert (plan.configmap, plan.service) == (True, 0)


def test_a_service_deleted_by_hand_is_created_again():
    st = status("Running")
    plan = run(st=st, pods=gang("Running"), services=[])
    assert plan.service == 0
    assert plan.create == () and plan.status.get("phase") is None, "nothing else happens to a running job"


def test_a_payload_configmap_deleted_by_hand_is_created_again():
    st = status("Running")
    assert run(st=st, pods=gang("Running"), configmap=lifecycle.CONFIGMAP_MISSING).configmap
    assert not run(st=st, pods=gang("Running")).configmap


def test_services_of_other_attempts_are_deleted():
    st = status("Running", restarts=2)
    legacy = lifecycle.ChildInfo(name="hello-master")
    plan = run(st=st, pods=gang("Running", restart=2), services=[service(1), service(2), legacy])
    assert set(plan.delete_services) == {service(1).name, "hello-master"}
    assert plan.service is None


def test_a_gang_scheduled_attempt_gets_its_podgroup_and_older_ones_go():
    s = spec(scheduling={"provider": "Volcano"})
    plan = run(s=s, st=None)
    assert (plan.podgroup, plan.create) == (0, (0, 1, 2, 3)), "the group exists before its pods are bound"
    st = status("Running", restarts=1)
    old = lifecycle.ChildInfo(name="hello-3fa9c-r0", restart=0)
    mine = lifecycle.ChildInfo(name="hello-3fa9c-r1", restart=1)
    plan = run(s=s, st=st, pods=gang("Running", restart=1), podgroups=[old, mine])
    assert (plan.podgroup, plan.delete_podgroups) == (None, ("hello-3fa9c-r0",))
    plan = run(s=s, st=st, pods=gang("Running", restart=1), podgroups=[old])
    assert plan.podgroup == 1, "a PodGroup deleted by hand is created again"
    assert run(st=st, pods=gang("Running", restart=1)).podgroup is None, "no provider, no group"
