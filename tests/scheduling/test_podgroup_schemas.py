"""PodGroups of Volcano and coscheduling against their published CRDs, on the real API server.

Neither gang scheduler can be built here (their Go modules are not served), so their schedulers do
not run in these tests; their CRDs can, vendored in tests/data/crds from the projects' releases.
The API server then checks a PodGroup exactly as a cluster with Volcano or scheduler-plugins
installed would (schema, defaults, pruning). These are the fields an operator sets for a gang of
`minMember` pods; docs/gang-scheduling.md says what the pods need to join the group.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client

from devcluster import LocalCluster

pytestmark = pytest.mark.cluster

VOLCANO = ("scheduling.volcano.sh", "v1beta1", "podgroups")
COSCHEDULING = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")


def volcano_podgroup(name: str) -> dict[str, Any]:
    """A Volcano PodGroup for a gang of 4 one-GPU pods in Volcano's `default` queue."""
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": 4, "queue": "default", "priorityClassName": "",
                 "minResources": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "4"}},
    }


def coscheduling_podgroup(name: str) -> dict[str, Any]:
    """A scheduler-plugins (coscheduling) PodGroup for a gang of 4 pods."""
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": 4, "scheduleTimeoutSeconds": 60,
                 "minResources": {"cpu": "8", "nvidia.com/gpu": "4"}},
    }


def with_spec(body: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body["spec"].update(spec)
    return body


@pytest.fixture
def api(podgroup_crds: LocalCluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(podgroup_crds.api_client())


@pytest.mark.parametrize("kind, build", [(VOLCANO, volcano_podgroup),
                                         (COSCHEDULING, coscheduling_podgroup)],
                         ids=["volcano", "coscheduling"])
def test_valid_podgroup_accepted(api: client.CustomObjectsApi, namespace: str,
                                 kind: tuple[str, str, str], build) -> None:
    body = build("gang")
    dry = api.create_namespaced_custom_object(*kind[:2], namespace, kind[2], body, dry_run="All")
    assert dry["spec"]["minMember"] == 4
    assert api.list_namespaced_custom_object(*kind[:2], namespace, kind[2])["items"] == []

    made = api.create_namespaced_custom_object(*kind[:2], namespace, kind[2], body)

    # Every field the operator set survives (nothing pruned as unknown).
    for field, value in body["spec"].items():
        assert made["spec"][field] == value, field


def test_volcano_queue_defaults_to_default(api: client.CustomObjectsApi, namespace: str) -> None:
    body = volcano_podgroup("no-queue")
    del body["spec"]["queue"]
    made = api.create_namespaced_custom_object(*VOLCANO[:2], namespace, VOLCANO[2], body)
    assert made["spec"]["queue"] == "default"


@pytest.mark.parametrize("kind, body, field", [
    (VOLCANO, with_spec(volcano_podgroup("bad"), minMember="4"), "spec.minMember"),
    (VOLCANO, with_spec(volcano_podgroup("bad"), minMember=-1), "spec.minMember"),
    (VOLCANO, with_spec(volcano_podgroup("bad"), queue="Not_A_Queue"), "spec.queue"),
    (COSCHEDULING, with_spec(coscheduling_podgroup("bad"), minMember="4"), "spec.minMember"),
    (COSCHEDULING, with_spec(coscheduling_podgroup("bad"), minMember=0), "spec.minMember"),
    (COSCHEDULING, with_spec(coscheduling_podgroup("bad"), scheduleTimeoutSeconds="60s"),
     "spec.scheduleTimeoutSeconds"),
], ids=["volcano-minmember-string", "volcano-minmember-negative", "volcano-queue-name",
        "cosched-minmember-string", "cosched-minmember-zero", "cosched-timeout-string"])
def test_wrong_podgroup_refused(api: client.CustomObjectsApi, namespace: str,
                                kind: tuple[str, str, str], body: dict[str, Any],
                                field: str) -> None:
    for dry_run in ("All", None):
        with pytest.raises(client.ApiException) as refused:
            api.create_namespaced_custom_object(*kind[:2], namespace, kind[2], body,
                                                dry_run=dry_run)
        assert refused.value.status == 422
        assert field in refused.value.body
    assert api.list_namespaced_custom_object(*kind[:2], namespace, kind[2])["items"] == []
