"""Replica groups on this machine: ``monarch-spmd run --replica-groups G``, torchft's fault tolerance.

Where it sits: beside :mod:`monarch_spmd.runner`, below :mod:`monarch_spmd.cli`. It never imports
torch or torchft: it runs torchft's ``torchft_lighthouse`` and G local runners as child processes
(``sys.executable -m monarch_spmd run ...``), each the runner of one replica group as
:mod:`monarch_spmd.runner` describes it. docs/torchft.md is the user's account.

torchft (https://github.com/pytorch/torchft) makes training fault tolerant across replica
groups: each group is its own torchrun world (its own MASTER_PORT and TCPStore), a Lighthouse
forms a quorum of the live groups at every step, a failed group drops out while the others keep
stepping, and a group that comes back gets the weights from a healthy peer. What this module does,
as torchft's own launcher (``torchft/torchx.py``) does with torchrun:

* one Lighthouse on 127.0.0.1 (``--lighthouse-port``, default a free port), started first and
  waited for until it accepts connections; the ``torchft_lighthouse`` beside ``sys.executable``,
  else the one on PATH, else an error naming the ``torchft`` extra;
* G groups, each a child runner with the job's own arguments and: its own master port (a free
  one, or ``--master-port`` + g), the agent store on (``--agent-store``: torchft's Manager is a
  client of the TCPStore at MASTER_PORT), and REPLICA_GROUP_ID=g, NUM_REPLICA_GROUPS=G,
  TORCHFT_LIGHTHOUSE=http://127.0.0.1:P in its environment, which its ranks inherit, and
  TORCHFT_QUORUM_RETRIES=10 unless set (:data:`QUORUM_RETRIES`);
* every line of a group is passed on with ``[group g] `` before the child's own ``[rank r] ``,
  stdout to stdout and stderr to stderr; the Lighthouse's lines with ``[lighthouse] `` on stderr;
  this module's own lines start with ``[monarch-spmd]`` and go to stderr.

Failure semantics (:func:`decide`, the one rule):

* a group restarts its ranks in place as any local run does, up to its own ``--max-restarts``:
  the budget is per group, and a group's failures never spend another group's;
* a group whose runner exits non-zero has failed for good (its restarts used up, or a permanent
  failure); the others go on while at least M (``--min-replicas``) groups are running or have
  finished with 0;
* below M, every group is stopped (SIGTERM to its runner, which stops its ranks) and the run
  exits with that group's exit code, its last line naming the group;
* once every group has ended the run exits 0 when at least M ended with 0, with a line naming
  each group that failed for good;
* the Lighthouse dying is not a group's failure: it is started again on the same port (the
  groups' quorums wait meanwhile: their Managers retry, TORCHFT_QUORUM_RETRIES), after a back-off when it keeps dying
  early; one that cannot listen :data:`LIGHTHOUSE_ATTEMPTS` times in a row stops the run (exit 1);
* SIGINT, SIGTERM and SIGHUP are passed to every group's runner as they are, the Lighthouse is
  stopped last and the run exits 128+N. Each group's runner and the Lighthouse get a parent-death
  signal: nothing outlives this process.
"""

from __future__ import annotations

import itertools
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Final

from .payload.agent import STOP_SIGNALS
from .payload.procs import parent_death_hook
from .ports import free_port

#: torchft's Lighthouse, its console script.
LIGHTHOUSE: Final = "torchft_lighthouse"
#: What to install when it is missing.
EXTRA_HINT: Final = "pip install 'monarch-spmd[torchft]'"
#: Where the Lighthouse listens and the groups reach it.
LIGHTHOUSE_ADDR: Final = "127.0.0.1"
#: Seconds a Lighthouse has to accept connections once started.
LIGHTHOUSE_START_TIMEOUT: Final = 30.0
#: Starts in a row that do not listen before the run gives up on the Lighthouse.
LIGHTHOUSE_ATTEMPTS: Final = 5
#: A Lighthouse that ran less than this many seconds died early: the next start waits a back-off.
LIGHTHOUSE_EARLY: Final = 10.0
#: Seconds between SIGTERM and SIGKILL for the Lighthouse and for a group runner that outlives
#: its own grace period (the runner stops its ranks itself first).
STOP_GRACE: Final = 5.0
#: The default of ``--min-replicas``: torchft's launcher's default, the most available choice (the
#: run goes on while any group does).
DEFAULT_MIN_REPLICAS: Final = 1

#: torchft's Manager reads how many times its quorum call may fail before the rank crashes here.
QUORUM_RETRIES_VAR: Final = "TORCHFT_QUORUM_RETRIES"
#: The groups' default: torchft's own (0) ends every rank at the first quorum the Lighthouse
#: misses, so a Lighthouse started again would find no group left; torchft 0.2.0 retries about
#: every 5 seconds, so 10 rides out a restart with room to spare.
QUORUM_RETRIES: Final = 10

_TAG: Final = "[monarch-spmd]"
#: Every Lighthouse process gets its own event key (a late exit of an old one is never the current one's).
_LIGHTHOUSES = itertools.count()


class ReplicaGroupsError(ValueError):
    """A flag of ``--replica-groups`` is invalid or torchft is missing; the message says which."""


@dataclass(frozen=True)
class Options:
    """What ``--replica-groups`` asks for (checked by :func:`check`).

    Attributes:
        groups: G, how many replica groups (each a torchrun world of the job's shape).
        min_replicas: M, the Lighthouse's ``--min_replicas`` and the fewest groups the run goes on with.
        lighthouse_port: the Lighthouse's port, or None for a free one.
        master_port: group g's master port is this + g, or None for free ones.
    """

    groups: int
    min_replicas: int = DEFAULT_MIN_REPLICAS
    lighthouse_port: int | None = None
    master_port: int | None = None


def check(opts: Options) -> Options:
    """Returns ``opts`` when valid.

    Raises:
        ReplicaGroupsError: naming the flag and the valid range.
    """
    if opts.groups < 1:
        raise ReplicaGroupsError(f"--replica-groups: {opts.groups} is out of range; valid is 1 or more")
    if not 1 <= opts.min_replicas <= opts.groups:
        raise ReplicaGroupsError(f"--min-replicas: {opts.min_replicas} is out of range; valid is 1..{opts.groups} "
                                 f"(at most --replica-groups {opts.groups})")
    if opts.lighthouse_port is not None and not 1 <= opts.lighthouse_port <= 65535:
        raise ReplicaGroupsError(f"--lighthouse-port: {opts.lighthouse_port} is out of range; valid is 1..65535")
    if opts.master_port is not None:
        last = opts.master_port + opts.groups - 1
        if last > 65535:
            raise ReplicaGroupsError(f"--master-port: {opts.master_port} + {opts.groups - 1} (the last group's) is "
                                     "above 65535; give a lower port")
        if opts.lighthouse_port is not None and opts.master_port <= opts.lighthouse_port <= last:
            raise ReplicaGroupsError(f"--lighthouse-port: {opts.lighthouse_port} is a group's master port "
                                     f"({opts.master_port}..{last}); give another")
    return opts


def find_lighthouse(python: str | None = None) -> str:
    """The ``torchft_lighthouse`` beside the interpreter, else on PATH.

    Raises:
        ReplicaGroupsError: neither exists, naming the extra that installs it.
    """
    beside = os.path.join(os.path.dirname(python or sys.executable), LIGHTHOUSE)
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which(LIGHTHOUSE)
    if found:
        return found
    raise ReplicaGroupsError(f"--replica-groups needs torchft's Lighthouse ({LIGHTHOUSE}), which is neither beside "
                             f"{python or sys.executable} nor on PATH: {EXTRA_HINT}")


def lighthouse_command(binary: str, port: int, min_replicas: int) -> list[str]:
    """The Lighthouse's command line (its other settings are torchft's defaults)."""
    return [binary, "--min_replicas", str(min_replicas), "--bind", f"{LIGHTHOUSE_ADDR}:{port}"]


def group_command(job_args: Sequence[str], master_port: int, python: str | None = None) -> list[str]:
    """Group runner's command: ``monarch-spmd run`` with the agent store, its port and the job's arguments."""
    return [python or sys.executable, "-m", "monarch_spmd", "run", "--agent-store", "--master-port", str(master_port),
            *job_args]


def group_env(base: Mapping[str, str], group: int, groups: int, lighthouse_port: int) -> dict[str, str]:
    """Group ``group``'s environment: ``base`` with torchft's three variables, as its launcher sets
    them, and :data:`QUORUM_RETRIES_VAR` unless ``base`` sets it."""
    return {QUORUM_RETRIES_VAR: str(QUORUM_RETRIES), **base, "REPLICA_GROUP_ID": str(group),
            "NUM_REPLICA_GROUPS": str(groups), "TORCHFT_LIGHTHOUSE": f"http://{LIGHTHOUSE_ADDR}:{lighthouse_port}"}


def master_ports(opts: Options, pick: Callable[[], int] | None = None) -> list[int]:
    """Each group's master port: ``--master-port`` + g, else distinct free ports."""
    if opts.master_port is not None:
        return [opts.master_port + g for g in range(opts.groups)]
    pick = pick or (lambda: free_port(LIGHTHOUSE_ADDR))
    ports: list[int] = []
    while len(ports) < opts.groups:
        port = pick()
        if port not in ports and port != opts.lighthouse_port:
            ports.append(port)
    return ports


# --- the rule --------------------------------------------------------------------------------------

GO_ON: Final = "go on"
STOP: Final = "stop"
DONE: Final = "done"


def decide(codes: Sequence[int | None], min_replicas: int) -> str:
    """What the run does now, from each group's exit code (None: still running).

    :data:`STOP` when fewer than ``min_replicas`` groups are running or finished with 0 (every
    group is stopped); :data:`DONE` when every group has ended; else :data:`GO_ON`.
    """
    viable = sum(1 for c in codes if c is None or c == 0)
    if viable < min_replicas:
        return STOP
    if all(c is not None for c in codes):
        return DONE
    return GO_ON


def exit_code(codes: Sequence[int | None], min_replicas: int, last_failed: int | None) -> int:
    """The run's exit code once it ends for :func:`decide`'s reason: 0 when at least
    ``min_replicas`` groups finished with 0, else the exit code of ``last_failed`` (the group
    whose failure left too few), else 1."""
    if sum(1 for c in codes if c == 0) >= min_replicas:
        return 0
    failed = codes[last_failed] if last_failed is not None else None
    return failed or 1


# --- processes ----------------------------------------------------------------------------------


class _Output:
    """Passes a child's lines on with a prefix, stdout and stderr apart, one writer at a time."""

    def __init__(self, stdout: IO[str], stderr: IO[str]) -> None:
        self.streams = {1: stdout, 2: stderr}
        self.lock = threading.Lock()

    def line(self, fd: int, text: str) -> None:
        with self.lock:
            stream = self.streams[fd]
            stream.write(text if text.endswith("\n") else text + "\n")
            stream.flush()

    def pump(self, source: IO[bytes], fd: int, prefix: str) -> threading.Thread:
        def run() -> None:
            for raw in iter(source.readline, b""):
                self.line(fd, prefix + raw.decode("utf-8", "replace"))
            source.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


def _listening(port: int) -> bool:
    try:
        with socket.create_connection((LIGHTHOUSE_ADDR, port), timeout=0.5):
            return True
    except OSError:
        return False


class _Child:
    """A child process whose output is passed on and whose end is posted to ``events``."""

    def __init__(self, key: tuple[str, int], command: list[str], env: Mapping[str, str] | None, out: _Output,
                 prefix: str, events: queue.Queue[tuple[tuple[str, int], int]], death_signal: int) -> None:
        self.key = key
        self.started = time.monotonic()
        self.proc = subprocess.Popen(command, env=None if env is None else dict(env), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=parent_death_hook(death_signal))
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.pumps = [out.pump(self.proc.stdout, 1, prefix), out.pump(self.proc.stderr, 2, prefix)]

        def watch() -> None:
            code = self.proc.wait()
            for pump in self.pumps:
                pump.join(5)  # its last lines before the news of its end
            events.put((key, 128 - code if code < 0 else code))

        threading.Thread(target=watch, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, signum: int) -> None:
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class _Interrupted(Exception):
    pass


def run(opts: Options, job_args: Sequence[str], *, python: str | None = None, stdout: IO[str] | None = None,
        stderr: IO[str] | None = None, grace_period: float = 5.0) -> int:
    """Runs G replica groups of the job (``job_args``: ``monarch-spmd run``'s arguments without
    the replica-group flags and without ``--master-port``) and a Lighthouse; returns the exit code.

    Args:
        opts: checked with :func:`check` first; nothing is started when invalid.
        job_args: each group runner's arguments, the same for every group.
        python: the interpreter of the group runners (default ``sys.executable``).
        stdout, stderr: where the prefixed output goes.
        grace_period: the groups' grace period; a group runner still running this long plus
            :data:`STOP_GRACE` after it was asked to stop is killed.

    Raises:
        ReplicaGroupsError: for invalid options or a missing Lighthouse (nothing started).
    """
    check(opts)
    binary = find_lighthouse(python)
    out = _Output(stdout or sys.stdout, stderr or sys.stderr)

    def note(message: str) -> None:
        out.line(2, f"{_TAG} {message}")

    lighthouse_port = opts.lighthouse_port or free_port(LIGHTHOUSE_ADDR)
    opts = Options(opts.groups, opts.min_replicas, lighthouse_port, opts.master_port)
    ports = master_ports(opts)
    events: queue.Queue[tuple[tuple[str, int], int]] = queue.Queue()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        events.put((("signal", signum), 0))

    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    groups: list[_Child] = []
    lighthouse: list[_Child] = []  # the current one, replaced when it is started again
    try:
        first = _start_lighthouse(binary, opts, out, events, note, received, first=True)
        if first is None:
            if received:
                return 128 + received[0]
            note(f"replica groups failed: torchft's lighthouse ({binary}) did not listen on port {lighthouse_port}; "
                 "no group was started")
            return 1
        lighthouse.append(first)
        base = dict(os.environ)
        for g in range(opts.groups):
            if received:
                break
            note(f"group {g}: starting its runner, master port {ports[g]}, REPLICA_GROUP_ID={g}")
            groups.append(_Child(("group", g), group_command(job_args, ports[g], python),
                                 group_env(base, g, opts.groups, lighthouse_port), out, f"[group {g}] ", events,
                                 signal.SIGTERM))
        return _supervise(opts, binary, groups, lighthouse, out, events, note, received, grace_period)
    finally:
        for child in groups:
            if child.running():
                child.kill()
        for child in lighthouse:
            if child.running():
                child.signal(signal.SIGTERM)
                try:
                    child.proc.wait(STOP_GRACE)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.proc.wait()
        for s, handler in handlers.items():
            signal.signal(s, handler)


def _start_lighthouse(binary: str, opts: Options, out: _Output, events: queue.Queue, note: Callable[[str], None],
                      received: list[int], first: bool = False) -> _Child | None:
    """Starts the Lighthouse and waits until it listens; None when it could not (said) or a signal came."""
    port = opts.lighthouse_port
    assert port is not None
    backoff = 0.5
    for attempt in range(1, LIGHTHOUSE_ATTEMPTS + 1):
        if _listening(port):  # another process's: ours would fail to bind, and look up
            if first:
                note(f"port {port} of the lighthouse is taken by another process: give another --lighthouse-port")
                return None
            note(f"port {port} of the lighthouse is taken by another process (attempt {attempt} of "
                 f"{LIGHTHOUSE_ATTEMPTS})")
            if received:
                return None
            time.sleep(backoff)
            backoff = min(backoff * 2, 8.0)
            continue
        child = _Child(("lighthouse", next(_LIGHTHOUSES)), lighthouse_command(binary, port, opts.min_replicas), None, out,
                       "[lighthouse] ", events, signal.SIGKILL)
        deadline = time.monotonic() + LIGHTHOUSE_START_TIMEOUT
        while time.monotonic() < deadline and child.running() and not received:
            if _listening(port):
                note(f"lighthouse pid {child.pid} listening on http://{LIGHTHOUSE_ADDR}:{port} (min replicas "
                     f"{opts.min_replicas}{', restarted' if not first else ''})")
                return child
            time.sleep(0.05)
        if child.running():
            child.signal(signal.SIGTERM)
            try:
                child.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                child.kill()
        if received:
            return None
        note(f"the lighthouse (pid {child.pid}) did not listen on port {port} (attempt {attempt} of "
             f"{LIGHTHOUSE_ATTEMPTS}, exit code {child.proc.poll()})")
        time.sleep(backoff)
        backoff = min(backoff * 2, 8.0)
    return None


def _supervise(opts: Options, binary: str, groups: list[_Child], lighthouse: list[_Child], out: _Output,
               events: queue.Queue, note: Callable[[str], None], received: list[int], grace_period: float) -> int:
    codes: list[int | None] = [None] * len(groups)
    last_failed: int | None = None
    stopping = False
    stop_deadline: float | None = None
    lighthouse_backoff = 0.5
    while True:
        try:
            key, code = events.get(timeout=0.2)
        except queue.Empty:
            key = None
        if key is not None and key[0] == "signal":
            name = signal.Signals(key[1]).name
            note(f"{name} received; passing it to every group and stopping the lighthouse last")
            for child in groups:
                if child.running():
                    child.signal(key[1])
            stopping = True
            stop_deadline = stop_deadline or time.monotonic() + grace_period + STOP_GRACE + 30
        elif key is not None and key[0] == "group":
            g = key[1]
            codes[g] = code
            if stopping:
                note(f"group {g} stopped (exit code {code})")
            elif code == 0:
                note(f"group {g} finished (exit code 0)")
            else:
                last_failed = g
                viable = sum(1 for c in codes if c is None or c == 0)
                if decide(codes, opts.min_replicas) == STOP:
                    note(f"group {g} failed for good with exit code {code}; {viable} of {len(groups)} groups are "
                         f"running or finished, fewer than --min-replicas {opts.min_replicas}: stopping every group")
                    stopping = True
                    stop_deadline = time.monotonic() + grace_period + STOP_GRACE + 30
                    for child in groups:
                        if child.running():
                            child.signal(signal.SIGTERM)
                else:
                    note(f"group {g} failed for good with exit code {code} (its restarts used up, or a permanent "
                         f"failure); {viable} of {len(groups)} groups are running or finished, at least "
                         f"--min-replicas {opts.min_replicas}: the others go on")
        elif key is not None and key == lighthouse[0].key and not stopping:
            lived = time.monotonic() - lighthouse[0].started
            note(f"the lighthouse (pid {lighthouse[0].pid}) exited with code {code}; starting it again on port "
                 f"{opts.lighthouse_port} (the groups' quorums wait for it meanwhile)")
            if lived < LIGHTHOUSE_EARLY:
                time.sleep(lighthouse_backoff)
                lighthouse_backoff = min(lighthouse_backoff * 2, 8.0)
            else:
                lighthouse_backoff = 0.5
            again = _start_lighthouse(binary, opts, out, events, note, received)
            if again is None and not received:
                note(f"the lighthouse could not listen on port {opts.lighthouse_port}: stopping every group")
                for child in groups:
                    if child.running():
                        child.signal(signal.SIGTERM)
                _wait_all(groups, grace_period)
                note(f"replica groups failed: torchft's lighthouse is down ({binary})")
                return 1
            if again is not None:
                lighthouse[0] = again
        if all(c is not None for c in codes):
            break
        if stop_deadline is not None and time.monotonic() > stop_deadline:
            for g, child in enumerate(groups):
                if child.running():
                    note(f"group {g} (pid {child.pid}) did not stop in time: killing it")
                    child.kill()
            stop_deadline = time.monotonic() + 60
    if received:
        return 128 + received[0]
    failed = [(g, c) for g, c in enumerate(codes) if c]
    code = exit_code(codes, opts.min_replicas, last_failed)
    if code == 0:
        finished = sum(1 for c in codes if c == 0)
        line = f"{finished} of {len(groups)} replica groups finished"
        if failed:
            line += "; " + ", ".join(f"group {g} failed for good (exit code {c})" for g, c in failed)
        note(line)
        return 0
    g = last_failed if last_failed is not None else failed[0][0]
    note(f"replica groups failed: group {g} exited with code {codes[g]}, leaving fewer than --min-replicas "
         f"{opts.min_replicas} of {len(groups)} groups running or finished")
    return code


def _wait_all(groups: Sequence[_Child], grace_period: float) -> None:
    deadline = time.monotonic() + grace_period + STOP_GRACE + 30
    for child in groups:
        try:
            child.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.proc.wait()
