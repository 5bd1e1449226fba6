"""The local runner (`monarch-spmd run`) with real processes and gloo: every contract variable on
every rank, manifests, a failing rank stopping the gang (no process left), restarts, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap

from monarch_spmd import runner
from monarch_spmd.payload import worker
from monarch_spmd.examples import allreduce

from .conftest import alive, cli_cmd, pids_in, run, script, wait_dead

EXAMPLES = "tests.programs"


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
    no_argv_at_all = run(cli_cmd("run"))
    assert no_argv_at_all.returncode == 2 and "--mesh" in no_argv_at_all.stderr
    bad_mesh = run(cli_cmd("run", "--mesh", "hosts=2,gpus=0", "--", "-m", "x"))
    assert bad_mesh.returncode == 2 and "mesh[1].size" in bad_mesh.stderr
    no_argv = run(cli_cmd("run", "--mesh", "hosts=2"))
    assert no_argv.returncode == 2 and "training argv" in no_argv.stderr
    dash_m = run(cli_cmd("run", "--mesh", "hosts=2", "--", "-m"))
    assert dash_m.returncode == 2 and "spec.args" in dash_m.stderr


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
    assert "SIGINT received; passing it to every rank and stopping" in out
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


def start_times(out: str) -> dict[int, float]:
    return {int(r): float(t) for r, t in re.findall(r"preinit start rank (\d+) t=([\d.]+)", out)}


def test_every_rank_starts_at_once_so_work_before_init_runs_in_parallel():
    # As under torchrun: no rank waits for rank 0's TCPStore before its program starts. Had the
    # ranks waited, the last would start only after rank 0 finished its work and opened the store.
    work = 8.0
    result = run(cli_cmd("run", "--mesh", "procs=3", "--", "-m", f"{EXAMPLES}.preinit", "--work", str(work)))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    starts = start_times(out)
    assert sorted(starts) == [0, 1, 2], out
    assert max(starts.values()) - min(starts.values()) < work, f"a rank started after another's work: {starts}"
    assert out.count("preinit done rank") == 3


def test_a_rank_failing_before_rank_0_listens_fails_the_gang_at_once():
    # Rank 0 works 300 s before it would open its store: the run must end long before that.
    result = run(cli_cmd("run", "--mesh", "gpus=2", "--", "-m", f"{EXAMPLES}.preinit", "--work", "300",
                         "--fail-rank", "1", "--fail-code", "7"), timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 7, out
    assert "rank 1 exited with code 7; stopping the other ranks" in out


def manifest_file(tmp_path, spec_yaml: str):
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: spmd.monarch.dev/v1alpha1\nkind: SPMDJob\nmetadata: {name: local-rules}\nspec:\n"
        + textwrap.indent(textwrap.dedent(spec_yaml), "  ")
    )
    return str(path)


def test_active_deadline_is_honoured_locally(tmp_path):
    job = manifest_file(tmp_path, f"""\
        mesh: [{{name: procs, size: 2}}]
        args: ["-m", "{EXAMPLES}.fail_once", "--rank", "9", "--sleep", "600"]
        image: unused:1
        activeDeadlineSeconds: 3
        """)
    result = run(cli_cmd("run", "-f", job, "--grace-period", "2"), timeout=120)  # the ranks sleep 600 s
    out = result.stdout + result.stderr
    assert result.returncode == 124, out
    assert "activeDeadlineSeconds (3s) passed" in out and "DeadlineExceeded" in out


def test_suspend_and_cluster_only_env_are_refused_naming_the_field(tmp_path):
    suspended = manifest_file(tmp_path, """\
        mesh: [{name: procs, size: 1}]
        args: [x.py]
        image: i
        suspend: true
        """)
    result = run(cli_cmd("run", "-f", suspended))
    assert result.returncode == 2 and "spec.suspend" in result.stderr, result.stderr
    secret = manifest_file(tmp_path, """\
        mesh: [{name: procs, size: 1}]
        args: [x.py]
        image: i
        template:
          spec:
            containers:
              - name: trainer
                env: [{name: TOKEN, valueFrom: {secretKeyRef: {name: s, key: k}}}]
        """)
    result = run(cli_cmd("run", "-f", secret))
    assert result.returncode == 2 and "spec.template.spec.containers[0].env[0].valueFrom" in result.stderr, result.stderr


def test_what_has_no_local_meaning_is_said_not_silently_dropped(tmp_path):
    job = manifest_file(tmp_path, f"""\
        mesh: [{{name: procs, size: 2}}]
        args: ["{script('print_env.py')}"]
        image: registry.example/train:1
        gpusPerProc: 1
        shmSize: 2Gi
        scheduling: {{provider: Kueue, queue: team-a}}
        template:
          spec:
            nodeSelector: {{pool: gpu}}
        """)
    result = run(cli_cmd("run", "-f", job))
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("[monarch-spmd] not used locally: ")]
    for field in ("spec.image (registry.example/train:1)", "spec.shmSize (2Gi)", "spec.scheduling.provider (Kueue)",
                  "spec.scheduling.queue (team-a)", "spec.template.spec.nodeSelector"):
        assert sum(field in n for n in notes) == 1, (field, notes)  # one line per field
    envs = [json.loads(line.split("] ", 1)[1])["env"] for line in result.stdout.splitlines() if "{" in line]
    assert len(envs) == 2
    if runner.visible_gpus() >= 2:  # each rank's worker gets its own GPU, as a pod would
        assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in envs) == ["0", "1"]
    else:  # not a made-up CUDA_VISIBLE_DEVICES: a note says there are not enough GPUs here
        assert all("CUDA_VISIBLE_DEVICES" not in e or e["CUDA_VISIBLE_DEVICES"] == os.environ.get("CUDA_VISIBLE_DEVICES")
                   for e in envs)
        assert "[monarch-spmd] spec.gpusPerProc: 1 asks for 2 GPUs in all and this machine has" in result.stderr


def test_retryable_exit_codes_are_the_operators_rule(tmp_path):
    # 64 is permanent by default, but listed as retryable it is retried: on the cluster and here.
    job = manifest_file(tmp_path, f"""\
        mesh: [{{name: procs, size: 2}}]
        args: ["-m", "{EXAMPLES}.fail_once", "--rank", "1", "--code", "64"]
        image: i
        restartPolicy: {{maxRestarts: 1, retryableExitCodes: [64]}}
        """)
    result = run(cli_cmd("run", "-f", job))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "restarting the gang (restart 1 of at most 1)" in out


def test_the_per_host_layout_runs_one_worker_per_host_as_the_cluster_does():
    result = run(cli_cmd("run", "--mesh", "hosts=2,gpus=2", "--pod-layout", "PerHost", "--",
                         "-m", f"{EXAMPLES}.check_env"))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert ranks_ok(result.stdout, 4) == {0, 1, 2, 3}, out
    assert "ranks 0..1/4 on hosts=0" in out and "ranks 2..3/4 on hosts=1" in out
    assert "[rank 0] [rank 0]" not in out, "a PerHost worker's lines are prefixed once"


def test_a_failing_proc_of_a_per_host_worker_fails_the_gang():
    result = run(cli_cmd("run", "--mesh", "hosts=2,gpus=2", "--pod-layout", "PerHost", "--grace-period", "2", "--",
                         "-m", f"{EXAMPLES}.fail_once", "--rank", "3", "--code", "5", "--sleep", "600"), timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 5, out
    assert "monarch-spmd worker: rank 3 exited with code 5 (local rank 1)" in out
    assert "[monarch-spmd] rank 3 exited with code 5; stopping the other ranks" in out


def test_a_monarch_mode_job_is_refused_locally_naming_the_field(tmp_path):
    job = manifest_file(tmp_path, """\
        mesh: [{name: hosts, size: 1}, {name: gpus, size: 2}]
        mode: Monarch
        podLayout: PerHost
        image: i
        """)
    result = run(cli_cmd("run", "-f", job))
    assert result.returncode == 2 and "spec.mode: Monarch" in result.stderr, result.stderr
