"""`monarch-spmd run` against real torchrun (`python -m torch.distributed.run`), same flags, same script.

tests/programs/torchrun_env.py prints, on every rank, its whole environment, sys.argv and working
directory, then all-reduces over gloo. Each case runs it under torchrun and under monarch-spmd
with the same command line and compares rank by rank every variable either launcher added to the
environment it was started with. They must be equal, except for exactly these:

- TORCHELASTIC_USE_AGENT_STORE: "True" under torchrun, whose agent hosts the TCPStore; "False"
  here by default: rank 0 hosts it (``--agent-store`` gives torchrun's, docs/torchft.md);
- TORCHELASTIC_ERROR_FILE and TORCHELASTIC_SIGNALS_TO_HANDLE: torchrun's agent's own (a file per
  rank under its temporary folder; the signals it forwards), not set here;
- MASTER_PORT and TORCHELASTIC_RUN_ID where torchrun picks them per run (a free port and a uuid,
  without --master-port); with --master-port and --rdzv-id they are compared too;
- PYTHONUNBUFFERED (torchrun runs `python -u`); the worker's own inputs (MONARCH_SPMD_*) must not
  reach the program at all.

A new variable in a later torch release makes the comparison fail until it is looked at.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest

from .conftest import ROOT, cli_cmd, free_port

SCRIPT = "tests/programs/torchrun_env.py"
MODULE = "tests.programs.torchrun_env"
#: Set by torchrun's agent for itself; monarch-spmd has no agent.
AGENT_ONLY = {"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE"}
#: PYTHONUNBUFFERED only: the worker's own inputs (MONARCH_SPMD_*) must not reach the program.
OURS_ONLY = re.compile(r"^PYTHONUNBUFFERED$")
#: Variables a launcher sets; taken out of the environment both launchers start with.
LAUNCHER_VARS = re.compile(r"^(RANK|WORLD_SIZE|LOCAL_.*|GROUP_.*|ROLE_.*|MASTER_.*|TORCHELASTIC_.*|TORCH_NCCL_.*|"
                           r"OMP_NUM_THREADS|MONARCH_SPMD_.*|PYTHONUNBUFFERED|PET_.*)$")


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not LAUNCHER_VARS.match(k)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def two_cpus() -> None:
    """Both launchers count CPUs by affinity (`--nproc-per-node cpu`): keep it at two at most."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])


def ranks(stdout: str) -> dict[int, dict]:
    """The TORCHRUN_ENV line of each rank, by RANK."""
    out = {}
    for line in stdout.splitlines():
        if "TORCHRUN_ENV " in line:
            seen = json.loads(line.split("TORCHRUN_ENV ", 1)[1])
            out[int(seen["env"]["RANK"])] = seen
    return out


def launch(cmds: list[list[str]], env: dict[str, str], timeout: float = 240) -> str:
    """Runs the commands at once (torchrun's nodes), checks they all succeed; returns their stdout."""
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=two_cpus) for c in cmds]
    results = []
    try:
        for p in procs:
            results.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for cmd, p, (out, err) in zip(cmds, procs, results):
        assert p.returncode == 0, f"{cmd} exited {p.returncode}\n{out}\n{err}"
    return "".join(out for out, _ in results)


def torchrun(flags: list[str], env: dict[str, str], nodes: int = 1) -> dict[int, dict]:
    """Runs torchrun with ``flags``; with ``nodes`` > 1, one agent per node (--node-rank), all on this machine."""
    base = [sys.executable, "-m", "torch.distributed.run"]
    if nodes == 1:
        return ranks(launch([base + flags], env))
    return ranks(launch([base + ["--node-rank", str(n), *flags] for n in range(nodes)], env))


def monarch(flags: list[str], env: dict[str, str]) -> dict[int, dict]:
    return ranks(launch([cli_cmd("run", *flags)], env))


def added(seen: dict, env: dict[str, str]) -> dict[str, str]:
    """What the launcher added to (or changed in) the environment it was started with."""
    return {k: v for k, v in seen["env"].items() if env.get(k) != v}


def compare(flags: list[str], *, nodes: int = 1, per_run: frozenset[str] = frozenset()) -> dict[int, dict]:
    """Runs both launchers and checks every rank; returns torchrun's variables by rank."""
    env = base_env()
    theirs = torchrun(flags, env, nodes)
    ours = monarch(flags, env)
    assert sorted(theirs) == sorted(ours) == list(range(len(theirs))), (sorted(theirs), sorted(ours))
    report = {}
    for rank in sorted(theirs):
        t, o = added(theirs[rank], env), added(ours[rank], env)
        o = {k: v for k, v in o.items() if not OURS_ONLY.match(k)}
        assert theirs[rank]["argv"] == ours[rank]["argv"], rank
        assert theirs[rank]["cwd"] == ours[rank]["cwd"], rank
        assert set(t) - AGENT_ONLY == set(o), (rank, sorted(set(t) ^ set(o)))
        differ = {k for k in o if t[k] != o[k]}
        assert differ == {"TORCHELASTIC_USE_AGENT_STORE", *per_run}, (rank, {k: (t[k], o[k]) for k in differ})
        assert (t["TORCHELASTIC_USE_AGENT_STORE"], o["TORCHELASTIC_USE_AGENT_STORE"]) == ("True", "False")
        assert "TORCHELASTIC_ERROR_FILE" in t  # (TORCHELASTIC_SIGNALS_TO_HANDLE came with later torch releases)
        report[rank] = t
    return report


def test_one_node_with_a_fixed_port_and_run_id_matches_torchrun_in_every_variable():
    port = free_port()
    env = compare(["--nproc-per-node", "2", "--master-port", str(port), "--rdzv-id", "parity", "--max-restarts", "1",
                   "--role", "trainer", "-m", MODULE, "--gloo", "--lr", "0.1"])
    assert env[1]["LOCAL_RANK"] == "1" and env[1]["ROLE_NAME"] == "trainer" and env[1]["MASTER_PORT"] == str(port)
    assert env[0]["TORCHELASTIC_RUN_ID"] == "parity" and env[0]["TORCHELASTIC_MAX_RESTARTS"] == "1"


def test_two_nodes_match_two_torchrun_agents():
    # torchrun: one agent per node (--node-rank 0 and 1); monarch-spmd runs both nodes itself.
    port = free_port()
    env = compare(["--nnodes", "2", "--nproc_per_node", "2", "--master-port", str(port), "--rdzv-id", "two",
                   SCRIPT, "--gloo"], nodes=2)
    assert [(env[r]["GROUP_RANK"], env[r]["LOCAL_RANK"]) for r in range(4)] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {env[r]["GROUP_WORLD_SIZE"] for r in range(4)} == {"2"}


def test_standalone_matches_except_the_port_and_run_id_torchrun_picks():
    env = compare(["--standalone", "--nproc-per-node", "2", SCRIPT, "--gloo"],
                  per_run=frozenset({"MASTER_PORT", "TORCHELASTIC_RUN_ID"}))
    assert env[0]["MASTER_ADDR"] == "localhost"
    uuid.UUID(env[0]["TORCHELASTIC_RUN_ID"])


def test_nproc_per_node_cpu_counts_cpus_as_torchrun_does():
    env = compare(["--nproc-per-node", "cpu", SCRIPT], per_run=frozenset({"MASTER_PORT", "TORCHELASTIC_RUN_ID"}))
    assert len(env) == min(2, len(os.sched_getaffinity(0)))


def log_layout(root: str) -> tuple[list[str], set[str]]:
    """The run folders under ``root`` and the files under them, relative to their run folder."""
    runs = sorted(os.listdir(root))
    files = set()
    for run_dir in runs:
        for path, _, names in os.walk(os.path.join(root, run_dir)):
            for name in names:
                files.add(os.path.relpath(os.path.join(path, name), os.path.join(root, run_dir)))
    return runs, files


def test_log_dir_tee_and_redirects_lay_the_files_out_as_torchrun_does(tmp_path):
    # torchrun's DefaultLogsSpecs: <log dir>/<run id>_<random>/attempt_<N>/<local rank>/{stdout,stderr}.log,
    # --redirects 2: stderr only in the files; --tee 1: stdout in the files and on the console.
    env = base_env()
    theirs, ours = tmp_path / "torchrun", tmp_path / "monarch"
    flags = ["--nproc-per-node", "2", "--master-port", str(free_port()), "--rdzv-id", "logs", "--redirects", "2",
             "--tee", "1", SCRIPT]
    torchrun_ranks = ranks(launch([[sys.executable, "-m", "torch.distributed.run", "--log-dir", str(theirs), *flags]], env))
    our_ranks = ranks(launch([cli_cmd("run", "--log-dir", str(ours), *flags)], env))
    assert sorted(torchrun_ranks) == sorted(our_ranks) == [0, 1]  # stdout reached the console in both
    (their_runs, their_files), (our_runs, our_files) = log_layout(str(theirs)), log_layout(str(ours))
    assert len(their_runs) == len(our_runs) == 1 and our_runs[0].startswith("logs_") and their_runs[0].startswith("logs_")
    layout = {"attempt_0/0/stdout.log", "attempt_0/0/stderr.log", "attempt_0/1/stdout.log", "attempt_0/1/stderr.log"}
    assert their_files == our_files == layout, (their_files, our_files)
    for root, runs in ((theirs, their_runs), (ours, our_runs)):
        for local in (0, 1):
            with open(os.path.join(root, runs[0], "attempt_0", str(local), "stdout.log")) as f:
                assert "TORCHRUN_ENV " in f.read()
    # The error file torchrun's @record writes to is where torchrun puts it, in both.
    for seen, root, runs in ((torchrun_ranks, theirs, their_runs), (our_ranks, ours, our_runs)):
        assert seen[1]["env"]["TORCHELASTIC_ERROR_FILE"] == os.path.join(root, runs[0], "attempt_0", "1", "error.json")
