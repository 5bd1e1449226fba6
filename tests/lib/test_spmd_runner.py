"""The local runner (`monarch-spmd run`) with real processes and gloo: every contract variable on
every rank, manifests, a failing rank stopping the gang (no process left), restarts, Ctrl-C."""

from __future__ import annotations

import re
import signal
import textwrap

from monarch_spmd.payload import worker
from monarch_spmd.examples import allreduce

from .conftest import alive, cli_cmd, pids_in, run, script, wait_dead

EXAMPLES = "monarch_spmd.examples"


def ranks_ok(stdout: str, world: int) -> set[int]:
    return {int(r) for r in re.findall(rf"^\[rank (\d+)\] check_env rank \1/{world}: ok", stdout, re.M)}


def test_every_rank_of_a_2x2_mesh_gets_every_contract_variable():
    result = run(cli_cmd("run", "--mesh", "hosts=2,gpus=2", "--", "-m", f"{EXAMPLES}.check_env"))
    assert result.returncode == 0, result.stdout + result.stderr
    # check_env compares all 17 variables against the mesh, then all-gathers ranks over gloo.
    assert ranks_ok(result.stdout, 4) == {0, 1, 2, 3}, result.stdout + result.stderr
    assert "[monarch-spmd] all 4 ranks succeeded" in result.stderr


def test_a_3d_mesh_with_restart_settings_and_fixed_port():
    result = run(
        cli_cmd(
            "run",
            "--mesh",
            "zone=1,hosts=3,gpus=1",
            "--max-restarts",
            "2",
            "--run-id",
            "my-run",
            "--",
            "-m",
            f"{EXAMPLES}.check_env",
            "--max-restarts",
            "2",
            "--run-id",
            "my-run",
            "--master-addr",
            "127.0.0.1",
        )
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert ranks_ok(result.stdout, 3) == {0, 1, 2}


def test_a_manifest_runs_with_the_operators_settings(tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: spmd.monarch.dev/v1alpha1
            kind: SPMDJob
            metadata:
              name: env-check
            spec:
              mesh:
                - {{name: hosts, size: 1}}
                - {{name: gpus, size: 3}}
              args: ["-m", "{EXAMPLES}.check_env", "--role-name", "trainer", "--max-restarts", "3"]
              image: example.com/unused-locally:1
              gpusPerProc: 1
              template:
                spec:
                  containers:
                    - name: trainer
                      env:
                        - {{name: MONARCH_SPMD_ROLE_NAME, value: trainer}}
            """
        )
    )
    result = run(cli_cmd("run", "-f", str(manifest)))
    assert result.returncode == 0, result.stdout + result.stderr
    # gpusPerProc: 1 -> pod scope: check_env expects LOCAL_RANK 0, LOCAL_WORLD_SIZE 1 on each rank;
    # maxRestarts defaults to the CRD's 3; ROLE_NAME comes from the trainer container's env.
    assert ranks_ok(result.stdout, 3) == {0, 1, 2}
    assert "LOCAL_RANK=0 LOCAL_WORLD_SIZE=1" in result.stdout
    assert "run id env-check-" in result.stderr


def test_a_bad_manifest_names_the_field(tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: spmd.monarch.dev/v1alpha1\nkind: SPMDJob\nmetadata: {name: bad}\n"
        "spec:\n  mesh: [{name: hosts, size: 0}]\n  args: ['-m', 'x']\n"
    )
    result = run(cli_cmd("run", "-f", str(manifest)))
    assert result.returncode == 2
    assert "spec.mesh[0].size" in result.stderr


def test_bad_command_lines_are_refused_with_the_reason():
    no_mesh = run(cli_cmd("run", "--", "-m", "x"))
    assert no_mesh.returncode == 2 and "--mesh" in no_mesh.stderr
    bad_mesh = run(cli_cmd("run", "--mesh", "hosts=2,gpus=0", "--", "-m", "x"))
    assert bad_mesh.returncode == 2 and "mesh[1].size" in bad_mesh.stderr
    no_argv = run(cli_cmd("run", "--mesh", "hosts=2"))
    assert no_argv.returncode == 2 and "training argv" in no_argv.stderr
    dash_m = run(cli_cmd("run", "--mesh", "hosts=2", "--", "-m"))
    assert dash_m.returncode == 2 and "argv" in dash_m.stderr


def test_a_script_path_runs_an_allreduce():
    path = allreduce.__file__
    result = run(cli_cmd("run", "--mesh", "hosts=2", "--", path))
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"[rank {rank}] allreduce rank {rank}/2: sum 3 (expected 3)" in result.stdout


def test_a_failing_rank_stops_the_gang_and_leaves_no_process():
    result = run(
        cli_cmd(
            "run", "--mesh", "hosts=2,gpus=2", "--grace-period", "3", "--",
            "-m", f"{EXAMPLES}.fail_once", "--rank", "2", "--code", "3", "--sleep", "600",
        ),
        timeout=120,  # the others sleep 600 s: finishing well before means they were stopped
    )
    out = result.stdout + result.stderr
    assert result.returncode == 3, out
    assert "[monarch-spmd] rank 2 exited with code 3; stopping the other ranks" in out
    assert "job failed: rank 2 exited with code 3" in out
    pids = pids_in(out)
    assert len(pids) == 8, out  # 4 workers + 4 training processes
    assert wait_dead(pids) == set()


def test_a_failure_restarts_the_gang_with_the_restart_count_incremented():
    result = run(
        cli_cmd("run", "--mesh", "hosts=2", "--max-restarts", "1", "--", "-m", f"{EXAMPLES}.fail_once", "--rank", "1")
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "[rank 1] fail_once rank 1: exiting with code 3 (restart 0)" in out
    assert "restarting the gang (restart 1 of at most 1)" in out
    assert "[rank 0] fail_once rank 0: done (restart 1)" in out
    assert "[rank 1] fail_once rank 1: done (restart 1)" in out


def test_restarts_are_bounded_and_the_first_failures_code_is_returned():
    result = run(
        cli_cmd(
            "run", "--mesh", "hosts=2", "--max-restarts", "1", "--",
            "-m", f"{EXAMPLES}.fail_once", "--rank", "0", "--code", "9", "--always",
        )
    )
    out = result.stdout + result.stderr
    assert result.returncode == 9, out
    assert out.count("restarting the gang") == 1
    assert "job failed: rank 0 exited with code 9" in out


def test_exit_code_64_is_permanent_and_not_retried():
    # 64 is the worker's "bad input" code: restarting cannot fix it, so the runner does not.
    result = run(
        cli_cmd("run", "--mesh", "hosts=1", "--max-restarts", "2", "--", script("exit_with.py"), str(worker.EX_USAGE))
    )
    out = result.stdout + result.stderr
    assert result.returncode == 64, out
    assert "restarting the gang" not in out and "(not retryable)" in out


def test_ctrl_c_stops_every_rank(spawn):
    proc = spawn(
        cli_cmd(
            "run", "--mesh", "hosts=2,gpus=2", "--grace-period", "3", "--",
            "-m", f"{EXAMPLES}.fail_once", "--rank", "0", "--delay", "600", "--sleep", "600",
        )
    )
    proc.wait_for(r"joined the gloo group", count=4)
    proc.proc.send_signal(signal.SIGINT)
    assert proc.finish(120) == 128 + signal.SIGINT
    out = proc.text
    assert "SIGINT received; stopping all ranks" in out
    pids = pids_in(out)
    assert len(pids) == 8, out
    assert wait_dead(pids) == set()


def test_sigterm_to_the_runner_stops_every_rank(spawn):
    # One rank: trap_term.py opens no TCPStore, which other ranks would wait for.
    proc = spawn(cli_cmd("run", "--mesh", "gpus=1", "--grace-period", "2", "--", script("trap_term.py")))
    proc.wait_for(r"\] ready")
    pids = pids_in(proc.text)
    assert len(pids) == 2 and all(alive(p) for p in pids)  # the worker and trap_term.py
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.finish(120) == 128 + signal.SIGTERM
    # The worker forwarded SIGTERM to the training process, which handled it.
    assert "[rank 0] got SIGTERM" in proc.text
    assert wait_dead(pids) == set()
