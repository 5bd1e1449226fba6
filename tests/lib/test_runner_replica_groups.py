"""`monarch-spmd run --replica-groups G`: torchft's replica groups on this machine, and the agent
store they need. The real runner as a subprocess, real torchft (a Lighthouse, Managers, gloo),
training written as torchft's examples write it (tests/programs/torchft_train.py): every
assertion is on what a user sees (lines, exit codes) and on which processes are left. Orderings
come from the ranks' own timestamps and progress files, never from a sleep."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

from .conftest import cli_cmd, free_port

pytest.importorskip("torchft")

PROGRAM = "tests.programs.torchft_train"
STEP = re.compile(r"^\[group (\d)\] \[rank (\d)\] torchft_train group \1 rank \2 pid (\d+) attempt (\d+) step (\d+) "
                  r"participants (\d+) t ([\d.]+) w \S+$", re.M)


def steps(text: str) -> list[dict]:
    return [{"group": int(g), "rank": int(r), "pid": int(p), "attempt": int(a), "step": int(s), "t": float(t)}
            for g, r, p, a, s, _, t in STEP.findall(text)]


def own_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[monarch-spmd] ")]


def pids(text: str) -> set[int]:
    """Every process the run said it started: the Lighthouses, the workers, the agent stores, the ranks."""
    return {int(p) for p in re.findall(r"\bpid (\d+)", text)}


def left(candidates: set[int], timeout: float = 15.0) -> set[int]:
    """Those of ``candidates`` still running (not zombies) after ``timeout``: none may be."""
    def running(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, IndexError):
            return False
        return state != "Z" and any(w in cmdline for w in (b"monarch_spmd", b"torchft", b"TCPStore"))

    deadline = time.monotonic() + timeout
    while True:
        alive = {p for p in candidates if running(p)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def start(spawn, *flags: str, program: tuple[str, ...] = ()):
    return spawn(cli_cmd("run", *flags, "--nproc-per-node", "2", "--grace-period", "3", "-m", PROGRAM, *program))


def test_a_torchft_script_trains_in_one_group_with_torchfts_variables_and_the_agent_store(spawn):
    proc = start(spawn, "--replica-groups", "1", program=("--steps", "5"))
    assert proc.finish(240) == 0, proc.text
    out = proc.text
    port = re.search(r"^\[monarch-spmd\] lighthouse pid \d+ listening on http://127\.0\.0\.1:(\d+) \(min replicas 1\)$",
                     out, re.M)
    assert port, out
    master = re.search(r"^\[monarch-spmd\] group 0: starting its runner, master port (\d+), REPLICA_GROUP_ID=0$", out, re.M)
    assert master, out
    for rank in (0, 1):
        env = re.search(rf"^\[group 0\] \[rank {rank}\] torchft_train env group 0 rank {rank} pid \d+ attempt 0 (.*)$",
                        out, re.M)
        assert env, out
        assert env.group(1).split() == ["REPLICA_GROUP_ID=0", "NUM_REPLICA_GROUPS=1",
                                        f"TORCHFT_LIGHTHOUSE=http://127.0.0.1:{port.group(1)}",
                                        "TORCHELASTIC_USE_AGENT_STORE=True", f"MASTER_PORT={master.group(1)}",
                                        "WORLD_SIZE=2"], env.group(0)
        assert f"[group 0] [rank {rank}] torchft_train group 0 rank {rank} done" in out
    assert [s["step"] for s in steps(out) if s["rank"] == 0] == [1, 2, 3, 4, 5]
    assert own_lines(out)[-1] == "[monarch-spmd] 1 of 1 replica groups finished", own_lines(out)
    assert not left(pids(out))


@pytest.mark.parametrize("shape", [("--nproc-per-node", "2"), ("--mesh", "procs=2", "--")],
                         ids=["one-worker", "a-worker-per-rank"])
def test_init_process_group_is_a_client_of_the_agent_store_also_after_a_restart_in_place(spawn, shape):
    # A torchrun-style script (gloo, env://) with the agent store on: torch makes every rank a
    # client of the store at MASTER_ADDR:MASTER_PORT; rank 1 fails once, the gang restarts in place.
    # With a worker per rank the store is rank 0's worker's, and rank 1 reaches it from another worker.
    proc = spawn(cli_cmd("run", "--agent-store", "--max-restarts", "1", *shape, "-m",
                         "tests.programs.fail_once", "--rank", "1"))
    assert proc.finish(240) == 0, proc.text
    out = proc.text
    assert re.search(r"agent store listening on \S+ \(TORCHELASTIC_USE_AGENT_STORE=True\), pid \d+", out), out
    assert "[rank 1] fail_once rank 1: exiting with code 3 (restart 0)" in out
    for rank in (0, 1):
        assert f"[rank {rank}] fail_once rank {rank}: joined the gloo group" in out
        assert f"[rank {rank}] fail_once rank {rank}: done (restart 1)" in out
    assert not left(pids(out))


def test_a_group_that_fails_restarts_alone_while_the_others_step_on(spawn, tmp_path):
    progress = tmp_path / "progress"
    progress.mkdir()
    proc = start(spawn, "--replica-groups", "3", "--max-restarts", "1",
                 program=("--steps", "30", "--step-seconds", "0.05", "--crash-group", "1", "--crash-rank", "1",
                          "--crash-step", "4", "--marker", str(tmp_path / "crashed"), "--progress-dir", str(progress)))
    assert proc.finish(300) == 0, proc.text
    out = proc.text
    seen = steps(out)
    crash = re.search(r"^\[group 1\] \[rank 1\] torchft_train group 1 rank 1 pid \d+ crashing at step 4 t ([\d.]+)$",
                      out, re.M)
    assert crash, out
    crashed_at = float(crash.group(1))
    back = [s for s in seen if s["group"] == 1 and s["attempt"] == 1]
    assert back, out
    back_at = min(s["t"] for s in back)
    assert "[group 1] monarch-spmd worker: restart 1: starting ranks 0..1 again (TORCHELASTIC_RESTART_COUNT=1)" in out
    for g in (0, 2):
        mine = [s for s in seen if s["group"] == g]
        assert {s["attempt"] for s in mine} == {0}, f"group {g} restarted"
        for rank in (0, 1):
            assert len({s["pid"] for s in mine if s["rank"] == rank}) == 1, f"group {g} rank {rank} changed pid"
        assert f"[group {g}] monarch-spmd worker: restart" not in out
        between = [s["step"] for s in mine if crashed_at < s["t"] < back_at]
        assert len(between) >= 2, (g, crashed_at, back_at, between)  # it stepped while group 1 was down
        assert f"[group {g}] [rank 0] torchft_train group {g} rank 0 done" in out
    assert "[group 1] [rank 0] torchft_train group 1 rank 0 done" in out
    said = own_lines(out)
    assert said[-1] == "[monarch-spmd] 3 of 3 replica groups finished", said
    assert not [line for line in said if "failed" in line], said
    assert not left(pids(out))


def test_below_min_replicas_every_group_is_stopped_and_the_run_names_the_group(spawn):
    proc = start(spawn, "--replica-groups", "2", "--min-replicas", "2", "--max-restarts", "0",
                 program=("--steps", "200", "--fail-group", "1", "--fail-rank", "1", "--fail-step", "3",
                          "--code", "1"))
    assert proc.finish(240) == 1, proc.text
    out = proc.text
    said = own_lines(out)
    assert ("[monarch-spmd] group 1 failed for good with exit code 1; 1 of 2 groups are running or finished, fewer "
            "than --min-replicas 2: stopping every group") in said, said
    assert said[-1] == ("[monarch-spmd] replica groups failed: group 1 exited with code 1, leaving fewer than "
                        "--min-replicas 2 of 2 groups running or finished"), said
    assert any(re.fullmatch(r"\[monarch-spmd\] group 0 stopped \(exit code \d+\)", line) for line in said), said
    assert not any(s["step"] == 200 for s in steps(out)), "group 0 was stopped, not left to finish"
    assert not left(pids(out))


def test_a_group_failed_for_good_is_named_when_the_others_finish(spawn):
    proc = start(spawn, "--replica-groups", "2", "--max-restarts", "0",
                 program=("--steps", "15", "--fail-group", "1", "--fail-rank", "1", "--fail-step", "3", "--code", "1"))
    assert proc.finish(240) == 0, proc.text
    out = proc.text
    said = own_lines(out)
    assert ("[monarch-spmd] group 1 failed for good with exit code 1 (its restarts used up, or a permanent failure); "
            "1 of 2 groups are running or finished, at least --min-replicas 1: the others go on") in said, said
    assert max(s["step"] for s in steps(out) if s["group"] == 0) == 15
    assert said[-1] == "[monarch-spmd] 1 of 2 replica groups finished; group 1 failed for good (exit code 1)", said
    assert not left(pids(out))


def test_the_lighthouse_killed_is_started_again_and_training_finishes(spawn):
    # A restarted Lighthouse starts its quorum ids at 1 again (torchft 0.2.0): a step in flight may
    # then see its quorum split and fail, and that group restarts in place within its budget.
    proc = start(spawn, "--replica-groups", "2", "--max-restarts", "2",
                 program=("--steps", "40", "--step-seconds", "0.05"))
    text = proc.wait_for(r"^\[group 0\] \[rank 0\] torchft_train group 0 rank 0 pid \d+ attempt 0 step 5 ", timeout=240)
    first = int(re.search(r"^\[monarch-spmd\] lighthouse pid (\d+) listening", text, re.M).group(1))
    os.kill(first, signal.SIGKILL)
    proc.wait_for(r"^\[monarch-spmd\] lighthouse pid \d+ listening on .*, restarted\)$")
    assert proc.finish(240) == 0, proc.text
    out = proc.text
    said = own_lines(out)
    port = re.search(r"listening on http://127\.0\.0\.1:(\d+)", out).group(1)
    assert (f"[monarch-spmd] the lighthouse (pid {first}) exited with code 137; starting it again on port {port} (the "
            "groups' quorums wait for it meanwhile)") in said, said
    for g in (0, 1):
        last = max(s["attempt"] for s in steps(out) if s["group"] == g)
        assert last <= 2 and max(s["step"] for s in steps(out) if s["group"] == g and s["attempt"] == last) == 40
    assert said[-1] == "[monarch-spmd] 2 of 2 replica groups finished", said
    assert not left(pids(out))


def test_bad_flags_start_nothing(spawn):
    began = time.monotonic()
    proc = start(spawn, "--replica-groups", "3", "--min-replicas", "4")
    assert proc.finish(60) == 2
    out = proc.text
    assert "monarch-spmd run: --min-replicas: 4 is out of range; valid is 1..3 (at most --replica-groups 3)" in out
    assert "lighthouse" not in out.replace("--lighthouse", "") and "[group" not in out and "pid" not in out, out
    assert time.monotonic() - began < 30


def test_sigterm_reaches_every_group_and_nothing_is_left(spawn):
    proc = start(spawn, "--replica-groups", "2", program=("--steps", "500", "--step-seconds", "0.05"))
    for g in (0, 1):
        proc.wait_for(rf"^\[group {g}\] \[rank 1\] torchft_train group {g} rank 1 pid \d+ attempt 0 step 2 ", timeout=240)
    os.kill(proc.proc.pid, signal.SIGTERM)
    assert proc.finish(120) == 128 + signal.SIGTERM, proc.text
    out = proc.text
    said = own_lines(out)
    assert "[monarch-spmd] SIGTERM received; passing it to every group and stopping the lighthouse last" in said
    for g in (0, 1):
        assert f"[group {g}] [monarch-spmd] SIGTERM received; passing it to every rank and stopping" in out, out[-3000:]
        assert any(line.startswith(f"[monarch-spmd] group {g} stopped (exit code ") for line in said), said
    assert not left(pids(out))


AGENT = """
import sys, time
from monarch_spmd.payload.agentstore import AgentStore
store = AgentStore.start("127.0.0.1", int(sys.argv[1]))
print(store.pid, flush=True)
from torch.distributed import TCPStore
client = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, wait_for_workers=False)
client.set("manager_addr", "old")
store.renew()  # a fresh store for the next round: the old round's key is gone
client = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, wait_for_workers=False)
print("renewed", client.check(["manager_addr"]), flush=True)
time.sleep(600)
"""


def test_the_agent_store_is_fresh_each_round_and_dies_with_its_agent(spawn):
    agent = spawn([sys.executable, "-c", AGENT, str(free_port())])
    text = agent.wait_for(r"^renewed ", timeout=120)
    assert "renewed False" in text, text
    store = int(text.splitlines()[0])
    os.kill(agent.proc.pid, signal.SIGKILL)  # the agent dies however it dies: its store goes too
    agent.finish(30)
    assert not left({store}), f"the agent store (pid {store}) outlived its agent"
