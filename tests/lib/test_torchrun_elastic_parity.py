"""The same elastic job under the real torchrun and under monarch-spmd's workers: every rank of
every phase is given the same torchrun variables.

One training script, monarch_spmd.examples.elastic_train (it prints ``elastic_train start {json}``
with its variables on every start), runs twice on this machine, each time as three "nodes" of two
processes (torchrun's ``--nnodes 2:3 --nproc-per-node 2``):

* **torchrun**: three agents, ``python -m torch.distributed.run --nnodes 2:3 --nproc-per-node 2
  --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT --rdzv-id parity --max-restarts 3
  --monitor-interval 0.5 --rdzv-conf last_call_timeout=5``, each started as a process group of
  its own, with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (with torchrun's default shared store a
  shrink never recovers: docs/design/torchrun-elastic.md). Agent 0 is started first and the test
  waits until it listens on PORT (it then hosts the rendezvous store), then agents 1 and 2.
* **monarch-spmd**: three PerHost workers started as pods are (tests/lib/test_agent.py's Gang),
  ``MONARCH_SPMD_MIN_MEMBERS=2`` and a 2 s ``MONARCH_SPMD_ELASTIC_WAIT``, as
  tests/lib/test_elastic_local.py starts them.

In both, once rank 0 trains at world 6 (phase a), node 1 is lost: torchrun's agent 1 and its
workers (which torchrun starts in sessions of their own, so the agent's process group does not
reach them) are SIGKILLed; our worker 1's process group is SIGKILLed (its ranks die with it).
Phase b is the smaller job's first training step at world 4. For each phase, the multiset of
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK,
ROLE_WORLD_SIZE) over its ranks must be the same under both; so must each node's own rows.
Both tables are printed, with the seconds from the kill to rank 0's first step at world 4.

``last_call_timeout=5``: torch 2.14.1's c10d rendezvous honours it (registry's c10d handler ->
dynamic_rendezvous.create_handler reads ``last_call_timeout`` from ``--rdzv-conf``); it is the
wait, once a round has its minimum of nodes, for more to come. Left at its default (30 s) the
shrink takes about 52 s (15 s for the dead node's heartbeats to expire, 30 s of last call, then
the workers' start); with 5 s it takes 22-27 s, which keeps the whole test under a minute on
two cores. The heartbeat expiry (keep-alive 5 s x 3) is left at its default. Growing back to
three nodes is not compared: torchrun's grow needs a new agent and is the slow part.

Not compared, deliberately:

* TORCHELASTIC_RESTART_COUNT: per agent in torchrun (an agent counts only its own workers'
  failures; a node loss counts where the survivors' collectives failed), one count for the gang
  here.
* MASTER_PORT: in torchrun's unshared mode rank 0's worker hosts a store on a port picked anew
  every round; here it is the job's fixed port.
* MASTER_ADDR: torchrun gives group rank 0's FQDN (``localhost`` on this machine), here the
  address the worker was given (127.0.0.1).
* TORCHELASTIC_RUN_ID: torchrun's ``--rdzv-id``; here MONARCH_SPMD_RUN_ID, the job's uid that
  the operator sets (unset in this test, so the worker's default ``none``).
* Which node gets which GROUP_RANK is compared only under an asserted assumption: torchrun sorts
  the agents by (hostname, pid), monarch-spmd by pod index. On one host, with the agents started
  in the order 0, 1, 2, the pid order is the index order (the test asserts the agents' pids
  increase), so node 1's survivors get the same GROUP_RANKs in both. The per-phase multisets do
  not depend on it.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from benchmarks.common import table
from benchmarks.torchrun_elastic_reference import clean_env, descendants, listening

from .conftest import alive, free_port, wait_dead
from .test_agent import Gang

COMPARED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_WORLD_SIZE")
NODES, PROCS, LOST = 3, 2, 1
PHASES = {"a: 3 nodes": NODES * PROCS, "b: node 1 lost": (NODES - 1) * PROCS}
LAST_CALL = 5
WAIT = "2"
TRAIN = ["-m", "monarch_spmd.examples.elastic_train", "--steps", "1000000", "--step-seconds", "0.05",
         "--report-every", "1"]
DECODER = json.JSONDecoder()


def starts(lines: list[str]) -> list[dict]:
    """Every ``elastic_train start {json}`` in ``lines``. Ranks that share an output pipe write it
    unbuffered (torchrun runs ``python -u``), so another rank's line can land before the newline:
    each record is decoded from where it starts, not up to the end of the line."""
    out = []
    for line in lines:
        for m in re.finditer(r"elastic_train start ", line):
            out.append(DECODER.raw_decode(line, m.end())[0])
    return out


def phase_ranks(recs: dict[int, list[dict]], world: int) -> dict[int, tuple[int, dict]]:
    """RANK -> (node, env) of the last start at ``world`` ranks of each rank (the one that trained)."""
    last = {}
    for node, node_recs in recs.items():
        for rec in node_recs:
            if rec["env"]["WORLD_SIZE"] == str(world):
                last[int(rec["env"]["RANK"])] = (node, rec["env"])
    return last


class Run:
    """What one launcher gave: phase -> RANK -> (node, env), the seconds from the loss to rank 0's
    first step at world 4, the start lines seen per phase."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.phases: dict[str, dict[int, tuple[int, dict]]] = {}
        self.seconds: float | None = None
        self.starts_seen: dict[str, int] = {}

    def record(self, readers: dict[int, object], marks: dict[int, int]) -> None:
        """Phase a: every start at world 6; phase b: starts at world 4 printed after the kill
        (``marks``: how many lines each node had printed by then)."""
        (a, world_a), (b, world_b) = PHASES.items()
        before = {i: starts(r.lines) for i, r in readers.items()}
        after = {i: starts(r.lines[marks[i]:]) for i, r in readers.items() if i != LOST}
        self.phases[a] = phase_ranks(before, world_a)
        self.phases[b] = phase_ranks(after, world_b)
        self.starts_seen[a] = sum(rec["env"]["WORLD_SIZE"] == str(world_a) for recs in before.values() for rec in recs)
        self.starts_seen[b] = sum(rec["env"]["WORLD_SIZE"] == str(world_b) for recs in after.values() for rec in recs)

    def tuples(self, phase: str) -> collections.Counter:
        return collections.Counter(tuple(env[k] for k in COMPARED) for _, env in self.phases[phase].values())

    def by_node(self, phase: str) -> dict[int, list[tuple]]:
        out: dict[int, list[tuple]] = {}
        for node, env in self.phases[phase].values():
            out.setdefault(node, []).append(tuple(env[k] for k in COMPARED))
        return {node: sorted(rows) for node, rows in sorted(out.items())}

    def show(self) -> str:
        rows = []
        for phase, ranks in self.phases.items():
            for rank in sorted(ranks):
                node, env = ranks[rank]
                rows.append([phase, node, *(env[k] for k in COMPARED), env["TORCHELASTIC_RESTART_COUNT"],
                             f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", env["TORCHELASTIC_RUN_ID"]])
        headers = ["phase", "node", *COMPARED, "RESTART_COUNT*", "MASTER*", "RUN_ID*"]
        seen = ", ".join(f"{p}: {n}" for p, n in self.starts_seen.items())
        return (f"\n# {self.name} (* not compared)\n\n{table(headers, rows)}\n\nstart lines seen per phase: {seen}\n"
                f"seconds from the kill of node {LOST} to rank 0's first step at world "
                f"{PHASES['b: node 1 lost']}: {self.seconds:.2f}")


def wait_until(cond, timeout: float, what: str, reader) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline or reader.proc.poll() is not None:
            raise AssertionError(f"gave up waiting for {what}; output:\n{reader.text[-5000:]}")
        time.sleep(0.05)


def world_steps(reader, world: int) -> int:
    return sum(1 for line in list(reader.lines) if re.search(rf"elastic_train step \d+ world {world}\b", line))


def started_pids(readers) -> set[int]:
    return {rec["pid"] for r in readers for rec in starts(list(r.lines))}


def sigkill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_agent(pid: int) -> list[int]:
    """A node lost under torchrun: its agent's process group and every process below the agent
    (its workers lead sessions of their own), all SIGKILLed."""
    tree = descendants(pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    sigkill(tree)
    return [pid, *tree]


def run_torchrun(spawn, ckpt: Path) -> Run:
    run = Run("torchrun --nnodes 2:3 (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, last_call_timeout=5)")
    port = free_port()
    env = clean_env(share_store=False)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", f"2:{NODES}", "--nproc-per-node", str(PROCS),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "parity",
            "--rdzv-conf", f"last_call_timeout={LAST_CALL}", "--max-restarts", "3", "--monitor-interval", "0.5",
            *TRAIN, "--checkpoint-dir", str(ckpt)]
    agents: dict[int, object] = {}
    seen: set[int] = set()
    try:
        agents[0] = spawn(argv, env=env)
        # The first agent to bind the endpoint hosts the rendezvous store: agent 0, never the lost node.
        wait_until(lambda: listening(port), 120, f"agent 0 to listen on {port}", agents[0])
        for i in range(1, NODES):
            agents[i] = spawn(argv, env=env)
        pids = [agents[i].proc.pid for i in range(NODES)]
        assert pids == sorted(pids), f"agents' pids {pids}: node order by pid is not index order"
        agents[0].wait_for(r"elastic_train step \d+ world 6\b", timeout=240)
        seen |= started_pids(agents.values())
        marks = {i: len(a.lines) for i, a in agents.items()}
        steps = world_steps(agents[0], 4)
        t_kill = time.monotonic()
        seen |= set(kill_agent(agents[LOST].proc.pid))
        agents[0].wait_for(r"elastic_train step \d+ world 4\b", count=steps + 1, timeout=240)
        run.seconds = time.monotonic() - t_kill
        run.record(agents, marks)
    finally:
        # Agents first (their process groups), then every worker they started, wherever it is now.
        for a in agents.values():
            seen |= set(descendants(a.proc.pid))
        for a in agents.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(a.proc.pid, signal.SIGKILL)
        seen |= started_pids(agents.values())
        sigkill(p for p in seen if alive(p))
        left = wait_dead(seen | {a.proc.pid for a in agents.values()}, 30)
    assert not left, f"torchrun processes still alive: {left}"
    return run


def run_ours(spawn, ckpt: Path) -> Run:
    run = Run(f"monarch-spmd workers, PerHost, MONARCH_SPMD_MIN_MEMBERS=2, MONARCH_SPMD_ELASTIC_WAIT={WAIT}")
    gang = Gang(spawn, f"nodes={NODES},procs={PROCS}", [*TRAIN, "--checkpoint-dir", str(ckpt)], layout="PerHost",
                MONARCH_SPMD_MAX_RESTARTS="3", MONARCH_SPMD_MIN_MEMBERS="2", MONARCH_SPMD_ELASTIC_WAIT=WAIT)
    events = gang.observed()
    try:
        workers = gang.workers
        workers[0].wait_for(r"elastic_train step \d+ world 6\b", timeout=240)
        marks = {i: len(w.lines) for i, w in workers.items()}
        steps = world_steps(workers[0], 4)
        t_kill = time.monotonic()
        os.killpg(workers[LOST].proc.pid, signal.SIGKILL)  # member 1's pod is lost; nothing replaces it
        workers[0].wait_for(r"elastic_train step \d+ world 4\b", count=steps + 1, timeout=240)
        run.seconds = time.monotonic() - t_kill
        run.record(workers, marks)
    finally:
        for w in gang.workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, signal.SIGKILL)  # their ranks die with them (parent-death signal)
        ranks = started_pids(gang.workers.values())
        sigkill(p for p in ranks if alive(p))
        left = wait_dead(ranks | {w.proc.pid for w in gang.workers.values()}, 30)
        events.close()
    assert not left, f"monarch-spmd processes still alive: {left}"
    return run


def test_a_lost_node_gives_every_rank_what_torchrun_gives_it(spawn, tmp_path):
    (tmp_path / "ours").mkdir()
    (tmp_path / "torchrun").mkdir()
    ours = run_ours(spawn, tmp_path / "ours")
    theirs = run_torchrun(spawn, tmp_path / "torchrun")
    print(theirs.show())
    print(ours.show())
    for phase, world in PHASES.items():
        for run in (theirs, ours):
            assert sorted(run.phases[phase]) == list(range(world)), f"{run.name}, phase {phase}: {run.phases[phase]}"
        assert ours.tuples(phase) == theirs.tuples(phase), (
            f"phase {phase}: {COMPARED}\ntorchrun: {sorted(theirs.tuples(phase).elements())}\n"
            f"ours:     {sorted(ours.tuples(phase).elements())}")
        # With the agents' pids in index order (asserted in run_torchrun) each node's rows match too.
        assert ours.by_node(phase) == theirs.by_node(phase), (
            f"phase {phase}, per node:\ntorchrun: {theirs.by_node(phase)}\nours:     {ours.by_node(phase)}")
