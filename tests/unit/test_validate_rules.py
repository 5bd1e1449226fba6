"""The rules `monarch-spmd validate` and the API server hold an SPMDJob to beyond one field: an
elastic job's elasticWaitSeconds below its joinTimeoutSeconds, the values Kubernetes takes for the
pod template's enum fields (a toleration's operator and effect, imagePullPolicy ...), each refused
naming the field and what is valid; and a note, not an error, for a GPU job whose pods tolerate no
GPU taint."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from monarch_spmd import crd as crdmod
from monarch_spmd import podspec_openapi, podtemplate, schema, spec, validate

from .test_crd import cel_failures

ELASTIC = {"mesh": [{"name": "nodes", "size": 4, "minSize": 2}, {"name": "procs", "size": 2}], "podLayout": "PerHost",
           "args": ["-m", "train"], "image": "img:1"}


def elastic(**restart: Any) -> dict[str, Any]:
    out = copy.deepcopy(ELASTIC)
    if restart:
        out["restartPolicy"] = restart
    return out


def manifest(job_spec: dict[str, Any], name: str = "job") -> dict[str, Any]:
    return {"apiVersion": spec.API_VERSION, "kind": spec.KIND, "metadata": {"name": name}, "spec": job_spec}


def errors_of(job_spec: dict[str, Any]) -> list[spec.SpecError]:
    return validate.check_manifest(manifest(job_spec))[1]


# --- elasticWaitSeconds below joinTimeoutSeconds ---------------------------------------------------


def test_the_docs_say_the_wait_must_stay_below_the_join_timeout():
    text = (Path(__file__).resolve().parents[2] / "docs" / "spmdjob.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `spec.restartPolicy.elasticWaitSeconds`"))
    assert "an elastic job's must be below `joinTimeoutSeconds`" in row and "refuse one that is not" in row


@pytest.mark.parametrize("restart,wait,join", [
    ({"elasticWaitSeconds": 200}, 200, 120),
    ({"elasticWaitSeconds": 60, "joinTimeoutSeconds": 60}, 60, 60),
    ({"joinTimeoutSeconds": 5}, 10, 5),  # the default wait (10) against a short join timeout
])
def test_an_elastic_wait_not_below_the_join_timeout_is_refused_naming_both(restart, wait, join):
    errors = errors_of(elastic(**restart))
    assert [e.field for e in errors] == ["spec.restartPolicy.elasticWaitSeconds"], errors
    message = str(errors[0])
    assert f"{wait} is not below restartPolicy.joinTimeoutSeconds ({join})" in message
    assert f"give elasticWaitSeconds below {join} (0..{join - 1}), or raise joinTimeoutSeconds above {wait}" in message
    with pytest.raises(spec.SpecError) as info:
        spec.parse_job_spec(elastic(**restart), require_image=True)
    assert info.value.field == "spec.restartPolicy.elasticWaitSeconds"


@pytest.mark.parametrize("job_spec", [
    elastic(),
    elastic(elasticWaitSeconds=59, joinTimeoutSeconds=60),
    elastic(elasticWaitSeconds=0, joinTimeoutSeconds=1),
    # not elastic: the wait is never used, so it is not held to the join timeout
    {**elastic(joinTimeoutSeconds=5), "mesh": [{"name": "nodes", "size": 4}, {"name": "procs", "size": 2}]},
    {**elastic(joinTimeoutSeconds=5), "mesh": [{"name": "nodes", "size": 2, "minSize": 2}, {"name": "procs", "size": 2}]},
])
def test_a_wait_below_the_join_timeout_or_a_fixed_size_is_valid(job_spec):
    assert errors_of(job_spec) == []


@pytest.mark.parametrize("restart,refused", [
    ({"elasticWaitSeconds": 200}, True),
    ({"joinTimeoutSeconds": 10}, True),
    ({"elasticWaitSeconds": 9, "joinTimeoutSeconds": 10}, False),
])
def test_the_api_server_refuses_the_same_through_the_crds_cel_rule(restart, refused):
    obj, problems = schema.validate(spec.ROOT, manifest(elastic(**restart)), reset=("status",))
    assert not any(p.blocking for p in problems)
    failed = cel_failures(obj)
    assert any("elasticWaitSeconds" in m for m in failed) is refused, failed
    rule = next(r for r in crdmod.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                ["x-kubernetes-validations"] if r.get("fieldPath") == ".restartPolicy.elasticWaitSeconds")
    assert "joinTimeoutSeconds" in rule["message"]


def test_a_stored_elastic_job_with_a_long_wait_still_runs():
    """A policy: the API server refuses new jobs, the operator keeps running one it stored before."""
    stored = spec.parse_stored(elastic(elasticWaitSeconds=200))
    assert stored.spec.elastic_wait_seconds == 200
    assert [e.field for e in stored.outdated] == ["spec.restartPolicy.elasticWaitSeconds"]


# --- the pod template's enum fields ---------------------------------------------------------------


def with_pod(pod: dict[str, Any]) -> dict[str, Any]:
    return {"mesh": [{"name": "a", "size": 2}], "args": ["x.py"], "image": "img:1", "template": {"spec": pod}}


def trainer(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "trainer", **fields}]}


@pytest.mark.parametrize("pod,field,valid", [
    ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exist"}]}, "spec.template.spec.tolerations[0].operator",
     "one of Exists, Equal (or empty)"),
    ({"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedul"}]},
     "spec.template.spec.tolerations[0].effect", "one of NoSchedule, PreferNoSchedule, NoExecute (or empty)"),
    (trainer(imagePullPolicy="always"), "spec.template.spec.containers[0].imagePullPolicy",
     "one of Always, Never, IfNotPresent (or empty)"),
    ({"dnsPolicy": "ClusterFirstWithHostNetwork"}, "spec.template.spec.dnsPolicy",
     "one of ClusterFirstWithHostNet, ClusterFirst, Default, None (or empty)"),
    (trainer(ports=[{"containerPort": 80, "protocol": "tcp"}]), "spec.template.spec.containers[0].ports[0].protocol",
     "one of TCP, UDP, SCTP (or empty)"),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Schedule"}]},
     "spec.template.spec.topologySpreadConstraints[0].whenUnsatisfiable", "one of DoNotSchedule, ScheduleAnyway"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "Equals", "values": ["a"]}]}]}}}},
     "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].operator", "one of In, NotIn, Exists, DoesNotExist, Gt, Lt"),
    ({"securityContext": {"seccompProfile": {"type": "runtime/default"}}},
     "spec.template.spec.securityContext.seccompProfile.type", "one of Unconfined, RuntimeDefault, Localhost"),
    ({"preemptionPolicy": ""}, "spec.template.spec.preemptionPolicy", "one of PreemptLowerPriority, Never"),
])
def test_a_value_kubernetes_does_not_take_is_refused_naming_the_field_and_the_valid_ones(pod, field, valid):
    errors = errors_of(with_pod(pod))
    assert [e.field for e in errors] == [field], errors
    assert f"is not valid; expected {valid}" in str(errors[0])


@pytest.mark.parametrize("pod", [
    {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                     {"key": "a", "operator": "Equal", "value": "b"}, {"operator": "Exists", "effect": ""},
                     {"key": "c", "operator": ""}]},
    trainer(imagePullPolicy="IfNotPresent", terminationMessagePolicy="FallbackToLogsOnError"),
    trainer(imagePullPolicy=""),  # a pod takes it empty: Kubernetes' defaulting fills it in
    {"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"]}, "preemptionPolicy": "Never"},
    {"volumes": [{"name": "h", "hostPath": {"path": "/data", "type": ""}}]},
])
def test_the_values_a_pod_takes_pass(pod):
    assert errors_of(with_pod(pod)) == []


def test_the_crd_carries_the_values_so_the_api_server_refuses_the_same():
    openapi = crdmod.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    template = openapi["properties"]["spec"]["properties"]["template"]["properties"]["spec"]["properties"]
    assert template["tolerations"]["items"]["properties"]["operator"]["enum"] == ["Exists", "Equal", ""]
    container = template["containers"]["items"]["properties"]
    assert container["imagePullPolicy"]["enum"] == ["Always", "Never", "IfNotPresent", ""]
    assert "enum" not in template["restartPolicy"], "the table's own rule (Never) replaces Kubernetes' values"
    committed = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "spmd.monarch.dev_spmdjobs.yaml")
                               .read_text())
    assert committed == crdmod.crd()


# The Go sources of the Kubernetes version the CRD is made for: every field whose Go type is an
# enum is in the table with exactly its constants ("" aside), but those left out on purpose.
GO_API = f"k8s.io/api@v0{podspec_openapi.KUBERNETES_VERSION[2:]}/core/v1/types.go"
GO_META = f"k8s.io/apimachinery@v0{podspec_openapi.KUBERNETES_VERSION[2:]}/pkg/apis/meta/v1/types.go"
#: (OpenAPI type, field) of an enum type that the table leaves out, and why.
LEFT_OUT = {("io.k8s.api.core.v1.AzureDiskVolumeSource", "kind"): "the pod's validation does not hold it to its values"}
#: Go structs whose OpenAPI type has another name (the fields of an embedded struct).
GO_STRUCT = {"EphemeralContainer": "EphemeralContainerCommon"}


def go_source(module_path: str) -> str:
    path = Path(os.environ.get("GOMODCACHE") or Path.home() / "go" / "pkg" / "mod") / module_path
    if not path.is_file():
        pytest.skip(f"{module_path} is not in the Go module cache")
    return path.read_text()


def go_constants(text: str, enums_only: bool) -> dict[str, set[str]]:
    types = {m.group(1): set() for m in re.finditer(r"// \+enum\n(?://.*\n)*type (\w+) string", text)}
    if not enums_only:
        types.update({m.group(1): set() for m in re.finditer(r"^type (\w+) string$", text, re.M)})
    for m in re.finditer(r'^\s*\w+\s+(\w+)\s*=\s*"([^"]*)"', text, re.M):
        if m.group(1) in types:
            types[m.group(1)].add(m.group(2))
    return types


def go_fields(text: str) -> dict[str, dict[str, str]]:
    """struct -> json name -> Go type (pointers and slices unwrapped)."""
    out: dict[str, dict[str, str]] = {}
    for m in re.finditer(r"^type (\w+) struct \{\n(.*?)^\}", text, re.M | re.S):
        out[m.group(1)] = {f.group(2): f.group(1) for f in
                           re.finditer(r'^\s*\w+\s+(?:\*|\[\])?(\w+)\s+`json:"(\w+)', m.group(2), re.M)}
    return out


def test_the_table_of_values_is_the_go_types_enums():
    core, meta = go_source(GO_API), go_source(GO_META)
    enums = go_constants(core, enums_only=True)
    constants = {**go_constants(meta, enums_only=False), **go_constants(core, enums_only=False)}
    fields = {**{f"io.k8s.apimachinery.pkg.apis.meta.v1.{k}": v for k, v in go_fields(meta).items()},
              **{f"io.k8s.api.core.v1.{k}": v for k, v in go_fields(core).items()}}
    expected = {}
    for name, raw in podspec_openapi.SCHEMAS.items():
        struct = fields.get(name.rsplit(".", 1)[0] + "." + GO_STRUCT.get(name.rsplit(".", 1)[1], name.rsplit(".", 1)[1]),
                            {})
        for prop in raw.get("properties") or {}:
            if struct.get(prop) in enums and (name, prop) not in LEFT_OUT:
                expected[(name, prop)] = struct[prop]
    assert set(expected) <= set(podtemplate.ENUMS), set(expected) - set(podtemplate.ENUMS)
    for key, values in podtemplate.ENUMS.items():
        go_type = expected.get(key) or fields[key[0]][key[1]]  # the selector operators: not marked +enum
        assert set(values) - {""} == constants[go_type] - {""}, key


# --- the note for a GPU job that tolerates no GPU taint --------------------------------------------


def notes_of(job_spec: dict[str, Any]) -> list[tuple[str, str]]:
    value, errors = validate.check_manifest(manifest(job_spec))
    assert errors == []
    return validate.notes(value)


GPU = {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 8}], "podLayout": "PerHost", "gpusPerProc": 1,
       "args": ["-m", "train"], "image": "img:1"}


@pytest.mark.parametrize("job_spec,asking", [
    (GPU, "spec.gpusPerProc 1"),
    ({**GPU, "gpusPerProc": 0, "template": {"spec": trainer(resources={"limits": {"nvidia.com/gpu": 8}})}},
     "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]"),
    ({**GPU, "template": {"spec": {"tolerations": [{"key": "example.com/spot", "operator": "Exists"}]}}},
     "spec.gpusPerProc 1"),
])
def test_a_gpu_job_that_tolerates_no_gpu_taint_gets_a_note(job_spec, asking):
    notes = notes_of(job_spec)
    assert [field for field, _ in notes] == ["spec.template.spec.tolerations"]
    message = notes[0][1]
    assert f"the pods request nvidia.com/gpu ({asking}) but tolerate no GPU taint" in message
    assert "{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}" in message


@pytest.mark.parametrize("job_spec", [
    {**GPU, "template": {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}},
    {**GPU, "template": {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}]}}},
    {**GPU, "template": {"spec": {"tolerations": [{"operator": "Exists"}]}}},  # every taint
    {**GPU, "gpusPerProc": 0},  # no GPU asked
    {**GPU, "gpusPerProc": 0, "template": {"spec": trainer(resources={"limits": {"nvidia.com/gpu": "0"}})}},
])
def test_no_note_where_the_pods_tolerate_the_gpu_taint_or_ask_for_no_gpu(job_spec):
    assert notes_of(job_spec) == []


def test_a_kueue_gpu_jobs_note_names_the_flavor_as_a_way_too():
    kueue = {**GPU, "scheduling": {"provider": "Kueue", "queue": "gpus"}}
    [(_, message)] = notes_of(kueue)
    assert "Kueue ResourceFlavor" in message
