"""torchrun's command line as monarch-spmd reads it (monarch_spmd.torchrun): every flag, every
refusal naming its flag, the defaults torchrun derives from its rendezvous, and the SPMDJob."""

from __future__ import annotations

import argparse
import copy

import pytest

from monarch_spmd import runner, spec, torchrun
from monarch_spmd.torchrun import CLUSTER, LOCAL, TorchrunError, parse, plan


def local(*argv: str, gpus: int = 0, cpus: int = 2) -> torchrun.Plan:
    return plan(parse(argv), LOCAL, gpus=gpus, cpus=cpus)


def cluster(*argv: str, gpus: int = 0, cpus: int = 2) -> torchrun.Plan:
    return plan(parse(argv), CLUSTER, gpus=gpus, cpus=cpus)


def refused(target: str, *argv: str, gpus: int = 0) -> str:
    with pytest.raises(TorchrunError) as e:
        plan(parse(argv), target, gpus=gpus, cpus=2)
    return str(e.value)


# --- parsing ------------------------------------------------------------------------------------


def test_flags_then_the_script_and_its_arguments():
    launch = parse(["--nproc-per-node", "4", "train.py", "--lr", "0.1", "--nnodes", "3"])
    assert launch == torchrun.Launch({"nproc_per_node": "4"}, "train.py", ("--lr", "0.1", "--nnodes", "3"))


@pytest.mark.parametrize("prefix", [["torchrun"], ["/usr/local/bin/torchrun"], ["python", "-m", "torch.distributed.run"],
                                    ["python3", "-u", "-m", "torch.distributed.run"], ["python3.11", "-m", "torch.distributed.run"], []])
def test_the_launcher_words_are_optional(prefix):
    launch = parse([*prefix, "--nnodes=2", "--nproc_per_node=8", "-m", "train", "--lr", "0.1"])
    assert launch.options == {"nnodes": "2", "nproc_per_node": "8", "module": True}
    assert (launch.script, launch.script_args) == ("train", ("--lr", "0.1"))


def test_torch_distributed_launch_is_refused_by_name():
    with pytest.raises(TorchrunError, match="torch.distributed.launch: not supported.*--local-rank"):
        parse(["python", "-m", "torch.distributed.launch", "--nproc-per-node", "2", "train.py"])


def test_a_double_dash_before_the_script_ends_the_flags_and_one_after_it_is_the_scripts():
    # As torchrun's own parser (measured: torch.distributed.run.parse_args).
    assert parse(["--nproc-per-node", "2", "--", "train.py", "--x"]) == torchrun.Launch({"nproc_per_node": "2"}, "train.py", ("--x",))
    assert parse(["train.py", "--a", "--", "--b"]).script_args == ("--a", "--", "--b")
    assert parse(["--rdzv-id", "r", "--", "x.py", "--"]) == torchrun.Launch({"rdzv_id": "r"}, "x.py", ("--",))
    with pytest.raises(TorchrunError, match="no training script after '--'"):
        parse(["--nproc-per-node", "2", "--"])


def test_an_unknown_flag_or_a_missing_value_is_an_error():
    with pytest.raises(TorchrunError, match="unrecognized arguments: --nprocs"):
        parse(["--nprocs", "2", "train.py"])
    with pytest.raises(TorchrunError, match="--nnodes"):
        parse(["--nnodes"])
    with pytest.raises(TorchrunError, match="invalid choice"):
        parse(["--start-method", "thread", "x.py"])


def test_given_reports_only_the_flags_set():
    p = argparse.ArgumentParser()
    torchrun.add_arguments(p)
    assert torchrun.given(p.parse_args(["--standalone", "--rdzv_id", "x"])) == {"standalone": True, "rdzv_id": "x"}
    q = argparse.ArgumentParser()
    torchrun.add_arguments(q, shared=False)
    assert "--max-restarts" not in q._option_string_actions and "--nnodes" in q._option_string_actions


def test_every_flag_has_torchruns_spellings():
    names = {n for f in torchrun.FLAGS for n in f.names}
    for long in ("--nproc-per-node", "--nproc_per_node", "--max_restarts", "--node_rank", "--master_addr",
                 "--master_port", "--rdzv_backend", "--rdzv_endpoint", "--rdzv_id", "--rdzv_conf", "--no_python",
                 "--log_dir", "-r", "-t", "-m", "--module", "--run_path", "--standalone", "--role"):
        assert long in names, long


# --- every flag: honoured, ignored with a note, or refused, naming it --------------------------

#: What each flag does (run / manifest): "ok", "note" (ignored, a note names it) or "refused".
#: A flag added to torchrun.FLAGS fails test_every_flag_is_decided until it is listed here.
DECISIONS = {
    "nnodes": ("2", "ok", "ok"),
    "nproc_per_node": ("2", "ok", "ok"),
    "rdzv_backend": ("c10d", "note", "note"),
    "rdzv_endpoint": ("head:29400", "note", "note"),
    "rdzv_id": ("abc", "ok", "note"),
    "rdzv_conf": ("join_timeout=900", "note", "note"),
    "standalone": (None, "ok", "ok"),
    "max_restarts": ("3", "ok", "ok"),
    "monitor_interval": ("0.5", "note", "note"),
    "start_method": ("fork", "note", "note"),
    "event_log_handler": ("console", "note", "note"),
    "role": ("trainer", "ok", "ok"),
    "module": (None, "ok", "ok"),
    "no_python": (None, "refused", "refused"),
    "run_path": (None, "note", "note"),
    "log_dir": ("/tmp/logs", "ok", "note"),
    "redirects": ("3", "ok", "note"),
    "tee": ("3", "ok", "note"),
    "log_line_prefix_template": ("${rank}:", "note", "note"),
    "local_ranks_filter": ("0", "note", "note"),
    "duplicate_stdout_filters": ("loss", "refused", "refused"),
    "duplicate_stderr_filters": ("loss", "refused", "refused"),
    "node_rank": ("0", "ok", "note"),
    "master_addr": ("127.0.0.1", "ok", "note"),
    "master_port": ("29511", "ok", "ok"),
    "local_addr": ("10.0.0.1", "note", "note"),
    "logs_specs": ("mine", "note", "note"),
    "numa_binding": ("node", "refused", "refused"),
    "signals_to_handle": ("SIGTERM", "note", "note"),
    "shutdown_timeout": ("10", "ok", "note"),
    "virtual_local_rank": (None, "refused", "refused"),
    "print_completion": ("bash", "refused", "refused"),
}


def test_every_flag_is_decided():
    assert set(DECISIONS) == {f.dest for f in torchrun.FLAGS}


@pytest.mark.parametrize("target", [LOCAL, CLUSTER])
@pytest.mark.parametrize("dest", sorted(DECISIONS))
def test_each_flag_is_honoured_noted_or_refused_by_name(dest, target):
    value, run_does, manifest_does = DECISIONS[dest]
    flag = torchrun.BY_DEST[dest]
    argv = [flag.name] if value is None else [flag.name, value]
    if dest in ("rdzv_id", "master_addr"):
        argv += ["--master-port", "29511"]  # what makes torchrun use them (see below)
    argv += ["train"] if dest == "module" else ["train.py"]
    does = run_does if target == LOCAL else manifest_does
    if does == "refused":
        message = refused(target, *argv)
        assert message.startswith(flag.name) and "not supported" in message
        return
    result = plan(parse(argv), target, gpus=0, cpus=2)
    noted = [n for n in result.notes if n.startswith(flag.name)]
    if does == "note":
        assert len(noted) == 1 and "ignored" in noted[0] or dest == "run_path", (dest, result.notes)
    else:
        assert not noted, result.notes


def test_what_the_honoured_flags_become():
    p = local("--nnodes", "3", "--nproc-per-node", "4", "--max-restarts", "2", "--master-port", "29511", "--rdzv-id", "job-7",
              "--role", "trainer", "--shutdown-timeout", "12", "--master-addr", "localhost", "-m", "pkg.train", "--lr", "0.1")
    assert p.mesh == [("nodes", 3), ("procs", 4)] and not p.from_gpus
    assert p.argv == ("-m", "pkg.train", "--lr", "0.1")
    assert (p.max_restarts, p.master_port, p.run_id, p.role, p.grace_period, p.master_addr) == (2, 29511, "job-7", "trainer", 12.0, "localhost")
    assert p.notes == ()
    assert local("x.py").mesh == [("nodes", 1), ("procs", 1)] and local("x.py").max_restarts == 0


@pytest.mark.parametrize("value", ["0", "1", "2", "3", "0:3,1:2", "1:1"])
def test_redirects_and_tee_take_torchruns_values_and_a_local_run_keeps_them(value):
    for flag, dest in (("-r", "redirects"), ("--redirects", "redirects"), ("-t", "tee"), ("--tee", "tee")):
        p = local(flag, value, "--log-dir", "/tmp/l", "x.py")
        assert p.notes == () and getattr(p, dest) == value and p.log_dir == "/tmp/l"
        on_cluster = plan(parse([flag, value, "x.py"]), CLUSTER, gpus=0, cpus=2)
        assert (on_cluster.redirects, on_cluster.tee, on_cluster.log_dir) == ("0", "0", None)
        assert any(n.startswith(f"--{dest}: ignored") for n in on_cluster.notes)


@pytest.mark.parametrize("value", ["4", "x", "0:4", "0:3,", "-1", ""])
def test_redirects_and_tee_refuse_what_torchrun_refuses_naming_the_flag(value):
    for flag, long in (("-r", "--redirects"), ("--tee", "--tee")):
        message = refused(LOCAL, flag, value, "x.py")
        assert message.startswith(f"{long}: {value!r} is not valid; expected 0 (none), 1 (stdout)"), message


def test_no_python_says_why():
    message = refused(LOCAL, "--no-python", "./train.sh")
    assert message.startswith("--no-python: not supported: the worker always runs the training program with Python")


# --- --nnodes and --nproc-per-node --------------------------------------------------------------


@pytest.mark.parametrize("text, nodes", [("1", (1, 1)), ("2", (2, 2)), ("4:4", (4, 4)), (" 3 ", (3, 3)),
                                         ("1:4", (1, 4)), ("2:3", (2, 3))])
def test_nnodes(text, nodes):
    assert torchrun.parse_nnodes(text) == nodes


@pytest.mark.parametrize("text, message", [
    ("0:2", "--nnodes: '0:2' is not valid"),
    ("0", "--nnodes: '0' is not valid"),
    ("3:2", "--nnodes: '3:2' is not valid"),
    ("two", "--nnodes: 'two' is not valid; expected a number of nodes"),
    ("1:2:3", "--nnodes: '1:2:3' is not valid"),
    ("", "--nnodes: '' is not valid"),
])
def test_bad_nnodes_name_the_flag(text, message):
    with pytest.raises(TorchrunError, match=message.replace("(", r"\(")):
        torchrun.parse_nnodes(text)


@pytest.mark.parametrize("value, gpus, cpus, want", [
    ("8", 0, 2, (8, False)), ("1", 4, 2, (1, False)), ("gpu", 4, 2, (4, True)), ("cpu", 4, 16, (16, False)),
    ("auto", 2, 16, (2, True)), ("auto", 0, 16, (16, False)), ("cpu", 0, 0, (1, False)),
])
def test_nproc_per_node_as_torchrun_resolves_it(value, gpus, cpus, want):
    assert torchrun.parse_nproc_per_node(value, gpus=gpus, cpus=cpus) == want


@pytest.mark.parametrize("value, message", [
    ("0", "--nproc-per-node: 0 is not valid; expected an integer in 1..4096"),
    ("-2", "--nproc-per-node: -2 is not valid"),
    ("eight", "--nproc-per-node: 'eight' is not valid; expected an integer of at least 1, or gpu, cpu or auto"),
    ("xpu", "--nproc-per-node xpu: not supported"),
    ("gpu", "--nproc-per-node gpu: no CUDA device is visible here"),
])
def test_bad_nproc_per_node_names_the_flag(value, message):
    with pytest.raises(TorchrunError, match=message):
        torchrun.parse_nproc_per_node(value, gpus=0, cpus=2)


def test_the_mesh_is_bounded_and_standalone_is_one_node():
    assert "--nnodes 2 x --nproc-per-node 4000 is 8000 procs; at most 4096" in refused(LOCAL, "--nnodes", "2", "--nproc-per-node", "4000", "x.py")
    assert refused(LOCAL, "--standalone", "--nnodes", "2", "x.py").startswith("--standalone: runs one node")


def test_counts_devices_only_for_gpu_and_auto():
    assert torchrun.counts_devices(parse(["--nproc-per-node", "gpu", "x.py"]))
    assert torchrun.counts_devices(parse(["--nproc-per-node", "auto", "x.py"]))
    assert not torchrun.counts_devices(parse(["--nproc-per-node", "cpu", "x.py"]))
    assert not torchrun.counts_devices(parse(["x.py"]))


# --- values ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--max-restarts", "-1"], "--max-restarts: -1 is not valid; expected an integer in 0..100 (spec.restartPolicy.maxRestarts)"),
    (["--max_restarts", "101"], "--max-restarts: 101 is not valid"),
    (["--max-restarts", "many"], "--max-restarts: 'many' is not valid"),
    (["--master-port", "0"], "--master-port: 0 is not valid; expected an integer in 1..65535"),
    (["--master-port", "70000"], "--master-port: 70000 is not valid"),
    (["--node-rank", "-1"], "--node-rank: -1 is not valid; expected an integer of at least 0"),
    (["--shutdown-timeout", "soon"], "--shutdown-timeout: 'soon' is not valid"),
    (["--role", " "], "--role: empty"),
    (["--master-addr", "", "--master-port", "29500"], "--master-addr: empty"),
])
def test_bad_values_name_the_flag(argv, message):
    assert refused(LOCAL, *argv, "x.py").startswith(message)


def test_the_training_argv():
    assert local("-m", "train", "--x").argv == ("-m", "train", "--x")
    assert local("--module", "train").argv == ("-m", "train")
    assert local("--run-path", "/abs/train.py", "1").argv == ("/abs/train.py", "1")
    assert "no training script" in refused(LOCAL, "--nproc-per-node", "2")
    for interpreter in ("python", "python3", "/usr/bin/python3.11", "torchrun"):
        assert "every rank is run with Python already" in refused(LOCAL, "--nproc-per-node", "2", "--", interpreter, "x.py")


# --- what torchrun derives from its rendezvous (measured in tests/lib/test_torchrun_parity.py) --


@pytest.mark.parametrize("argv, addr, run_id", [
    # One node, no port and no rendezvous flag: torchrun's c10d rendezvous at localhost, a fresh uuid.
    ([], "localhost", None),
    (["--standalone"], "localhost", None),
    (["--rdzv-id", "mine"], "localhost", None),  # torchrun ignores it here, and says nothing
    # A port, several nodes or a rendezvous flag: static (or the given backend): --master-addr, --rdzv-id.
    (["--master-port", "29511"], "127.0.0.1", "none"),
    (["--master-port", "29511", "--rdzv-id", "mine", "--master-addr", "localhost"], "localhost", "mine"),
    (["--nnodes", "2"], "127.0.0.1", "none"),
    (["--nnodes", "2", "--rdzv-id", "mine"], "127.0.0.1", "mine"),
    (["--rdzv-backend", "c10d", "--rdzv-id", "mine"], "127.0.0.1", "mine"),
])
def test_master_addr_and_run_id_follow_torchruns_rendezvous(argv, addr, run_id):
    p = local(*argv, "x.py")
    assert (p.master_addr, p.run_id) == (addr, run_id)


def test_what_torchrun_ignores_in_its_local_rendezvous_is_noted():
    notes = local("--standalone", "--master-port", "29511", "--rdzv-id", "mine", "x.py").notes
    assert any(n.startswith("--master-port: ignored with --standalone") for n in notes)
    assert any(n.startswith("--rdzv-id: ignored, as torchrun ignores it") for n in notes)
    assert local("--standalone", "--master-port", "29511", "x.py").master_port is None
    assert any(n.startswith("--master-addr: ignored, as torchrun ignores it") for n in local("--master-addr", "h", "x.py").notes)


def test_node_rank_locally():
    assert local("--node-rank", "0", "x.py").nodes == 1
    assert refused(LOCAL, "--node-rank", "1", "x.py") == "--node-rank: 1 is not valid with one node; expected 0"
    message = refused(LOCAL, "--nnodes", "2", "--node-rank", "0", "x.py")
    assert message.startswith("--node-rank: monarch-spmd run starts all 2 nodes on this machine") and "monarch-spmd manifest" in message


def test_on_the_cluster_the_per_machine_flags_are_noted():
    p = cluster("--nnodes", "2", "--node-rank", "1", "--master-addr", "head", "--rdzv-id", "x", "--shutdown-timeout", "9", "x.py")
    assert [n.split(":")[0] for n in p.notes] == ["--node-rank", "--master-addr", "--rdzv-id", "--shutdown-timeout"]
    assert (p.master_addr, p.run_id, p.grace_period) == (None, None, None)
    assert "<name>-<id>-m<attempt>.<namespace>.svc" in p.notes[1]


def test_gpu_and_cpu_counts_on_the_cluster_come_from_this_machine_with_a_note():
    p = cluster("--nproc-per-node", "gpu", "x.py", gpus=8)
    assert (p.procs, p.from_gpus) == (8, True)
    assert p.notes == ("--nproc-per-node gpu: 8, the CUDA devices of this machine; give the number the cluster's "
                       "nodes have if it differs",)
    assert refused(CLUSTER, "--nproc-per-node", "gpu", "x.py").startswith(
        "--nproc-per-node gpu: this machine sees no CUDA device to count; give the number of GPUs a node of the cluster has")


# --- the SPMDJob --------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, name", [
    (["-m", "train"], "train"), (["-m", "torchtitan.train"], "torchtitan-train"), (["scripts/train_llm.py"], "train-llm"),
    (["2023_run.py"], "run"), (["___.py"], "torchrun-job"), (["-m", "A" * 80], "a" * 50), ([], "torchrun-job"),
])
def test_default_names_are_valid_job_names(argv, name):
    assert torchrun.default_name(argv) == name
    assert spec.job_name_error(name) is None


def test_the_manifest_of_a_torchrun_command_line():
    p = cluster("--nnodes=2", "--nproc-per-node=8", "--max-restarts", "2", "--master-port", "29511", "--role", "trainer",
                "-m", "train", "--lr", "0.1")
    doc = torchrun.manifest(p, name="train", image="registry/train:1", namespace="ml", gpus_per_proc=1)
    assert doc == {
        "apiVersion": "spmd.monarch.dev/v1alpha1", "kind": "SPMDJob",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "mesh": [{"name": "nodes", "size": 2}, {"name": "procs", "size": 8}],
            "podLayout": "PerHost",
            "image": "registry/train:1",
            "args": ["-m", "train", "--lr", "0.1"],
            "gpusPerProc": 1,
            "masterPort": 29511,
            "restartPolicy": {"maxRestarts": 2},
            "template": {"spec": {"containers": [{"name": "trainer", "env": [{"name": "MONARCH_SPMD_ROLE_NAME", "value": "trainer"}]}],
                                  "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}},
        },
    }
    _, errors = spec.check_manifest(copy.deepcopy(doc))
    assert errors == []
    parsed = spec.load_manifest(doc).spec
    assert (parsed.max_restarts, parsed.pod_layout, parsed.gpus_per_proc) == (2, "PerHost", 1)


def test_the_manifest_writes_torchruns_default_restarts_and_gpus_from_gpu():
    doc = torchrun.manifest(cluster("x.py"), name="x", image="i")
    assert doc["spec"]["restartPolicy"] == {"maxRestarts": 0}  # torchrun's default, not the SPMDJob's 3
    assert "gpusPerProc" not in doc["spec"] and "masterPort" not in doc["spec"] and "namespace" not in doc["metadata"]
    gpu = torchrun.manifest(cluster("--nproc-per-node", "gpu", "x.py", gpus=4), name="x", image="i")
    assert gpu["spec"]["gpusPerProc"] == 1 and gpu["spec"]["mesh"][1] == {"name": "procs", "size": 4}
    assert "gpusPerProc" not in torchrun.manifest(cluster("--nproc-per-node", "gpu", "x.py", gpus=4), name="x", image="i",
                                                  gpus_per_proc=0)["spec"]
    assert spec.check_manifest(gpu)[1] == []


def test_an_elastic_range_becomes_the_meshs_min_size_on_the_cluster_and_locally():
    doc = torchrun.manifest(cluster("--nnodes", "2:4", "--nproc-per-node", "8", "-m", "train"), name="t", image="i")
    assert doc["spec"]["mesh"] == [{"name": "nodes", "size": 4, "minSize": 2}, {"name": "procs", "size": 8}]
    parsed = spec.load_manifest(doc).spec
    assert (parsed.min_members, parsed.world_size) == (2, 32)
    fixed = torchrun.manifest(cluster("--nnodes", "3:3", "-m", "train"), name="t", image="i")
    assert fixed["spec"]["mesh"][0] == {"name": "nodes", "size": 3}, "N:N is a fixed size"
    job = runner.job_from_args("nodes=3,procs=2", ["-m", "train"], min_nodes=1, pod_layout="PerHost")
    assert job.spec.min_members == 1 and job.spec.mesh[0].size == 3
