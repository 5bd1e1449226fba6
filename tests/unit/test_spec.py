"""Unit tests of monarch_spmd.spec: defaults, every validation error and its field path, manifests."""

from __future__ import annotations

import copy

import pytest

from monarch_spmd.payload import worker
from monarch_spmd.spec import (
    API_VERSION,
    KIND,
    JobSpec,
    Manifest,
    check_job_spec,
    MeshDim,
    SpecError,
    load_manifest,
    parse_job_spec,
)

MINIMAL = {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 4}], "args": ["-m", "train"]}


def spec_with(**changes):
    out = copy.deepcopy(MINIMAL)
    out.update(changes)
    return out


def trainer_template(**container):
    return {"spec": {"containers": [{"name": "trainer", **container}]}}


def test_minimal_spec_gets_the_documented_defaults():
    spec = parse_job_spec(MINIMAL)
    assert spec == JobSpec(mesh=(MeshDim("hosts", 2), MeshDim("gpus", 4)), args=("-m", "train"))
    assert (spec.python, spec.master_port, spec.gpus_per_proc, spec.colocate) == ("python3", 29500, 0, False)
    assert (spec.max_restarts, spec.permanent_exit_codes, spec.retryable_exit_codes) == (3, (), ())
    assert (spec.rendezvous_timeout_seconds, spec.active_deadline_seconds) == (300, None)
    assert (spec.ttl_seconds_after_finished, spec.suspend, spec.template) == (None, False, {})
    assert spec.world_size == 8
    assert spec.mesh_pairs == [("hosts", 2), ("gpus", 4)]


def test_full_spec_maps_every_camel_case_field():
    spec = parse_job_spec(
        spec_with(
            image="pytorch/pytorch:2.5.1",
            python="/usr/bin/python3",
            masterPort=1234,
            gpusPerProc=1,
            colocate=True,
            restartPolicy={
                "maxRestarts": 5,
                "permanentExitCodes": [2, 2, 3],
                "retryableExitCodes": [137],
                "permanentReasons": ["OOMKilled"],
            },
            rendezvousTimeoutSeconds=60,
            activeDeadlineSeconds=3600,
            ttlSecondsAfterFinished=0,
            suspend=True,
            template={"metadata": {"labels": {"team": "a"}}, "spec": {"nodeSelector": {"gpu": "h100"}}},
        ),
        require_image=True,
    )
    assert spec.image == "pytorch/pytorch:2.5.1"
    assert spec.python == "/usr/bin/python3"
    assert (spec.master_port, spec.gpus_per_proc, spec.colocate) == (1234, 1, True)
    assert spec.max_restarts == 5
    assert spec.permanent_exit_codes == (2, 3)
    assert spec.retryable_exit_codes == (137,)
    assert spec.permanent_reasons == ("OOMKilled",)
    assert (spec.rendezvous_timeout_seconds, spec.active_deadline_seconds) == (60, 3600)
    assert (spec.ttl_seconds_after_finished, spec.suspend) == (0, True)
    assert spec.template["spec"]["nodeSelector"] == {"gpu": "h100"}


def test_template_is_a_deep_copy():
    raw = spec_with(template={"spec": {"nodeSelector": {"a": "b"}}})
    spec = parse_job_spec(raw)
    raw["template"]["spec"]["nodeSelector"]["a"] = "changed"
    assert spec.template["spec"]["nodeSelector"] == {"a": "b"}


@pytest.mark.parametrize(
    ("changes", "field", "hint"),
    [
        ({"mesh": None}, "spec.mesh", "required"),
        ({"mesh": []}, "spec.mesh", "must not be empty; give the ordered dimensions"),
        ({"mesh": "hosts=2"}, "spec.mesh", "expected a list of 1 to 4 items"),
        ({"mesh": [{"name": f"d{i}", "size": 1} for i in range(5)]}, "spec.mesh", "has 5 items; expected a list of 1 to 4"),
        ({"mesh": [{"name": "a", "size": 0}]}, "spec.mesh[0].size", "an integer in 1..4096"),
        ({"mesh": [{"name": "a", "size": 1}, {"name": "b", "size": True}]}, "spec.mesh[1].size", "an integer in 1..4096"),
        ({"mesh": [{"name": "a", "size": 2.5}]}, "spec.mesh[0].size", "an integer"),
        ({"mesh": [{"name": "a", "size": "2"}]}, "spec.mesh[0].size", "an integer"),
        ({"mesh": [{"name": "a", "size": 2**63}]}, "spec.mesh[0].size", "an integer"),
        ({"mesh": [{"name": "a"}]}, "spec.mesh[0].size", "required"),
        ({"mesh": [{"name": "a", "size": 1}, {"name": "a", "size": 2}]}, "spec.mesh[1].name", "unique"),
        ({"mesh": [{"name": "Hosts", "size": 2}]}, "spec.mesh[0].name", "DNS label"),
        ({"mesh": [{"name": "a" * 58, "size": 2}]}, "spec.mesh[0].name", "at most 57"),
        ({"mesh": [{"name": "a", "size": 1, "extra": 1}]}, "spec.mesh[0].extra", "unknown field; spec.mesh[0] has name, size"),
        ({"mesh": [{"name": "a", "size": 64}, {"name": "b", "size": 65}]}, "spec.mesh", "at most 4096"),
        ({"args": None}, "spec.args", "required"),
        ({"args": []}, "spec.args", "must not be empty; give the training argv"),
        ({"args": ["-m"]}, "spec.args", "module name"),
        ({"args": ["-m", ""]}, "spec.args", "module name"),
        ({"args": ["--lr"]}, "spec.args", "'--lr' is not a script path"),
        ({"args": [""]}, "spec.args", "is not a script path"),
        ({"args": ["a"] * 4097}, "spec.args", "has 4097 items; expected a list of 1 to 4096 items"),
        ({"args": ["train.py", 3]}, "spec.args[1]", "expected a string (quote it in YAML)"),
        ({"image": ""}, "spec.image", "printable ASCII without spaces"),
        ({"image": "a b"}, "spec.image", "printable ASCII without spaces"),
        ({"image": "a\tb"}, "spec.image", "printable ASCII without spaces"),
        ({"image": "a" * 4097}, "spec.image", "at most 4096"),
        ({"python": 3}, "spec.python", "expected a string"),
        ({"python": "py thon"}, "spec.python", "no spaces"),
        ({"python": ""}, "spec.python", "no spaces"),
        ({"masterPort": 0}, "spec.masterPort", "1..65535"),
        ({"masterPort": 65536}, "spec.masterPort", "1..65535"),
        ({"masterPort": "29500"}, "spec.masterPort", "1..65535"),
        ({"gpusPerProc": -1}, "spec.gpusPerProc", "0..16"),
        ({"gpusPerProc": 17}, "spec.gpusPerProc", "0..16"),
        ({"colocate": "yes"}, "spec.colocate", "true or false"),
        ({"suspend": 1}, "spec.suspend", "true or false"),
        ({"rendezvousTimeoutSeconds": 0}, "spec.rendezvousTimeoutSeconds", "1..86400"),
        ({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", "at least 1"),
        ({"ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished", "at least 0"),
        ({"restartPolicy": {"maxRestarts": 101}}, "spec.restartPolicy.maxRestarts", "0..100"),
        ({"restartPolicy": {"maxRestarts": -1}}, "spec.restartPolicy.maxRestarts", "0..100"),
        ({"restartPolicy": {"permanentExitCodes": [0]}}, "spec.restartPolicy.permanentExitCodes[0]", "1..255"),
        ({"restartPolicy": {"retryableExitCodes": [1, 256]}}, "spec.restartPolicy.retryableExitCodes[1]", "1..255"),
        (
            {"restartPolicy": {"permanentExitCodes": [1, 2], "retryableExitCodes": [2]}},
            "spec.restartPolicy.retryableExitCodes",
            "[2] also in permanentExitCodes",
        ),
        ({"restartPolicy": {"permanentReasons": [""]}}, "spec.restartPolicy.permanentReasons[0]", "of 1 to 128 characters"),
        ({"restartPolicy": {"permanentReasons": ["OOM Killed"]}}, "spec.restartPolicy.permanentReasons[0]", "OOMKilled"),
        ({"restartPolicy": {"permanentReasons": ["x" * 129]}}, "spec.restartPolicy.permanentReasons[0]", "of 1 to 128 characters"),
        ({"restartPolicy": {"permanentReasons": ["Evicted"] * 33}}, "spec.restartPolicy.permanentReasons", "at most 32"),
        ({"restartPolicy": {"podReplacementPolicy": "failed"}}, "spec.restartPolicy.podReplacementPolicy", "one of Failed, TerminatingOrFailed"),
        ({"restartPolicy": {"replacementTimeoutSeconds": 0}}, "spec.restartPolicy.replacementTimeoutSeconds", "1..86400"),
        ({"restartPolicy": {"replacementTimeoutSeconds": 86401}}, "spec.restartPolicy.replacementTimeoutSeconds", "1..86400"),
        ({"restartPolicy": {"backoffLimit": 3}}, "spec.restartPolicy.backoffLimit", "unknown field"),
        ({"xyzzy": 3}, "spec.xyzzy", "unknown field; spec has mesh, args"),
        ({"template": {"spec": {"restartPolicy": "OnFailure"}}}, "spec.template.spec.restartPolicy", "Never"),
        ({"template": {"kind": "Pod"}}, "spec.template.kind", "unknown field; spec.template has metadata, spec"),
        ({"template": {"metadata": {"name": "x"}}}, "spec.template.metadata.name", "has labels, annotations"),
        ({"template": {"metadata": {"labels": {"a": 1}}}}, "spec.template.metadata.labels.a", "quote it in YAML"),
        ({"template": trainer_template(image="other")}, "spec.template.spec.containers[0].image", "spec.image"),
        ({"template": trainer_template(command=["sh"])}, "spec.template.spec.containers[0].command", "spec.python"),
        ({"template": trainer_template(args=["x"])}, "spec.template.spec.containers[0].args", "spec.args"),
        (
            {"template": trainer_template(env=[{"name": worker.MESH_VAR, "value": "a=1"}])},
            "spec.template.spec.containers[0].env[0].name",
            "set by the operator",
        ),
        (
            {"template": {"spec": {"containers": [{"name": "trainer"}, {"name": "trainer"}]}}},
            "spec.template.spec.containers[1]",
            "a second trainer container",
        ),
    ],
)
def test_invalid_specs_name_the_field_and_what_is_valid(changes, field, hint):
    with pytest.raises(SpecError) as info:
        parse_job_spec(spec_with(**changes))
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert hint in str(info.value)
    assert isinstance(info.value, ValueError)


def test_image_is_required_only_for_the_cluster():
    assert parse_job_spec(MINIMAL).image is None
    with pytest.raises(SpecError) as info:
        parse_job_spec(MINIMAL, require_image=True)
    assert info.value.field == "spec.image"


def test_user_may_override_role_name_and_local_rank_scope():
    env = [{"name": worker.ROLE_NAME_VAR, "value": "rank"}, {"name": worker.LOCAL_RANK_SCOPE_VAR, "value": "pod"}]
    spec = parse_job_spec(spec_with(template=trainer_template(env=env)))
    assert spec.template["spec"]["containers"][0]["env"] == env


def test_sidecars_may_set_anything():
    sidecar = {"name": "log-shipper", "image": "busybox", "command": ["sh"], "env": [{"name": worker.MESH_VAR, "value": "x"}]}
    spec = parse_job_spec(spec_with(template={"spec": {"containers": [sidecar]}}))
    assert spec.template["spec"]["containers"] == [sidecar]


def manifest(**metadata):
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "hello", **metadata}, "spec": dict(MINIMAL)}


def test_load_manifest_returns_name_namespace_and_spec():
    assert load_manifest(manifest()) == Manifest("hello", "default", parse_job_spec(MINIMAL))
    assert load_manifest(manifest(namespace="team-a")).namespace == "team-a"
    name, namespace, spec = load_manifest(manifest())
    assert (name, namespace, spec.world_size) == ("hello", "default", 8)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({**manifest(), "apiVersion": "v1"}, "apiVersion"),
        ({**manifest(), "kind": "Job"}, "kind"),
        (manifest(name=None), "metadata.name"),
        (manifest(name="Hello"), "metadata.name"),
        (manifest(name="1hello"), "metadata.name"),
        (manifest(name="hello-"), "metadata.name"),
        (manifest(name="a" * 51), "metadata.name"),
        (manifest(namespace="Team_A"), "metadata.namespace"),
        ({**manifest(), "spec": None}, "spec"),
        ([1, 2], "manifest"),
    ],
)
def test_load_manifest_rejects_bad_documents(doc, field):
    with pytest.raises(SpecError) as info:
        load_manifest(doc)
    assert info.value.field == field


def test_longest_valid_job_name_is_accepted():
    assert load_manifest(manifest(name="a" * 50)).name == "a" * 50


# --- what the table adds: new fields, the API server's treatment of values ----------------------


def test_pod_replacement_fields_have_their_defaults_and_parse():
    spec = parse_job_spec(MINIMAL)
    assert (spec.pod_replacement_policy, spec.replacement_timeout_seconds) == ("Failed", 120)
    spec = parse_job_spec(spec_with(restartPolicy={"podReplacementPolicy": "TerminatingOrFailed",
                                                   "replacementTimeoutSeconds": 5}))
    assert (spec.pod_replacement_policy, spec.replacement_timeout_seconds) == ("TerminatingOrFailed", 5)
    assert spec.max_restarts == 3  # the other defaults of restartPolicy still apply


def test_restart_in_place_fields_have_the_agents_defaults_and_parse():
    from monarch_spmd.payload import rendezvous

    spec = parse_job_spec(MINIMAL)
    assert (spec.restart_mode, spec.progress_timeout_seconds, spec.failure_output) == ("InPlace", None, "Tail")
    assert (spec.backoff_seconds, spec.max_backoff_seconds, spec.backoff_reset_seconds, spec.join_timeout_seconds) == (
        rendezvous.DEFAULT_BACKOFF, rendezvous.DEFAULT_MAX_BACKOFF, rendezvous.DEFAULT_BACKOFF_RESET,
        rendezvous.DEFAULT_JOIN_TIMEOUT)
    spec = parse_job_spec(spec_with(failureOutput="None", restartPolicy={
        "mode": "RecreatePods", "progressTimeoutSeconds": 600, "backoffSeconds": 0, "maxBackoffSeconds": 60,
        "backoffResetSeconds": 30, "joinTimeoutSeconds": 900}))
    assert (spec.restart_mode, spec.progress_timeout_seconds, spec.failure_output) == ("RecreatePods", 600, "None")
    assert (spec.backoff_seconds, spec.max_backoff_seconds, spec.backoff_reset_seconds, spec.join_timeout_seconds) == (
        0, 60, 30, 900)


@pytest.mark.parametrize(("changes", "field", "hint"), [
    ({"restartPolicy": {"mode": "inPlace"}}, "spec.restartPolicy.mode", "one of InPlace, RecreatePods"),
    ({"restartPolicy": {"progressTimeoutSeconds": 0}}, "spec.restartPolicy.progressTimeoutSeconds", "1..604800"),
    ({"restartPolicy": {"backoffSeconds": -1}}, "spec.restartPolicy.backoffSeconds", "0..86400"),
    ({"restartPolicy": {"maxBackoffSeconds": 86401}}, "spec.restartPolicy.maxBackoffSeconds", "0..86400"),
    ({"restartPolicy": {"backoffResetSeconds": -5}}, "spec.restartPolicy.backoffResetSeconds", "0..86400"),
    ({"restartPolicy": {"joinTimeoutSeconds": 0}}, "spec.restartPolicy.joinTimeoutSeconds", "1..86400"),
    ({"failureOutput": "none"}, "spec.failureOutput", "one of Tail, None"),
])
def test_restart_in_place_fields_refuse_bad_values_naming_the_field(changes, field, hint):
    with pytest.raises(SpecError) as info:
        parse_job_spec(spec_with(**changes))
    assert info.value.field == field and hint in str(info.value), str(info.value)


def test_whole_floats_are_integers_as_kubectl_sends_them():
    spec = parse_job_spec(spec_with(masterPort=1234.0, mesh=[{"name": "a", "size": 2.0}]))
    assert spec.master_port == 1234 and type(spec.master_port) is int
    assert spec.mesh == (MeshDim("a", 2),) and type(spec.mesh[0].size) is int
    with pytest.raises(SpecError) as info:
        parse_job_spec(spec_with(masterPort=1e21))
    assert info.value.field == "spec.masterPort"


def test_null_is_absent_and_takes_the_default():
    spec = parse_job_spec(spec_with(python=None, restartPolicy=None, masterPort=None, template=None))
    assert (spec.python, spec.max_restarts, spec.master_port, spec.template) == ("python3", 3, 29500, {})
    with pytest.raises(SpecError) as info:
        parse_job_spec(spec_with(image=None), require_image=True)
    assert info.value.field == "spec.image" and "required" in str(info.value)
    # A null label is dropped, as the API server drops it.
    spec = parse_job_spec(spec_with(template={"metadata": {"labels": {"a": None, "b": "c"}}}))
    assert spec.template == {"metadata": {"labels": {"b": "c"}}}


def test_the_former_drifts_between_the_crd_and_the_parser_are_gone():
    # Each was accepted by one side and refused by the other.
    for changes, field in [({"python": "python 3"}, "spec.python"), ({"image": "img\tlatest"}, "spec.image"),
                           ({"restartPolicy": {"permanentReasons": ["x"] * 33}}, "spec.restartPolicy.permanentReasons"),
                           ({"args": ["x"] * 4097}, "spec.args")]:
        with pytest.raises(SpecError) as info:
            parse_job_spec(spec_with(**changes))
        assert info.value.field == field


def test_check_job_spec_reports_every_error():
    _, errors = check_job_spec(spec_with(masterPort=0, gpusPerProc=99, colour="red"))
    assert [e.field for e in errors] == ["spec.colour", "spec.masterPort", "spec.gpusPerProc"]


def test_rules_are_skipped_after_a_type_error_as_the_api_server_does():
    # The product rule would fail, but a size of the wrong type stops every CEL rule.
    _, errors = check_job_spec(spec_with(mesh=[{"name": "a", "size": 4096}, {"name": "b", "size": "2"}]))
    assert [e.field for e in errors] == ["spec.mesh[1].size"]


def test_template_limits_and_sidecars():
    many = [{"name": f"s{i}"} for i in range(65)]
    with pytest.raises(SpecError) as info:
        parse_job_spec(spec_with(template={"spec": {"containers": many}}))
    assert info.value.field == "spec.template.spec.containers" and "at most 64" in str(info.value)
    env = [{"name": f"V{i}"} for i in range(1025)]
    with pytest.raises(SpecError) as info:
        parse_job_spec(spec_with(template=trainer_template(env=env)))
    assert info.value.field == "spec.template.spec.containers[0].env"
    # A container name is a DNS-1123 label, as a pod's: an empty one is refused up front.
    with pytest.raises(SpecError) as info:
        parse_job_spec(spec_with(template={"spec": {"containers": [{"name": "", "image": "x"}, {"name": "trainer"}]}}))
    assert info.value.field == "spec.template.spec.containers[0].name"
    # A null image is no image.
    assert parse_job_spec(spec_with(template=trainer_template(image=None))).template == {"spec": {"containers": [{"name": "trainer"}]}}


def test_manifest_metadata_is_checked_as_kubernetes_does():
    assert load_manifest(manifest(labels={"app.kubernetes.io/name": "x", "a": ""})).name == "hello"
    for metadata, field in [({"labels": {"a b": "x"}}, "metadata.labels"), ({"labels": {"a": "b c"}}, "metadata.labels.a"),
                            ({"labels": {"a": 1}}, "metadata.labels.a"), ({"colour": "red"}, "metadata.colour"),
                            ({"annotations": {"x/y/z": "a"}}, "metadata.annotations")]:
        with pytest.raises(SpecError) as info:
            load_manifest(manifest(**metadata))
        assert info.value.field == field


def test_generate_name_gives_a_name_the_rule_then_checks():
    doc = manifest()
    doc["metadata"] = {"generateName": "train-"}
    name = load_manifest(doc).name
    assert name.startswith("train-") and len(name) == len("train-") + 5
    doc["metadata"] = {"generateName": "a" * 46}
    with pytest.raises(SpecError) as info:
        load_manifest(doc)
    assert info.value.field == "metadata.name"


def test_status_is_ignored_on_create_but_its_fields_must_exist():
    doc = manifest()
    doc["status"] = {"phase": "Bogus"}
    load_manifest(doc)
    doc["status"] = {"colour": 1}
    with pytest.raises(SpecError) as info:
        load_manifest(doc)
    assert info.value.field == "status.colour"


def test_unknown_top_level_field_and_wrong_envelope():
    with pytest.raises(SpecError) as info:
        load_manifest({**manifest(), "specs": {}})
    assert info.value.field == "specs"


def test_the_table_and_its_toolkit_need_only_the_standard_library():
    import ast
    import sys
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "monarch_spmd"
    for name in ("spec.py", "schema.py"):
        for node in ast.walk(ast.parse((package / name).read_text())):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            for top in tops:
                assert top in sys.stdlib_module_names or top == "__future__", f"{name} imports {top}"


def test_pod_problems_name_every_quantity_no_pod_could_hold():
    from monarch_spmd.spec import pod_problems

    template = {"spec": {
        "containers": [{"name": "trainer", "resources": {"limits": {"memory": "2 Gi", "cpu": 0.5, "nvidia.com/gpu": 1},
                                                         "requests": {"cpu": " 250m ", "memory": True}}}],
        "initContainers": [{"name": "fetch", "resources": {"requests": {"ephemeral-storage": "1Xi"}}}],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1e3"}}, {"name": "s2", "emptyDir": {"sizeLimit": "lots"}}],
    }}
    problems = pod_problems({"template": template})
    assert [p.field for p in problems] == [
        "spec.template.spec.initContainers[0].resources.requests[ephemeral-storage]",
        "spec.template.spec.containers[0].resources.limits.memory",
        "spec.template.spec.containers[0].resources.requests.memory",
        "spec.template.spec.volumes[1].emptyDir.sizeLimit",
    ]
    assert "'2 Gi' is not a resource quantity" in str(problems[1])
    assert pod_problems({"template": {"spec": {"containers": [{"resources": {"limits": {"cpu": "1"}}}]}}}) == []
    assert pod_problems({}) == []
