"""The ConfigMap and the per-attempt master Services (lifecycle.children)."""

from __future__ import annotations

from spmd_operator import lifecycle

from .helpers import gang, run, service, status


def test_a_new_job_gets_its_configmap_and_the_first_attempts_service():
    plan = run(st=None, configmap=lifecycle.CONFIGMAP_MISSING)
    assert (plan.configmap, plan.service) == (True, 0)


def test_a_service_deleted_by_hand_is_created_again():
    st = status("Running")
    plan = run(st=st, pods=gang("Running"), services=[])
    assert plan.service == 0
    assert plan.create == () and plan.status.get("phase") is None, "nothing else happens to a running job"


def test_a_configmap_deleted_by_hand_or_of_an_older_operator_is_rewritten():
    st = status("Running")
    assert run(st=st, pods=gang("Running"), configmap=lifecycle.CONFIGMAP_MISSING).configmap
    assert run(st=st, pods=gang("Running"), configmap=lifecycle.CONFIGMAP_STALE).configmap
    assert not run(st=st, pods=gang("Running")).configmap


def test_services_of_other_attempts_are_deleted():
    st = status("Running", restarts=2)
    legacy = lifecycle.ChildInfo(name="hello-master")
    plan = run(st=st, pods=gang("Running", restart=2), services=[service(1), service(2), legacy])
    assert set(plan.delete_services) == {service(1).name, "hello-master"}
    assert plan.service is None
