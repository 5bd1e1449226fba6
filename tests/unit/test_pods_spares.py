"""Hot spares are pods too: `monarch-spmd pods` (every format) and `manifest --pods` show them with
their resources, marked as spares, and count them in the totals; the operator's Kueue waiting
message counts the pods its Workload asks for, and says when the spares are what does not fit."""

from __future__ import annotations

import contextlib
import io
import json

import yaml

from monarch_spmd import cli, podview, spec
from monarch_spmd.payload import names
from spmd_operator import builders
from spmd_operator import names as operator_names

from .lifecycle import helpers


def spare_job(spares: int = 1) -> dict:
    """2 nodes x 8 GPUs, PerHost, with hot spares: what a GPU cluster runs."""
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": "train"},
            "spec": {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 8}], "podLayout": "PerHost",
                     "gpusPerProc": 1, "spares": spares, "args": ["-m", "train"], "image": "registry.example/train:1",
                     "template": {"spec": {
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                         "containers": [{"name": "trainer",
                                         "resources": {"requests": {"cpu": "32", "memory": "256Gi"}}}]}}}}


def gpus(pod: dict) -> int:
    return int(podview.trainer(pod)["resources"]["limits"]["nvidia.com/gpu"])


def cli_run(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if stdin is None:
            code = cli.main(list(argv))
        else:
            import sys

            saved, sys.stdin = sys.stdin, io.StringIO(stdin)
            try:
                code = cli.main(list(argv))
            finally:
                sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


# --- monarch-spmd pods ---------------------------------------------------------------------------


def test_the_spare_is_a_pod_shown_as_the_operator_builds_it():
    doc = spare_job()
    pods = podview.build(doc, namespace="ml")
    assert [v.name for v in pods.pods] == ["train-00000-r0-0", "train-00000-r0-1", "train-00000-r0-s0"]
    assert [v.kind for v in pods.pods] == ["member", "member", "spare"]
    parsed = spec.load_manifest(doc, require_image=True).spec
    job = operator_names.JobRef("train", "ml", podview.PLACEHOLDER_UID)
    spare = pods.spares[0]
    assert spare.pod == builders.build_spare_pod(job, parsed, 0, 0, token=podview.PLACEHOLDER_TOKEN)
    assert spare.pod["metadata"]["labels"][operator_names.LABEL_SPARE] == "0"
    assert spare.procs == (), "a spare has no rank until it takes a lost pod's place"
    assert [gpus(v.pod) for v in pods.pods] == [8, 8, 8]


def test_the_table_of_a_2x8_job_with_a_spare_shows_3_pods_and_24_gpus():
    code, out, err = cli_run("pods", "-f", "-", "-o", "table", stdin=yaml.safe_dump(spare_job()))
    assert code == 0, err
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["POD", "KIND", "RANKS", "GPUS", "CPU", "MEMORY", "SHM", "TOLERATIONS", "MASTER"]
    assert [r[:4] for r in rows[1:4]] == [["train-00000-r0-0", "member", "0..7", "8"],
                                          ["train-00000-r0-1", "member", "8..15", "8"],
                                          ["train-00000-r0-s0", "spare", "-", "8"]]
    assert rows[3][4:6] == ["32", "256Gi"], "the spare holds what the gang's pods hold"
    assert rows[4] == ["TOTAL", "3", "pods", "24", "96", "768Gi"]


def test_the_json_of_a_2x8_job_with_a_spare_lists_3_pods_holding_24_gpus():
    code, out, err = cli_run("pods", "-f", "-", "-o", "json", stdin=yaml.safe_dump(spare_job()))
    assert code == 0, err
    items = json.loads(out)["items"]
    assert [p["metadata"]["name"] for p in items] == ["train-00000-r0-0", "train-00000-r0-1", "train-00000-r0-s0"]
    assert sum(gpus(p) for p in items) == 24
    assert [operator_names.LABEL_SPARE in p["metadata"]["labels"] for p in items] == [False, False, True]


def test_the_yaml_says_what_the_spares_are_and_counts_them():
    out = podview.render_yaml(podview.build(spare_job(spares=2)))
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert [d["metadata"]["name"] for d in docs][-2:] == ["train-00000-r0-s0", "train-00000-r0-s1"]
    assert "# 3 pod(s) of" not in out and "# 2 pod(s) of 8 proc(s) each, podLayout PerHost." in out
    assert "# 4 pod(s) (2 of the gang and 2 hot spare(s)), holding 32 nvidia.com/gpu, cpu 128, memory 1Ti in all." in out
    assert "# hot spare 1: no rank until it takes a lost pod's place" in out


def test_the_server_dry_run_sends_the_spares_too(monkeypatch):
    sent = []

    def post(api_client, path, query, body):
        sent.append(body["metadata"]["name"])
        return 201, ""

    monkeypatch.setattr(podview, "post", post)
    pods = podview.build(spare_job())
    answers = podview.dry_run(pods, api_client=None)
    assert sent == ["train-00000-r0-0", "train-00000-r0-1", "train-00000-r0-s0"]
    assert all(a.accepted for a in answers)


# --- monarch-spmd manifest ------------------------------------------------------------------------

TORCHRUN = ("--", "torchrun", "--nnodes", "2", "--nproc-per-node", "8", "-m", "train")


def test_manifest_writes_spec_spares_after_the_restart_policy():
    code, out, err = cli_run("manifest", "--image", "img:1", "--gpus-per-proc", "1", "--spares", "1", *TORCHRUN)
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert doc["spec"]["spares"] == 1
    keys = list(doc["spec"])
    assert keys.index("spares") == keys.index("restartPolicy") + 1
    _, errors = spec.check_manifest(doc, require_image=True)
    assert errors == []


def test_manifest_pods_lists_the_spare_with_its_gpus():
    code, out, err = cli_run("manifest", "--image", "img:1", "--gpus-per-proc", "1", "--spares", "1", "--pods",
                             *TORCHRUN)
    assert code == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert [d["metadata"]["name"] for d in docs] == ["train-00000-r0-0", "train-00000-r0-1", "train-00000-r0-s0"]
    assert docs[2]["metadata"]["labels"][operator_names.LABEL_SPARE] == "0"
    assert [gpus(d) for d in docs] == [8, 8, 8]
    assert "holding 24 nvidia.com/gpu in all." in out


def test_manifest_refuses_spares_it_cannot_use_naming_the_flag():
    code, _, err = cli_run("manifest", "--image", "img:1", "--gpus-per-proc", "1", "--spares", "1",
                           "--", "torchrun", "--nnodes", "1", "--nproc-per-node", "8", "-m", "train")
    assert code == 2 and "--spares: 1 is not allowed with one node" in err and "--nnodes 2 or more" in err
    code, _, err = cli_run("manifest", "--image", "img:1", "--gpus-per-proc", "1", "--spares", "65", *TORCHRUN)
    assert code == 2 and "--spares: 65 is not valid; expected an integer in 0..64 (spec.spares)" in err


# --- the Kueue waiting message --------------------------------------------------------------------

KUEUE = {"provider": "Kueue", "queue": "gpus"}


def workload_count(s: spec.JobSpec) -> int:
    workload = builders.build_workload(helpers.JOB, s)
    return sum(p["count"] for p in workload["spec"]["podSets"])


def waiting_message(s: spec.JobSpec, kueue_message: str | None = None) -> str:
    from spmd_operator import lifecycle

    workload = None if kueue_message is None else lifecycle.WorkloadInfo(name="w", message=kueue_message)
    st = helpers.apply(None, helpers.run(s=s, st=None))
    plan = helpers.run(s=s, st=st, workload=workload)
    new = helpers.apply(st, plan)
    assert new["reason"] == "WaitingForAdmission"
    return new["message"]


def test_the_kueue_message_counts_the_pods_the_workload_asks_for():
    for s in (helpers.spec(scheduling=KUEUE), helpers.spec(scheduling=KUEUE, spares=1),
              helpers.spec(scheduling=KUEUE, spares=2, podLayout="PerHost"),
              helpers.spec(scheduling=KUEUE, spares=1, podLayout="PerHost",
                           mesh=[{"name": "nodes", "size": 4, "minSize": 2}, {"name": "procs", "size": 2}])):
        count = workload_count(s)
        message = waiting_message(s)
        assert message.startswith(f"waiting for Kueue to admit all {count} pods"), (count, message)
    assert waiting_message(helpers.spec(scheduling=KUEUE, spares=1)) == (
        "waiting for Kueue to admit all 5 pods (4 of the gang and 1 hot spare) on queue gpus")


def test_the_kueue_message_says_when_the_spares_are_what_does_not_fit():
    s = helpers.spec(scheduling=KUEUE, spares=1, podLayout="PerHost", gpusPerProc=4)  # 2 pods + 1 spare, 4 GPUs each
    assert workload_count(s) == 3
    said = ("couldn't assign flavors to pod set procs: insufficient quota for nvidia.com/gpu in flavor a100, "
            "previously considered podsets requests (0) + current podset request (12) > maximum capacity (8)")
    assert waiting_message(s, said) == (
        "waiting for Kueue to admit all 3 pods (2 of the gang and 1 hot spare) on queue gpus; the quota of "
        "nvidia.com/gpu in flavor a100 holds the gang's 2 pods but not its hot spare: lower spec.spares or raise "
        f"the quota: {said}")
    too_small = said.replace("maximum capacity (8)", "maximum capacity (4)")
    assert "holds 1 of the 3 pods, and the gang alone needs 2: raise the quota" in waiting_message(s, too_small)
    other = "couldn't assign flavors to pod set procs: insufficient unused quota for cpu in flavor a100, 3 more needed"
    assert waiting_message(s, other) == (
        f"waiting for Kueue to admit all 3 pods (2 of the gang and 1 hot spare) on queue gpus: {other}")
