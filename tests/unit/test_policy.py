"""The rules the runner and the operator share (monarch_spmd.policy)."""

from __future__ import annotations

import copy

import pytest

from monarch_spmd import policy
from monarch_spmd.spec import parse_job_spec

BASE = {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 2}], "args": ["train.py"], "image": "img"}


def spec(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return parse_job_spec(raw)


@pytest.mark.parametrize(
    ("restart_policy", "code", "reason", "permanent"),
    [
        ({}, 1, "Error", False),
        ({}, 137, "OOMKilled", False),
        ({}, 64, "Error", True),
        ({}, 75, "Error", False),
        ({}, None, "Evicted", False),
        ({}, None, "InvalidImageName", True),
        ({}, None, "ErrImageNeverPull", True),
        ({}, None, "DeletionByPodGC", False),
        ({"permanentExitCodes": [2]}, 2, "Error", True),
        ({"permanentExitCodes": [75]}, 75, "Error", True),
        ({"retryableExitCodes": [137]}, 137, "Error", False),
        ({"retryableExitCodes": [137]}, 1, "Error", True),
        ({"retryableExitCodes": [137]}, 75, "Error", False),
        ({"retryableExitCodes": [64]}, 64, "Error", False),
        ({"retryableExitCodes": [137]}, None, "PodDeleted", False),
        ({"retryableExitCodes": [137]}, 1, "PreemptionByScheduler", False),
        ({"permanentReasons": ["OOMKilled"]}, 137, "OOMKilled", True),
        ({"permanentReasons": ["Evicted"]}, None, "Evicted", True),
    ],
)
def test_failure_classification(restart_policy, code, reason, permanent):
    assert policy.is_permanent(spec(restartPolicy=restart_policy), code, reason) is permanent


def test_disruptions_are_the_clusters_doing():
    assert policy.is_disruption("PreemptionByScheduler")
    assert policy.is_disruption("DeletionByPodGC")
    assert not policy.is_disruption("Error")
    assert not policy.is_disruption(None)


def test_trainer_container_is_the_named_or_the_unnamed_one():
    assert policy.trainer_container({"spec": {"containers": [{"name": "side"}, {"name": "trainer", "x": 1}]}}) == {"name": "trainer", "x": 1}
    assert policy.trainer_container({"spec": {"containers": [{"image": "i"}]}}) == {"image": "i"}
    assert policy.trainer_container({}) is None


@pytest.mark.parametrize(
    ("changes", "scope"),
    [
        ({}, "mesh"),
        ({"gpusPerProc": 1}, "pod"),
        ({"template": {"spec": {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}, "pod"),
        ({"template": {"spec": {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "0"}}}]}}}, "mesh"),
        ({"template": {"spec": {"containers": [{"name": "side", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}, "mesh"),
    ],
)
def test_local_rank_scope_follows_the_gpus_a_pod_holds(changes, scope):
    assert policy.local_rank_scope(spec(**changes)) == scope


def test_trainer_env_gives_plain_values_and_refuses_cluster_only_sources():
    s = spec(template={"spec": {"containers": [{"name": "trainer", "env": [{"name": "A", "value": "1"}, {"name": "B"}]}]}})
    assert policy.trainer_env(s) == {"A": "1", "B": ""}
    s = spec(template={"spec": {"containers": [{"name": "trainer", "env": [
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}})
    with pytest.raises(policy.UnsupportedLocally, match=r"spec\.template\.spec\.containers\[0\]\.env\[0\]\.valueFrom"):
        policy.trainer_env(s)
    s = spec(template={"spec": {"containers": [{"name": "trainer", "envFrom": [{"configMapRef": {"name": "c"}}]}]}})
    with pytest.raises(policy.UnsupportedLocally, match="envFrom"):
        policy.trainer_env(s)
