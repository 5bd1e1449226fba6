"""The in-pod worker as a real process: env handed to the child, exit codes, signal forwarding,
input errors (64), and the rendezvous wait: a master that appears late is waited for, one that
never appears ends in a clear message and 75."""

from __future__ import annotations

import json
import shutil
import signal
import sys
import threading
import time

import pytest

from monarch_spmd.payload import worker

from .conftest import ROOT, free_port, pids_in, run, script, wait_dead, worker_cmd, worker_inputs


def child_json(stdout: str) -> dict:
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("{")))


def test_the_child_gets_the_contract_env_and_its_argv():
    port = free_port()
    env = worker_inputs(
        "hosts=2,gpus=2",
        "1,1",
        port,
        MONARCH_SPMD_RESTART_COUNT="1",
        MONARCH_SPMD_MAX_RESTARTS="2",
        MONARCH_SPMD_RUN_ID="uid-7",
    )
    result = run(worker_cmd(script("print_env.py"), "--lr", "0.1"), env)
    assert result.returncode == 0, result.stderr
    out = child_json(result.stdout)
    assert out["argv"] == [script("print_env.py"), "--lr", "0.1"]
    e = out["env"]
    assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == ("3", "4", "1", "2")
    assert (e["GROUP_RANK"], e["GROUP_WORLD_SIZE"], e["ROLE_RANK"], e["ROLE_NAME"]) == ("1", "2", "3", "default")
    assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("127.0.0.1", str(port))
    assert (e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"], e["TORCHELASTIC_RUN_ID"]) == ("1", "2", "uid-7")
    assert e["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    # the start line for pod logs
    assert "rank 3/4" in result.stderr and f"master 127.0.0.1:{port}" in result.stderr


def test_a_module_argv_runs_with_dash_m():
    result = run(worker_cmd("-m", "tests.programs.check_env", "--no-gloo"), worker_inputs("gpus=1", "0"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check_env rank 0/1: ok" in result.stdout


def test_pod_scope_gives_local_rank_zero():
    env = worker_inputs("hosts=2,gpus=4", "1,3", MONARCH_SPMD_LOCAL_RANK_SCOPE="pod")
    result = run(worker_cmd(script("print_env.py")), env)
    e = child_json(result.stdout)["env"]
    assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) == ("7", "8", "0", "1", "7")


def test_the_childs_exit_code_is_the_workers():
    result = run(worker_cmd(script("exit_with.py"), "7"), worker_inputs())
    assert result.returncode == 7
    assert "exit_with rank 0" in result.stdout


def test_a_child_killed_by_a_signal_gives_128_plus_the_signal():
    result = run(worker_cmd(script("kill_self.py"), str(int(signal.SIGKILL))), worker_inputs())
    assert result.returncode == 128 + signal.SIGKILL


def test_sigterm_reaches_the_training_process(spawn):
    proc = spawn(worker_cmd(script("trap_term.py")), env=worker_inputs())
    proc.wait_for(r"^ready")
    proc.proc.send_signal(signal.SIGTERM)  # to the worker only: it leads its own process group
    assert proc.finish(60) == 42
    assert "got SIGTERM" in proc.text


def test_the_console_script_runs_the_worker():
    exe = shutil.which("monarch-spmd")
    cmd = [exe] if exe else [sys.executable, "-m", "monarch_spmd.cli"]
    result = run([*cmd, "worker", "--", script("exit_with.py"), "5"], worker_inputs())
    assert result.returncode == 5


def test_the_shipped_files_run_as_a_script_without_the_project_installed(tmp_path):
    # What a pod has: the payload's files from the worker ConfigMap, no project, no site-packages.
    pkg = tmp_path / "opt" / "monarch-spmd" / "payload"
    pkg.mkdir(parents=True)
    for path in (ROOT / "monarch_spmd" / "payload").glob("*.py"):
        shutil.copy(path, pkg / path.name)
    env = worker_inputs("hosts=2", "0")
    env.pop("PYTHONPATH", None)
    result = run([sys.executable, "-S", str(pkg / "worker.py"), "--", script("print_env.py")], env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert child_json(result.stdout)["env"]["WORLD_SIZE"] == "2"


def test_missing_input_is_exit_64_naming_the_variable():
    env = worker_inputs()
    del env["MONARCH_SPMD_COORDS"]
    result = run(worker_cmd(script("exit_with.py"), "0"), env)
    assert result.returncode == worker.EX_USAGE == 64
    assert "MONARCH_SPMD_COORDS" in result.stderr
    assert "exit_with" not in result.stdout  # the child never ran


def test_bad_coordinates_are_exit_64_naming_the_range():
    result = run(worker_cmd(script("exit_with.py"), "0"), worker_inputs("hosts=2,gpus=2", "0,2"))
    assert result.returncode == 64
    assert "MONARCH_SPMD_COORDS" in result.stderr and "0..1" in result.stderr


def test_dash_m_alone_and_empty_argv_are_exit_64():
    for argv in (["-m"], []):
        result = run(worker_cmd(*argv), worker_inputs())
        assert result.returncode == 64, argv
        assert "argv" in result.stderr


@pytest.mark.parametrize("coords", ["0", "1"])
def test_no_rank_waits_for_the_masters_port(coords):
    # Nothing listens on the port: every rank starts its program at once, as under torchrun
    # (torch's TCPStore client retries a refused connection by itself).
    # Had it waited for the port, it would have ended with the rendezvous timeout (75).
    env = worker_inputs("hosts=2", coords, free_port(), MONARCH_SPMD_RENDEZVOUS_TIMEOUT="60")
    result = run(worker_cmd(script("exit_with.py"), "0"), env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"exit_with rank {coords}" in result.stdout
    assert "rendezvous timeout" not in result.stderr


def test_a_master_name_that_resolves_late_is_waited_for(tmp_path):
    # The worker runs in a private mount namespace whose /etc/hosts learns the name after 3 s,
    # as a headless Service's DNS record appears some time after its pod started.
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    env = worker_inputs("hosts=2", "1", free_port(), addr="late-master.test", MONARCH_SPMD_RENDEZVOUS_TIMEOUT="60")
    shell = f'mount --bind {hosts} /etc/hosts && exec "$@"'
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell, "sh", *worker_cmd(script("exit_with.py"), "0")]

    def learn() -> None:
        time.sleep(3)
        hosts.write_text("127.0.0.1 localhost\n127.0.0.1 late-master.test\n")

    thread = threading.Thread(target=learn, daemon=True)
    started = time.monotonic()
    thread.start()
    result = run(cmd, env, timeout=60)
    thread.join(10)
    assert result.returncode == 0, result.stderr
    assert "exit_with rank 1" in result.stdout
    assert time.monotonic() - started >= 3, "it waited for the name"


def test_a_name_that_never_resolves_ends_in_a_clear_message_and_75():
    env = worker_inputs("hosts=2", "1", 29500, addr="no-such-master.invalid", MONARCH_SPMD_RENDEZVOUS_TIMEOUT="2")
    result = run(worker_cmd(script("exit_with.py"), "0"), env, timeout=60)
    assert result.returncode == 75
    assert "'no-such-master.invalid' did not resolve within 2s" in result.stderr


def test_interrupting_the_wait_exits_without_running_the_child(spawn):
    env = worker_inputs("hosts=2", "1", free_port(), addr="no-such-master.invalid", MONARCH_SPMD_RENDEZVOUS_TIMEOUT="300")
    proc = spawn(worker_cmd(script("exit_with.py"), "0"), env=env)
    proc.wait_for(r"worker: rank 1/2")
    proc.proc.send_signal(signal.SIGINT)
    assert proc.finish(60) == 128 + signal.SIGINT
    assert "exit_with rank" not in proc.text



# --- the PerHost layout: one worker runs the procs of its host ---------------------------------


def host_inputs(mesh: str, coords: str, **extra: str) -> dict[str, str]:
    return worker_inputs(mesh, coords, MONARCH_SPMD_POD_LAYOUT="PerHost", **extra)


def test_a_per_host_worker_runs_every_proc_of_its_host_with_its_own_env():
    # The whole 1x3 mesh in one "pod": three procs join gloo and check every contract variable.
    result = run(worker_cmd("-m", "tests.programs.check_env"), host_inputs("hosts=1,gpus=3", "0"))
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(3):
        assert f"[rank {rank}] check_env rank {rank}/3: ok" in result.stdout, result.stdout + result.stderr
    assert "ranks 0..2/3 on hosts=0 of mesh hosts=1,gpus=3" in result.stderr


def test_a_failing_local_proc_stops_its_siblings_and_names_its_rank():
    result = run(worker_cmd("-m", "tests.programs.fail_once", "--rank", "4", "--code", "3", "--sleep", "600",
                            "--no-rendezvous"),
                 host_inputs("hosts=2,gpus=3", "1"), timeout=120)  # the siblings sleep 600 s
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == "monarch-spmd worker: rank 4 exited with code 3 (local rank 1) in restart 0; stopped the other local ranks"
    pids = pids_in(result.stdout + result.stderr)
    assert wait_dead(pids) == set()


def test_sigterm_reaches_every_local_proc(spawn):
    proc = spawn(worker_cmd(script("trap_term.py")), env=host_inputs("hosts=1,gpus=2", "0"))
    proc.wait_for(r"\] ready", count=2)
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.finish(60) == 42
    assert proc.text.count("got SIGTERM") == 2, proc.text
