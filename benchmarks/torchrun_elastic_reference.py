"""What the real torchrun gives each rank when an elastic job (``--nnodes 2:3``) shrinks and grows.

    python benchmarks/torchrun_elastic_reference.py [--store shared|unshared|both]
        [--scenario shrink|grow|both] [--grow-wait 90] [--no-below-min] [--json PATH]

The reference a reimplementation of torchrun's elastic behaviour is held to
(docs/design/torchrun-elastic.md). Everything runs on loopback with the torchrun of the running
Python (``python -m torch.distributed.run``). Each "node" is one torchrun agent started as its own
process group (``start_new_session``) with

    --nnodes 2:3 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT
    --rdzv-id ref --max-restarts 3 --monitor-interval 0.5 tests/programs/elastic_env.py
    --stop-file STOP

and nothing else (rendezvous timeouts are torchrun's defaults: join 600 s, last call 30 s,
heartbeat every 5 s, a node dead after 3 missed). The agents' environment is this process's, less
every torchrun variable (so the workers' values are torchrun's own), plus ``LOGLEVEL=INFO`` so the
agents log their rendezvous. Each worker prints its variables once (``elastic_env {json}``) and a
line per all_reduce step; a rank is "running" once its process printed a step.

Phases (every wait polls the agents' output against a deadline; none relies on a sleep):

a. agent 0 is started first and the benchmark waits until it listens on PORT (with c10d the
   first agent to bind the endpoint hosts the rendezvous store; which process listens on PORT,
   and on the workers' MASTER_PORT, is then read from /proc), then agents 1 and 2: 6 ranks;
b. a node is lost: the agent with group rank 1 (or another that does not host the rendezvous
   store) and its workers are SIGKILLed. torchrun starts workers in sessions of their own, so
   killing the agent's process group would leave them running: the whole process tree is killed.
   Waits ``--shrink-wait`` s for the 2 surviving agents to run 4 ranks again;
c. a new agent (agent 3) is started, and the benchmark waits up to ``--grow-wait`` s for 6 ranks;
c2. (unless ``--no-below-min``) the job is taken below its minimum: every agent but the store's
   host is killed as in b, leaving 1 node of min 2; after ``--below-min-wait`` s of watching, one
   more agent is started and the benchmark waits for 4 ranks;
d. the stop file is created; every agent is waited for (their exit codes recorded).
(c and c2 are skipped when the store's host has exited by then: nothing can rendezvous.) That is
the ``shrink`` scenario; ``grow`` starts 2 agents (the minimum: the rendezvous waits its 30 s last
call) and then adds a 3rd, as in c.

Each scenario runs with torchrun's defaults (``shared``: the agent of group rank 0 hosts the
workers' TCPStore, TORCHELASTIC_USE_AGENT_STORE=True, kept for the agent's life) or with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (``unshared``: rank 0's worker hosts it, on a port chosen
per rendezvous round). By default: shrink/shared, shrink/unshared and grow/shared, one after the
other (about 8 minutes on 2 cores).

For each run it prints a Markdown table of the ranks of each phase (when a phase missed its
target: the ranks alive at its deadline, after a SIGUSR1 that makes elastic_env.py dump its stacks),
what changed for each (agent, local rank) since the previous phase, the seconds from the kill (or
the new agent's start) to every rank stepping, the agents' rendezvous and restart log lines,
every worker process of the run (with the port it listened on, to which each gloo connection error
is attributed), and the agents' exit codes. Every process it started (agents and their workers)
is killed at the end, also on error. The measurements go to benchmarks/out/ as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import machine, machine_line, table, write_json  # noqa: E402

PROGRAM = REPO / "tests" / "programs" / "elastic_env.py"
MIN_NODES, MAX_NODES, NPROC, MAX_RESTARTS = 2, 3, 2, 3

# Agent log lines worth showing in the timeline.
INTERESTING = re.compile(
    r"closing signal|exitcode|Worker group|attempts left|Rendezvous complete|restart_count=|"
    r"group_rank=|global_ranks=|master_port=|has joined round|Detected|hosts the TCP store|"
    r"Rendezvous'ing|Starting worker group|Stopping worker group|Traceback|Error|error|"
    r"timed out|Timeout|closed|SIGKILL|forcefully|elastic_env rank \d+ error"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def listen_inodes() -> dict[str, int]:
    """Socket inode -> port of every listening TCP socket (from /proc/net/tcp*)."""
    out = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A":
                    out[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return out


def listen_ports(pid: int, inodes: dict[str, int]) -> set[int]:
    ports = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    ports.add(inodes[link[8:-1]])
    return ports


def listening_owner(port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` holds the socket listening on ``port``."""
    inodes = listen_inodes()
    return next((pid for pid in pids if port in listen_ports(pid, inodes)), None)


def proc_state(pid: int) -> tuple[int, str, bytes] | None:
    """(ppid, state, cmdline) of a live process, None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), fields[0], cmdline


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_state(int(entry))
            if st:
                children.setdefault(st[0], []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def ours(pid: int) -> bool:
    """Still one of this benchmark's processes (a torchrun agent or an elastic_env worker)?"""
    st = proc_state(pid)
    return bool(st) and (b"elastic_env" in st[2] or b"torch.distributed.run" in st[2])


def sigkill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def clean_env(share_store: bool = True) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items()
        if not (k.startswith("TORCH") or "ELASTIC" in k or k.startswith(("MASTER_", "GROUP_", "ROLE_"))
                or k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS"))
    }
    env["LOGLEVEL"] = "INFO"
    if not share_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)
    return env


class Agent:
    """One torchrun agent (a node), its output read line by line with the time each was seen."""

    def __init__(self, index: int, port: int, stop_file: Path, logdir: Path, t0: float, share_store: bool):
        self.index = index
        self.t0 = t0
        self.log_path = logdir / f"agent{index}.log"
        argv = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", f"{MIN_NODES}:{MAX_NODES}", "--nproc-per-node", str(NPROC),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ref",
            "--max-restarts", str(MAX_RESTARTS), "--monitor-interval", "0.5",
            str(PROGRAM), "--stop-file", str(stop_file),
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=clean_env(share_store), cwd=REPO, start_new_session=True,
            )
        self.pid = self.proc.pid
        self.started = time.monotonic()
        self.reader = open(self.log_path, "rb")  # noqa: SIM115 - closed in close()
        self.buf = b""
        self.lines: list[tuple[float, str]] = []
        self.envs: list[dict] = []  # one per worker process, in the order they printed
        self.killed_at: float | None = None
        self.exited_at: float | None = None
        self.tree_seen: set[int] = set()
        self.tree_polled = 0.0

    def rel(self, t: float) -> float:
        return t - self.t0

    def poll(self) -> None:
        data = self.reader.read()
        now = time.monotonic()
        if data:
            self.buf += data
            *complete, self.buf = self.buf.split(b"\n")
            for raw in complete:
                self.on_line(now, raw.decode(errors="replace"))
        if self.exited_at is None and self.proc.poll() is not None:
            self.exited_at = now
        if self.proc.poll() is None and now - self.tree_polled > 2:
            self.tree_polled = now
            self.tree_seen.update(descendants(self.pid))

    def on_line(self, t: float, line: str) -> None:
        self.lines.append((t, line))
        if line.startswith("elastic_env {"):
            try:
                rec = json.loads(line[len("elastic_env "):])
            except ValueError:  # not a whole line of ours (another process wrote into it)
                return
            rec.update(agent=self.index, seen=t, first_step=None, error=None, gone=None, ports=[])
            self.envs.append(rec)
            return
        m = re.match(r"elastic_env rank (\d+) (step|error) ?(.*)", line)
        if m:
            for rec in reversed(self.envs):
                if rec["env"]["RANK"] == m.group(1):
                    if m.group(2) == "step" and rec["first_step"] is None:
                        rec["first_step"] = t
                    elif m.group(2) == "error" and rec["error"] is None:
                        rec["error"] = (t, m.group(3))
                    break

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_tree(self) -> list[int]:
        """SIGKILL the agent and every process below it (a node lost)."""
        tree = [self.pid, *descendants(self.pid)]
        for pid in tree:
            if pid == self.pid or ours(pid):
                sigkill(pid)
        self.killed_at = time.monotonic()
        return tree

    def close(self) -> None:
        self.reader.close()


class Bench:
    def __init__(self, opts: argparse.Namespace, share_store: bool, scenario: str):
        self.share_store = share_store
        self.scenario = scenario
        self.host_idx: int | None = None
        self.opts = opts
        self.t0 = time.monotonic()
        self.port = free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix="torchrun-elastic-"))
        self.stop_file = self.tmp / "stop"
        self.agents: list[Agent] = []
        self.phases: list[dict] = []
        self.notes: list[str] = []
        self.stacks_at: list[float] = []
        self.ports_polled = 0.0

    # -- helpers -----------------------------------------------------------------------------
    def rel(self, t: float | None) -> float | None:
        return None if t is None else round(t - self.t0, 2)

    def note(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.2f}s] {msg}"
        self.notes.append(line)
        print(line, flush=True)

    def start_agent(self) -> Agent:
        agent = Agent(len(self.agents), self.port, self.stop_file, self.tmp, self.t0, self.share_store)
        self.agents.append(agent)
        self.note(f"started agent {agent.index} (pid {agent.pid})")
        return agent

    def poll(self) -> None:
        for agent in self.agents:
            agent.poll()
        for rec in self.all_envs():
            if rec["gone"] is None and proc_state(rec["pid"]) is None:
                rec["gone"] = time.monotonic()
        now = time.monotonic()
        if now - self.ports_polled > 0.5:
            # Each worker's listening ports (its gloo listener): a "connection refused" to a port of a
            # process of an earlier attempt is then attributed to that process in the report.
            self.ports_polled = now
            inodes = None
            for rec in self.all_envs():
                if rec["gone"] is None and (not rec["ports"] or rec["first_step"] is None):
                    inodes = inodes if inodes is not None else listen_inodes()
                    rec["ports"] = sorted(set(rec["ports"]) | listen_ports(rec["pid"], inodes))

    def all_envs(self) -> list[dict]:
        return [rec for agent in self.agents for rec in agent.envs]

    def watch(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll()
            time.sleep(0.05)

    def wait(self, what: str, cond, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            result = cond()
            if result:
                return result
            if time.monotonic() > deadline:
                self.note(f"gave up after {timeout:.0f} s waiting for {what}")
                return None
            time.sleep(0.05)

    def running_world(self, since: float, world: int, agents: list[Agent]):
        """The env records of ``world`` new worker processes (printed after ``since``) on
        ``agents``, all of that WORLD_SIZE and all stepping; None until then."""
        recs = [r for a in agents for r in a.envs if r["seen"] >= since and r["gone"] is None]
        recs = [r for r in recs if r["env"]["WORLD_SIZE"] == str(world)]
        if len(recs) == world and all(r["first_step"] is not None for r in recs):
            return sorted(recs, key=lambda r: int(r["env"]["RANK"]))
        return None

    def live_ranks(self) -> list[dict]:
        """Every live worker process (for a phase that did not reach its target)."""
        return sorted((r for r in self.all_envs() if r["gone"] is None), key=lambda r: int(r["env"]["RANK"]))

    def dump_stacks(self) -> None:
        """SIGUSR1 to every live worker: elastic_env.py dumps its Python stacks to its agent's log."""
        pids = [r["pid"] for r in self.live_ranks() if ours(r["pid"])]
        self.note(f"SIGUSR1 (stack dump) to workers {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        self.stacks_at.append(time.monotonic())
        self.watch(2)

    def phase(self, name: str, world: int, agents: list[Agent], t_event: float, timeout: float,
              previous: list[dict], t_prev: float | None = None, **extra) -> dict:
        """Wait for ``world`` new ranks on ``agents`` after ``t_event``, then record the phase: its
        ranks (or, when it never got there, whatever ran at the deadline), the seconds from the
        event to the last of them stepping, and what became of the previous ranks' processes."""
        t_prev = t_event if t_prev is None else t_prev
        recs = self.wait(f"{world} ranks ({name})", lambda: self.running_world(t_event, world, agents), timeout)
        reached = recs is not None
        if not reached:
            self.dump_stacks()
            recs = self.live_ranks()
        phase = {
            "phase": name, "reached": reached, "target_world": world, "ranks": recs,
            "t_event": self.rel(t_event),
            "seconds": round(max(r["first_step"] for r in recs) - t_event, 2) if reached else None,
            "previous_workers": [{
                "agent": r["agent"], "rank": r["env"]["RANK"], "pid": r["pid"],
                "error": None if not r["error"] else [round(r["error"][0] - t_prev, 2), r["error"][1]],
                "gone": None if r["gone"] is None else round(r["gone"] - t_prev, 2),
            } for r in previous],
            "t_prev": self.rel(t_prev),
            **extra,
        }
        self.phases.append(phase)
        self.note(f"phase {name}: {'reached' if reached else 'NOT reached'} {world} ranks"
                  + (f" {phase['seconds']} s after the event" if reached else ""))
        return phase

    # -- the run -----------------------------------------------------------------------------
    def start_nodes(self, n: int) -> dict:
        """Agent 0 first (it then hosts the rendezvous store), then the others once it listens;
        phase a: their ``n * NPROC`` ranks running. Returns the phase."""
        self.start_agent()
        if not self.wait("agent 0 to listen on the rendezvous port", lambda: listening(self.port), 60):
            raise RuntimeError("agent 0 never listened on the rendezvous endpoint")
        self.note(f"agent 0 listens on 127.0.0.1:{self.port}")
        for _ in range(n - 1):
            self.start_agent()
        a = self.phase(f"a: {n} nodes", n * NPROC, list(self.agents), self.t0, self.opts.start_wait, [])
        if not a["reached"]:
            raise RuntimeError(f"the job never ran {n * NPROC} ranks")
        pids = [ag.pid for ag in self.agents]
        store_host = listening_owner(self.port, pids)
        master_port = int(a["ranks"][0]["env"]["MASTER_PORT"])
        master_host = listening_owner(master_port, pids + [r["pid"] for r in a["ranks"]])
        self.host_idx = next((ag.index for ag in self.agents if ag.pid == store_host), None)
        a["store_host"] = f"agent {self.host_idx} (pid {store_host}) listens on the rendezvous endpoint {self.port}"
        a["master_host"] = f"MASTER_PORT {master_port} is listened on by " + next(
            (f"agent {ag.index} (pid {ag.pid})" for ag in self.agents if ag.pid == master_host),
            next((f"the worker of rank {r['env']['RANK']} (pid {r['pid']})" for r in a["ranks"]
                  if r["pid"] == master_host), f"pid {master_host}"))
        self.note(a["store_host"] + "; " + a["master_host"])
        return a

    def run(self) -> None:
        if self.scenario == "grow":
            self.run_grow()
        else:
            self.run_shrink()

    def run_grow(self) -> None:
        """2 nodes (the minimum), then a 3rd: how a node joins a running job."""
        self.start_nodes(2)
        before = self.live_ranks()
        new = self.start_agent()
        c = self.phase("c: node added", 6, list(self.agents), new.started, self.opts.grow_wait, before,
                       added=f"agent {new.index}")
        c["new_agent_exit"] = new.proc.poll()

    def run_shrink(self) -> None:
        o = self.opts
        a = self.start_nodes(3)
        host_idx = self.host_idx

        # b. lose a node that does not host the rendezvous store
        group_rank = {r["agent"]: r["env"]["GROUP_RANK"] for r in a["ranks"]}
        candidates = [ag for ag in self.agents if ag.index != host_idx]
        victim = next((ag for ag in candidates if group_rank[ag.index] == "1"), candidates[0])
        survivors = [ag for ag in self.agents if ag is not victim]
        self.note(f"killing agent {victim.index} (pid {victim.pid}, group rank {group_rank[victim.index]}; "
                  f"agent {host_idx} hosts the rendezvous store) and its workers")
        tree = victim.kill_tree()
        self.note(f"SIGKILLed {tree}")
        self.phase("b: node lost", 4, survivors, victim.killed_at, o.shrink_wait,
                   [r for r in a["ranks"] if r["agent"] != victim.index],
                   killed=f"agent {victim.index} (group rank {group_rank[victim.index]})")

        # c. a new node joins
        host = self.agents[host_idx]
        if not host.alive():
            self.note(f"phases c and c2 skipped: agent {host_idx}, the rendezvous store's host, exited with "
                      f"{host.proc.returncode}; no rendezvous is possible without it")
            return
        before = self.live_ranks()
        live = [ag for ag in self.agents if ag.alive()]
        new = self.start_agent()
        c = self.phase("c: node added", 6, [*live, new], new.started, o.grow_wait, before,
                       added=f"agent {new.index}")
        c["new_agent_exit"] = new.proc.poll()

        # c2. below the minimum, then back to it
        if o.below_min and not host.alive():
            self.note(f"phase c2 skipped: agent {host_idx}, the rendezvous store's host, exited with "
                      f"{host.proc.returncode}")
        elif o.below_min:
            keep = self.agents[host_idx]
            before = [r for r in self.live_ranks() if r["agent"] == keep.index]
            t_kill = time.monotonic()
            for v in [ag for ag in self.agents if ag.alive() and ag is not keep]:
                self.note(f"killing agent {v.index} (pid {v.pid}) and its workers")
                v.kill_tree()
            self.watch(o.below_min_wait)
            below = {
                "agent_alive": keep.alive(),
                "workers_alive": [p for p in descendants(keep.pid) if ours(p)],
                "workers_started_since": [(r["env"]["RANK"], r["env"]["WORLD_SIZE"])
                                          for r in keep.envs if r["seen"] >= t_kill],
            }
            self.note(f"after {o.below_min_wait:.0f} s with 1 node: {below}")
            extra = self.start_agent()
            c2 = self.phase("c2: below min, then a node added", 4, [keep, extra], extra.started, o.shrink_wait,
                            before, t_prev=t_kill, below=below, t_below=self.rel(t_kill))
            if c2["reached"]:
                c2["seconds_from_kill"] = round(c2["seconds"] + extra.started - t_kill, 2)

    def stop(self) -> dict:
        self.stop_file.touch()
        t_stop = time.monotonic()
        self.note("stop file created")
        self.wait("every agent to exit", lambda: not any(a.alive() for a in self.agents), self.opts.stop_wait)
        codes = {}
        for a in self.agents:
            if a.alive():
                a.kill_tree()
                a.proc.wait(10)
                codes[a.index] = f"still running after {self.opts.stop_wait:.0f} s: killed"
            elif a.killed_at is not None:
                codes[a.index] = f"{a.proc.returncode} (SIGKILLed by the benchmark)"
            elif a.exited_at < t_stop:
                codes[a.index] = (f"{a.proc.returncode}, exited on its own at {self.rel(a.exited_at)} s "
                                  "(before the stop file)")
            else:
                codes[a.index] = f"{a.proc.returncode} {a.exited_at - t_stop:.2f} s after the stop file"
        return codes

    def cleanup(self) -> None:
        for a in self.agents:
            if a.alive():
                a.kill_tree()
            for pid in a.tree_seen:
                if ours(pid):
                    sigkill(pid)
        for rec in self.all_envs():
            if ours(rec["pid"]):
                sigkill(rec["pid"])
        for a in self.agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.proc.wait(10)
            a.close()

    # -- the report --------------------------------------------------------------------------
    def report(self, exits: dict) -> dict:
        out = {"machine": machine(), "port": self.port, "phases": [], "exits": exits, "notes": self.notes}
        print()
        print(f"# torchrun elastic reference, {self.scenario}: torch {out['machine']['torch']}"
              + (" (torchrun's defaults)" if self.share_store else " with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"))
        print(machine_line(out["machine"]))
        print(f"rendezvous endpoint 127.0.0.1:{self.port}; agents: "
              + ", ".join(f"{a.index}=pid {a.pid}" for a in self.agents))
        print("seconds are from the benchmark's start unless said otherwise; 'stepping' is when the rank's "
              "process printed its first step")
        previous: list[dict] = []
        for phase in self.phases:
            print(f"\n## {phase['phase']}" + ("" if phase["reached"] else
                                                f" (did NOT reach {phase['target_world']} ranks: live ranks shown)"))
            print()
            rows = [[
                r["env"]["RANK"], r["env"]["LOCAL_RANK"], r["env"]["GROUP_RANK"], r["env"]["WORLD_SIZE"],
                r["env"]["GROUP_WORLD_SIZE"], r["env"]["ROLE_RANK"], r["env"]["ROLE_WORLD_SIZE"],
                r["env"]["TORCHELASTIC_RESTART_COUNT"], f"{r['env']['MASTER_ADDR']}:{r['env']['MASTER_PORT']}",
                r["agent"], r["agent_pid"], r["pid"], self.rel(r["seen"]),
                "no" if r["first_step"] is None else self.rel(r["first_step"]),
            ] for r in phase["ranks"]]
            print(table(["rank", "local rank", "group rank", "world size", "group world size", "role rank",
                         "role world size", "restart count", "master addr:port", "agent", "agent pid", "pid",
                         "env printed", "stepping"], rows))
            varying = {"RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_RANK",
                       "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT",
                       "TORCHELASTIC_ERROR_FILE"}
            other: dict[str, set] = {}
            for r in phase["ranks"]:
                for k, v in r["env"].items():
                    if k not in varying:
                        other.setdefault(k, set()).add(v)
            print("\nother variables: " + ", ".join(
                f"{k}={'|'.join(sorted(map(str, v)))}" for k, v in sorted(other.items())))
            if phase["ranks"]:
                print("TORCHELASTIC_ERROR_FILE e.g. " + str(phase["ranks"][0]["env"]["TORCHELASTIC_ERROR_FILE"]))
            for key in ("store_host", "master_host", "killed", "added", "new_agent_exit", "t_below", "below",
                        "t_event", "seconds", "seconds_from_kill"):
                if key in phase:
                    print(f"{key}: {phase[key]}")
            for w in phase["previous_workers"]:
                err = "no error line" if not w["error"] else f"error line at {w['error'][0]} s: {w['error'][1][:110]}"
                print(f"previous worker (agent {w['agent']}, rank {w['rank']}, pid {w['pid']}): {err}; "
                      f"gone at {w['gone']} s (from t_prev {phase['t_prev']})")
            if previous:
                before = {(r["agent"], r["env"]["LOCAL_RANK"]): r for r in previous}
                for r in phase["ranks"]:
                    b = before.get((r["agent"], r["env"]["LOCAL_RANK"]))
                    if b is None:
                        print(f"agent {r['agent']} local rank {r['env']['LOCAL_RANK']}: new in this phase")
                        continue
                    changed = {k: f"{b['env'].get(k)}->{v}" for k, v in r["env"].items()
                               if b["env"].get(k) != v and k != "TORCHELASTIC_ERROR_FILE"}
                    print(f"agent {r['agent']} local rank {r['env']['LOCAL_RANK']}: "
                          f"{'same process' if b['pid'] == r['pid'] else 'new process'}; changed {changed}")
            if phase["ranks"]:
                previous = phase["ranks"]
            out["phases"].append(copy.deepcopy(phase))
        print("\n## agents' rendezvous and restart log lines (s from start)\n")
        for a in self.agents:
            print(f"### agent {a.index} (pid {a.pid})")
            for t, line in a.lines:
                if (INTERESTING.search(line) and not line.startswith("elastic_env {")
                        and "debug_logger" not in line and not line.startswith("frame #")):
                    print(f"  {a.rel(t):7.2f} {line[:200]}")
        print("\n## every worker process of the run (s from start)\n")
        rows = []
        for r in sorted(self.all_envs(), key=lambda r: (r["seen"], int(r["env"]["RANK"]))):
            rows.append([
                r["agent"], r["pid"], r["env"]["TORCHELASTIC_RESTART_COUNT"], r["env"]["RANK"],
                r["env"]["WORLD_SIZE"], r["env"]["GROUP_RANK"], r["env"]["MASTER_PORT"],
                ",".join(map(str, r["ports"])) or "-", self.rel(r["seen"]),
                "no" if r["first_step"] is None else self.rel(r["first_step"]),
                "-" if not r["error"] else f"{self.rel(r['error'][0])} {r['error'][1][:60]}",
                self.rel(r["gone"]),
            ])
        print(table(["agent", "pid", "restart count", "rank", "world size", "group rank", "master port",
                     "listens on", "env printed", "stepping", "error line", "gone"], rows))
        owners: dict[int, list[dict]] = {}
        for r in self.all_envs():
            for port in r["ports"]:
                owners.setdefault(port, []).append(r)
        refused = []
        for a in self.agents:
            for t, line in a.lines:
                m = re.match(r"elastic_env rank (\d+) error .*?(connectFullMesh failed|Connection closed by peer)"
                             r".*?\[[^\]]*\]:(\d+)", line)
                if m:
                    printed = int(m.group(3))
                    # gloo prints a port in network byte order: 15245 (0x3b8d) is port 36155 (0x8d3b)
                    swapped = int.from_bytes(printed.to_bytes(2, "big"), "little")
                    port = swapped if swapped in owners and printed not in owners else printed
                    who = [f"pid {o['pid']} (agent {o['agent']}, "
                           f"restart count {o['env']['TORCHELASTIC_RESTART_COUNT']}, "
                           f"rank {o['env']['RANK']}/{o['env']['WORLD_SIZE']}, gone at {self.rel(o['gone'])})"
                           for o in owners.get(port, [])]
                    refused.append(f"  {a.rel(t):7.2f} agent {a.index} rank {m.group(1)}: {m.group(2)} "
                                   f"{printed} (port {port}): "
                                   + ("listener of " + "; ".join(who) if who else "port not seen listening"))
        if refused:
            print("\n## gloo connection errors, attributed to the worker process that listened on that port\n")
            print("\n".join(refused))
        if self.stacks_at:
            print("\n## stacks dumped (SIGUSR1) when a phase missed its deadline\n")
            for a in self.agents:
                for t, line in a.lines:
                    dumped = any(at <= t <= at + 2.5 for at in self.stacks_at)
                    if dumped and re.match(r'\s*(File "|Thread 0x|Current thread)', line):
                        print(f"  agent {a.index} {a.rel(t):7.2f} {line[:200]}")
        print("\n## exit codes after the stop file\n")
        for idx, code in exits.items():
            print(f"agent {idx}: {code}")
        print("\n## summary\n")
        for phase in self.phases:
            print(f"{phase['phase']}: {'reached' if phase['reached'] else 'NOT reached'} "
                  f"{phase['target_world']} ranks; {phase['seconds']} s from the event to all stepping"
                  + (f" ({phase['seconds_from_kill']} s from the kill)" if "seconds_from_kill" in phase else ""))
        out["workers"] = copy.deepcopy(sorted(self.all_envs(), key=lambda r: r["seen"]))
        for r in out["workers"]:
            for k in ("seen", "first_step", "gone"):
                r[k] = self.rel(r[k])
            if r["error"]:
                r["error"] = [self.rel(r["error"][0]), r["error"][1]]
        out["logs"] = {a.index: [[round(a.rel(t), 2), line] for t, line in a.lines
                                 if not re.match(r"elastic_env rank \d+ step", line)] for a in self.agents}
        for phase in out["phases"]:
            for r in phase["ranks"]:
                for k in ("seen", "first_step", "gone"):
                    r[k] = self.rel(r[k])
                if r["error"]:
                    r["error"] = [self.rel(r["error"][0]), r["error"][1]]
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start-wait", type=float, default=180)
    parser.add_argument("--shrink-wait", type=float, default=120)
    parser.add_argument("--grow-wait", type=float, default=90)
    parser.add_argument("--below-min", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--below-min-wait", type=float, default=20)
    parser.add_argument("--stop-wait", type=float, default=60)
    parser.add_argument("--store", choices=["shared", "unshared", "both"], default="both",
                        help="shared: torchrun's default (the agent of group rank 0 hosts the workers' store); "
                             "unshared: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in the agents (rank 0's worker "
                             "hosts it, on a port picked per round); both (default)")
    parser.add_argument("--scenario", choices=["shrink", "grow", "both"], default="both",
                        help="shrink: 3 nodes, lose one, add one, (below min); grow: 2 nodes, add one. "
                             "both (default): shrink with each store, grow with the shared store only "
                             "(the unshared store's shrink run grows too)")
    parser.add_argument("--json", help="write the measurements here "
                        "(default benchmarks/out/torchrun_elastic_reference.json)")
    opts = parser.parse_args(argv)
    stores = ["shared", "unshared"] if opts.store == "both" else [opts.store]
    runs = [(st, "shrink") for st in stores if opts.scenario in ("shrink", "both")]
    runs += [(st, "grow") for st in stores if opts.scenario == "grow" or (opts.scenario == "both" and st == "shared")]
    results, ok = {}, True
    for store, scenario in runs:
        print(f"\n===== {scenario} run with the {store} store =====", flush=True)
        bench = Bench(opts, share_store=store == "shared", scenario=scenario)
        exits: dict = {}
        try:
            bench.run()
            exits = bench.stop()
        except Exception as e:  # noqa: BLE001 - report what was measured before it
            bench.note(f"run failed: {e!r}")
            ok = False
        finally:
            bench.cleanup()
        results[f"{scenario}/{store}"] = bench.report(exits)
        print(f"\nagent logs in {bench.tmp}", flush=True)
        ok = ok and bool(bench.phases) and bench.phases[0]["reached"]
    path = write_json("torchrun_elastic_reference", results, opts.json)
    print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
