"""Unit tests of spmd_operator.builders and names: every child of an SPMDJob as a plain dict."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

import monarch_spmd
from monarch_spmd import policy
from monarch_spmd.payload import worker
from monarch_spmd.spec import SpecError, parse_job_spec, parse_stored
from spmd_operator import builders, lifecycle, names
from spmd_operator.names import JobRef

JOB = JobRef(name="hello", namespace="team-a", uid="1234abcd-0000-4000-8000-000000000000")
BASE = {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 2}], "args": ["-m", "train", "--lr", "0.1"], "image": "img:1"}


def spec(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return parse_job_spec(raw, require_image=True)


def trainer(pod):
    [c] = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    return c


def env_of(pod):
    """The trainer's env as name -> value (or -> valueFrom)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in trainer(pod)["env"]}


OWNER = {
    "apiVersion": "spmd.monarch.dev/v1alpha1",
    "kind": "SPMDJob",
    "name": "hello",
    "uid": "1234abcd-0000-4000-8000-000000000000",
    "controller": True,
    "blockOwnerDeletion": True,
}


def test_names_follow_the_interface_document():
    assert names.job_id(JOB.uid) == "1234a"
    assert names.pod_name(JOB, 0, 3) == "hello-1234a-r0-3"
    assert names.pod_name(JOB, 12, 4095) == "hello-1234a-r12-4095"
    assert names.service_name(JOB, 2) == "hello-1234a-m2"
    assert names.payload_configmap_name("0123456789abcdef") == "monarch-spmd-payload-0123456789abcdef"
    assert names.master_addr(JOB, 2) == "hello-1234a-m2.team-a.svc"
    assert names.coord_label("hosts") == "spmd.monarch.dev/coord-hosts"


def test_two_jobs_of_the_same_name_never_share_a_child_name():
    again = JobRef(name="hello", namespace="team-a", uid="9f00aa11-0000-4000-8000-000000000000")
    assert names.pod_name(again, 0, 0) != names.pod_name(JOB, 0, 0)
    assert names.service_name(again, 0) != names.service_name(JOB, 0)


def test_every_service_name_is_a_dns_label_even_for_the_longest_job_name_and_many_restarts():
    longest = JobRef("a" * names.MAX_JOB_NAME_LENGTH, "ns", JOB.uid)
    assert len(names.service_name(longest, 99999)) <= 63
    assert len(names.pod_name(longest, 99999, 4095)) <= 253


def test_job_ref_reads_an_api_object():
    body = {"metadata": {"name": "hello", "namespace": "team-a", "uid": JOB.uid, "generation": 2}}
    assert JobRef.from_body(body) == JOB


def test_owner_uid_is_the_controller_spmdjob():
    pod = builders.build_pod(JOB, spec(), 0, 0)
    assert names.owner_uid(pod) == JOB.uid
    pod["metadata"]["ownerReferences"][0]["controller"] = False
    assert names.owner_uid(pod) is None


@pytest.mark.parametrize(
    ("rank", "coords"),
    [(0, ("0", "0")), (1, ("0", "1")), (2, ("1", "0")), (3, ("1", "1"))],
)
def test_pod_identity_labels_and_owner(rank, coords):
    pod = builders.build_pod(JOB, spec(), rank, 2)
    meta = pod["metadata"]
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert meta["name"] == f"hello-1234a-r2-{rank}"
    assert meta["namespace"] == "team-a"
    assert meta["labels"] == {
        "spmd.monarch.dev/job": "hello",
        "spmd.monarch.dev/job-uid": JOB.uid,
        "spmd.monarch.dev/rank": str(rank),
        "spmd.monarch.dev/restart": "2",
        "spmd.monarch.dev/coord-hosts": coords[0],
        "spmd.monarch.dev/coord-gpus": coords[1],
    }
    assert meta["ownerReferences"] == [OWNER]
    env = env_of(pod)
    assert env[worker.COORDS_VAR] == ",".join(coords)


def test_pod_command_runs_the_shipped_worker():
    pod = builders.build_pod(JOB, spec(python="/opt/conda/bin/python"), 0, 0)
    c = trainer(pod)
    assert c["command"] == ["/opt/conda/bin/python", "/opt/monarch-spmd/payload/worker.py", "--", "-m", "train", "--lr", "0.1"]
    assert "args" not in c
    assert c["image"] == "img:1"
    assert {"name": "monarch-spmd-worker", "mountPath": "/opt/monarch-spmd/payload", "readOnly": True} in c["volumeMounts"]
    assert {"name": "monarch-spmd-worker", "configMap": {"name": builders.installed_payload_configmap()}} in pod["spec"]["volumes"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_pod_env_is_the_worker_input_plus_downward_api():
    pod = builders.build_pod(JOB, spec(masterPort=1234, rendezvousTimeoutSeconds=90, restartPolicy={"maxRestarts": 7}), 3, 1)
    env = env_of(pod)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    inputs = worker.read_inputs(plain)
    assert inputs.mesh == [("hosts", 2), ("gpus", 2)]
    assert inputs.coords == [1, 1]
    assert inputs.rank == 3
    assert (inputs.master_addr, inputs.master_port) == ("hello-1234a-m1.team-a.svc", 1234)
    assert (inputs.restart_count, inputs.max_restarts) == (1, 7)
    assert inputs.run_id == JOB.uid
    assert inputs.rendezvous_timeout == 90
    assert inputs.local_rank_scope == "mesh"
    torch_env = worker.build_env(inputs, {})
    assert (torch_env["RANK"], torch_env["WORLD_SIZE"], torch_env["LOCAL_RANK"], torch_env["LOCAL_WORLD_SIZE"]) == ("3", "4", "1", "2")
    assert torch_env["TORCHELASTIC_RESTART_COUNT"] == "1"


def test_user_template_is_merged_and_user_env_wins_where_set_but_never_over_the_pods_own():
    template = {
        "metadata": {"labels": {"team": "a", "spmd.monarch.dev/rank": "spoofed"}, "annotations": {"note": "x"}},
        "spec": {
            "serviceAccountName": "trainer-sa",
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 120,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [
                {"name": "sidecar", "image": "busybox"},
                {
                    "name": "trainer",
                    "env": [
                        {"name": "POD_IP", "value": "override"},
                        {"name": worker.ROLE_NAME_VAR, "value": "rank"},
                        {"name": "DATA", "value": "$(POD_NAME)"},
                    ],
                    "resources": {"limits": {"memory": "2Gi"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                },
            ],
        },
    }
    # The spec refuses POD_IP in the trainer now; a job stored before that rule still runs.
    raw = {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 2}], "args": ["-m", "train", "--lr", "0.1"],
           "image": "img:1", "template": template}
    with pytest.raises(SpecError, match="POD_IP is reserved"):
        parse_job_spec(raw, require_image=True)
    s, outdated = parse_stored(raw)
    assert [e.field for e in outdated] == ["spec.template.spec.containers[1].env[0].name"]
    before = copy.deepcopy(s.template)
    pod = builders.build_pod(JOB, s, 1, 0)
    assert s.template == before, "building a pod must not change the spec"
    p = pod["spec"]
    assert p["serviceAccountName"] == "trainer-sa"
    assert p["nodeSelector"] == {"pool": "gpu"}
    assert p["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert p["terminationGracePeriodSeconds"] == 120
    assert [c["name"] for c in p["containers"]] == ["sidecar", "trainer"]
    assert p["containers"][0] == {"name": "sidecar", "image": "busybox"}
    assert [v["name"] for v in p["volumes"]] == ["data", "monarch-spmd-worker", "dshm"]
    c = trainer(pod)
    assert c["resources"] == {"limits": {"memory": "2Gi"}}
    assert [m["name"] for m in c["volumeMounts"]] == ["data", "monarch-spmd-worker", "dshm"]
    env_names = [e["name"] for e in c["env"]]
    assert len(env_names) == len(set(env_names)), "each variable once"
    env = env_of(pod)
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}, "the pod's own address, never shadowed"
    assert env[worker.ROLE_NAME_VAR] == "rank"
    assert env[worker.MESH_VAR] == "hosts=2,gpus=2"
    # Ours come first so that the user's values may refer to them.
    assert env_names.index("POD_NAME") < env_names.index("DATA")
    assert pod["metadata"]["labels"]["team"] == "a"
    assert pod["metadata"]["labels"]["spmd.monarch.dev/rank"] == "1"
    assert pod["metadata"]["annotations"] == {"note": "x"}


def test_unnamed_template_container_is_the_trainer():
    pod = builders.build_pod(JOB, spec(template={"spec": {"containers": [{"workingDir": "/w"}]}}), 0, 0)
    assert len(pod["spec"]["containers"]) == 1
    assert trainer(pod)["workingDir"] == "/w"


def test_user_termination_message_policy_is_kept():
    pod = builders.build_pod(JOB, spec(template={"spec": {"containers": [{"name": "trainer", "terminationMessagePolicy": "File"}]}}), 0, 0)
    assert trainer(pod)["terminationMessagePolicy"] == "File"


def test_gpus_per_proc_sets_the_limit_and_pod_local_rank_scope():
    pod = builders.build_pod(JOB, spec(gpusPerProc=1), 3, 0)
    c = trainer(pod)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = env_of(pod)
    assert env[worker.LOCAL_RANK_SCOPE_VAR] == "pod"
    # What the training script sees: one torchrun node per pod, so set_device(LOCAL_RANK) is cuda:0.
    inputs = worker.read_inputs({k: v for k, v in env.items() if isinstance(v, str)})
    torch_env = worker.build_env(inputs, {})
    assert (torch_env["LOCAL_RANK"], torch_env["LOCAL_WORLD_SIZE"]) == ("0", "1")
    assert (torch_env["RANK"], torch_env["WORLD_SIZE"]) == ("3", "4")
    assert torch_env["GROUP_RANK"] == "3"


def test_gpus_per_proc_overrides_a_template_gpu_request():
    template = {"spec": {"containers": [{"name": "trainer", "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]}}
    c = trainer(builders.build_pod(JOB, spec(gpusPerProc=2, template=template), 0, 0))
    assert c["resources"] == {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}


def test_gpu_limit_in_the_template_alone_also_gives_pod_scope():
    template = {"spec": {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    assert env_of(builders.build_pod(JOB, spec(template=template), 0, 0))[worker.LOCAL_RANK_SCOPE_VAR] == "pod"


def test_user_may_force_mesh_scope_with_gpus():
    template = {"spec": {"containers": [{"name": "trainer", "env": [{"name": worker.LOCAL_RANK_SCOPE_VAR, "value": "mesh"}]}]}}
    assert env_of(builders.build_pod(JOB, spec(gpusPerProc=1, template=template), 0, 0))[worker.LOCAL_RANK_SCOPE_VAR] == "mesh"


def test_no_gpus_means_no_gpu_limit_and_mesh_scope():
    pod = builders.build_pod(JOB, spec(), 0, 0)
    assert "resources" not in trainer(pod)
    env = env_of(pod)
    assert worker.LOCAL_RANK_SCOPE_VAR not in env, "mesh is the worker's default: not written"
    assert worker.read_inputs({k: v for k, v in env.items() if isinstance(v, str)}).local_rank_scope == "mesh"


def test_pod_env_leaves_out_the_inputs_at_the_workers_default_and_the_worker_reads_the_same():
    # The default InPlace policy writes 22 variables; every one at the worker's default is left
    # out (4,096 pods carry them in every stored copy and every watch event).
    s = parse_job_spec({**BASE, "mesh": [{"name": "procs", "size": 8}]}, require_image=True)
    pod = builders.build_pod(JOB, s, 5, 0)
    env = env_of(pod)
    assert [name for name in env if name.startswith("MONARCH_SPMD_")] == [
        "MONARCH_SPMD_MESH", "MONARCH_SPMD_COORDS", "MONARCH_SPMD_MASTER_ADDR", "MONARCH_SPMD_MASTER_PORT",
        "MONARCH_SPMD_RESTART_COUNT", "MONARCH_SPMD_MAX_RESTARTS", "MONARCH_SPMD_RUN_ID", "MONARCH_SPMD_AGENT_PORT"]
    full = worker.worker_input_env(
        s.mesh_pairs, builders.pod_coords(s, 5), names.master_addr(JOB, 0), s.master_port, restart_count=0,
        max_restarts=s.max_restarts, run_id=JOB.uid, rendezvous_timeout=s.rendezvous_timeout_seconds,
        local_rank_scope=policy.local_rank_scope(s), pod_layout=s.pod_layout, **policy.in_place_inputs(s))
    assert len(full) == 18, "10 of them left out"
    assert worker.read_inputs({k: v for k, v in env.items() if isinstance(v, str)}) == worker.read_inputs(full)


def test_an_input_the_template_refers_to_is_written_even_at_its_default():
    # The kubelet expands $(NAME) only for a variable the container has.
    template = {"spec": {"containers": [{"name": "trainer", "env": [
        {"name": "LOG_PREFIX", "value": "$(MONARCH_SPMD_ROLE_NAME)-$(POD_NAME)"}]}]}}
    s = spec(args=["-m", "train", "--grace", "$(MONARCH_SPMD_STOP_GRACE)"], template=template)
    env = env_of(builders.build_pod(JOB, s, 0, 0))
    assert env["MONARCH_SPMD_ROLE_NAME"] == "default"
    assert env["MONARCH_SPMD_STOP_GRACE"] == "30"
    assert "MONARCH_SPMD_JOIN_TIMEOUT" not in env, "not referred to: left out"


def test_colocate_prefers_the_node_of_the_same_first_coordinate():
    user_affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    pod = builders.build_pod(JOB, spec(colocate=True, template={"spec": {"affinity": user_affinity}}), 3, 1)
    affinity = pod["spec"]["affinity"]
    assert affinity["nodeAffinity"] == user_affinity["nodeAffinity"]
    [term] = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100
    assert term["podAffinityTerm"] == {
        "labelSelector": {
            "matchLabels": {
                "spmd.monarch.dev/job-uid": JOB.uid,
                "spmd.monarch.dev/restart": "1",
                "spmd.monarch.dev/coord-hosts": "1",
            }
        },
        "topologyKey": "kubernetes.io/hostname",
    }


def test_no_colocate_means_no_affinity():
    assert "affinity" not in builders.build_pod(JOB, spec(), 0, 0)["spec"]


def test_build_pod_needs_an_image():
    with pytest.raises(ValueError, match="spec.image"):
        builders.build_pod(JOB, parse_job_spec({k: v for k, v in BASE.items() if k != "image"}), 0, 0)


def test_build_pod_rejects_an_index_out_of_range():
    with pytest.raises(ValueError, match="index"):
        builders.build_pod(JOB, spec(), 4, 0)


def test_service_is_headless_and_selects_the_current_rank_zero():
    svc = builders.build_service(JOB, spec(masterPort=29400), 3)
    assert (svc["apiVersion"], svc["kind"]) == ("v1", "Service")
    assert svc["metadata"]["name"] == "hello-1234a-m3"
    assert svc["metadata"]["namespace"] == "team-a"
    assert svc["metadata"]["labels"] == {"spmd.monarch.dev/job": "hello", "spmd.monarch.dev/job-uid": JOB.uid,
                                         "spmd.monarch.dev/restart": "3"}
    assert svc["metadata"]["ownerReferences"] == [OWNER]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"spmd.monarch.dev/job-uid": JOB.uid, "spmd.monarch.dev/rank": "0", "spmd.monarch.dev/restart": "3"}
    assert svc["spec"]["ports"] == [{"name": "master", "port": 29400, "targetPort": 29400, "protocol": "TCP"}]
    # The service selects exactly the rank-0 pod of that attempt.
    pod_labels = builders.build_pod(JOB, spec(), 0, 3)["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_worker_configmap_holds_the_library_files():
    files = builders.worker_files()
    payload = Path(monarch_spmd.__file__).parent / "payload"
    assert files == {p.name: p.read_text(encoding="utf-8") for p in payload.glob("*.py")}
    cm = builders.build_worker_configmap("team-a", files)
    digest = builders.payload_hash(files)
    assert (cm["apiVersion"], cm["kind"]) == ("v1", "ConfigMap")
    assert cm["metadata"]["name"] == f"monarch-spmd-payload-{digest}" == builders.installed_payload_configmap()
    assert cm["metadata"]["namespace"] == "team-a"
    assert cm["metadata"]["labels"] == {"spmd.monarch.dev/payload": digest}, "no job label: no job's child"
    assert cm["metadata"]["annotations"] == {"spmd.monarch.dev/payload-hash": digest}
    assert "ownerReferences" not in cm["metadata"], "shared by the namespace's jobs"
    assert cm["immutable"] is True, "a new payload is a new name; the kubelets need not watch it"
    assert cm["data"] == files
    assert builders.payload_hash({**files, "worker.py": files["worker.py"] + "#"}) != digest
    pod = builders.build_pod(JOB, spec(), 0, 0)
    assert {"name": "monarch-spmd-worker", "configMap": {"name": cm["metadata"]["name"]}} in pod["spec"]["volumes"]
    other = builders.build_pod(JOB, spec(), 0, 0, payload="monarch-spmd-payload-0000")
    assert {"name": "monarch-spmd-worker", "configMap": {"name": "monarch-spmd-payload-0000"}} in other["spec"]["volumes"]
    assert sum(len(v.encode()) for v in files.values()) < 1024 * 1024, "a ConfigMap holds at most 1 MiB"


def test_shipped_worker_needs_only_the_standard_library(tmp_path):
    """The files of the ConfigMap, alone in a folder, run as the pod command does."""
    import subprocess
    import sys

    folder = tmp_path / "payload"
    folder.mkdir()
    for name, text in builders.worker_files().items():
        (folder / name).write_text(text, encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", worker.MESH_VAR: "a=1"}
    result = subprocess.run(
        [sys.executable, "-I", str(folder / "worker.py"), "--", "-m", "x"],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    # The worker starts without the project installed and reports the missing variable (64).
    assert result.returncode == worker.EX_USAGE, result.stderr
    assert worker.COORDS_VAR in result.stderr


def test_every_pod_gets_a_memory_backed_dev_shm_of_the_size_asked_for():
    pod = builders.build_pod(JOB, spec(shmSize="2Gi"), 0, 0)
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["spec"]["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in trainer(pod)["volumeMounts"]
    unlimited = builders.build_pod(JOB, spec(), 0, 0)
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in unlimited["spec"]["volumes"]
    own = {"spec": {"containers": [{"name": "trainer", "volumeMounts": [{"name": "mine", "mountPath": "/dev/shm"}]}],
                    "volumes": [{"name": "mine", "emptyDir": {}}]}}
    kept = builders.build_pod(JOB, spec(template=own), 0, 0)
    assert "dshm" not in [v["name"] for v in kept["spec"]["volumes"]], "the template's own /dev/shm wins"


def test_a_per_host_pod_runs_its_hosts_procs_and_holds_their_gpus():
    s = spec(mesh=[{"name": "hosts", "size": 3}, {"name": "gpus", "size": 4}], podLayout="PerHost", gpusPerProc=1)
    pod = builders.build_pod(JOB, s, 2, 1)
    meta = pod["metadata"]
    assert meta["name"] == "hello-1234a-r1-2"
    assert meta["labels"]["spmd.monarch.dev/rank"] == "8"
    assert meta["labels"]["spmd.monarch.dev/procs"] == "4"
    assert meta["labels"]["spmd.monarch.dev/coord-hosts"] == "2"
    assert "spmd.monarch.dev/coord-gpus" not in meta["labels"]
    assert trainer(pod)["resources"]["limits"]["nvidia.com/gpu"] == "4"
    inputs = worker.read_inputs({k: v for k, v in env_of(pod).items() if isinstance(v, str)})
    assert (inputs.pod_layout, inputs.coords, inputs.rank, inputs.local_procs, inputs.local_rank_scope) == (
        "PerHost", [2], 8, 4, "mesh")
    assert policy.pods_per_attempt(s) == 3
    with pytest.raises(ValueError, match="index"):
        builders.build_pod(JOB, s, 3, 0)


def test_a_per_host_service_selects_the_pod_of_rank_zero():
    s = spec(podLayout="PerHost")
    svc = builders.build_service(JOB, s, 0)
    assert svc["spec"]["selector"].items() <= builders.build_pod(JOB, s, 0, 0)["metadata"]["labels"].items()
    assert not svc["spec"]["selector"].items() <= builders.build_pod(JOB, s, 1, 0)["metadata"]["labels"].items()


def monarch_spec(**changes):
    raw = {k: v for k, v in BASE.items() if k != "args"}
    raw.update(mode="Monarch", podLayout="PerHost", **changes)
    return parse_job_spec(raw, require_image=True)


def test_a_monarch_pod_runs_the_worker_loop_on_its_port_with_a_readiness_probe():
    s = monarch_spec(mesh=[{"name": "hosts", "size": 3}, {"name": "gpus", "size": 2}], python="/usr/bin/python3")
    pod = builders.build_pod(JOB, s, 1, 2)
    c = trainer(pod)
    assert c["command"] == ["/usr/bin/python3", "/opt/monarch-spmd/payload/worker.py"], "no argv: the worker serves"
    assert "args" not in c
    assert c["ports"] == [{"name": "monarch", "containerPort": 26600, "protocol": "TCP"}]
    assert c["readinessProbe"] == {"tcpSocket": {"port": "monarch"}, "periodSeconds": 2, "timeoutSeconds": 1,
                                   "failureThreshold": 3}
    # One pod per host, named and labelled as every PerHost pod: what the client selects.
    assert pod["metadata"]["name"] == "hello-1234a-r2-1"
    labels = pod["metadata"]["labels"]
    assert (labels["spmd.monarch.dev/rank"], labels["spmd.monarch.dev/procs"], labels["spmd.monarch.dev/coord-hosts"],
            labels["spmd.monarch.dev/restart"]) == ("2", "2", "1", "2")
    inputs = worker.read_inputs({k: v for k, v in env_of(pod).items() if isinstance(v, str)})
    assert (inputs.mode, inputs.monarch_port, inputs.pod_layout, inputs.coords) == ("Monarch", 26600, "PerHost", [1])
    assert env_of(pod)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}, "the address the loop advertises"
    assert policy.pods_per_attempt(s) == 3


def test_a_program_pod_has_no_monarch_port_probe_or_mode_variable():
    c = trainer(builders.build_pod(JOB, spec(podLayout="PerHost"), 0, 0))
    assert [p["name"] for p in c.get("ports", [])] == ["spmd-agent"] and "readinessProbe" not in c
    assert "MONARCH_SPMD_MODE" not in env_of(builders.build_pod(JOB, spec(), 0, 0))


def test_a_monarch_pod_keeps_the_templates_own_port_and_probe():
    probe = {"tcpSocket": {"port": 26600}, "initialDelaySeconds": 5}
    template = {"spec": {"containers": [{"name": "trainer", "readinessProbe": probe,
                                         "ports": [{"name": "metrics", "containerPort": 9090}]}]}}
    c = trainer(builders.build_pod(JOB, monarch_spec(template=template), 0, 0))
    assert c["readinessProbe"] == probe
    # The template's own port is defaulted as the API server defaults it (protocol TCP).
    assert c["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
                          {"name": "monarch", "containerPort": 26600, "protocol": "TCP"}]
    named = {"spec": {"containers": [{"name": "trainer", "ports": [{"name": "monarch", "containerPort": 26600}]}]}}
    assert trainer(builders.build_pod(JOB, monarch_spec(template=named), 0, 0))["ports"] == [
        {"name": "monarch", "containerPort": 26600, "protocol": "TCP"}]


# --- restart in place ----------------------------------------------------------------------------


def test_in_place_pods_get_the_agents_inputs_and_declare_its_port():
    s = spec(restartPolicy={"permanentExitCodes": [3], "retryableExitCodes": [1, 2], "permanentReasons": ["OOMKilled"],
                            "progressTimeoutSeconds": 600, "backoffSeconds": 5, "maxBackoffSeconds": 60,
                            "backoffResetSeconds": 120, "joinTimeoutSeconds": 300, "maxRestarts": 7},
             template={"spec": {"terminationGracePeriodSeconds": 12}})
    pod = builders.build_pod(JOB, s, 1, 2, disruptions=1)
    env = env_of(pod)
    assert {k: env[k] for k in env if k.startswith("MONARCH_SPMD_") and k not in (
        "MONARCH_SPMD_MESH", "MONARCH_SPMD_COORDS", "MONARCH_SPMD_MASTER_ADDR", "MONARCH_SPMD_MASTER_PORT",
        "MONARCH_SPMD_RUN_ID", "MONARCH_SPMD_ROLE_NAME", "MONARCH_SPMD_RENDEZVOUS_TIMEOUT",
        "MONARCH_SPMD_LOCAL_RANK_SCOPE", "MONARCH_SPMD_POD_LAYOUT")} == {
        "MONARCH_SPMD_RESTART_COUNT": "2", "MONARCH_SPMD_MAX_RESTARTS": "7",
        "MONARCH_SPMD_AGENT_PORT": "29400", "MONARCH_SPMD_DISRUPTIONS": "1",
        "MONARCH_SPMD_PERMANENT_EXIT_CODES": "3", "MONARCH_SPMD_RETRYABLE_EXIT_CODES": "1,2",
        "MONARCH_SPMD_PERMANENT_REASONS": "OOMKilled", "MONARCH_SPMD_BACKOFF_SECONDS": "5",
        "MONARCH_SPMD_MAX_BACKOFF_SECONDS": "60", "MONARCH_SPMD_BACKOFF_RESET_SECONDS": "120",
        "MONARCH_SPMD_JOIN_TIMEOUT": "300", "MONARCH_SPMD_PROGRESS_TIMEOUT": "600", "MONARCH_SPMD_STOP_GRACE": "12"}
    inputs = worker.read_inputs({k: v for k, v in env.items() if isinstance(v, str)})
    assert inputs.policy().permanent_exit_codes == (3,) and inputs.member == 1
    assert trainer(pod)["ports"] == [{"name": "spmd-agent", "containerPort": 29400, "protocol": "TCP"}]
    assert names.LABEL_REPLACEMENT not in pod["metadata"]["labels"]


def test_the_agent_port_steps_aside_for_a_master_port_of_29400():
    pod = builders.build_pod(JOB, spec(masterPort=29400), 0, 0)
    assert env_of(pod)["MONARCH_SPMD_AGENT_PORT"] == "29401"
    assert trainer(pod)["ports"][0]["containerPort"] == 29401


def test_recreate_pods_leaves_every_restart_in_place_input_unset():
    pod = builders.build_pod(JOB, spec(restartPolicy={"mode": "RecreatePods", "progressTimeoutSeconds": 60}), 0, 0)
    env = env_of(pod)
    for var in worker.OPTIONAL_INPUTS.values():
        assert var not in env, var
    assert "ports" not in trainer(pod)
    monarch = builders.build_pod(JOB, monarch_spec(), 0, 0)
    assert [p["name"] for p in trainer(monarch)["ports"]] == ["monarch"], "Monarch mode always recreates its pods"
    assert "MONARCH_SPMD_AGENT_PORT" not in env_of(monarch)


def test_a_replacement_pod_joins_its_gang_at_the_open_round_under_a_name_of_its_own():
    pod = builders.build_pod(JOB, spec(), 3, 1, replacement=2, restart_count=4, disruptions=2)
    assert pod["metadata"]["name"] == "hello-1234a-r1-3-2" != names.pod_name(JOB, 1, 3, 1)
    labels = pod["metadata"]["labels"]
    assert (labels[names.LABEL_RESTART], labels[names.LABEL_RANK], labels[names.LABEL_REPLACEMENT]) == ("1", "3", "2")
    env = env_of(pod)
    assert env["MONARCH_SPMD_MASTER_ADDR"] == names.master_addr(JOB, 1), "the gang's master, not a new one"
    assert (env["MONARCH_SPMD_RESTART_COUNT"], env["MONARCH_SPMD_DISRUPTIONS"]) == ("4", "2")
    info = lifecycle.pod_info(pod)
    assert info is not None and (info.replacement, info.joins) == (2, 4), "the lifecycle reads the round it joins"
    assert lifecycle.pod_info(builders.build_pod(JOB, spec(), 3, 1)).joins is None, "a pod of the gang joins none"


def test_failure_output_none_reaches_the_agent_and_keeps_the_log_out_of_the_termination_message():
    pod = builders.build_pod(JOB, spec(failureOutput="None"), 0, 0)
    assert env_of(pod)["MONARCH_SPMD_FAILURE_OUTPUT"] == "None"
    assert trainer(pod)["terminationMessagePolicy"] == "File"
    plain = builders.build_pod(JOB, spec(), 0, 0)
    assert "MONARCH_SPMD_FAILURE_OUTPUT" not in env_of(plain)
    assert trainer(plain)["terminationMessagePolicy"] == "FallbackToLogsOnError"
    recreate = builders.build_pod(JOB, spec(failureOutput="None", restartPolicy={"mode": "RecreatePods"}), 0, 0)
    assert env_of(recreate)["MONARCH_SPMD_FAILURE_OUTPUT"] == "None", "a PerHost worker alone writes tails too"


def test_failure_text_keeps_only_the_workers_own_lines_with_failure_output_none():
    message = "Traceback (most recent call last):\nValueError: password=hunter2\nmonarch-spmd worker: rank 1 exited with code 1 in restart 0; job failed"
    assert policy.failure_text(spec(), message) == message
    assert policy.failure_text(spec(failureOutput="None"), message) == "monarch-spmd worker: rank 1 exited with code 1 in restart 0; job failed"
    assert policy.failure_text(spec(failureOutput="None"), "ValueError: password=hunter2") is None


def test_the_network_policy_lets_in_only_the_jobs_own_pods_and_the_operator_on_the_agent_port():
    job = JobRef("train", "team-a", "0d9c0ffe-0000-4000-8000-00000000abcd")
    spec = parse_job_spec({"mesh": [{"name": "procs", "size": 4}], "args": ["train.py"], "image": "img"},
                          require_image=True)
    body = builders.build_network_policy(job, spec, "monarch-spmd", {"app.kubernetes.io/name": "monarch-spmd"})
    own = {"matchLabels": {names.LABEL_JOB: "train", names.LABEL_JOB_UID: job.uid}}
    assert body["metadata"]["name"] == names.network_policy_name(job) and body["metadata"]["namespace"] == "team-a"
    assert body["spec"] == {
        "podSelector": own, "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": own}]},
                    {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monarch-spmd"}},
                               "podSelector": {"matchLabels": {"app.kubernetes.io/name": "monarch-spmd"}}}],
                     "ports": [{"protocol": "TCP", "port": 29400}]}]}
    # Every pod of the job (any attempt, any replacement) is selected by it.
    for restart, replacement in ((0, 0), (3, 0), (1, 2)):
        labels = builders.build_pod(job, spec, 1, restart, replacement=replacement)["metadata"]["labels"]
        assert own["matchLabels"].items() <= labels.items()
    # An operator outside any pod: only the job's own pods; RecreatePods: no agent port to open.
    assert builders.build_network_policy(job, spec, None, {})["spec"]["ingress"] == [{"from": [{"podSelector": own}]}]
    recreate = parse_job_spec({"mesh": [{"name": "procs", "size": 4}], "args": ["train.py"], "image": "img",
                               "restartPolicy": {"mode": "RecreatePods"}}, require_image=True)
    assert len(builders.build_network_policy(job, recreate, "ops", {})["spec"]["ingress"]) == 1
    monarch = parse_job_spec({"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 1}], "mode": "Monarch",
                              "image": "img", "podLayout": "PerHost"}, require_image=True)
    assert builders.build_network_policy(job, monarch, "ops", {}) is None, "a Monarch client attaches from anywhere"


def test_pods_created_after_a_node_loss_keep_off_that_node_whatever_the_template_requires():
    job = JobRef("train", "team-a", "0d9c0ffe-0000-4000-8000-00000000abcd")
    zone = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                                  {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}
    spec = parse_job_spec({"mesh": [{"name": "procs", "size": 2}], "args": ["train.py"], "image": "img",
                           "template": {"spec": {"affinity": {"nodeAffinity": {
                               "requiredDuringSchedulingIgnoredDuringExecution": zone}}}}}, require_image=True)
    pod = builders.build_pod(job, spec, 1, 1, avoid_nodes=("node-7",))
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keep_off = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-7"]}
    assert len(terms) == 2 and all(term["matchExpressions"][-1] == keep_off for term in terms), "ANDed into each"
    assert spec.template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == zone
    plain = parse_job_spec({"mesh": [{"name": "procs", "size": 2}], "args": ["train.py"], "image": "img"},
                           require_image=True)
    pod = builders.build_pod(job, plain, 0, 1, avoid_nodes=("node-7",))
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [keep_off]}]}
    assert "affinity" not in builders.build_pod(job, plain, 0, 1)["spec"]
