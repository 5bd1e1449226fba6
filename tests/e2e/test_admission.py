"""End-to-end: malformed SPMDJobs are refused by the API server itself, naming the field.

Each manifest goes through `kubectl apply` exactly as a user would send it. The CRD's schema and
CEL rules must refuse it with a message that names the offending field, and nothing may be left
behind: no SPMDJob object, and so no pod or service.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e.conftest import apply, job_manifest

pytestmark = pytest.mark.cluster

GOOD = job_manifest("good", [("hosts", 2), ("gpus", 2)], ["-m", "train"])


def _set(path: str, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    if value is _DELETE:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return body


_DELETE = object()

# (case id, manifest, text the refusal must contain: the field it names)
CASES = [
    ("no-mesh", _set("spec.mesh", _DELETE), "spec.mesh"),
    ("empty-mesh", _set("spec.mesh", []), "spec.mesh"),
    ("five-dims", _set("spec.mesh", [{"name": f"d{i}", "size": 1} for i in range(5)]), "spec.mesh"),
    ("size-zero", _set("spec.mesh.1.size", 0), "size"),
    ("size-negative", _set("spec.mesh.0.size", -2), "size"),
    ("size-not-int", _set("spec.mesh.0.size", "two"), "size"),
    ("dim-name-uppercase", _set("spec.mesh.0.name", "Hosts"), "name"),
    ("dim-name-underscore", _set("spec.mesh.0.name", "gpu_s"), "name"),
    ("dim-names-duplicate", _set("spec.mesh.1.name", "hosts"), "unique"),
    ("too-many-procs", _set("spec.mesh", [{"name": "a", "size": 128}, {"name": "b", "size": 64}]),
     "4096"),
    ("no-args", _set("spec.args", _DELETE), "args"),
    ("empty-args", _set("spec.args", []), "spec.args"),
    ("dash-m-alone", _set("spec.args", ["-m"]), "spec.args"),
    ("port-zero", _set("spec.masterPort", 0), "masterPort"),
    ("port-too-big", _set("spec.masterPort", 70000), "masterPort"),
    ("negative-restarts", _set("spec.restartPolicy", {"maxRestarts": -1}), "maxRestarts"),
    ("exit-code-both", _set("spec.restartPolicy", {"permanentExitCodes": [3],
                                                   "retryableExitCodes": [3]}), "restartPolicy"),
    ("exit-code-out-of-range", _set("spec.restartPolicy", {"permanentExitCodes": [300]}),
     "permanentExitCodes"),
    ("name-too-long", _set("metadata.name", "j" * 51), "name"),
    ("name-not-dns-1035", _set("metadata.name", "1job"), "name"),
    ("gpus-negative", _set("spec.gpusPerProc", -1), "gpusPerProc"),
    ("no-image", _set("spec.image", _DELETE), "image"),
    # shmSize: a memory quantity from 1Mi to 1Ti, named with its range
    ("shm-zero", _set("spec.shmSize", "0"), "spec.shmSize: Invalid value: \"string\": must be a memory quantity from 1Mi to 1Ti"),
    ("shm-tiny", _set("spec.shmSize", "0.0000001"), "from 1Mi to 1Ti"),
    ("shm-huge", _set("spec.shmSize", "99999999999Ei"), "from 1Mi to 1Ti"),
    # the torchrun contract's variables and the pod's own are refused in the trainer, by name
    ("env-rank", _set("spec.template.spec.containers", [{"name": "trainer", "env": [{"name": "RANK", "value": "0"}]}]),
     "may not set RANK"),
    ("env-pod-ip", _set("spec.template.spec.containers", [{"name": "trainer", "env": [{"name": "POD_IP", "value": "1.2.3.4"}]}]),
     "may not set POD_IP"),
    ("container-name", _set("spec.template.spec.containers", [{"name": "Trainer_1", "image": "x"}]),
     "spec.template.spec.containers[0].name"),
]


@pytest.mark.parametrize("manifest,field", [(m, f) for _, m, f in CASES], ids=[c[0] for c in CASES])
def test_malformed_job_is_refused_naming_the_field(operator, namespace, manifest, field):
    result = apply(operator, namespace, manifest, check=False)
    assert result.returncode != 0, f"accepted: {manifest}"
    message = result.stderr
    assert field in message, message
    assert "spmdjob" in message.lower() or "SPMDJob" in message, message
    jobs = client.CustomObjectsApi(operator.api_client()).list_namespaced_custom_object(
        "spmd.monarch.dev", "v1alpha1", namespace, "spmdjobs")["items"]
    assert jobs == []
    assert client.CoreV1Api(operator.api_client()).list_namespaced_pod(namespace).items == []


def test_the_good_manifest_is_accepted(operator, namespace):
    """The control for the cases above: the unmodified manifest passes admission."""
    result = operator.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                              input=yaml.safe_dump(GOOD), check=False)
    assert result.returncode == 0, result.stderr
    assert "created (server dry run)" in result.stdout, result.stdout
