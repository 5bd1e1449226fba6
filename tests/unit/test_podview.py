"""`monarch-spmd pods` and `manifest --pods`: the pods shown are the operator's own (its pod
builder), a GPU job's carry the nvidia.com/gpu limit and the GPU toleration, each pod's procs get
the torchrun contract's variables, and a server's refusal names the pod's field and the job's."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import yaml

from monarch_spmd import cli, podview, policy, spec, torchrun
from monarch_spmd.payload import contract, names
from spmd_operator import builders
from spmd_operator import names as operator_names


def gpu_job(*, nnodes: int = 2, nproc: int = 4, namespace: str | None = None) -> dict:
    """The SPMDJob `monarch-spmd manifest --gpus-per-proc 1` prints for a torchrun line."""
    plan = torchrun.plan(torchrun.parse(["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
                                         "--max-restarts", "2", "-m", "train"]), torchrun.CLUSTER)
    return torchrun.manifest(plan, name="train", image="registry.example/train:1", namespace=namespace,
                             gpus_per_proc=1, cpu="32", memory="256Gi", shm_size="64Gi")


def hello_job() -> dict:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": "hello"},
            "spec": {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 2}], "image": "python:3.11",
                     "args": ["-m", "hello"]}}


def test_the_pods_are_those_the_operators_builder_makes():
    doc = gpu_job()
    pods = podview.build(doc, namespace="ml")
    parsed = spec.load_manifest(doc, require_image=True).spec
    job = operator_names.JobRef("train", "ml", podview.PLACEHOLDER_UID)
    assert len(pods.pods) == policy.pods_per_attempt(parsed) == 2
    for view in pods.pods:
        assert view.pod == builders.build_pod(job, parsed, view.index, 0, token=podview.PLACEHOLDER_TOKEN)


def test_a_gpu_job_shows_the_gpu_limit_the_toleration_the_shm_and_the_worker_volume():
    pods = podview.build(gpu_job(nproc=4))
    for view in pods.pods:
        trainer = podview.trainer(view.pod)
        assert trainer["resources"]["limits"] == {"memory": "256Gi", "nvidia.com/gpu": "4"}  # gpusPerProc x procs
        assert trainer["resources"]["requests"] == {"cpu": "32", "memory": "256Gi"}
        assert torchrun.GPU_TOLERATION in view.pod["spec"]["tolerations"]
        volumes = {v["name"]: v for v in view.pod["spec"]["volumes"]}
        assert volumes[builders.SHM_VOLUME]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
        assert volumes[operator_names.WORKER_VOLUME]["configMap"]["name"].startswith("monarch-spmd-payload-")
        assert {"name": builders.SHM_VOLUME, "mountPath": "/dev/shm"} in trainer["volumeMounts"]
        labels = view.pod["metadata"]["labels"]
        assert labels[names.LABEL_RANK] == str(view.index * 4)
        assert labels["spmd.monarch.dev/coord-nodes"] == str(view.index)
    rows = podview.table_rows(pods)
    assert rows[0] == ["POD", "KIND", "RANKS", "GPUS", "CPU", "MEMORY", "SHM", "TOLERATIONS", "MASTER"]
    assert rows[1] == ["train-00000-r0-0", "member", "0..3", "4", "32", "256Gi", "64Gi", "nvidia.com/gpu",
                       "train-00000-m0.default.svc:29500"]
    assert rows[2][:3] == ["train-00000-r0-1", "member", "4..7"]
    assert rows[3] == ["TOTAL", "2 pods", "", "8", "64", "512Gi", "", "", ""]


@pytest.mark.parametrize("doc", [gpu_job(nnodes=2, nproc=3), hello_job()], ids=["PerHost", "PerProc"])
def test_every_procs_torchrun_variables_are_the_contracts(doc):
    pods = podview.build(doc, namespace="ml")
    parsed = pods.spec
    mesh = parsed.mesh_pairs
    seen = []
    for view in pods.pods:
        for env in view.procs:
            rank = int(env["RANK"])
            seen.append(rank)
            expected = contract.torch_elastic_env(
                mesh, contract.coords_of(mesh, rank), f"{pods.name}-00000-m0.ml.svc", parsed.master_port,
                max_restarts=parsed.max_restarts, run_id=podview.PLACEHOLDER_UID, base_env={})
            if parsed.pod_layout != names.PER_HOST:  # one proc per pod: LOCAL_RANK within the mesh
                assert env["LOCAL_WORLD_SIZE"] == str(mesh[-1][1])
            assert env == expected, (view.name, rank)
    assert seen == list(range(contract.world_size(mesh)))


def test_a_namespace_on_the_command_line_must_match_the_manifests():
    with pytest.raises(podview.PodsError, match=r"namespace from the command line \(b\) and metadata.namespace \(a\)"):
        podview.build(gpu_job(namespace="a"), namespace="b")
    assert podview.build(gpu_job(namespace="a")).namespace == "a"
    with pytest.raises(podview.PodsError, match="spec.image"):
        podview.build({**hello_job(), "spec": {**hello_job()["spec"], "image": None}})


def test_a_refusal_names_the_pods_field_and_the_jobs():
    pods = podview.build(gpu_job())
    status = {"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
              "message": 'Pod "train-00000-r0-1" is invalid: spec.containers[0].resources.requests: Invalid value',
              "details": {"causes": [{"reason": "FieldValueInvalid", "message": "Invalid value: \"4\": must be equal",
                                      "field": "spec.containers[0].resources.requests[nvidia.com/gpu]"},
                                     {"reason": "FieldValueInvalid", "message": "must be a toleration",
                                      "field": "spec.tolerations[0].key"}]}}
    answer = podview.answer_of(pods, pods.pods[1], 422, json.dumps(status))
    assert not answer.accepted and answer.status == 422 and answer.message == status["message"]
    lines = podview.report([podview.answer_of(pods, pods.pods[0], 201, ""), answer], "ml")
    assert lines[0] == "pod/train-00000-r0-0 accepted (server dry run in namespace ml; nothing created)"
    assert lines[1].startswith("pod/train-00000-r0-1 refused (422): Pod ")
    assert lines[2] == ("  in the job's terms: Pod \"train-00000-r0-1\" is invalid: "
                        "spec.template.spec.containers[0].resources.requests: Invalid value")
    assert lines[3].startswith("  spec.containers[0].resources.requests[nvidia.com/gpu] (the job's spec.gpusPerProc")
    assert lines[4] == ("  spec.tolerations[0].key (the job's spec.template.spec.tolerations[0].key): "
                        "must be a toleration")
    # A field the Pod API does not know (the template is typed, so only a server of another
    # version says this): the message alone names it; said in the job's terms too.
    typo = pods
    message = ('Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
               'unknown field "spec.nodeSelectr"')
    said = podview.report([podview.answer_of(typo, typo.pods[0], 400, json.dumps({"message": message}))], "ml")
    assert said[0] == f"pod/train-00000-r0-0 refused (400): {message}"
    assert said[1].startswith("  in the job's terms: ")
    assert said[1].endswith("spec.template.spec.nodeSelectr: unknown field")
    body = podview.dry_run_body(pods.pods[0].pod)
    assert "ownerReferences" not in body["metadata"] and "ownerReferences" in pods.pods[0].pod["metadata"]


def _cli(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if stdin is not None:
            import sys

            saved, sys.stdin = sys.stdin, io.StringIO(stdin)
            try:
                code = cli.main(list(argv))
            finally:
                sys.stdin = saved
        else:
            code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_manifest_pods_prints_the_pods_with_their_procs_variables():
    code, out, err = _cli("manifest", "--image", "img:1", "--gpus-per-proc", "1", "--pods", "--",
                          "torchrun", "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "3", "-m", "train")
    assert code == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert [d["kind"] for d in docs] == ["Pod", "Pod"]
    assert all(podview.trainer(d)["resources"]["limits"]["nvidia.com/gpu"] == "2" for d in docs)
    assert "# pod 1: ranks 2..3; the worker gives its procs (torchrun's variables):" in out
    assert "MASTER_ADDR=train-00000-m0.default.svc MASTER_PORT=29500" in out
    assert "TORCHELASTIC_MAX_RESTARTS=3" in out
    assert "#   RANK=3 LOCAL_RANK=1 GROUP_RANK=1 ROLE_RANK=3" in out


def test_pods_reads_a_manifest_from_standard_input_as_a_table_or_json():
    text = yaml.safe_dump(gpu_job())
    code, out, err = _cli("pods", "-f", "-", "-o", "table", "-n", "ml", stdin=text)
    assert code == 0, err
    assert out.splitlines()[1].split() == ["train-00000-r0-0", "member", "0..3", "4", "32", "256Gi", "64Gi",
                                           "nvidia.com/gpu", "train-00000-m0.ml.svc:29500"]
    code, out, err = _cli("pods", "-f", "-", "-o", "json", stdin=text)
    assert code == 0 and [p["metadata"]["name"] for p in json.loads(out)["items"]] == ["train-00000-r0-0",
                                                                                        "train-00000-r0-1"]
    code, out, err = _cli("pods", "-f", "-", stdin="kind: ConfigMap\n")
    assert code == 1 and "expected one document of kind SPMDJob" in err
