"""Unit tests of the SPMDJob CRD file: shape, a description on every field, and the admission rules.

The CEL rules' logic is checked by evaluating them with cel-python when it is installed; the
end-to-end tests apply the same file to a real API server.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from monarch_spmd import spec as specmod
from spmd_operator import lifecycle, names

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "spmd.monarch.dev_spmdjobs.yaml"


@pytest.fixture(scope="module")
def crd():
    return yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def version(crd):
    [v] = crd["spec"]["versions"]
    return v


@pytest.fixture(scope="module")
def schema(version):
    return version["schema"]["openAPIV3Schema"]


def walk(node, path=""):
    """Yields (path, schema node) for every node of a structural schema."""
    yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{key}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def node_at(schema, path):
    return dict(walk(schema))[path]


def rules_at(schema, path):
    return [v["rule"] for v in node_at(schema, path).get("x-kubernetes-validations", [])]


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


def test_every_field_has_a_description_and_a_type(schema):
    # The root's metadata is the one exception: the API server forbids anything but its type.
    assert node_at(schema, ".metadata") == {"type": "object"}
    missing = [p or "<root>" for p, node in walk(schema) if p != ".metadata" and not node.get("description", "").strip()]
    assert not missing, f"fields without a description (kubectl explain shows nothing): {missing}"
    untyped = [p for p, node in walk(schema) if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields")]
    assert not untyped, f"a structural schema needs a type on every node: {untyped}"


def test_pod_template_spec_is_free_form(schema):
    node = node_at(schema, ".spec.template.spec")
    assert node["type"] == "object"
    assert node["x-kubernetes-preserve-unknown-fields"] is True
    # Nowhere else: unknown fields elsewhere are pruned, so typos do not pass silently.
    free = [p for p, n in walk(schema) if n.get("x-kubernetes-preserve-unknown-fields")]
    assert free == [".spec.template.spec"]


def test_required_fields(schema):
    assert schema["required"] == ["spec"]
    assert set(node_at(schema, ".spec")["required"]) == {"mesh", "args", "image"}
    assert set(node_at(schema, ".spec.mesh[]")["required"]) == {"name", "size"}


def test_defaults_match_the_spec_parser(schema):
    assert node_at(schema, ".spec.python")["default"] == specmod.DEFAULT_PYTHON
    assert node_at(schema, ".spec.masterPort")["default"] == specmod.DEFAULT_MASTER_PORT
    assert node_at(schema, ".spec.gpusPerProc")["default"] == 0
    assert node_at(schema, ".spec.colocate")["default"] is False
    assert node_at(schema, ".spec.suspend")["default"] is False
    assert node_at(schema, ".spec.restartPolicy")["default"] == {}
    assert node_at(schema, ".spec.restartPolicy.maxRestarts")["default"] == specmod.DEFAULT_MAX_RESTARTS
    assert node_at(schema, ".spec.rendezvousTimeoutSeconds")["default"] == specmod.DEFAULT_RENDEZVOUS_TIMEOUT


def test_dimension_names_are_dns_labels_short_enough_for_a_label_key(schema):
    node = node_at(schema, ".spec.mesh[].name")
    assert node["pattern"] == "^[a-z]([-a-z0-9]*[a-z0-9])?$"
    assert node["maxLength"] == specmod.MAX_DIM_NAME_LENGTH
    assert node_at(schema, ".spec.mesh")["maxItems"] == specmod.contract.MAX_DIMS


def test_status_phase_and_conditions_match_the_lifecycle(schema):
    assert node_at(schema, ".status.phase")["enum"] == list(lifecycle.PHASES)
    conditions = node_at(schema, ".status.conditions")
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(node_at(schema, ".status.conditions[]")["properties"]) >= {"type", "status", "reason", "message", "lastTransitionTime"}
    assert set(node_at(schema, ".status.failure")["properties"]) >= {"rank", "pod", "node", "exitCode", "reason", "message", "restart"}


# Each constraint: where its CEL rule sits and a fragment of that rule.
CONSTRAINTS = [
    ("", "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"),
    ("", "size(self.metadata.name) <= 50"),
    (".spec.mesh", "size(self) >= 1 && size(self) <= 4"),
    (".spec.mesh", "exists_one(e, e.name == d.name)"),
    (".spec.mesh", "<= 4096"),
    (".spec.mesh", "self == oldSelf"),
    (".spec.mesh[].size", "self >= 1"),
    (".spec.args", "size(self) >= 1"),
    (".spec.args", "self[0] == '-m' ? (size(self) >= 2"),
    (".spec.image", "size(self) > 0"),
    (".spec.python", "size(self) > 0"),
    (".spec.masterPort", "self >= 1 && self <= 65535"),
    (".spec.gpusPerProc", "self >= 0 && self <= 16"),
    (".spec.restartPolicy", "!self.permanentExitCodes.exists(c, c in self.retryableExitCodes)"),
    (".spec.restartPolicy.maxRestarts", "self >= 0 && self <= 100"),
    (".spec.restartPolicy.permanentExitCodes", "self.all(c, c >= 1 && c <= 255)"),
    (".spec.restartPolicy.retryableExitCodes", "self.all(c, c >= 1 && c <= 255)"),
    (".spec.rendezvousTimeoutSeconds", "self >= 1 && self <= 86400"),
    (".spec.activeDeadlineSeconds", "self >= 1"),
    (".spec.ttlSecondsAfterFinished", "self >= 0"),
]


@pytest.mark.parametrize(("path", "fragment"), CONSTRAINTS)
def test_cel_rule_present_for_each_constraint(schema, path, fragment):
    assert any(fragment in rule for rule in rules_at(schema, path)), f"no CEL rule at {path or '<root>'} with {fragment!r}"


def test_every_cel_rule_has_a_message_naming_its_field(schema):
    for path, node in walk(schema):
        for v in node.get("x-kubernetes-validations", []):
            field = "metadata.name" if path == "" else path.lstrip(".").split("[]")[0].split(".")[-1]
            assert field in v.get("message", ""), f"{path}: message {v.get('message')!r} does not name {field}"


def test_lists_and_strings_under_cel_rules_are_bounded(schema):
    """The API server refuses rules whose estimated cost is unbounded."""
    for path in (".spec.mesh", ".spec.restartPolicy.permanentExitCodes", ".spec.restartPolicy.retryableExitCodes",
                 ".spec.restartPolicy.permanentReasons", ".spec.args"):
        assert "maxItems" in node_at(schema, path), path
    for path in (".spec.mesh[].name", ".spec.image", ".spec.python"):
        assert "maxLength" in node_at(schema, path), path


# --- the rules' logic (needs cel-python) --------------------------------------------------------

VALID = {
    "apiVersion": "spmd.monarch.dev/v1alpha1",
    "kind": "SPMDJob",
    "metadata": {"name": "hello"},
    "spec": {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 4}], "args": ["-m", "train"], "image": "img",
             "restartPolicy": {"maxRestarts": 3, "permanentExitCodes": [2], "retryableExitCodes": [137]}},
}


def evaluate(schema, obj, old=None):
    """Runs every CEL rule of the schema over ``obj``; returns the messages of the rules that fail."""
    import celpy  # cel-python, in the test extra
    env = celpy.Environment()
    failed = []

    def visit(node, value, old_value, has_old):
        for v in node.get("x-kubernetes-validations", []):
            if "oldSelf" in v["rule"] and not has_old:
                continue
            act = {"self": celpy.json_to_cel(value)}
            if has_old:
                act["oldSelf"] = celpy.json_to_cel(old_value)
            try:
                ok = bool(env.program(env.compile(v["rule"])).evaluate(act))
            except Exception:  # an evaluation error rejects the object too
                ok = False
            if not ok:
                failed.append(v["message"])
        for key, child in (node.get("properties") or {}).items():
            if isinstance(value, dict) and key in value:
                old_child = old_value.get(key) if has_old and isinstance(old_value, dict) else None
                visit(child, value[key], old_child, has_old and isinstance(old_value, dict) and key in old_value)
        if "items" in node and isinstance(value, list):
            for item in value:
                visit(node["items"], item, None, False)

    visit(schema, obj, old, old is not None)
    return failed


def with_spec(**changes):
    obj = copy.deepcopy(VALID)
    obj["spec"].update(changes)
    return obj


def test_cel_accepts_a_valid_job(schema):
    assert evaluate(schema, VALID) == []
    assert evaluate(schema, VALID, old=VALID) == []


BAD = [
    ({"mesh": []}, "spec.mesh: needs 1 to 4"),
    ({"mesh": [{"name": f"d{i}", "size": 1} for i in range(5)]}, "spec.mesh: needs 1 to 4"),
    ({"mesh": [{"name": "a", "size": 0}]}, "spec.mesh[].size"),
    ({"mesh": [{"name": "a", "size": 1}, {"name": "a", "size": 2}]}, "must be unique"),
    ({"mesh": [{"name": "a", "size": 64}, {"name": "b", "size": 65}]}, "at most 4096"),
    ({"mesh": [{"name": "a", "size": 4097}]}, "spec.mesh[].size"),
    ({"args": []}, "spec.args must not be empty"),
    ({"args": ["-m"]}, "needs a module name"),
    ({"args": ["--lr", "1"]}, "needs a module name"),
    ({"image": "has space"}, "spec.image"),
    ({"masterPort": 0}, "spec.masterPort"),
    ({"masterPort": 65536}, "spec.masterPort"),
    ({"gpusPerProc": 17}, "spec.gpusPerProc"),
    ({"restartPolicy": {"maxRestarts": 101}}, "spec.restartPolicy.maxRestarts"),
    ({"restartPolicy": {"permanentExitCodes": [0]}}, "spec.restartPolicy.permanentExitCodes"),
    ({"restartPolicy": {"retryableExitCodes": [256]}}, "spec.restartPolicy.retryableExitCodes"),
    ({"restartPolicy": {"permanentExitCodes": [1, 2], "retryableExitCodes": [2]}}, "not be both"),
    ({"rendezvousTimeoutSeconds": 0}, "spec.rendezvousTimeoutSeconds"),
    ({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds"),
    ({"ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished"),
]


@pytest.mark.parametrize(("changes", "message"), BAD)
def test_cel_and_the_spec_parser_reject_the_same_input(schema, changes, message):
    obj = with_spec(**changes)
    failed = evaluate(schema, obj)
    assert any(message in m for m in failed), failed
    with pytest.raises(specmod.SpecError):
        specmod.parse_job_spec(obj["spec"])


@pytest.mark.parametrize("name", ["Hello", "1hello", "hello-", "a" * 51, "hello.world"])
def test_cel_rejects_bad_job_names(schema, name):
    obj = copy.deepcopy(VALID)
    obj["metadata"]["name"] = name
    assert any("metadata.name" in m for m in evaluate(schema, obj))
    with pytest.raises(specmod.SpecError):
        specmod.load_manifest(obj)


def test_cel_keeps_the_mesh_immutable(schema):
    changed = with_spec(mesh=[{"name": "hosts", "size": 4}, {"name": "gpus", "size": 4}])
    assert any("immutable" in m for m in evaluate(schema, changed, old=VALID))
    assert evaluate(schema, with_spec(args=["-m", "other"]), old=VALID) == []
