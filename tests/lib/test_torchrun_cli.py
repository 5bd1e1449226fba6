"""`monarch-spmd run` with torchrun's flags, and `monarch-spmd manifest`, with real processes and gloo.

The env each rank gets is checked independently by tests/programs/check_env.py (and against real
torchrun by test_torchrun_parity.py); here: the command lines, what is refused and how, the notes,
restarts, and the manifests, checked by `monarch-spmd validate`.
"""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest
import yaml

from .conftest import cli_cmd, free_port, run, script

PROGRAMS = "tests.programs"


def ranks_ok(stdout: str, world: int) -> set[int]:
    return {int(r) for r in re.findall(rf"^\[rank (\d+)\] check_env rank \1/{world}: ok", stdout, re.M)}


def argv_of_ranks(stdout: str) -> dict[int, list[str]]:
    out = {}
    for m in re.finditer(r"^\[rank (\d+)\] (\{.*\})$", stdout, re.M):
        out[int(m.group(1))] = json.loads(m.group(2))["argv"]
    return out


# --- run ----------------------------------------------------------------------------------------


def test_two_nodes_of_two_procs_get_torchruns_contract_and_join_gloo():
    port = free_port()
    result = run(cli_cmd(
        "run", "--nnodes", "2", "--nproc-per-node", "2", "--master-port", str(port), "--rdzv-id", "job-1",
        "--max-restarts", "1", "--role", "trainer",
        "-m", f"{PROGRAMS}.check_env", "--mesh", "nodes=2,procs=2", "--master-addr", "127.0.0.1",
        "--master-port", str(port), "--run-id", "job-1", "--max-restarts", "1", "--role-name", "trainer"))
    assert result.returncode == 0, result.stdout + result.stderr
    # check_env computed every variable from the mesh [nodes=2, procs=2] itself, then all-gathered over gloo.
    assert ranks_ok(result.stdout, 4) == {0, 1, 2, 3}, result.stdout + result.stderr
    assert "attempt 0: 4 ranks of mesh nodes=2,procs=2, master 127.0.0.1:" in result.stderr
    # PerHost, torchrun's agent: one worker per node, running its two procs.
    assert len(re.findall(r"monarch-spmd worker: ranks \d\.\.\d/4 on nodes=\d", result.stderr)) == 2


def test_an_elastic_range_runs_its_largest_size_here_and_its_ranks_train_on_a_resharded_checkpoint(tmp_path):
    """--nnodes 1:2: every node starts on this machine at once, so the first round has both (the
    elastic wait is for pods that come late); the example script checks its model at the end."""
    result = run(cli_cmd("run", "--nnodes", "1:2", "--nproc-per-node", "1", "-m", "monarch_spmd.examples.elastic_train",
                         "--checkpoint-dir", str(tmp_path / "ckpt"), "--steps", "6", "--step-seconds", "0",
                         "--report-every", "3"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "elastic_train step 6 world 2" in result.stdout, result.stdout
    assert "elastic_train done at step 6: w matches a run at one fixed size (2 ranks from step 0)" in result.stdout
    assert len(re.findall(r"monarch-spmd worker: ranks? \d+(\.\.\d+)?/2 on nodes=\d of mesh nodes=2,procs=1", result.stderr)) == 2


def test_the_script_its_arguments_and_double_dashes_go_through_as_torchrun_passes_them():
    print_env = script("print_env.py")
    result = run(cli_cmd("run", "--nproc_per_node=2", print_env, "--nnodes", "7", "--", "--mesh", "x"))
    assert result.returncode == 0, result.stderr
    assert argv_of_ranks(result.stdout) == {r: [print_env, "--nnodes", "7", "--", "--mesh", "x"] for r in (0, 1)}
    # '--' before the script ends the flags, as in torchrun; the word torchrun may lead the command line.
    for argv in (["--nproc-per-node", "2", "--", print_env, "--a"], ["torchrun", "--nproc-per-node", "2", print_env, "--a"],
                 ["python3", "-m", "torch.distributed.run", "--nproc-per-node", "2", print_env, "--a"]):
        result = run(cli_cmd("run", *argv))
        assert result.returncode == 0, (argv, result.stderr)
        assert argv_of_ranks(result.stdout) == {0: [print_env, "--a"], 1: [print_env, "--a"]}, argv


def test_a_bare_script_is_torchruns_one_proc():
    result = run(cli_cmd("run", script("print_env.py")))
    assert result.returncode == 0, result.stderr
    assert list(argv_of_ranks(result.stdout)) == [0]
    assert "1 ranks of mesh nodes=1,procs=1" in result.stderr


def test_max_restarts_restarts_the_gang_as_torchrun_does():
    result = run(cli_cmd("run", "--nproc-per-node", "2", "--max-restarts", "1", "-m", f"{PROGRAMS}.fail_once", "--rank", "1",
                         "--no-rendezvous"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fail_once rank 1: exiting with code 3 (restart 0)" in result.stdout
    assert "restarting the gang (restart 1 of at most 1)" in result.stderr


def test_ignored_flags_are_noted_by_name(tmp_path):
    result = run(cli_cmd("run", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:29400", "--log-dir",
                         str(tmp_path), "--monitor-interval", "1", script("print_env.py")))
    assert result.returncode == 0, result.stderr
    for flag in ("--rdzv-backend", "--rdzv-endpoint", "--monitor-interval"):
        assert f"[monarch-spmd] {flag}: ignored: " in result.stderr, flag
    assert "--log-dir: ignored" not in result.stderr and os.listdir(tmp_path)  # honoured: the files are there


@pytest.mark.parametrize("flags", [["--tee", "3"], ["-r", "3"], ["--redirects", "0:1", "-t", "1:2"]])
def test_tee_and_redirects_are_taken_as_torchrun_takes_them(flags, tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = run(cli_cmd("run", "--nproc-per-node", "2", *flags, script("print_env.py")), env=env)
    assert result.returncode == 0, result.stderr
    assert len(os.listdir(tmp_path)) == 1 and os.listdir(tmp_path)[0].startswith("torchelastic_")


@pytest.mark.parametrize("argv, message", [
    (["--no-python", "train.sh"], "--no-python: not supported: the worker always runs the training program with Python"),
    (["--nproc-per-node", "many", "x.py"], "--nproc-per-node: 'many' is not valid; expected an integer of at least 1, or gpu, cpu or auto"),
    (["--nnodes", "2", "--node-rank", "1", "x.py"], "--node-rank: monarch-spmd run starts all 2 nodes on this machine"),
    (["--master-addr", "192.0.2.1", "--master-port", "29511", "x.py"],
     "--master-addr: '192.0.2.1' is not an address of this machine"),
    (["--tee", "4", "x.py"], "--tee: '4' is not valid; expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"),
    (["--virtual-local-rank", "x.py"], "--virtual-local-rank: not supported"),
    (["--max-restarts", "101", "x.py"], "--max-restarts: 101 is not valid; expected an integer in 0..100"),
    (["--nnodes", "3:2", "x.py"], "--nnodes: '3:2' is not valid; expected a number of nodes, e.g. --nnodes 2, or a range"),
])
def test_refusals_name_the_flag_and_start_nothing(argv, message):
    result = run(cli_cmd("run", *argv))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"monarch-spmd run: {message}" in result.stderr
    assert "[rank" not in result.stdout


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "hosts=2", "--nproc-per-node", "2", "x.py"], "--nproc-per-node and --mesh hosts=2: both give the job's shape"),
    (["--mesh", "hosts=2", "--nnodes", "2", "--", "x.py"], "--nnodes and --mesh hosts=2"),
    (["-f", "job.yaml", "--standalone"], "--standalone and the manifest job.yaml"),
    (["--run-id", "a", "--rdzv-id", "b", "x.py"], "--run-id and --rdzv-id: both set TORCHELASTIC_RUN_ID; give one"),
    (["--role-name", "a", "--role", "b", "x.py"], "--role-name and --role: both set ROLE_NAME"),
    (["--grace-period", "1", "--shutdown-timeout", "2", "x.py"], "--grace-period and --shutdown-timeout"),
    (["--nproc-per-node", "2", "torchrun", "x.py"], "the training argv starts with torchrun (torchrun)"),
    (["--nproc-per-node", "2"], "no training script"),
])
def test_mixing_a_mesh_or_a_manifest_with_torchruns_flags_names_both(argv, message):
    result = run(cli_cmd("run", *argv))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr


def test_the_mesh_options_still_take_max_restarts_and_master_port(tmp_path):
    port = free_port()
    result = run(cli_cmd("run", "--mesh", "hosts=2", "--master_port", str(port), "--max-restarts", "0", "--",
                         "-m", f"{PROGRAMS}.check_env", "--master-port", str(port), "--no-gloo"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert ranks_ok(result.stdout, 2) == {0, 1}
    manifest = tmp_path / "job.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        apiVersion: spmd.monarch.dev/v1alpha1
        kind: SPMDJob
        metadata: {{name: positional}}
        spec:
          mesh: [{{name: procs, size: 2}}]
          args: ["-m", "{PROGRAMS}.check_env", "--no-gloo"]
          restartPolicy: {{maxRestarts: 0}}
        """))
    # The manifest as the first positional, its args replaced after '--' (as before torchrun's flags).
    result = run(cli_cmd("run", str(manifest), "--", "-m", f"{PROGRAMS}.check_env", "--no-gloo", "--run-id", "r9"))
    assert result.returncode == 1 and "TORCHELASTIC_RUN_ID='positional-" in result.stderr  # the args were replaced
    result = run(cli_cmd("run", str(manifest), "--run-id", "r9"))
    assert result.returncode == 0 and ranks_ok(result.stdout, 2) == {0, 1}, result.stderr


# --- manifest -----------------------------------------------------------------------------------


def manifest(*argv: str, **kwargs) -> tuple[dict, str]:
    result = run(cli_cmd("manifest", *argv), **kwargs)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout), result


@pytest.mark.parametrize("launcher", [["torchrun"], [], ["python", "-m", "torch.distributed.run"]])
def test_the_manifest_of_a_torchrun_command_line_is_valid(launcher, tmp_path):
    doc, result = manifest("--image", "registry/train:1", "--gpus-per-proc", "0", "--", *launcher, "--nnodes=2",
                           "--nproc-per-node=8", "--max-restarts", "2", "--rdzv-backend", "c10d", "-m", "train", "--lr", "0.1")
    assert doc["metadata"] == {"name": "train"}
    assert doc["spec"] == {"mesh": [{"name": "nodes", "size": 2}, {"name": "procs", "size": 8}], "podLayout": "PerHost",
                           "image": "registry/train:1", "args": ["-m", "train", "--lr", "0.1"],
                           "restartPolicy": {"maxRestarts": 2}, "shmSize": "8Gi"}
    assert result.stdout.startswith("# monarch-spmd manifest --image registry/train:1 --gpus-per-proc 0 -- ")
    assert "--rdzv-backend: ignored" in result.stderr  # a note, on stderr: stdout is only YAML
    path = tmp_path / "job.yaml"
    path.write_text(result.stdout)
    check = run(cli_cmd("validate", "-f", str(path)))
    assert check.returncode == 0 and "1 SPMDJob(s) valid" in check.stdout, check.stdout + check.stderr


def test_the_manifest_options_and_flags_without_double_dash():
    doc, result = manifest("--name", "llm", "--namespace", "team-a", "--image", "img:2", "--gpus-per-proc", "1",
                           "--nproc_per_node", "4", "--master-port", "29511", "--role", "trainer",
                           "--rdzv-backend", "c10d", "--node-rank", "1", "scripts/train.py", "--epochs", "1")
    assert doc["metadata"] == {"name": "llm", "namespace": "team-a"}
    assert doc["spec"]["gpusPerProc"] == 1 and doc["spec"]["masterPort"] == 29511
    assert doc["spec"]["template"]["spec"]["containers"] == [
        {"name": "trainer", "env": [{"name": "MONARCH_SPMD_ROLE_NAME", "value": "trainer"}]}]
    assert doc["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "--rdzv-backend: ignored" in result.stderr and "--node-rank: ignored" in result.stderr
    check = run(cli_cmd("validate", "-f", "-"), input=result.stdout)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("argv, message", [
    (["--", "torchrun", "x.py"], "--image: required: the container image every node runs"),
    (["--image", "i"], "no torchrun command line"),
    (["--image", "i", "--gpus-per-proc", "0", "--name", "Train_1", "x.py"], "--name: 'Train_1' is not valid; a job name is a DNS-1035 label"),
    (["--image", "has space", "--gpus-per-proc", "0", "x.py"], "--image: 'has space' is not valid"),
    (["--image", "i", "--namespace", "Team", "x.py"], "--namespace: 'Team' is not valid"),
    (["--image", "i", "--gpus-per-proc", "17", "x.py"], "--gpus-per-proc: 17 is not valid; expected an integer in 0..16"),
    (["--image", "i", "--", "torchrun", "--no-python", "x.sh"], "--no-python: not supported"),
    (["--image", "i", "--nnodes", "2", "--", "torchrun", "x.py"], "--nnodes before '--'"),
    (["--image", "i", "--", "python", "-m", "torch.distributed.launch", "x.py"], "torch.distributed.launch: not supported"),
])
def test_manifest_refusals_name_the_flag(argv, message):
    result = run(cli_cmd("manifest", *argv))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and result.stdout == ""


def test_the_usage_lists_manifest():
    result = run(cli_cmd("--help"))
    assert "  manifest " in result.stdout
