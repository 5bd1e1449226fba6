"""`monarch-spmd run` stops as safely as torchrun: SIGINT reaches every rank as SIGINT (a
KeyboardInterrupt whose `finally` saves a checkpoint), SIGTERM and SIGHUP as themselves, and when
the runner itself is killed (SIGKILL) its workers and their ranks go with it. After each, `ps`
shows no worker, no rank and no child of a rank. The real runner, as a subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from .conftest import cli_cmd

PROGRAMS = "tests.programs"


def ps_lines(token: str) -> list[str]:
    """Every process whose command line holds ``token``, as `ps` shows it."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,pgid,stat,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines()[1:] if token in line and " ps -eo " not in line]


def ps_pids(pids: set[int]) -> list[str]:
    """The `ps` lines of those of ``pids`` that still exist (zombies aside)."""
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines()[1:]:
        pid, stat = line.split()[:2]
        if int(pid) in pids and not stat.startswith("Z"):
            rows.append(line)
    return rows


def nothing_left(token: str, pids: set[int], timeout: float = 20.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = ps_lines(token) + ps_pids(pids)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def start(spawn, tmp_path, *flags: str):
    """2 nodes x 2 procs, torchrun's command line; every rank starts a grandchild."""
    return spawn(cli_cmd("run", "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "3", *flags,
                         "-m", f"{PROGRAMS}.resume_training", "--checkpoint-dir", str(tmp_path), "--steps", "100000",
                         "--step-seconds", "0.2", "--grandchild"))


def wait_for_steps(folder, ranks: int, proc, timeout: float = 120.0) -> None:
    """Waits until every rank saved a checkpoint (took a step)."""
    deadline = time.monotonic() + timeout
    while not all((folder / f"rank{r}.json").exists() for r in range(ranks)):
        assert time.monotonic() < deadline, proc.text
        time.sleep(0.1)


def children(text: str) -> set[int]:
    return {int(p) for p in re.findall(r"(?:\bpid|grandchild pid) (\d+)", text)}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_reaches_every_rank_as_itself_and_nothing_is_left(spawn, tmp_path, signum):
    proc = start(spawn, tmp_path, "--shutdown-timeout", "10")
    proc.wait_for(r"resume_training rank \d grandchild pid", count=4)
    wait_for_steps(tmp_path, 4, proc)  # every rank is in its training loop (past init_process_group)
    pids = children(proc.text)
    assert len(pids) == 2 + 4 + 4, proc.text  # two workers, four ranks, four grandchildren
    proc.proc.send_signal(signum)
    assert proc.finish(60) == 128 + signum, proc.text
    out = proc.text
    assert f"{signal.Signals(signum).name} received; passing it to every rank and stopping" in out
    assert "restarting the gang" not in out, "a stop asked for is not a failure to restart from"
    if signum == signal.SIGINT:  # Ctrl-C is Ctrl-C: KeyboardInterrupt, and the finally block ran
        for rank in range(4):
            assert re.search(rf"\[rank {rank}\] resume_training rank {rank}: KeyboardInterrupt at step \d+", out), out
            assert re.search(rf"\[rank {rank}\] resume_training rank {rank}: checkpoint saved at step \d+", out), out
            assert json.loads((tmp_path / f"rank{rank}.json").read_text())["step"] > 0
    assert nothing_left(str(tmp_path), pids) == []


def test_killing_the_runner_takes_its_workers_and_ranks_with_it(spawn, tmp_path):
    proc = start(spawn, tmp_path, "--shutdown-timeout", "3")
    proc.wait_for(r"resume_training rank \d grandchild pid", count=4)
    pids = children(proc.text)
    assert len(pids) == 10, proc.text
    os.kill(proc.proc.pid, signal.SIGKILL)  # no handler runs in the runner
    assert proc.proc.wait(30) == -signal.SIGKILL
    assert nothing_left(str(tmp_path), pids) == []


def test_killing_a_worker_leaves_none_of_its_ranks_and_the_runner_replaces_it(spawn, tmp_path):
    proc = spawn(cli_cmd("run", "--mesh", "hosts=3", "--max-restarts", "1", "--grace-period", "3", "--",
                         "-m", f"{PROGRAMS}.resume_training", "--checkpoint-dir", str(tmp_path), "--steps", "30",
                         "--step-seconds", "0.2"))
    proc.wait_for(r"resume_training rank \d pid \d+ restart 0", count=3)
    worker = int(re.search(r"\[rank 2\] monarch-spmd worker: rank 2/3 .* pid (\d+)", proc.text).group(1))
    rank2 = int(re.search(r"resume_training rank 2 pid (\d+) restart 0", proc.text).group(1))
    os.kill(worker, signal.SIGKILL)
    assert proc.finish(180) == 0, proc.text
    out = proc.text
    assert f"the worker of rank 2 (pid {worker}) was killed by SIGKILL (exit code 137); starting a new one" in out
    for rank in range(3):
        assert f"resume_training rank {rank} done at step 30 (restart 1, all_reduce sum ok)" in out, out
    assert ps_pids({worker, rank2}) == []


def test_killing_rank_0s_worker_recreates_the_gang_on_the_same_port(spawn, tmp_path):
    # The local twin of losing the rank-0 pod: the coordinator is gone, so the gang is recreated.
    proc = spawn(cli_cmd("run", "--mesh", "hosts=2", "--max-restarts", "1", "--grace-period", "3", "--",
                         "-m", f"{PROGRAMS}.resume_training", "--checkpoint-dir", str(tmp_path), "--steps", "25",
                         "--step-seconds", "0.2"))
    proc.wait_for(r"resume_training rank \d pid \d+ restart 0", count=2)
    wait_for_steps(tmp_path, 2, proc)  # a step done: a checkpoint to resume from
    worker = int(re.search(r"\[rank 0\] monarch-spmd worker: rank 0/2 .* pid (\d+)", proc.text).group(1))
    rank0 = int(re.search(r"resume_training rank 0 pid (\d+) restart 0", proc.text).group(1))
    os.kill(worker, signal.SIGKILL)
    assert proc.finish(180) == 0, proc.text
    out = proc.text
    assert "the worker of rank 0 was killed by SIGKILL (exit code 137); recreating the gang (restart 1 of at most 1)" in out
    assert "new gang at restart 1: 2 ranks" in out
    masters = set(re.findall(r"resume_training rank \d pid \d+ restart \d from step \d+ master (\S+)", out))
    assert len(masters) == 1, masters
    for rank in range(2):
        assert re.search(rf"resume_training rank {rank} pid \d+ restart 1 from step [1-9]", out), out
        assert f"resume_training rank {rank} done at step 25 (restart 1, all_reduce sum ok)" in out
    assert ps_pids({worker, rank0}) == []


def test_a_killed_worker_is_not_replaced_when_no_restart_is_left(spawn, tmp_path):
    proc = spawn(cli_cmd("run", "--mesh", "hosts=2", "--grace-period", "3", "--", "-m", f"{PROGRAMS}.resume_training",
                         "--checkpoint-dir", str(tmp_path), "--steps", "100000", "--step-seconds", "0.2"))
    wait_for_steps(tmp_path, 2, proc)
    worker = int(re.search(r"\[rank 1\] monarch-spmd worker: rank 1/2 .* pid (\d+)", proc.text).group(1))
    os.kill(worker, signal.SIGKILL)
    assert proc.finish(120) == 137, proc.text
    last = proc.text.strip().splitlines()[-1]
    assert last == (f"[monarch-spmd] job failed: the worker of rank 1 (pid {worker}) was killed by SIGKILL (exit code 137) "
                    "(restarts used up: 0 of at most 0)"), proc.text
    assert "starting a new one" not in proc.text
    assert nothing_left(str(tmp_path), children(proc.text)) == []
