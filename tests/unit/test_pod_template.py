"""The pod template's schema: Kubernetes' PodTemplateSpec under ``spec.template``, generated, and
checked offline as the API server checks it.

The committed subset of Kubernetes' OpenAPI (monarch_spmd/podspec_openapi.py) must be what
``python -m monarch_spmd.podtemplate extract`` makes of the document in the Go module cache
(checked where that document is), and the CRD what the generator makes of it (test_crd.py, byte
for byte). A misspelled field anywhere under the template is refused by ``monarch-spmd validate``
naming its path (tests/e2e/test_refusals.py holds the API server to the same cases), while the
examples and the chart's test job still validate. The operator creates pods with field validation
Strict, and a strict refusal names the pod's field so that the job's can be found.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from aiohttp import web

from monarch_spmd import crd as crdmod
from monarch_spmd import podspec_openapi, podtemplate, schema, validate
from monarch_spmd import spec as specmod
from spmd_operator import kube
from tests.unit.localserver import LocalServer
from tests.unit.test_crd import walk

ROOT = Path(__file__).resolve().parents[2]
OPENAPI_IN_MODULE = "api/openapi-spec/v3/api__v1_openapi.json"


def kubernetes_openapi() -> Path:
    """Kubernetes' OpenAPI document of the version the CRD is made for, from Go's module cache
    (the real node's kubelet build puts the module there; Go's proxy serves it otherwise)."""
    module = f"k8s.io/kubernetes@{podspec_openapi.KUBERNETES_VERSION}"
    cached = Path(os.environ.get("GOMODCACHE") or Path.home() / "go" / "pkg" / "mod") / module / OPENAPI_IN_MODULE
    if cached.is_file():
        return cached
    done = subprocess.run(["go", "mod", "download", "-json", module], capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, f"go mod download {module}: {done.stderr or done.stdout}"
    return Path(json.loads(done.stdout)["Dir"]) / OPENAPI_IN_MODULE


def job(pod: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None, name: str = "typo") -> dict[str, Any]:
    """A valid SPMDJob whose template is ``pod`` (a PodSpec) and ``metadata``."""
    template: dict[str, Any] = {"spec": pod if pod is not None else {}}
    if metadata is not None:
        template["metadata"] = metadata
    return {"apiVersion": specmod.API_VERSION, "kind": specmod.KIND, "metadata": {"name": name},
            "spec": {"mesh": [{"name": "a", "size": 1}], "args": ["x.py"], "image": "img:1", "template": template}}


def trainer(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "trainer", **fields}]}


#: (name, manifest, the misspelled field's path): one misspelling at each level of the template.
#: tests/e2e/test_refusals.py applies the same manifests to the API server.
MISSPELLINGS: list[tuple[str, dict[str, Any], str]] = [
    ("container-field", job(trainer(resoures={"limits": {"cpu": "1"}})), "spec.template.spec.containers[0].resoures"),
    ("pod-field", job({"toleration": [{"key": "gpu", "operator": "Exists"}]}), "spec.template.spec.toleration"),
    ("volume-field", job({"volumes": [{"name": "data", "emtpyDir": {}}]}), "spec.template.spec.volumes[0].emtpyDir"),
    ("toleration-field", job({"tolerations": [{"key": "gpu", "opertor": "Exists"}]}), "spec.template.spec.tolerations[0].opertor"),
    ("resources-field", job(trainer(resources={"limts": {"cpu": "1"}})), "spec.template.spec.containers[0].resources.limts"),
    ("security-context-field", job(trainer(securityContext={"runAsNonroot": True})),
     "spec.template.spec.containers[0].securityContext.runAsNonroot"),
    ("env-field", job(trainer(env=[{"name": "A", "valu": "1"}])), "spec.template.spec.containers[0].env[0].valu"),
    ("volume-mount-field", job({"volumes": [{"name": "data", "emptyDir": {}}],
                                **trainer(volumeMounts=[{"name": "data", "mountPath": "/data", "readonly": True}])}),
     "spec.template.spec.containers[0].volumeMounts[0].readonly"),
    ("template-metadata", job(metadata={"label": {"team": "a"}}), "spec.template.metadata.label"),
    ("probe-field", job(trainer(livenessProbe={"exec": {"command": ["true"]}, "periodSecond": 5})),
     "spec.template.spec.containers[0].livenessProbe.periodSecond"),
]


def run_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    code = validate.main(["-f", str(path)])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("name,doc,path", MISSPELLINGS, ids=[m[0] for m in MISSPELLINGS])
def test_validate_refuses_a_misspelled_template_field_naming_its_path(tmp_path, capsys, name, doc, path):
    code, out = run_validate(tmp_path, capsys, doc)
    assert code == 1, out
    errors = [line for line in out.splitlines() if ": doc 1 (typo): " in line]
    assert len(errors) == 1, out  # the misspelling, and nothing else
    assert f": doc 1 (typo): {path}: unknown field" in errors[0], out
    print(errors[0].split(": doc 1 (typo): ", 1)[1])


def test_a_misspelling_gets_the_field_it_was_meant_as():
    _, errors = validate.check_manifest(MISSPELLINGS[0][1])
    assert [str(e) for e in errors] == [
        "spec.template.spec.containers[0].resoures: unknown field; did you mean resources? "
        "(spec.template.spec.containers[0] has 25 fields)"]


@pytest.mark.parametrize("pod,path,fragment", [
    ({"tolerations": {"key": "gpu"}}, "spec.template.spec.tolerations", "expected a list"),
    (trainer(ports=[{"containerPort": "http"}]), "spec.template.spec.containers[0].ports[0].containerPort", "expected an integer"),
    (trainer(livenessProbe={"httpGet": {"port": 1.5}}), "spec.template.spec.containers[0].livenessProbe.httpGet.port",
     "expected an integer or a string"),
    (trainer(stdin="yes"), "spec.template.spec.containers[0].stdin", "expected true or false"),
    ({"nodeSelector": {"zone": 5}}, "spec.template.spec.nodeSelector.zone", "expected a string"),
    ({"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}, "spec.template.spec.volumes[1]",
     "duplicate value"),
    ({"tolerations": [{"effect": "NoSchedule"}], "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone"}]},
     "spec.template.spec.topologySpreadConstraints[0].whenUnsatisfiable", "required"),
])
def test_validate_refuses_a_mistyped_template_value_naming_its_path(pod, path, fragment):
    _, errors = validate.check_manifest(job(pod))
    assert [e.field for e in errors] == [path], errors
    assert fragment in str(errors[0]), errors


@pytest.mark.parametrize("pod", [
    trainer(resources={"limits": {"cpu": 0.5, "memory": "1Gi"}, "requests": {"cpu": 1}}),
    trainer(livenessProbe={"httpGet": {"port": "http", "path": "/"}}, readinessProbe={"tcpSocket": {"port": 8080}}),
    trainer(ports=[{"containerPort": 80}, {"containerPort": 80, "protocol": "UDP"}]),
    {"containers": [{"image": "x2", "name": "side"}, {}], "nodeSelector": {"zone": "a"}, "affinity": {}},
    {"containers": [{"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}]},
])
def test_validate_takes_what_pods_take(pod):
    value, errors = validate.check_manifest(job(pod))
    assert errors == [], errors


def test_a_declared_kubernetes_default_is_filled_in_as_the_api_server_does():
    value, errors = validate.check_manifest(job(trainer(ports=[{"containerPort": 80}])))
    assert not errors
    assert value["spec"]["template"]["spec"]["containers"][0]["ports"] == [{"containerPort": 80, "protocol": "TCP"}]


def test_the_tables_own_template_rules_still_hold():
    _, errors = validate.check_manifest(job(trainer(image="other")))
    assert [e.field for e in errors] == ["spec.template.spec.containers[0].image"], errors
    _, errors = validate.check_manifest(job({"restartPolicy": "Always"}))
    assert [e.field for e in errors] == ["spec.template.spec.restartPolicy"], errors


def test_the_examples_validate(capsys):
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
    assert examples
    assert validate.main(examples) == 0, capsys.readouterr().out


def test_the_charts_test_job_validates(tmp_path, capsys):
    helm = Path(os.environ.get("MONARCH_SPMD_K8S_BIN", "/nonexistent")) / "helm"
    if not helm.exists():
        pytest.skip("no helm binary (MONARCH_SPMD_K8S_BIN)")
    rendered = subprocess.run([str(helm), "template", "t", str(ROOT / "helm" / "monarch-spmd"), "--show-only",
                               "templates/tests/spmdjob-test.yaml"], capture_output=True, text=True, check=True,
                              timeout=120).stdout
    [pod] = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") == "Pod"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    doc = json.loads(env["SPMD_TEST_JOB_MANIFEST"])
    doc["metadata"]["name"] = "chart-test"
    code, out = run_validate(tmp_path, capsys, doc)
    assert code == 0, out


# --- the generated schema ------------------------------------------------------------------------


def test_the_committed_openapi_subset_is_what_extract_makes_of_kubernetes_openapi():
    openapi = kubernetes_openapi()
    document = json.loads(openapi.read_text(encoding="utf-8"))
    text = podtemplate.render_subset(document, podspec_openapi.KUBERNETES_VERSION, podspec_openapi.SOURCE)
    assert text == (ROOT / "monarch_spmd" / "podspec_openapi.py").read_text(encoding="utf-8"), (
        "monarch_spmd/podspec_openapi.py differs from Kubernetes' OpenAPI: run bash scripts/gen-crd.sh --openapi "
        f"{openapi} {podspec_openapi.KUBERNETES_VERSION}")


def test_the_subset_is_the_closure_of_the_pod_template_spec():
    assert podspec_openapi.SOURCE.startswith(f"k8s.io/kubernetes@{podspec_openapi.KUBERNETES_VERSION} ")
    assert podtemplate.closure(podspec_openapi.SCHEMAS) == podspec_openapi.SCHEMAS
    assert {"io.k8s.api.core.v1.PodSpec", "io.k8s.api.core.v1.Container", "io.k8s.api.core.v1.Toleration"} <= set(
        podspec_openapi.SCHEMAS)


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    root = crdmod.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root["properties"]["spec"]["properties"]["template"]


def test_the_template_schema_is_structural(template):
    text = json.dumps(template)
    assert "$ref" not in text and "allOf" not in text and "oneOf" not in text
    for path, node in walk(template):
        assert not ("properties" in node and "additionalProperties" in node), path
        assert "type" in node or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields"), path
        if node.get("x-kubernetes-list-type") == "map":
            for key in node["x-kubernetes-list-map-keys"]:
                item = node["items"]
                assert key in item.get("required", []) or "default" in item["properties"][key], (path, key)
        if node.get("x-kubernetes-list-type") == "set":
            assert node["items"]["type"] in ("string", "integer", "number", "boolean"), path
        assert "default" not in node or node["default"] not in ({}, []), path


def test_only_free_form_values_keep_unknown_fields(template):
    free = sorted({p.split("{}")[0].rsplit(".", 1)[-1] for p, n in walk(template)
                   if n.get("x-kubernetes-preserve-unknown-fields")})
    # Resource quantities (strings or numbers: limits, requests, overhead, an emptyDir's sizeLimit,
    # a resourceFieldRef's divisor) and managedFields' fieldsV1 (an ephemeral volume's claim
    # template has a whole ObjectMeta); nothing else.
    assert free == ["divisor", "fieldsV1", "limits", "overhead", "requests", "sizeLimit"], free


def test_the_tables_declarations_are_laid_over_kubernetes_fields(template):
    pod = template["properties"]["spec"]
    containers = pod["properties"]["containers"]
    assert containers["maxItems"] == specmod.MAX_CONTAINERS and containers["x-kubernetes-validations"]
    # The trainer may be unnamed (the operator names it): no required name, so no map list either.
    assert "required" not in containers["items"] and "x-kubernetes-list-type" not in containers
    assert {"resources", "env", "volumeMounts", "livenessProbe", "securityContext"} <= set(containers["items"]["properties"])
    assert pod["properties"]["restartPolicy"]["x-kubernetes-validations"]
    assert set(template["properties"]["metadata"]["properties"]) == {"labels", "annotations"}
    port = containers["items"]["properties"]["livenessProbe"]["properties"]["httpGet"]["properties"]["port"]
    assert port["x-kubernetes-int-or-string"] is True
    assert pod["properties"]["volumes"]["x-kubernetes-list-map-keys"] == ["name"]


def test_overlaying_twice_changes_nothing():
    once = podtemplate.with_template(specmod.ROOT)
    assert podtemplate.with_template(once).openapi() == once.openapi()


def test_descriptions_are_shortened_to_a_sentence():
    assert podtemplate.short_description("Host name to connect to, defaults to the pod IP. You probably want "
                                         "to set \"Host\" in httpHeaders instead.") == \
        "Host name to connect to, defaults to the pod IP."
    assert len(podtemplate.short_description("word " * 100)) <= podtemplate.MAX_DESCRIPTION


def test_a_table_field_kubernetes_does_not_have_is_an_error():
    bad = schema.Obj(description="t", properties={"spec": schema.Obj(description="s", properties={
        "podFoo": schema.Str(description="x")})})
    with pytest.raises(ValueError, match="spec.template.spec.podFoo: not a field"):
        podtemplate.overlay(podtemplate.pod_template_spec(), bad)


# --- the operator: pods created with field validation Strict --------------------------------------


class PodServer(LocalServer):
    """Records the query of each create and refuses pods as a Strict API server refuses a typo."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[tuple[str, dict[str, str]]] = []
        self.app.router.add_post("/api/v1/namespaces/ns/{kind}", self.create)

    async def create(self, request: web.Request) -> web.Response:
        self.queries.append((request.match_info["kind"], dict(request.query)))
        body = await request.json()
        if request.match_info["kind"] == "pods" and request.query.get("fieldValidation") == "Strict" \
                and "resoures" in body["spec"]["containers"][0]:
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "BadRequest", "code": 400,
                                      "message": 'Pod in version "v1" cannot be handled as a Pod: strict decoding '
                                                 'error: unknown field "spec.containers[0].resoures"'}, status=400)
        return web.json_response(body, status=201)


def test_pods_are_created_with_strict_field_validation_and_a_refusal_names_the_field():
    async def go() -> tuple[list[Any], kube.KubeError]:
        server = PodServer()
        api = kube.Kube(kopf.ConnectionInfo(server=await server.start()), 2)
        try:
            pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "trainer", "image": "i"}]}}
            assert await api.create(kube.pods_url("ns"), pod, keep=False)
            assert await api.create(kube.services_url("ns"), {"metadata": {"name": "s"}}, keep=False)
            bad = copy.deepcopy(pod)
            bad["spec"]["containers"][0]["resoures"] = {}
            with pytest.raises(kube.KubeError) as info:
                await api.create(kube.pods_url("ns"), bad, keep=False)
            return server.queries, info.value
        finally:
            await api.close()
            await server.runner.cleanup()

    queries, error = asyncio.run(go())
    assert queries[:2] == [("pods", {"fieldValidation": "Strict"}), ("services", {})]
    assert error.status == 400
    assert "spec.containers[0].resoures: unknown field" in error.message, error.message


def test_strict_message_puts_each_path_before_a_colon():
    message = ('Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field '
               '"spec.containers[1].resoures", unknown field "spec.toleration"')
    assert kube.strict_message(message) == ('Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
                                            'spec.containers[1].resoures: unknown field, spec.toleration: unknown field')
    assert kube.strict_message('spec.x: Invalid value: "unknown field \\"a\\""') == 'spec.x: Invalid value: "unknown field \\"a\\""'


def test_every_pod_the_operator_builds_has_only_fields_the_pod_api_knows():
    """Pods go with field validation Strict: a field of the operator's own that the Pod API does
    not know would make every pod refused. Each example, in each layout and mode, builds pods whose
    every field is in Kubernetes' Pod schema."""
    from monarch_spmd import policy
    from spmd_operator import builders, names

    converter = podtemplate._Converter(podspec_openapi.SCHEMAS)
    pod_schema = schema.Obj(description="A Pod.", properties={
        "apiVersion": schema.Str(description="v1"), "kind": schema.Str(description="Pod"),
        "metadata": converter.named("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
        "spec": converter.named("io.k8s.api.core.v1.PodSpec")})
    ref = names.JobRef("job", "ns", "0123456789abcdef-0000-4000-8000-000000000000")
    variants = ({}, {"podLayout": "PerHost"}, {"podLayout": "PerHost", "mode": "Monarch", "args": None})
    built = 0
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != specmod.KIND:
                continue
            for variant in variants:
                changed = copy.deepcopy(doc)
                changed["spec"].update(variant)
                try:
                    parsed = specmod.load_manifest(changed, require_image=True)
                except specmod.SpecError:
                    continue
                last = policy.pods_per_attempt(parsed.spec) - 1
                for index, replacement in ((0, 0), (last, 1)):
                    pod = builders.build_pod(ref, parsed.spec, index, 0, replacement=replacement)
                    _, problems = schema.validate(pod_schema, pod, "")
                    unknown = [p for p in problems if p.message.startswith("unknown field") or p.blocking]
                    assert not unknown, (path.name, variant, unknown)
                    built += 1
    assert built >= 12


def test_the_crd_stays_well_under_what_the_api_server_stores():
    """etcd refuses a request over 1.5 MiB (its default --max-request-bytes): the CRD object, as
    JSON, must stay far below. Its compact JSON also still fits client-side apply's annotation
    (256 KiB for all annotations), though the docs install it with --server-side."""
    text = (ROOT / "crds" / "spmd.monarch.dev_spmdjobs.yaml").read_text(encoding="utf-8")
    compact = len(json.dumps(yaml.safe_load(text), separators=(",", ":")).encode())
    print(f"CRD: {len(text.encode())} bytes of YAML, {compact} bytes of compact JSON")
    assert compact < 262_144 < 1_572_864
