"""Refusals of a child by the API server (lifecycle.refusal): named, announced once, retried with
back-off, and an incomplete gang released after a bound."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from spmd_operator import names
from spmd_operator.lifecycle import Refusal, refusal

from .helpers import JOB, NOW, apply, cond, events, gang, pod, pod_name, run, spec, status

QUOTA = ('pods "{name}" is forbidden: exceeded quota: q1, requested: pods=1, used: pods=2, limited: pods=2')
PSA = ('pods "{name}" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
       '(container "trainer" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
       '(container "trainer" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or '
       'container "trainer" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container '
       '"trainer" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')


def refused(index, text=QUOTA, at=NOW, kind="Pod", code=403):
    name = names.pod_name(JOB, 0, index) if kind == "Pod" else names.service_name(JOB, 0)
    return Refusal(kind=kind, name=name, code=code, reason="Forbidden", message=text.format(name=name),
                   at=at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), index=index if kind == "Pod" else None)


def test_a_quota_refusal_reaches_status_and_one_event_naming_the_quota_and_the_resource():
    st = status("Pending")
    plan = run(st=st, pods=gang("Pending")[:2], rejection=refused(2))
    new = apply(st, plan)
    assert new["phase"] == "Pending"
    assert (new["reason"], cond(new, "Running")["reason"], cond(new, "Created")["status"]) == \
        ("QuotaExceeded", "QuotaExceeded", "False")
    assert "2/4 pods created" in new["message"]
    assert f"pod {pod_name(2)} (rank 2) refused by ResourceQuota q1 of namespace ns: pods: requested 1, used 2, limited 2" \
        in new["message"], new["message"]
    r = new["refusal"]
    assert (r["reason"], r["kind"], r["name"], r["code"], r["retries"]) == ("QuotaExceeded", "Pod", pod_name(2), 403, 1)
    assert events(plan) == [("Warning", "QuotaExceeded")]
    assert "ResourceQuota q1" in plan.events[0].message
    assert plan.create == (), "nothing is created again before the back-off"
    assert plan.requeue_after == pytest.approx(refusal.RETRY_SECONDS[0])


def test_pods_the_server_took_that_the_informer_does_not_show_yet_count_as_created():
    # The gang's four pods went at once: 0, 1 and 3 were taken, 2 refused; the watch has shown 0 only.
    st = status("Pending")
    coming = [pod_name(1), pod_name(3)]
    new = apply(st, run(st=st, pods=gang("Pending")[:1], rejection=refused(2), creating=coming))
    assert "3/4 pods created" in new["message"], new["message"]
    assert "1/4 pods created" in apply(st, run(st=st, pods=gang("Pending")[:1], rejection=refused(2)))["message"]


def test_the_same_refusal_again_is_retried_with_growing_back_off_and_no_new_event():
    st = status("Pending")
    new = apply(st, run(st=st, pods=gang("Pending")[:2], rejection=refused(2)))
    t1 = NOW + dt.timedelta(seconds=3)
    plan = run(st=new, pods=gang("Pending")[:2], rejection=refused(2), now=t1)
    assert plan.create == (2,), "the back-off is over: the first missing pod is tried again"
    assert plan.events == ()
    plan = run(st=new, pods=gang("Pending")[:2], rejection=refused(3, at=t1), now=t1)
    again = apply(new, plan)
    assert plan.events == (), "the same quota and resource: not announced again"
    assert again["refusal"]["retries"] == 2
    assert plan.requeue_after == pytest.approx(refusal.RETRY_SECONDS[1])
    assert again["refusal"]["since"] == new["refusal"]["since"]


def test_a_different_cause_is_a_new_event():
    st = status("Pending")
    new = apply(st, run(st=st, pods=gang("Pending")[:2], rejection=refused(2)))
    later = NOW + dt.timedelta(seconds=5)
    plan = run(st=new, pods=gang("Pending")[:2], rejection=refused(2, text=PSA, at=later), now=later)
    assert events(plan) == [("Warning", "PodSecurity")]


def test_a_pod_security_refusal_names_the_level_and_the_jobs_fields():
    s = spec(template={"spec": {"containers": [{"name": "side", "image": "b"}, {"name": "trainer"}]}})
    st = status("Pending")
    new = apply(st, run(s=s, st=st, rejection=refused(0, text=PSA)))
    message = new["message"]
    assert new["reason"] == "PodSecurity"
    assert 'violates Pod Security "restricted:latest" enforced on namespace ns' in message
    assert "spec.template.spec.containers[1] must set securityContext.allowPrivilegeEscalation=false" in message
    assert "spec.template.spec (or spec.template.spec.containers[1]) must set securityContext.runAsNonRoot=true" in message
    assert "0/4 pods created" in message
    # Without a trainer in the template, the message says where to add it.
    new = apply(st, run(st=st, rejection=refused(0, text=PSA)))
    assert "spec.template.spec.containers[] (add a container named trainer) must set" in new["message"]


def test_an_incomplete_gang_releases_its_pods_after_the_bound_without_using_a_restart():
    st = status("Pending")
    held = gang("Pending")[:2]
    new = apply(st, run(st=st, pods=held, rejection=refused(2)))
    before = run(st=new, pods=held, now=NOW + dt.timedelta(seconds=refusal.RELEASE_SECONDS - 1))
    assert before.delete_pods == ()
    assert before.requeue_after == pytest.approx(1)
    at = NOW + dt.timedelta(seconds=refusal.RELEASE_SECONDS)
    plan = run(st=new, pods=held, now=at)
    assert set(plan.delete_pods) == {pod_name(0), pod_name(1)}
    assert events(plan) == [("Warning", "GangReleased")]
    released = apply(new, plan)
    assert released["refusal"]["releases"] == 1
    assert "released the incomplete gang 1 time(s)" in released["message"]
    assert plan.requeue_after == pytest.approx(refusal.RELEASE_WAIT_SECONDS[0])
    # The pods being deleted are no failure: no restart, nothing created until the wait is over.
    going = [dataclasses.replace(p, deleting=True) for p in held]
    plan = run(st=released, pods=going, now=at + dt.timedelta(seconds=5))
    after = apply(released, plan)
    assert (after["phase"], after["restarts"]) == ("Pending", 0)
    assert plan.create == () and plan.delete_pods == ()
    plan = run(st=after, pods=(), now=at + dt.timedelta(seconds=refusal.RELEASE_WAIT_SECONDS[0]))
    assert plan.create == (0,), "the gang is tried again, one pod first"


def test_after_a_back_off_one_pod_probes_and_the_rest_follows_once_it_exists():
    st = status("Pending")
    new = apply(st, run(st=st, rejection=refused(0, text=PSA)))
    later = NOW + dt.timedelta(seconds=refusal.RETRY_SECONDS[0])
    plan = run(st=new, now=later)
    assert plan.create == (0,), "a gang of any size costs one refused request per retry"
    probing = apply(new, plan)
    assert probing["refusal"]["probe"] == pod_name(0)
    plan = run(st=probing, pods=gang("Pending")[:1], now=later + dt.timedelta(seconds=1))
    assert plan.create == (1, 2, 3), "the server took the probe: the rest at once"
    done = apply(probing, plan)
    assert done["refusal"]["probed"] is True
    final = apply(done, run(st=done, pods=gang("Pending"), now=later + dt.timedelta(seconds=2)))
    assert "refusal" not in final and cond(final, "Created")["status"] == "True"


def test_the_refusal_is_cleared_once_every_pod_exists():
    st = status("Pending")
    new = apply(st, run(st=st, pods=gang("Pending")[:2], rejection=refused(2)))
    plan = run(st=new, pods=gang("Pending"), now=NOW + dt.timedelta(seconds=10))
    done = apply(new, plan)
    assert "refusal" not in done
    assert cond(done, "Created")["status"] == "True"
    assert done["reason"] == "WaitingForProcs"


def test_a_refused_service_holds_the_pods_and_is_named():
    st = status("Pending")
    text = 'services "{name}" is forbidden: exceeded quota: q2, requested: services=1, used: services=0, limited: services=0'
    plan = run(st=st, services=[], rejection=refused(0, text=text, kind="Service"))
    new = apply(st, plan)
    assert new["refusal"]["kind"] == "Service"
    assert f"Service {names.service_name(JOB, 0)} refused by ResourceQuota q2" in new["message"]
    assert plan.service is None and plan.create == (), "held during the back-off"


def test_a_refusal_seen_again_without_a_new_attempt_changes_nothing():
    st = status("Pending")
    r = refused(2)
    new = apply(st, run(st=st, pods=gang("Pending")[:2], rejection=r))
    plan = run(st=new, pods=gang("Pending")[:2], rejection=r, now=NOW + dt.timedelta(seconds=1))
    assert plan.events == () and plan.create == ()
    assert apply(new, plan)["refusal"]["retries"] == 1


def test_classify_other_403s_and_quota_that_needs_limits():
    s = spec(template={"spec": {"containers": [{"name": "trainer"}]}})
    failed = refusal.classify(refused(0, text='pods "{name}" is forbidden: failed quota: q3: must specify limits.cpu for: '
                                              'trainer; limits.memory for: trainer'), s, JOB, 0)
    assert failed.reason == "QuotaExceeded"
    assert "spec.template.spec.containers[0]" in failed.message
    other = refusal.classify(refused(0, text='pods "{name}" is forbidden: User "x" cannot create resource "pods"'), s, JOB, 0)
    assert (other.reason, other.permanent) == ("Forbidden", False)
    assert pod_name(0) in other.message
