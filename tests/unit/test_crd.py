"""Unit tests of the SPMDJob CRD: generated from the table, its shape, and its CEL rules' logic.

The committed file must be what ``monarch_spmd.crd`` generates from the table in
``monarch_spmd.spec``. Every CEL rule is evaluated with cel-python on many values and must agree
with the Python check of the same rule object; a CEL evaluation error fails the test (a rule that
errors refuses every object it sees, which is a bug, not a rejection). The real API server holds
the whole table to the same standard in tests/e2e/test_spec_parity.py.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from monarch_spmd import crd as crdmod
from monarch_spmd import schema
from monarch_spmd import spec as specmod
from monarch_spmd.payload import names

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "spmd.monarch.dev_spmdjobs.yaml"


@pytest.fixture(scope="module")
def crd():
    return yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def version(crd):
    [v] = crd["spec"]["versions"]
    return v


@pytest.fixture(scope="module")
def openapi(version):
    return version["schema"]["openAPIV3Schema"]


def walk(node, path=""):
    """Yields (path, schema node) for every node of a structural schema (a dict)."""
    yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{key}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def node_at(openapi, path):
    return dict(walk(openapi))[path]


# --- generated, not edited ---------------------------------------------------------------------


def test_committed_crd_is_what_the_table_generates():
    assert CRD_PATH.read_text(encoding="utf-8") == crdmod.render(), (
        "crds/spmd.monarch.dev_spmdjobs.yaml differs from the table in monarch_spmd/spec.py: "
        "run bash scripts/gen-crd.sh (and commit both copies)")


def test_generated_yaml_reads_back_as_the_table(crd):
    assert crd == crdmod.crd()
    assert crdmod.render().startswith("# GENERATED from the SPMDJob table in monarch_spmd/spec.py")


def test_generator_check_mode(tmp_path, capsys):
    assert crdmod.main(["--check", str(CRD_PATH)]) == 0
    stale = tmp_path / "stale.yaml"
    stale.write_text(CRD_PATH.read_text().replace("maxItems: 4\n", "maxItems: 5\n", 1))
    assert crdmod.main(["--check", str(stale)]) == 1
    assert "gen-crd.sh" in capsys.readouterr().err


# --- shape -------------------------------------------------------------------------------------


def test_names_scope_and_version(crd, version):
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{names.PLURAL}.{names.GROUP}"
    assert crd["spec"]["group"] == names.GROUP
    assert crd["spec"]["scope"] == "Namespaced"
    n = crd["spec"]["names"]
    assert (n["kind"], n["plural"], n["singular"]) == (names.KIND, names.PLURAL, "spmdjob")
    assert set(n["shortNames"]) == {"spmd", "sj"}
    assert version["name"] == names.VERSION
    assert version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_printer_columns(version):
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Mesh"]["jsonPath"] == ".status.mesh"
    assert columns["Procs"]["jsonPath"] == ".status.procs"
    assert columns["Phase"]["jsonPath"] == ".status.phase"
    assert columns["Restarts"]["jsonPath"] == ".status.restarts"
    assert (columns["Age"]["jsonPath"], columns["Age"]["type"]) == (".metadata.creationTimestamp", "date")
    for c in version["additionalPrinterColumns"]:
        assert c.get("description"), c["name"]


def test_every_field_has_a_description_and_a_type(openapi):
    # The root's metadata is the one exception: the API server forbids anything but its type.
    assert node_at(openapi, ".metadata") == {"type": "object"}
    # Kubernetes' PodTemplateSpec (under .spec.template) describes no list item or map value.
    missing = [p or "<root>" for p, node in walk(openapi) if p != ".metadata" and not node.get("description", "").strip()
               and not (p.startswith(".spec.template.") and p.endswith(("[]", "{}")))]
    assert not missing, f"fields without a description (kubectl explain shows nothing): {missing}"
    # A structural schema needs a type on every node but an int-or-string and a free-form value.
    untyped = [p for p, node in walk(openapi) if "type" not in node and not node.get("x-kubernetes-int-or-string")
               and not node.get("x-kubernetes-preserve-unknown-fields")]
    assert not untyped, f"a structural schema needs a type on every node: {untyped}"


def test_only_free_form_pod_template_values_keep_unknown_fields(openapi):
    free = [p for p, n in walk(openapi) if n.get("x-kubernetes-preserve-unknown-fields")]
    # Under Kubernetes' PodTemplateSpec: resource quantities (a string or a number) and
    # managedFields' fieldsV1 (tests/unit/test_pod_template.py); nothing else anywhere.
    assert free and all(p.startswith(".spec.template.spec.") for p in free), free
    assert {p.rsplit(".", 1)[-1].split("{")[0] for p in free} == {"divisor", "fieldsV1", "limits", "overhead", "requests",
                                                                  "sizeLimit"}
    declared = node_at(openapi, ".spec.template.spec.containers[]")["properties"]
    assert {"name", "image", "command", "args", "env", "resources", "volumeMounts"} <= set(declared)


def test_required_fields(openapi):
    assert openapi["required"] == ["spec"]
    # args: required by a rule on spec instead (mode Program needs it, mode Monarch refuses it)
    assert set(node_at(openapi, ".spec")["required"]) == {"mesh", "image"}
    assert [r["fieldPath"] for r in node_at(openapi, ".spec")["x-kubernetes-validations"]] == \
        [".args", ".podLayout", ".spares", ".mesh", ".restartPolicy.elasticWaitSeconds", ".replicaGroups",
         ".replicaGroups.managerPort", *(f".{k}" for k in specmod.POD_SHAPING_FIELDS)]
    assert set(node_at(openapi, ".spec.mesh[]")["required"]) == {"name", "size"}


def test_defaults_are_the_module_constants(openapi):
    assert node_at(openapi, ".spec.python")["default"] == specmod.DEFAULT_PYTHON
    assert node_at(openapi, ".spec.masterPort")["default"] == specmod.DEFAULT_MASTER_PORT
    assert node_at(openapi, ".spec.gpusPerProc")["default"] == 0
    assert node_at(openapi, ".spec.colocate")["default"] is False
    assert node_at(openapi, ".spec.suspend")["default"] is False
    assert node_at(openapi, ".spec.restartPolicy")["default"] == {}
    assert node_at(openapi, ".spec.restartPolicy.maxRestarts")["default"] == specmod.DEFAULT_MAX_RESTARTS
    assert node_at(openapi, ".spec.restartPolicy.podReplacementPolicy")["default"] == specmod.DEFAULT_POD_REPLACEMENT_POLICY
    assert node_at(openapi, ".spec.restartPolicy.podReplacementPolicy")["enum"] == ["Failed", "TerminatingOrFailed"]
    assert node_at(openapi, ".spec.restartPolicy.replacementTimeoutSeconds")["default"] == specmod.DEFAULT_REPLACEMENT_TIMEOUT
    assert node_at(openapi, ".spec.rendezvousTimeoutSeconds")["default"] == specmod.DEFAULT_RENDEZVOUS_TIMEOUT


def test_bounds(openapi):
    assert node_at(openapi, ".spec.mesh")["maxItems"] == specmod.contract.MAX_DIMS
    assert node_at(openapi, ".spec.mesh[].name")["maxLength"] == specmod.MAX_DIM_NAME_LENGTH
    assert (node_at(openapi, ".spec.masterPort")["minimum"], node_at(openapi, ".spec.masterPort")["maximum"]) == (1, 65535)
    assert node_at(openapi, ".spec.restartPolicy.replacementTimeoutSeconds")["maximum"] == 86400
    assert node_at(openapi, ".spec.restartPolicy.permanentReasons")["maxItems"] == 32
    assert node_at(openapi, ".spec.restartPolicy.permanentReasons[]")["maxLength"] == 128
    assert node_at(openapi, ".spec.args")["maxItems"] == 4096


def test_lists_and_strings_under_cel_rules_are_bounded(openapi):
    """The API server refuses rules whose estimated cost it cannot bound."""
    for path in (".spec.mesh", ".spec.restartPolicy.permanentExitCodes", ".spec.restartPolicy.retryableExitCodes",
                 ".spec.restartPolicy.permanentReasons", ".spec.args", ".spec.template.spec.containers",
                 ".spec.template.spec.containers[].env"):
        assert "maxItems" in node_at(openapi, path), path
    for path in (".spec.mesh[].name", ".spec.image", ".spec.python", ".spec.restartPolicy.permanentReasons[]",
                 ".spec.shmSize", ".spec.template.spec.containers[].name"):
        assert "maxLength" in node_at(openapi, path), path


def test_status_phase_and_conditions_match_the_operator(openapi):
    from spmd_operator import lifecycle

    assert node_at(openapi, ".status.phase")["enum"] == list(lifecycle.PHASES)
    conditions = node_at(openapi, ".status.conditions")
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(node_at(openapi, ".status.conditions[]")["properties"]) >= {"type", "status", "reason", "message", "lastTransitionTime"}
    assert set(node_at(openapi, ".status.failure")["properties"]) >= {"rank", "pod", "node", "exitCode", "reason", "message", "restart"}


def test_rule_messages_are_one_line_and_field_paths_point_at_declared_fields(openapi):
    for path, node in walk(openapi):
        for v in node.get("x-kubernetes-validations", []):
            assert v["message"] and "\n" not in v["message"], (path, v)
            if "fieldPath" in v:
                target = node
                for part in v["fieldPath"].lstrip(".").split("."):  # a nested path walks the objects
                    target = target.get("properties", {}).get(part)
                    assert target is not None, (path, v)


# --- the table and JobSpec ---------------------------------------------------------------------


def test_every_table_field_is_a_jobspec_attribute_and_back():
    fields = {f.name for f in dataclasses.fields(specmod.JobSpec)}
    value, errors = specmod.check_job_spec({"mesh": [{"name": "a", "size": 1}], "args": ["x.py"]})
    assert not errors
    assert set(specmod.attributes(specmod.SPEC, value)) == fields


def test_jobspec_defaults_are_the_table_defaults():
    parsed = specmod.parse_job_spec({"mesh": [{"name": "a", "size": 1}], "args": ["x.py"]})
    constructed = specmod.JobSpec(mesh=parsed.mesh, args=parsed.args)
    assert parsed == constructed


# --- the CEL rules' logic, with cel-python ------------------------------------------------------

VALID = {
    "apiVersion": "spmd.monarch.dev/v1alpha1",
    "kind": "SPMDJob",
    "metadata": {"name": "hello"},
    "spec": {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 4}], "args": ["-m", "train"], "image": "img",
             "restartPolicy": {"maxRestarts": 3, "permanentExitCodes": [2], "retryableExitCodes": [137]},
             "template": {"spec": {"containers": [{"name": "trainer", "env": [{"name": "MONARCH_SPMD_ROLE_NAME"}]},
                                                  {"name": "side", "image": "busybox", "env": [{"name": "MONARCH_SPMD_MESH"}]}]}}},
}


def kubernetes_cel_functions():
    """Kubernetes' CEL quantity library for cel-python (``isQuantity``, ``quantity``, ``compareTo``),
    on :mod:`monarch_spmd.quantity` (tests/e2e/test_spec_parity.py holds that to the API server)."""
    import celpy

    from monarch_spmd import quantity

    class Quantity:
        def __init__(self, text):
            value = quantity.parse(str(text))
            if value is None:
                raise ValueError(f"quantity({text!r}): not a quantity")
            self.value = value

    def compare(a, b):
        return celpy.celtypes.IntType((a.value > b.value) - (a.value < b.value))

    return {
        "isQuantity": lambda text: celpy.celtypes.BoolType(quantity.is_quantity(str(text))),
        "quantity": Quantity,
        "compareTo": compare,
        "isLessThan": lambda a, b: celpy.celtypes.BoolType(a.value < b.value),
        "isGreaterThan": lambda a, b: celpy.celtypes.BoolType(a.value > b.value),
    }


def cel_failures(obj: Any, old: Any = schema.MISSING, where: set[tuple[str, str]] | None = None) -> list[str]:
    """Runs every CEL rule of the CRD over ``obj`` (defaulted); returns the failing rules' messages
    (and adds ``(path, rule)`` of each to ``where``).

    An evaluation error fails the calling test. On an update (``old``) a rule that does not use
    ``oldSelf`` is skipped on a value that did not change, as the API server ratchets.
    """
    import celpy  # cel-python, in the test extra

    env = celpy.Environment()
    functions = kubernetes_cel_functions()
    openapi = crdmod.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    failed: list[str] = []

    def visit(node, value, old_value, path):
        for v in node.get("x-kubernetes-validations", []):
            transition = "oldSelf" in v["rule"]
            if transition and old_value is schema.MISSING:
                continue
            if not transition and old_value is not schema.MISSING and old_value == value:
                continue  # ratcheting
            act = {"self": celpy.json_to_cel(value)}
            if transition:
                act["oldSelf"] = celpy.json_to_cel(old_value)
            try:
                result = env.program(env.compile(v["rule"]), functions=functions).evaluate(act)
            except Exception as e:  # noqa: BLE001 - any error is the failure reported
                pytest.fail(f"CEL evaluation error at {path or '<root>'}: {v['rule']!r} on {value!r}: {e!r}")
            if isinstance(result, celpy.CELEvalError):
                pytest.fail(f"CEL evaluation error at {path or '<root>'}: {v['rule']!r} on {value!r}: {result!r}")
            if not bool(result):
                failed.append(v["message"])
                if where is not None:
                    where.add((path, v["rule"]))
        for key, child in (node.get("properties") or {}).items():
            if isinstance(value, dict) and key in value:
                old_child = old_value.get(key, schema.MISSING) if isinstance(old_value, dict) else schema.MISSING
                visit(child, value[key], old_child, f"{path}.{key}".lstrip("."))
        if isinstance(node.get("additionalProperties"), dict) and isinstance(value, dict):
            for key, item in value.items():
                old_item = old_value.get(key, schema.MISSING) if isinstance(old_value, dict) else schema.MISSING
                visit(node["additionalProperties"], item, old_item, f"{path}.{key}")
        if "items" in node and isinstance(value, list):
            for i, item in enumerate(value):
                old_item = old_value[i] if isinstance(old_value, list) and i < len(old_value) else schema.MISSING
                visit(node["items"], item, old_item, f"{path}[{i}]")

    visit(openapi, obj, old, "")
    return failed


def with_spec(**changes):
    obj = copy.deepcopy(VALID)
    obj["spec"].update(changes)
    return obj


def trainer(**fields):
    return {"spec": {"containers": [{"name": "trainer", **fields}]}}


# (changes to spec, a fragment of the CEL message that must fail; None: every rule passes)
CASES = [
    ({}, None),
    ({"mesh": [{"name": "a", "size": 1}, {"name": "a", "size": 2}]}, "must be unique"),
    ({"mesh": [{"name": "a", "size": 64}, {"name": "b", "size": 65}]}, "at most 4096"),
    ({"mesh": [{"name": "a", "size": 64}, {"name": "b", "size": 64}]}, None),
    ({"mesh": [{"name": "a", "size": 16}, {"name": "b", "size": 16}, {"name": "c", "size": 4}, {"name": "d", "size": 5}]}, "at most 4096"),
    # out of bounds (the schema says so): the product rule must still evaluate, and pass
    ({"mesh": [{"name": "a", "size": 2**62}, {"name": "b", "size": 2**62}]}, None),
    ({"mesh": [{"name": "a", "size": 0}]}, None),
    ({"mesh": []}, None),
    ({"mesh": [{"name": f"d{i}", "size": 4096} for i in range(5)]}, None),
    ({"mesh": [{"name": "Hosts", "size": 2}]}, "DNS label"),
    ({"mesh": [{"name": "a-", "size": 2}]}, "DNS label"),
    ({"args": []}, None),
    ({"args": ["-m"]}, "needs a module name"),
    ({"args": ["-m", ""]}, "needs a module name"),
    ({"args": ["-m", "-x"]}, None),
    ({"args": ["--lr", "1"]}, "script path"),
    ({"args": [""]}, "script path"),
    ({"args": ["train.py", "-m"]}, None),
    ({"image": "has space"}, "image reference"),
    ({"image": "tab\there"}, "image reference"),
    ({"image": "ünïcode"}, "image reference"),
    ({"image": ""}, "image reference"),
    ({"python": "py thon"}, "interpreter"),
    ({"python": "/usr/bin/python3"}, None),
    ({"python": "ü"}, None),
    ({"restartPolicy": {"permanentExitCodes": [1, 2], "retryableExitCodes": [2]}}, "not be both"),
    ({"restartPolicy": {"permanentExitCodes": [1, 2]}}, None),
    ({"restartPolicy": {"retryableExitCodes": [2]}}, None),
    ({"restartPolicy": {"permanentReasons": ["OOMKilled", "OutOfnvidia.com/gpu"]}}, None),
    ({"restartPolicy": {"permanentReasons": ["OOM Killed"]}}, "one word"),
    ({"restartPolicy": {"permanentReasons": [""]}}, "one word"),
    ({"template": trainer(image="x")}, "image is set by the operator"),
    ({"template": trainer(command=["x"])}, "command is set by the operator"),
    ({"template": trainer(args=["x"])}, "args is set by the operator"),
    ({"template": {"spec": {"containers": [{"image": "x"}]}}}, "image is set by the operator"),
    ({"template": {"spec": {"containers": [{"name": "", "image": "x"}]}}}, "DNS-1123 label"),
    ({"template": {"spec": {"containers": [{"name": "Side_1", "image": "x"}]}}}, "DNS-1123 label"),
    ({"template": {"spec": {"containers": [{"name": "side-1", "image": "x"}]}}}, None),
    # shmSize: a memory quantity within the documented range
    ({"shmSize": "16Gi"}, None),
    ({"shmSize": "1Mi"}, None),
    ({"shmSize": "1Ti"}, None),
    ({"shmSize": "0"}, "from 1Mi to 1Ti"),
    ({"shmSize": "0.0000001"}, "from 1Mi to 1Ti"),
    ({"shmSize": "1048575"}, "from 1Mi to 1Ti"),
    ({"shmSize": "1025Gi"}, "from 1Mi to 1Ti"),
    ({"shmSize": "99999999999Ei"}, "from 1Mi to 1Ti"),
    ({"shmSize": "2 Gi"}, "a memory quantity such as"),
    # reserved variables: the contract's and the pod's own, in the trainer only
    ({"template": trainer(env=[{"name": "RANK", "value": "3"}])}, "may not set the torchrun variables"),
    ({"template": trainer(env=[{"name": "MASTER_PORT", "value": "1"}])}, "may not set the torchrun variables"),
    ({"template": trainer(env=[{"name": "POD_IP", "value": "1.2.3.4"}])}, "may not set the torchrun variables"),
    ({"template": trainer(env=[{"name": "OMP_NUM_THREADS", "value": "4"},
                               {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "0"}])}, None),
    ({"template": {"spec": {"containers": [{"name": "side", "image": "b", "env": [{"name": "RANK"}]}]}}}, None),
]


@pytest.mark.parametrize(("changes", "fragment"), CASES)
def test_cel_rules_and_their_python_checks_agree(changes, fragment):
    obj, problems = schema.validate(specmod.ROOT, with_spec(**changes), reset=("status",))
    assert not any(p.blocking for p in problems), problems  # the cases keep every type right
    where: set[tuple[str, str]] = set()
    failed = cel_failures(obj, where=where)
    if fragment is None:
        assert failed == [], failed
    else:
        assert any(fragment in m for m in failed), failed
    # The same rules fail at the same places, in CEL and in Python.
    assert where == schema.failing_rules(specmod.ROOT, obj)


@pytest.mark.parametrize("name", ["Hello", "1hello", "hello-", "a" * 51, "hello.world"])
def test_cel_and_python_refuse_bad_job_names(name):
    obj = copy.deepcopy(VALID)
    obj["metadata"]["name"] = name
    assert any("metadata.name" in m for m in cel_failures(obj))
    with pytest.raises(specmod.SpecError) as info:
        specmod.load_manifest(obj)
    assert info.value.field == "metadata.name"


@pytest.mark.parametrize("key,value", [("masterPort", 29501), ("image", "other:2"), ("shmSize", "2Gi"),
                                       ("template", {"spec": {"nodeSelector": {"a": "b"}}}),
                                       ("scheduling", {"provider": "Volcano"}), ("args", ["-m", "other"])])
def test_pod_shaping_fields_change_only_while_suspended(key, value):
    stored, _ = schema.validate(specmod.ROOT, VALID, reset=("status",))
    changed = with_spec(**{key: value})
    failed = cel_failures(schema.validate(specmod.ROOT, changed, reset=("status",))[0], old=stored)
    assert any(f"spec.{key} shapes the pods" in m for m in failed), failed
    _, errors = specmod.check_manifest(changed, old=VALID)
    assert [e.field for e in errors] == [f"spec.{key}"]
    assert "suspend" in str(errors[0])
    # Suspended (before, or in the same update): allowed.
    suspended_old = copy.deepcopy(stored)
    suspended_old["spec"]["suspend"] = True
    new = schema.validate(specmod.ROOT, dict(changed, spec=dict(changed["spec"], suspend=True)), reset=("status",))[0]
    assert cel_failures(new, old=suspended_old) == []
    assert cel_failures(new, old=stored) == []
    assert specmod.check_manifest(new, old=suspended_old)[1] == []
    # The other fields change at any time.
    relaxed = with_spec(activeDeadlineSeconds=60, restartPolicy={"maxRestarts": 5})
    assert cel_failures(schema.validate(specmod.ROOT, relaxed, reset=("status",))[0], old=stored) == []
    assert specmod.check_manifest(relaxed, old=VALID)[1] == []


@pytest.mark.parametrize("field,value", [("mode", "RecreatePods"), ("progressTimeoutSeconds", 60),
                                         ("backoffSeconds", 0), ("maxBackoffSeconds", 60),
                                         ("backoffResetSeconds", 60), ("joinTimeoutSeconds", 600)])
def test_restart_fields_the_agents_act_on_change_only_while_suspended(field, value):
    """They reach the pods as env: a pod replaced alone must agree with the gang it joins."""
    stored, _ = schema.validate(specmod.ROOT, VALID, reset=("status",))
    changed = with_spec(restartPolicy={field: value})
    failed = cel_failures(schema.validate(specmod.ROOT, changed, reset=("status",))[0], old=stored)
    assert any(f"spec.restartPolicy.{field} shapes the pods" in m for m in failed), failed
    _, errors = specmod.check_manifest(changed, old=VALID)
    assert [e.field for e in errors] == [f"spec.restartPolicy.{field}"]
    suspended_old = copy.deepcopy(stored)
    suspended_old["spec"]["suspend"] = True
    new = schema.validate(specmod.ROOT, dict(changed, spec=dict(changed["spec"], suspend=True)), reset=("status",))[0]
    assert cel_failures(new, old=suspended_old) == []
    assert specmod.check_manifest(new, old=suspended_old)[1] == []
    # Stored before the field existed (no restartPolicy at all, or without the field): the
    # server's defaults fill both sides, so an unrelated update passes.
    bare = copy.deepcopy(VALID)
    bare["spec"].pop("restartPolicy", None)
    same = schema.validate(specmod.ROOT, with_spec(activeDeadlineSeconds=60), reset=("status",))[0]
    assert cel_failures(same, old=schema.validate(specmod.ROOT, bare, reset=("status",))[0]) == []


def test_failure_output_changes_only_while_suspended():
    stored, _ = schema.validate(specmod.ROOT, VALID, reset=("status",))
    changed = with_spec(failureOutput="None")
    failed = cel_failures(schema.validate(specmod.ROOT, changed, reset=("status",))[0], old=stored)
    assert any("spec.failureOutput shapes the pods" in m for m in failed), failed
    assert [e.field for e in specmod.check_manifest(changed, old=VALID)[1]] == ["spec.failureOutput"]


def test_an_unchanged_value_a_newer_rule_refuses_is_kept_on_update():
    """Ratcheting: a job stored before a rule may still be updated elsewhere (suspended, say)."""
    stored, _ = schema.validate(specmod.ROOT, with_spec(shmSize="0"), reset=("status",))
    update = copy.deepcopy(stored)
    update["spec"]["activeDeadlineSeconds"] = 600
    assert cel_failures(update, old=stored) == []
    assert specmod.check_manifest(update, old=stored)[1] == []
    assert [e.field for e in specmod.check_manifest(update)[1]] == ["spec.shmSize"], "refused on create"


def test_the_mesh_is_immutable():
    changed = with_spec(mesh=[{"name": "hosts", "size": 4}, {"name": "gpus", "size": 4}])
    assert any("immutable" in m for m in cel_failures(changed, old=VALID))
    assert cel_failures(with_spec(activeDeadlineSeconds=5), old=VALID) == []
    _, errors = specmod.check_manifest(changed, old=VALID)
    assert [e.field for e in errors] == ["spec.mesh"]
    suspended = with_spec(mesh=changed["spec"]["mesh"], suspend=True)
    _, errors = specmod.check_manifest(suspended, old=dict(VALID, spec=dict(VALID["spec"], suspend=True)))
    assert [e.field for e in errors] == ["spec.mesh"], "not even while suspended"
