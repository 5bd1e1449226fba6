"""spmd_operator.replicagroups' pure parts: the group jobs and the Lighthouse it builds, the env
every rank of a group gets, and the job's phase from its groups' (one row per case)."""

from __future__ import annotations

import json

import pytest

from monarch_spmd.spec import parse_job_spec
from spmd_operator import builders, names, replicagroups as rg_mod
from spmd_operator.names import JobRef
from spmd_operator.replicagroups import FAILED, PENDING, RESTARTING, RUNNING, SUCCEEDED, Group, phase_of, plan

JOB = JobRef("train", "ns", "uid-1")
SPEC = {"mesh": [{"name": "procs", "size": 2}], "args": ["-m", "train"], "image": "img:1",
        "replicaGroups": {"count": 3, "minReplicas": 2, "timeoutSeconds": 30}, "ttlSecondsAfterFinished": 60,
        "restartPolicy": {"maxRestarts": 2}}
NOW = "2026-12-07T00:00:00Z"


def parent() -> dict:
    return {"metadata": {"name": JOB.name, "namespace": JOB.namespace, "uid": JOB.uid, "labels": {"team": "a"}},
            "spec": json.loads(json.dumps(SPEC))}


def child(g: int, phase: str | None, *, suspend: bool = False, reason: str | None = None) -> dict:
    body = rg_mod.build_group_job(parent(), JOB, parse_job_spec(SPEC).replica_groups, g, suspend=suspend)
    if phase is not None:
        body["status"] = {"phase": phase, "restarts": 1, **({"reason": reason} if reason else {})}
    return body


def test_a_group_job_is_the_parents_spec_without_its_own_fields_owned_by_it_with_its_env():
    body = child(1, None)
    assert body["metadata"]["name"] == "train-g1"
    assert body["metadata"]["ownerReferences"] == [builders.owner_reference(JOB)]
    assert body["metadata"]["labels"] == {"team": "a", rg_mod.LABEL_GROUPS_OF: "train", rg_mod.LABEL_GROUP: "1"}
    assert "replicaGroups" not in body["spec"] and "ttlSecondsAfterFinished" not in body["spec"]
    assert body["spec"]["restartPolicy"] == {"maxRestarts": 2}, "each group has the job's budget, its own"
    parse_job_spec(body["spec"], require_image=True)  # a valid job of its own
    env = json.loads(body["metadata"]["annotations"][rg_mod.ANNOTATION_ENV])
    assert env == {"REPLICA_GROUP_ID": "1", "NUM_REPLICA_GROUPS": "3",
                   "TORCHFT_LIGHTHOUSE": "http://train-lighthouse.ns.svc:29510", "TORCHFT_MANAGER_PORT": "29512",
                   "TORCHFT_QUORUM_RETRIES": "10", "TORCHFT_TIMEOUT_SEC": "30", "MONARCH_SPMD_AGENT_STORE": "1"}


def test_a_group_jobs_pods_get_its_env_after_the_operators_and_its_label_and_its_policy_lets_siblings_in():
    body = child(2, None)
    body["metadata"]["uid"] = "uid-g2"
    ref = JobRef.from_body(body)
    spec = parse_job_spec({**body["spec"], "template": {"spec": {"containers": [
        {"name": "trainer", "env": [{"name": "TORCHFT_QUORUM_RETRIES", "value": "3"}]}]}}}, require_image=True)
    pod = builders.build_pod(ref, spec, 0, 0)
    rg_mod.dress_pod(pod, body)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["REPLICA_GROUP_ID"] == "2" and env["TORCHFT_QUORUM_RETRIES"] == "3", "the user's own value wins"
    assert pod["metadata"]["labels"][rg_mod.LABEL_GROUPS_OF] == "train"
    policy = builders.build_network_policy(ref, spec, "ops", {"app": "op"})
    rg_mod.dress_network_policy(policy, body)
    assert {"from": [{"podSelector": {"matchLabels": {rg_mod.LABEL_GROUPS_OF: "train"}}}]} in policy["spec"]["ingress"]
    other = builders.build_pod(JOB, parse_job_spec({k: v for k, v in SPEC.items() if k != "replicaGroups"}), 0, 0)
    before = json.dumps(other, sort_keys=True)
    rg_mod.dress_pod(other, parent())
    assert json.dumps(other, sort_keys=True) == before, "a job that is no group's is left alone"


def test_the_lighthouse_runs_torchft_lighthouse_from_the_image_behind_a_headless_service():
    spec = parse_job_spec({**SPEC, "template": {"spec": {"nodeSelector": {"pool": "cpu"},
                                                          "containers": [{"name": "trainer"}]}}})
    pod = rg_mod.build_lighthouse_pod(JOB, spec, spec.replica_groups)
    c = pod["spec"]["containers"][0]
    assert c["image"] == "img:1" and c["command"][:3] == ["torchft_lighthouse", "--min_replicas", "2"]
    assert "0.0.0.0:29510" in c["command"] and pod["spec"]["restartPolicy"] == "Always"
    assert pod["spec"]["nodeSelector"] == {"pool": "cpu"}
    svc = rg_mod.build_lighthouse_service(JOB, spec.replica_groups)
    assert svc["spec"]["clusterIP"] == "None" and svc["metadata"]["name"] == "train-lighthouse"
    assert svc["spec"]["selector"] == {names.LABEL_JOB_UID: "uid-1", rg_mod.LABEL_ROLE: "lighthouse"}


def g(i: int, phase: str | None) -> Group:
    return Group(i, f"train-g{i}", phase, reason="RestartLimit" if phase == FAILED else None)


@pytest.mark.parametrize("phases, started, expected", [
    ((None, None, None), False, PENDING),
    ((RUNNING, RUNNING, PENDING), False, RUNNING),
    ((RUNNING, "Restarting", RUNNING), True, RUNNING),  # one group restarts: the others train on
    ((RUNNING, FAILED, RUNNING), True, RUNNING),  # 2 of 3 can run: minReplicas 2 holds
    ((RUNNING, FAILED, FAILED), True, FAILED),  # fewer than 2 can run
    ((RUNNING, "Restarting", "Restarting"), True, RESTARTING),
    ((SUCCEEDED, SUCCEEDED, SUCCEEDED), True, SUCCEEDED),
    ((SUCCEEDED, FAILED, SUCCEEDED), True, SUCCEEDED),  # every group ended, 2 succeeded
    ((SUCCEEDED, RUNNING, SUCCEEDED), True, RUNNING),  # the last group still trains
])
def test_the_jobs_phase_from_its_groups(phases, started, expected):
    phase, reason, message = phase_of([g(i, p) for i, p in enumerate(phases)], 3, 2, started)
    assert phase == expected, (reason, message)
    if FAILED in phases:
        assert "group 1 (train-g1) failed: RestartLimit" in message


def test_a_pass_creates_the_missing_groups_and_the_lighthouse_then_follows_them():
    spec = parse_job_spec(SPEC)
    first = plan(JOB, spec, {}, {}, None, False, NOW)
    assert first.create_groups == (0, 1, 2) and first.lighthouse and first.status["phase"] == PENDING
    running = {i: child(i, RUNNING) for i in range(3)}
    second = plan(JOB, spec, first.status, running, (RUNNING, False), True, NOW)
    assert second.create_groups == () and not second.lighthouse
    assert second.status["phase"] == RUNNING and second.status["startTime"] == NOW
    assert second.status["replicaGroups"] == {"count": 3, "minReplicas": 2, "running": 3, "succeeded": 0, "failed": 0}
    status = {**first.status, **second.status}
    lost = plan(JOB, spec, status, running, (FAILED, False), True, NOW)
    assert lost.restart_lighthouse and "phase" not in lost.status, "a Lighthouse lost is started again; no group stops"
    gone = plan(JOB, spec, status, {0: running[0], 2: running[2]}, (RUNNING, False), True, NOW)
    assert gone.create_groups == (1,), "a group job deleted is created again"


def test_fewer_than_min_replicas_fails_the_job_suspends_the_rest_and_removes_the_lighthouse():
    spec = parse_job_spec(SPEC)
    status = {"phase": RUNNING, "startTime": NOW}
    children = {0: child(0, RUNNING), 1: child(1, FAILED, reason="RestartLimit"), 2: child(2, FAILED)}
    p = plan(JOB, spec, status, children, (RUNNING, False), True, NOW)
    assert p.status["phase"] == FAILED and p.status["reason"] == "TooFewReplicaGroups"
    assert p.suspend_groups == ("train-g0",) and p.delete_lighthouse and not p.lighthouse
    assert p.status["completionTime"] == NOW
    assert {e[1] for e in p.events} == {"TooFewReplicaGroups", "GroupFailed"}
    after = plan(JOB, spec, {**status, **p.status}, {**children, 0: child(0, "Suspended", suspend=True)}, None,
                 False, NOW)
    assert after.create_groups == () and after.status.get("phase") is None, "a failed job stays failed, creates nothing"


def test_a_suspended_job_suspends_its_groups_and_resumes_them():
    spec = parse_job_spec({**SPEC, "suspend": True})
    children = {i: child(i, RUNNING) for i in range(3)}
    p = plan(JOB, spec, {"phase": RUNNING}, children, (RUNNING, False), True, NOW)
    assert p.status["phase"] == "Suspended" and p.suspend_groups == ("train-g0", "train-g1", "train-g2")
    assert p.delete_lighthouse
    resumed = plan(JOB, parse_job_spec(SPEC), {"phase": "Suspended"},
                   {i: child(i, "Suspended", suspend=True) for i in range(3)}, None, False, NOW)
    assert resumed.resume_groups == ("train-g0", "train-g1", "train-g2") and resumed.lighthouse


# --- the rules of spec.replicaGroups, offline and in the CRD's CEL alike ----------------------------

BASE = {"mesh": [{"name": "procs", "size": 2}], "args": ["-m", "train"], "image": "img:1"}


@pytest.mark.parametrize("changes, name, field", [
    ({"replicaGroups": {"count": 2, "minReplicas": 3}}, "job", "spec.replicaGroups.minReplicas"),
    ({"replicaGroups": {"count": 2, "managerPort": 29500}}, "job", "spec.replicaGroups.managerPort"),
    ({"replicaGroups": {"count": 2, "managerPort": 29401}}, "job", "spec.replicaGroups.managerPort"),
    ({"replicaGroups": {"count": 2}, "mode": "Monarch", "podLayout": "PerHost", "args": None}, "job",
     "spec.replicaGroups"),
    ({"replicaGroups": {"count": 2}, "scheduling": {"provider": "Kueue", "queue": "q"}}, "job", "spec.replicaGroups"),
    ({"replicaGroups": {"count": 2}}, "j" * 47, "metadata.name"),
    ({"replicaGroups": {"count": 2}}, "j" * 46, None),
    ({"replicaGroups": {"count": 99, "minReplicas": 99, "managerPort": 29600}}, "job", None),
])
def test_a_replica_groups_rule_is_refused_offline_and_by_the_crds_cel_alike(changes, name, field):
    from monarch_spmd import schema, spec as spec_mod

    from .test_crd import cel_failures
    job_spec = {**BASE, **changes}
    job_spec = {k: v for k, v in job_spec.items() if v is not None}
    doc = {"apiVersion": spec_mod.API_VERSION, "kind": spec_mod.KIND, "metadata": {"name": name}, "spec": job_spec}
    errors = spec_mod.check_manifest(doc)[1]
    assert [e.field for e in errors] == ([field] if field else []), errors
    obj, problems = schema.validate(spec_mod.ROOT, doc, reset=("status",))
    assert bool(cel_failures(obj)) is bool(field), cel_failures(obj)


def test_the_lighthouse_pod_is_seen_as_a_pod_of_the_job_with_no_rank():
    from spmd_operator.lifecycle import model
    spec = parse_job_spec(SPEC)
    pod = rg_mod.build_lighthouse_pod(JOB, spec, spec.replica_groups)
    pod["status"] = {"phase": "Running"}
    info = model.pod_info(pod)
    assert info is not None and (info.name, info.rank, info.restart, info.phase) == ("train-lighthouse", -1, 0, "Running")
    assert all(value == "" or value[0].isalnum() for value in pod["metadata"]["labels"].values()), "valid label values"


def test_each_group_pod_gets_a_headless_service_of_its_own_name_kept_with_its_attempt():
    body = child(0, None)
    body["metadata"]["uid"] = "uid-g0"
    ref = JobRef.from_body(body)
    pod = builders.build_pod(ref, parse_job_spec(body["spec"], require_image=True), 0, 2)
    rg_mod.dress_pod(pod, body)
    svc = rg_mod.build_host_service(ref, pod)
    name = pod["metadata"]["name"]
    assert svc["metadata"]["name"] == name and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {names.LABEL_JOB_UID: "uid-g0", rg_mod.LABEL_POD: name}
    assert all(pod["metadata"]["labels"][k] == v for k, v in svc["spec"]["selector"].items()), "it selects the pod"
    assert svc["metadata"]["labels"][names.LABEL_RESTART] == "2", "deleted with its attempt's Services"
