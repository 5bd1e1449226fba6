"""The agent: the worker as torchrun's elastic agent, restarting its processes in place.

Where it sits: in the payload (standard library only, shipped into pods), above
:mod:`.rendezvous` (the protocol), :mod:`.coordinator` (the coordinator's state machine),
:mod:`.procgroup` (processes and output) and :mod:`.timer` (the watchdog), below :mod:`.worker`, which reads the inputs and
hands the agent its :class:`Settings`, the command and the env of each process. The local runner
(:mod:`monarch_spmd.runner`) runs the same code through the worker and watches it as an
observer (:class:`Observer`). docs/restart-in-place.md describes the protocol, the failure cases
and the bounds; this module is its I/O.

Every agent (one per pod, one per local worker) runs the processes of its pod, one round at a
time, and talks to the coordinator over one TCP connection: ``hello``, ``join`` r, ``go`` r,
``running``, ``failure``, ``exited``, ``stop``, ``fail``, ``finish``, heartbeats both ways. The
agent of member 0 (the pod of rank 0, what MASTER_ADDR names) also runs the coordinator, in a
thread of its own (:class:`CoordinatorServer`), and connects to it over loopback like any other
member. Without a coordinator (MONARCH_SPMD_AGENT_PORT unset) the agent runs one round and exits
with its first failure's code, so the operator recreates the gang.

In each round the agent also enforces torchrun's watchdog (TORCHELASTIC_ENABLE_FILE_TIMER) and
the progress timeout: a rank whose timer expires, or that writes nothing for the timeout, is
hung. Before the round's ranks end, every Python rank's stack is taken (:mod:`.hangs`: SIGABRT,
faulthandler writes it to the rank's output) and the rank that :mod:`.stacks`' rule blames is the
round's failure (WatchdogTimeout, NoProgress); without stacks to take the hung rank is killed.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from . import agentstore, coordinator, counting, elastic, hangs, member, procgroup, rendezvous, stacks, timer
from .link import Link, SpareOutcome, keepalive, listen, wait_as_spare
from .names import EX_TEMPFAIL
from .observe import Observer
from .procs import REAP_EVERY, children, error_file_message, oom_kills, parent_death_hook, reap_orphans
from .server import CoordinatorServer

__all__ = ["Agent", "CoordinatorServer", "Link", "Observer", "Settings", "SpareOutcome", "children", "failure_line",
           "keepalive", "listen", "oom_kills", "parent_death_hook", "reap_orphans", "wait_as_spare"]

_PREFIX: Final = "monarch-spmd worker"
#: Where a pod's termination message goes (the operator reads it); absent off a cluster.
TERMINATION_LOG: Final = "/dev/termination-log"
#: Kubernetes keeps at most this many bytes of a termination message.
TERMINATION_LIMIT: Final = 4096
#: Seconds member 0 waits, once its coordinator listens, for an observer to be connected before
#: it joins its gang (unset or 0: no wait). The local runner sets it: its observer then sees every
#: event live, the ``exited`` rows of a gang that fails at once too (a late observer's welcome
#: replays a history without them).
OBSERVER_WAIT_VAR: Final = "MONARCH_SPMD_OBSERVER_WAIT"


def observer_wait(environ: Mapping[str, str]) -> float:
    """:data:`OBSERVER_WAIT_VAR` in seconds (0 when unset or not a number from 0 to 60)."""
    try:
        seconds = float(environ.get(OBSERVER_WAIT_VAR, "") or 0)
    except ValueError:
        return 0.0
    return seconds if 0 <= seconds <= 60 else 0.0


#: Signals that stop the agent; each is passed on to the processes as it is (torchrun's).
STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: How often the agent's loop turns at the least (seconds).
TICK: Final = 0.1


@dataclass(frozen=True)
class Settings:
    """What an agent needs besides the command (read by the worker from its inputs).

    Attributes:
        member: this agent's member id (the pod's index in the gang).
        members: how many members (pods) the gang has.
        procs: how many processes this agent runs per round (1, or a host's procs in PerHost).
        first_rank: the global rank of its first process.
        world_size: the gang's world size.
        first_round: the round (restart count) the pod was created for.
        run_id: TORCHELASTIC_RUN_ID.
        coordinator: (address, port) of the coordinator, or None (no restart in place).
        policy: the coordinator's policy (read only by member 0).
        grace: seconds between SIGTERM and SIGKILL when stopping the processes.
        progress_timeout: seconds without output before a rank is a failure (0: off).
        connect_timeout: seconds to reach the coordinator at start (the rendezvous timeout).
        prefix: prefix the processes' lines with their rank (PerHost pods).
        node: where this agent runs (the pod's node), for the coordinator's events.
        log_dir, redirects, tee: torchrun's --log-dir, --redirects, --tee.
        watchdog: serve torchrun's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1).
        timer_file: TORCHELASTIC_TIMER_FILE, or None for a fresh path.
        bind_any: the coordinator listens on every interface (a pod) rather than on the
            coordinator address only (a local run on loopback).
        output_in_failures: a failure report, the termination message and the heartbeats carry
            lines of the processes' output (MONARCH_SPMD_FAILURE_OUTPUT=Tail); False: only what
            the agent itself says (rank, exit code, reason).
        token: the attempt's proof of membership (MONARCH_SPMD_AGENT_TOKEN): every hello carries
            it, and member 0's coordinator accepts no connection without it ("" accepts any).
        spare: the hot spare this agent's worker was before it was given this member's place
            (its hello says so), else None.
        store: (MASTER_ADDR, MASTER_PORT) of the agent store this agent hosts for its whole life
            (member 0 with MONARCH_SPMD_AGENT_STORE, :mod:`.agentstore`), else None.
    """

    member: int
    members: int
    procs: int
    first_rank: int
    world_size: int
    first_round: int = 0
    run_id: str = "none"
    coordinator: tuple[str, int] | None = None
    policy: counting.Policy = field(default_factory=counting.Policy)
    grace: float = 30.0
    progress_timeout: float = 0.0
    connect_timeout: float = 300.0
    prefix: bool = False
    node: str = ""
    #: This agent's pod (POD_NAME): the hello names it, so the coordinator's events say which pod
    #: of a member they are about (one created in its place may be running already).
    pod: str = ""
    log_dir: str | None = None
    redirects: int | Mapping[int, int] = 0
    tee: int | Mapping[int, int] = 0
    watchdog: bool = False
    timer_file: str | None = None
    bind_any: bool = True
    output_in_failures: bool = True
    token: str = field(default="", repr=False)
    spare: int | None = None
    store: tuple[str, int] | None = None



def _within(lines: Sequence[str], budget: int) -> list[str]:
    """The last of ``lines`` that fit in ``budget`` characters together (the newest kept)."""
    out: list[str] = []
    for line in reversed(lines):
        budget -= len(line) + 4
        if budget < 0:
            break
        out.append(line)
    return out[::-1]


def failure_line(rank: int, local: int | None, code: int, restart: int, outcome: str) -> str:
    """The last line of a failed agent's log and termination message, the same in every pod of
    the gang (docs/restart-in-place.md); the operator reads the rank and the restart from it."""
    who = f"rank {rank} exited with code {code}"
    if local is not None:
        who += f" (local rank {local})"
    return f"{_PREFIX}: {who} in restart {restart}; {outcome}"


def finished_line(finish: Mapping[str, Any]) -> str | None:
    """The termination message of an agent told ``finish``: which pods' ranks made the gang's last
    round (an elastic round may have had fewer; the operator reads it from any pod that
    succeeded, lifecycle.completion); None when ``finish`` names no members."""
    members, r = finish.get("members"), finish.get("round")
    if not isinstance(members, list) or not all(isinstance(m, int) for m in members) or not isinstance(r, int):
        return None
    return f"{_PREFIX}: the gang finished in restart {r}: every rank of pods {','.join(map(str, members))} exited 0"


@dataclass
class _Verdict:
    code: int
    line: str | None = None
    tail: Sequence[str] = ()
    say: bool = True  # also the log's last line (else only the termination message)


class Agent:
    """Runs rounds of this pod's processes as the coordinator says (see the module docstring).

    Args:
        settings: see :class:`Settings`.
        command: the training command (``[python, ...]``).
        env_for: the whole environment of process ``local`` in round ``r``: ``env_for(r, local)``, or
            ``env_for(r, local, (group_rank, group_world_size))`` in an elastic gang's round
            (torchrun's variables with TORCHELASTIC_RESTART_COUNT = r, over the pod's env).
        out: where the processes' output and the agent's own lines go.
    """

    def __init__(self, settings: Settings, command: Sequence[str],
                 env_for: Callable[..., dict[str, str]], out: procgroup.Prefixer) -> None:
        self.s = settings
        self.command = list(command)
        self.env_for = env_for
        self.out = out
        self.selector = selectors.DefaultSelector()
        self.link: Link | None = None
        self.server: CoordinatorServer | None = None
        self.group: procgroup.ProcGroup | None = None
        #: This member's side of the protocol (phase and round): :class:`.member.Member`.
        self.member = member.Member(settings.first_round, settings.member)
        #: The global rank of this agent's first process in the running round (an elastic gang's
        #: changes with the round's members).
        self.first_rank = settings.first_rank
        self.received: list[int] = []
        #: When the first stop signal came (Unix time): the ``leave`` says so.
        self.signalled_at: float | None = None
        self.parent = os.getppid()
        self.incarnation = uuid.uuid4().hex
        self.watchdog: timer.FileTimerServer | None = None
        self.run_dir: str | None = None
        self.failure_sent = False
        self.oom_base: int | None = None
        #: PID 1 of its container reaps the orphans that land on it (:func:`reap_orphans`).
        self.reaper = os.getpid() == 1
        self.reaped = 0
        self.reaped_at = 0.0
        #: A hung round's stacks being taken (:mod:`.hangs`); Python ranks with faulthandler only.
        self.capture: hangs.Capture | None = None
        #: The capture's states go to the coordinator (a gang's capture), not to a local verdict.
        self.capture_for_gang = False
        #: A hang this agent reported (``hang`` sent) and the coordinator has not answered yet:
        #: (when, the hung rank, reason, why, describe, exempt).
        self.hang_pending: tuple[float, procgroup.Proc, str, str, Callable[[procgroup.Proc], str], procgroup.Proc | None] | None = None
        #: Ranks of this round killed by their watchdog timer in a gang (no stack): what was said.
        self.exempted: dict[procgroup.Proc, str] = {}
        self.stacks = stacks.dumps_stacks(self.command)
        #: The agent store this agent hosts (Settings.store), from before its first round to its end.
        self.store: agentstore.AgentStore | None = None

    @property
    def round(self) -> int:
        return self.member.round

    @round.setter
    def round(self, value: int) -> None:
        self.member.round = value

    # --- output ----------------------------------------------------------------------------------

    def say(self, message: str) -> None:
        self.out.line(2, f"{_PREFIX}: {message}")

    def ranks(self) -> str:
        first = self.first_rank
        return f"rank {first}" if self.s.procs == 1 else f"ranks {first}..{first + self.s.procs - 1}"

    # --- signals ---------------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        if not self.received:
            self.signalled_at = time.time()
        self.received.append(signum)
        orphaned = os.getppid() != self.parent
        self._thaw()
        if self.group is not None:
            # In a pod the kubelet decides when it is enough; a worker whose runner is gone
            # (the parent-death signal) ends its processes itself, after the grace period.
            self.group.grace = self.s.grace if orphaned else 1e9
            self.group.stop(signum)
            if self.server is not None and self.server.machine.unseen():
                # Rank 0's pod deleted while the operator does not see its coordinator (its node
                # was cut off and is back): it was likely recreated elsewhere; no lingering.
                self.group.hurry(rendezvous.FENCE_GRACE)

    # --- the run ---------------------------------------------------------------------------------

    def run(self) -> int:
        """Runs until the job ends for this agent; returns the exit code."""
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            return self._run()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._cleanup()

    def _run(self) -> int:
        if self.s.watchdog:
            try:
                self.watchdog = timer.FileTimerServer(self.s.timer_file)
            except OSError as e:
                self.say(f"cannot serve the watchdog's pipe {self.s.timer_file}: {e}; the watchdog is off")
            else:
                self.selector.register(self.watchdog.fileno(), selectors.EVENT_READ, self.watchdog.read)
        if self.s.log_dir is not None or self.s.redirects or self.s.tee:
            base = self.s.log_dir or tempfile.mkdtemp(prefix="torchelastic_")
            os.makedirs(base, exist_ok=True)
            self.run_dir = tempfile.mkdtemp(prefix=f"{self.s.run_id}_", dir=base)
            self.say(f"log directory set to: {self.run_dir}")
        if self.s.store is not None:
            try:
                self.store = agentstore.AgentStore.start(*self.s.store, python=self.command[0])
            except agentstore.AgentStoreError as e:
                return self._exit(_Verdict(e.code, f"{_PREFIX}: {e}"))
            self.say(f"agent store listening on {self.s.store[0]}:{self.s.store[1]} (TORCHELASTIC_USE_AGENT_STORE=True), "
                     f"pid {self.store.pid}")
        if self.s.coordinator is None:
            return self._run_alone()
        addr, port = self.s.coordinator
        if self.s.member == 0:
            try:
                sock = listen(addr, port, self.s.bind_any)
            except OSError as e:
                return self._give_up(f"cannot listen on the agent port {port} (MONARCH_SPMD_AGENT_PORT): {e}",
                                     rendezvous.REASON_COORDINATOR_UNREACHABLE)
            machine = coordinator.Coordinator(self.s.members, self.s.first_round, self.s.policy, time.monotonic(),
                                             world_size=self.s.world_size, run_id=self.s.run_id, wall=time.time)
            self.server = CoordinatorServer(sock, machine, self.s.token)
            self.server.start()
            self.server.await_observer(observer_wait(os.environ), lambda: bool(self.received))
            if self.s.bind_any:
                addr = "127.0.0.1"  # its own coordinator, over loopback
        try:
            self.link = Link.connect(addr, port, time.monotonic() + self.s.connect_timeout, lambda: bool(self.received))
        except InterruptedError:
            return 128 + self.received[0]
        except TimeoutError as e:
            return self._give_up(f"{e} within {self.s.connect_timeout:g}s", rendezvous.REASON_COORDINATOR_UNREACHABLE)
        self.selector.register(self.link.fileno(), selectors.EVENT_READ, self.link.readable)
        self.link.send({"type": rendezvous.HELLO, "v": rendezvous.VERSION, "versions": list(rendezvous.VERSIONS),
                        "role": rendezvous.ROLE_MEMBER, "token": self.s.token,
                        "member": self.s.member, "incarnation": self.incarnation,
                        "round": self.s.first_round, "disruptions": self.s.policy.disruptions,
                        "node": self.s.node, "pod": self.s.pod, "pid": os.getpid(), "procs": self.s.procs,
                        "first_rank": self.s.first_rank,
                        **({"spare": self.s.spare} if self.s.spare is not None else {})})
        return self._serve()

    def _run_alone(self) -> int:
        """No coordinator: one round, then this agent's own verdict (the operator recreates)."""
        self._start_round(self.round)
        while self._step():
            pass
        group = self._end_round()
        if self.received:
            return self._signal_exit(group)
        failed = group.first_failure
        if failed is None:
            return 0
        code = failed.code or 1
        if self.s.procs == 1:
            return code  # the pod's log and exit code say it all, as before
        outcome = "stopped the other local ranks"
        if failed.reason in (rendezvous.REASON_WATCHDOG, rendezvous.REASON_NO_PROGRESS) and failed.message:
            outcome = f"{failed.reason} ({rendezvous.cut(failed.message, 1024)}); {outcome}"  # the rank to blame
        line = self._failure_line(failed.spec.rank, failed.spec.local_rank, code, outcome)
        return self._exit(_Verdict(code, line, list(failed.tail)))

    def _serve(self) -> int:
        """The member's loop: feeds :class:`.member.Member` what happens (a signal, the round's
        processes gone, the coordinator's messages, its silence) and carries out what it says."""
        link = self.link
        assert link is not None
        machine = self.member
        while True:
            if self.received:
                self._carry_out(machine.on_signal(self.received[0], self.signalled_at))
            group = self.group
            if group is not None and not group.finished:
                if not self._step():
                    self._end_round()
                    if self.received:
                        # The signal and the processes' end came in one turn: the coordinator
                        # still hears that this member left (not that it fell silent).
                        self._carry_out(machine.on_signal(self.received[0], self.signalled_at))
                        return self._signal_exit(group)
                    self._carry_out(machine.on_round_ended(self._exited_rows()))
            else:
                if self.received:
                    self._carry_out(machine.on_signal(self.received[0], self.signalled_at))
                    return 128 + self.received[0]
                self._select(TICK)
                self._reap()
            self._heartbeat()
            messages, link.inbox = link.inbox, []
            for message in messages:
                code = self._carry_out(machine.on_message(message, procs_running=self._procs_running()))
                if code is not None:
                    return code
            silent = time.monotonic() - link.heard > rendezvous.HEARTBEAT_TIMEOUT
            if link.closed or silent:
                if (link.broken or silent) and self.group is not None and not self.group.finished:
                    # Cut off (the connection broke or fell silent, not closed by the coordinator's
                    # end): the gang may be going on without this member, whatever else it was
                    # told (a pod deleted on a node just back from a freeze), so its processes
                    # end within the fence.
                    self.group.hurry(rendezvous.FENCE_GRACE)
                where = f"{self.s.coordinator[0]}:{self.s.coordinator[1]}" if self.s.coordinator else "?"
                lost = machine.on_link_lost(where, signalled=self.received[0] if self.received else None,
                                            procs_running=self._procs_running(), all_succeeded=self._all_succeeded())
                code = self._carry_out([lost])
                assert code is not None
                return code

    def _procs_running(self) -> bool:
        return self.group is not None and not self.group.finished

    def _carry_out(self, actions: Sequence[member.Do]) -> int | None:
        """Does what the member's state machine says; an exit code when the agent is to end."""
        for do in actions:
            if do.what == member.SEND:
                assert self.link is not None
                self.link.send(do.message)
            elif do.what == member.SAY:
                self.say(do.text)
            elif do.what == member.START:
                if self.link is not None and self.link.closed:
                    continue  # its coordinator is gone (a go read before a freeze): start nothing
                self._start_round(do.round, do.message.get("members"))
            elif do.what == member.STOP:
                self._thaw()
                if self.group is not None and not self.received:  # a signal already told them: no second one
                    self.group.stop()
                if self.group is not None and do.message.get("fence"):
                    self.group.hurry(rendezvous.FENCE_GRACE)  # the coordinator was stopped itself a while
            elif do.what == member.FREEZE:
                self._freeze(do.reason)
            elif do.what == member.DUMP:
                self._dump()
            elif do.what == member.SIGNAL_EXIT:
                group = self.group
                assert group is not None
                self._stop_and_wait()
                return self._signal_exit(group)
            elif do.what == member.EXIT:
                return do.code
            else:
                if self.group is not None and do.what == member.FAIL and do.message.get("fallback"):
                    # The gang is given up to be recreated (this member superseded, the
                    # coordinator cut off ...): a new gang may start without waiting for this
                    # member, so its processes end within the fence, not the stop grace.
                    self.group.hurry(rendezvous.FENCE_GRACE)
                self._stop_and_wait()
                if do.what == member.FINISH:
                    return self._exit(_Verdict(0, finished_line(do.message), say=False))
                if do.what == member.FAIL:
                    return self._exit(self._verdict(do.message))
                return self._give_up(do.text, do.reason)
        return None

    # --- one round -------------------------------------------------------------------------------

    def _start_round(self, r: int, listed: Any = None) -> None:
        """Starts round ``r``'s processes; ``listed``: the members of an elastic gang's round (its
        ``go`` says), from which this agent's ranks and the world's size follow."""
        self.failure_sent = False
        group = None
        if isinstance(listed, list) and all(isinstance(m, int) and not isinstance(m, bool) for m in listed):
            group = elastic.group_of(self.s.member, listed)
        self.first_rank = self.s.first_rank if group is None else group[0] * self.s.procs
        attempt_dir = None
        if self.run_dir is not None:
            attempt_dir = os.path.join(self.run_dir, f"attempt_{r}")
            shutil.rmtree(attempt_dir, ignore_errors=True)
            os.makedirs(attempt_dir)
        specs = []
        for local in range(self.s.procs):
            env = self.env_for(r, local) if group is None else self.env_for(r, local, group)
            logs = None
            if attempt_dir is not None:
                logs = procgroup.log_files(attempt_dir, local, self.s.redirects, self.s.tee)
                env["TORCHELASTIC_ERROR_FILE"] = logs.error_file or ""
            if self.watchdog is not None:
                env[timer.FILE_VAR] = self.watchdog.path
            specs.append(procgroup.ProcSpec(rank=self.first_rank + local, command=self.command, env=env,
                                            prefix=self.s.prefix, local_rank=int(env.get("LOCAL_RANK", local)),
                                            logs=logs))
        if r != self.s.first_round:
            self.say(f"restart {r}: starting {self.ranks()} again (TORCHELASTIC_RESTART_COUNT={r})")
        self.oom_base = oom_kills()
        self.capture = None
        self.capture_for_gang = False
        self.hang_pending = None
        self.exempted = {}
        self.group = hangs.CapturingGroup(specs, self.out, self.s.grace, on_failure=self._on_failure,
                               preexec=parent_death_hook(signal.SIGKILL), selector=self.selector)
        self.group.start(between=self._heartbeat)  # a slow start must not look like a lost agent
        if self.received:  # a signal came while they started: they get it too
            self.group.grace = self.s.grace if os.getppid() != self.parent else 1e9
            self.group.stop(self.received[0])
        if self.link is not None:
            self.link.send({"type": rendezvous.RUNNING, "round": r,
                            "procs": [{"rank": p.spec.rank, "local_rank": p.spec.local_rank, "pid": p.pid}
                                      for p in self.group.procs]})

    def _reap(self, now: float | None = None) -> None:
        """PID 1's duty, at most every REAP_EVERY seconds: waits for orphans that exited."""
        now = time.monotonic() if now is None else now
        if not self.reaper or now - self.reaped_at < REAP_EVERY:
            return
        self.reaped_at = now
        own = self.group.pids if self.group is not None and not self.group.finished else []
        self.reaped += reap_orphans(own)

    def _step(self) -> bool:
        assert self.group is not None
        alive = self.group.step(TICK)
        now = time.monotonic()
        self._reap(now)
        if self.capture is not None:
            if self.capture.done():
                self._captured()
            return bool(self.group.running())
        if self.hang_pending is not None and now - self.hang_pending[0] >= rendezvous.HANG_WAIT_SECONDS:
            _, proc, reason, why, describe, exempt = self.hang_pending
            self.hang_pending = None
            self.say(f"the coordinator did not answer rank {proc.spec.rank}'s hang within "
                     f"{rendezvous.HANG_WAIT_SECONDS:g}s; judging this pod's ranks alone")
            self._capture_here(proc, reason, why, describe, exempt)
            return bool(self.group.running())
        if self.watchdog is not None:
            self._check_timers()
        if (self.s.progress_timeout > 0 and not self.group.stop_deadline and self.capture is None
                and self.hang_pending is None and now - self._gang_output() >= self.s.progress_timeout):
            # The gang wrote nothing for the timeout: its rank silent longest here is named.
            silent = [p for p in self.group.running()
                      if now - p.last_output >= self.s.progress_timeout and p.reason is None]
            for proc in sorted(silent, key=lambda p: p.last_output)[:1]:  # the one silent longest
                self._hung(proc, rendezvous.REASON_NO_PROGRESS, "went silent first", self._silence)
        return alive

    def _gang_output(self) -> float:
        """When a rank of the gang last wrote output (monotonic): this pod's ranks' newest line,
        or a later one of any rank of the round as the coordinator's heartbeats tell it. Silence
        is judged for the gang: a rank whose peers print while its collectives complete (rank 0
        logs, the others say nothing) is not hung."""
        assert self.group is not None
        own = max((p.last_output for p in self.group.procs), default=0.0)
        link = self.link
        gang = link.gang_output if link is not None and not link.closed and link.gang_output is not None else 0.0
        return max(own, gang)

    def _silence(self, proc: procgroup.Proc) -> str:
        """The progress timeout's words about a rank: how long it has been silent, its last line."""
        idle = time.monotonic() - proc.last_output
        message = (f"rank {proc.spec.rank} wrote nothing for {idle:.0f}s (progress timeout "
                   f"{self.s.progress_timeout:g}s)")
        if self.s.output_in_failures:
            message += f"; last line: {proc.last_line or '(no output)'}"
        return message

    def _quiet(self, proc: procgroup.Proc) -> str:
        """What a rank of a hung gang that no detector of this agent named did: its silence."""
        if self.s.progress_timeout > 0:
            return self._silence(proc)
        message = f"rank {proc.spec.rank} wrote nothing for {time.monotonic() - proc.last_output:.0f}s"
        if self.s.output_in_failures:
            message += f"; last line: {proc.last_line or '(no output)'}"
        return message

    def _hung(self, proc: procgroup.Proc, reason: str, why: str, describe: Callable[[procgroup.Proc], str],
              exempt: procgroup.Proc | None = None) -> None:
        """``proc`` hangs: every rank's stack is taken before the round's ranks end, and the rank
        the rule names is the failure. In a gang the coordinator is told (``hang``): it has every
        member freeze its ranks and dump their stacks, and judges them all; an agent alone takes
        its own (:meth:`_capture_here`). Without stacks to take (not a Python rank with
        faulthandler, a round already stopping) ``proc`` is killed at once (SIGKILL), unless
        ``exempt`` says it was killed already."""
        assert self.group is not None
        if not self.stacks or self.group.stop_deadline or not isinstance(self.group, hangs.CapturingGroup):
            if exempt is None:
                self.group.kill(proc, reason, describe(proc))
            else:
                proc.reason, proc.message = reason, describe(proc)
            return
        if self.link is None:
            self._capture_here(proc, reason, why, describe, exempt)
            return
        if exempt is not None:
            exempt.stopped = True  # killed by its timer, reported with the gang's stacks (no stack of its own)
            self.exempted[exempt] = describe(exempt)
        if self.hang_pending is not None or self.capture is not None:
            return  # one hang at a time: the gang's capture covers this rank too
        self.hang_pending = (time.monotonic(), proc, reason, why, describe, exempt)
        self.say(f"rank {proc.spec.rank} hangs ({reason}); asking the coordinator to have every rank of "
                 f"the gang write its Python stack (SIGABRT: faulthandler writes it under the rank's prefix)")
        self.link.send({"type": rendezvous.HANG, "round": self.round, "rank": proc.spec.rank, "reason": reason,
                        "message": rendezvous.cut(describe(proc), rendezvous.MAX_TEXT), "at": time.time()})

    def _capture_here(self, proc: procgroup.Proc, reason: str, why: str, describe: Callable[[procgroup.Proc], str],
                      exempt: procgroup.Proc | None) -> None:
        assert isinstance(self.group, hangs.CapturingGroup)
        self.say(f"rank {proc.spec.rank} hangs ({reason}); taking every local rank's Python stack "
                 f"(SIGABRT: faulthandler writes it under the rank's prefix) before they end")
        self.capture = hangs.Capture.start(self.group, proc, reason, why, describe, exempt)
        self.capture_for_gang = False

    def _thaw(self) -> None:
        """Ranks frozen for a gang's capture that is called off (a stop, a signal, a lost
        coordinator) write their stacks and end now: a stopped process would not see a stop signal."""
        if self.capture is not None and self.capture.frozen:
            self.capture.abort()

    def _freeze(self, reason: str) -> None:
        """The coordinator's ``freeze``: this agent's running ranks stop (SIGSTOP) for their
        stacks; ``frozen`` says so (also when none runs)."""
        assert self.link is not None
        group = self.group
        if (self.capture is None and isinstance(group, hangs.CapturingGroup) and not group.finished and group.running()
                and self.stacks and not group.stop_deadline):
            if self.hang_pending is not None:
                _, proc, reason, why, describe, exempt = self.hang_pending
            else:
                proc = min(group.running(), key=lambda p: p.last_output)
                why, describe, exempt = "went silent first", self._quiet, None
            self.capture = hangs.Capture.freeze(group, proc, reason, why, describe, exempt)
            self.capture_for_gang = True
        self.hang_pending = None
        self.link.send({"type": rendezvous.FROZEN, "round": self.round})

    def _dump(self) -> None:
        """The coordinator's ``dump``: the frozen ranks write their stacks and end; ``stacks``
        follows when they have (:meth:`_captured`), at once when this agent froze none."""
        assert self.link is not None
        if self.capture is not None and self.capture_for_gang:
            ranks = [p.spec.rank for p in self.capture.aborted]
            if ranks:
                self.say(f"a rank of the gang hangs ({self.capture.reason}): {stacks.ranks_words(ranks)} of this pod "
                         f"write their Python stacks (SIGABRT: faulthandler writes them under the rank's prefix) "
                         f"and end")
            self.capture.abort()
        elif self.capture is None:
            self._send_stacks({}, {}, 0.0)

    def _send_stacks(self, states: Mapping[int, stacks.RankState], said: Mapping[procgroup.Proc, str],
                     now: float, silent: Callable[[procgroup.Proc], float] | None = None) -> None:
        """``stacks``: each rank's state with its process, what was said of it and its last lines
        (as many as fit the member's line, the newest first), and the ranks killed by their
        watchdog timer as ranks without a stack."""
        assert self.link is not None
        detail = self.s.output_in_failures
        procs = {**self.exempted, **said}
        budget = max(0, (rendezvous.MAX_MEMBER_LINE // 2) // max(1, len(procs)))
        rows = []
        for p in sorted(procs, key=lambda p: p.spec.rank):
            state = states.get(p.spec.rank) or stacks.RankState(p.spec.rank, stacks.NO_STACK)
            seconds = silent(p) if silent is not None else max(0.0, now - p.last_output)
            row = {**p.row(), **stacks.to_row(state), "silent": round(seconds, 3),
                   "said": rendezvous.cut(procs[p], rendezvous.MAX_TEXT),
                   "tail": _within(rendezvous.cut_lines(p.tail), budget) if detail else []}
            row.pop("stopped", None)
            rows.append(row)
        self.link.send({"type": rendezvous.STACKS, "round": self.round, "detail": detail, "ranks": rows})

    def _captured(self) -> None:
        """Every rank of the capture has ended: their states go to the coordinator (a gang's
        capture), or the rule names the rank to blame here, and it is the failure."""
        capture, group = self.capture, self.group
        assert capture is not None and isinstance(group, hangs.CapturingGroup)
        self.capture = None
        detail = self.s.output_in_failures
        if self.capture_for_gang and self.link is not None:
            now = time.monotonic()
            states = capture.states(group)
            self._send_stacks(states, {p: capture.describe(p) for p in capture.procs}, now,
                              lambda p: capture.silent_for(p, now))
            return
        verdict = capture.finish(group, detail=detail)
        self.say(f"{capture.reason}: {verdict.sentence}")
        hangs.fail(group, capture.proc(verdict.rank), capture.reason, capture.message(verdict, detail=detail))

    def _select(self, timeout: float) -> None:
        if not self.selector.get_map():
            time.sleep(timeout)
            return
        try:
            for key, _ in self.selector.select(timeout):
                if callable(key.data):
                    key.data()
        except InterruptedError:
            pass

    def _check_timers(self) -> None:
        assert self.watchdog is not None and self.group is not None
        by_pid = {p.pid: p for p in self.group.running()}
        for request in self.watchdog.timers.expired(time.time()):
            proc = by_pid.get(request.pid)
            if proc is None:
                try:
                    proc = by_pid.get(os.getpgid(request.pid))
                except OSError:
                    proc = None
            self.watchdog.timers.clear([request.pid])
            if proc is None or self.capture is not None or self.hang_pending is not None:
                continue  # not a process of this agent's round, or its stack is being (or about to be) taken
            # Where stacks can be taken, the rank's own is taken with the gang's before it ends: a
            # rank whose timer expired is often one that only waits for the culprit, and killed
            # first (its timer's signal, SIGKILL by default, as torchrun's agent sends it) it
            # would show no stack, leaving the rule only the culprit's and naming the wrong rank.
            # Otherwise (not a Python rank, a round already stopping) it gets its timer's signal.
            own = request.pid == proc.pid
            abort = (own and self.stacks and not self.group.stop_deadline
                     and isinstance(self.group, hangs.CapturingGroup))
            name = procgroup.signal_name(-request.signal) or str(request.signal)
            if not abort:
                try:
                    os.kill(request.pid, request.signal)
                except OSError:
                    pass
                ended = f"killed with {name}"
            else:
                ended = f"its stack taken with the gang's before it ends (instead of {name})"
            message = (f"watchdog timer {request.scope_id!r} of rank {proc.spec.rank} (pid {request.pid}) expired; "
                       f"{ended}")
            self._hung(proc, rendezvous.REASON_WATCHDOG, "whose watchdog timer expired",
                       lambda p, m=message, hung=proc: m if p is hung else self._quiet(p),
                       exempt=proc if own and not abort else None)

    def _on_failure(self, proc: procgroup.Proc) -> None:
        """The first process of the round to fail: report it at once (the gang stops the others)."""
        if self.received:
            return
        if self.s.procs > 1 and self.link is not None:  # alone, the last line says it
            self.say(f"rank {proc.spec.rank} (local rank {proc.spec.local_rank}) "
                     f"{self._how(proc)}; stopping the other local ranks")
        if self.link is not None and not self.failure_sent:
            self.failure_sent = True
            self.link.send({"type": rendezvous.FAILURE, "round": self.round, **self._failure_info(proc)})

    def _how(self, proc: procgroup.Proc) -> str:
        name = procgroup.signal_name(proc.returncode)
        what = f"was killed by {name} (exit code {proc.code})" if name else f"exited with code {proc.code}"
        if proc.reason in (rendezvous.REASON_WATCHDOG, rendezvous.REASON_NO_PROGRESS):
            what += f": {proc.reason}"
        return what

    def _failure_info(self, proc: procgroup.Proc) -> dict[str, Any]:
        reason = proc.reason
        if reason is None and proc.returncode == -signal.SIGKILL and self.oom_base is not None:
            now = oom_kills()
            if now is not None and now > self.oom_base:
                reason = rendezvous.REASON_OOM
        if reason is None:
            reason = rendezvous.REASON_SIGNAL if (proc.returncode or 0) < 0 else rendezvous.REASON_ERROR
        message = proc.message
        if self.s.output_in_failures:
            message = message or error_file_message(proc.spec.logs.error_file if proc.spec.logs else None)
        if not message:
            message = f"rank {proc.spec.rank} {self._how(proc)}"
            if self.s.procs > 1:  # as the verdict line names it (failure_line)
                message += f" (local rank {proc.spec.local_rank})"
        tail = rendezvous.cut_lines(proc.tail) if self.s.output_in_failures else []
        return {**proc.row(), "reason": reason, "message": rendezvous.cut(message, rendezvous.MAX_TEXT), "tail": tail,
                "at": proc.exited_at or time.time()}

    def _end_round(self) -> procgroup.ProcGroup:
        group = self.group
        assert group is not None
        group.finish()
        if self.watchdog is not None:
            self.watchdog.timers.clear(group.pids)
        self._renew_store()
        return group

    def _renew_store(self) -> None:
        """A fresh agent store for the next round, before this member says its round ended (so
        before any member can start the next round's ranks): :mod:`.agentstore`."""
        if self.store is None:
            return
        try:
            self.store.renew()
        except agentstore.AgentStoreError as e:
            self.say(f"{e}; starting it again")
            try:
                self.store = agentstore.AgentStore.start(self.store.addr, self.store.port, python=self.command[0])
            except agentstore.AgentStoreError as again:
                self.store = None
                self.say(f"{again}: the next round's ranks will find no store at MASTER_PORT")

    def _exited_rows(self) -> list[dict[str, Any]]:
        """The round's processes as ``exited`` reports them (with the reason the agent found)."""
        assert self.group is not None
        rows = []
        for p in self.group.procs:
            row = p.row()
            if p.reason:
                row["reason"] = p.reason
            rows.append(row)
        return rows

    def _all_succeeded(self) -> bool:
        return self.group is not None and all(p.code == 0 for p in self.group.procs)

    def _stop_and_wait(self) -> None:
        """Stops the round's processes (unless a signal already did) and waits until they are gone."""
        if self.group is None or self.group.finished:
            return
        self._thaw()
        if not self.received:
            self.group.stop()
        while self._step():
            pass
        self._end_round()

    def _heartbeat(self) -> None:
        link = self.link
        if link is None or time.monotonic() - link.sent < rendezvous.HEARTBEAT_INTERVAL:
            return
        beat: dict[str, Any] = {"type": rendezvous.HEARTBEAT}
        if self.group is not None and not self.group.finished:
            running = self.group.running()
            if running:
                now = time.monotonic()
                stalest = min(running, key=lambda p: p.last_output)
                freshest = max(p.last_output for p in running)
                beat.update(idle=round(now - stalest.last_output, 3), fresh=round(now - freshest, 3),
                            rank=stalest.spec.rank,
                            line=rendezvous.cut(stalest.last_line[-200:], rendezvous.MAX_OUTPUT_LINE)
                            if self.s.output_in_failures else "")
        link.send(beat)

    # --- endings ---------------------------------------------------------------------------------

    def _signal_exit(self, group: procgroup.ProcGroup) -> int:
        """The exit code after a signal stopped the round: the first process's non-zero code (what
        it made of the signal), 128+N when they had to be killed, else 0."""
        codes = [p.code for p in group.procs if p.code]
        if codes:
            return codes[0]
        return 128 + self.received[0] if group.killed else 0

    def _failure_line(self, rank: int, local: int | None, code: int, outcome: str) -> str:
        return failure_line(rank, local if self.s.procs > 1 else None, code, self.round, outcome)

    def _verdict(self, fail: Mapping[str, Any]) -> _Verdict:
        code = int(fail.get("exit_code") or EX_TEMPFAIL)
        reason = fail.get("reason") or rendezvous.REASON_ERROR
        if fail.get("fallback"):
            outcome = f"the gang must be recreated: {reason}"
            if fail.get("message"):
                outcome += f" ({fail['message']})"
        elif fail.get("permanent"):
            outcome = f"job failed: not retryable ({reason})"
        elif fail.get("exhausted") and not fail.get("max_restarts"):
            outcome = "job failed: no restarts allowed (maxRestarts 0)"
        elif fail.get("exhausted"):
            outcome = f"job failed: restarts used up ({fail.get('counted')} of {fail.get('max_restarts')})"
        else:
            outcome = f"job failed ({reason})"
        counted, at = fail.get("counted"), fail.get("round")
        if isinstance(counted, int) and isinstance(at, int) and 0 <= counted <= at:
            outcome += f"; {counted} of its {at} restarts counted"  # the rest were disruptions
        rank = fail.get("rank")
        self.round = int(fail.get("round", self.round))
        if rank is None:
            return _Verdict(code, f"{_PREFIX}: {outcome}", list(fail.get("tail") or []), say=self.s.member == 0)
        line = self._failure_line(int(rank), fail.get("local_rank"), int(fail.get("rank_exit_code") or code), outcome)
        # Every pod's termination message names the root cause; its log says it only where it happened.
        mine = fail.get("member") == self.s.member
        return _Verdict(code, line, list(fail.get("tail") or []), say=mine)

    def _give_up(self, message: str, reason: str) -> int:
        return self._exit(_Verdict(EX_TEMPFAIL, f"{_PREFIX}: {message} ({reason}); the gang must be recreated"))

    def _exit(self, verdict: _Verdict) -> int:
        if verdict.line:
            if verdict.say:
                self.out.line(2, verdict.line)
            tail = list(verdict.tail) if self.s.output_in_failures else []
            text = "\n".join([*tail, verdict.line]) + "\n"
            data = text.encode("utf-8", "replace")[-TERMINATION_LIMIT:]
            if os.path.exists(TERMINATION_LOG):  # the kubelet's file, in a pod only
                try:
                    with open(TERMINATION_LOG, "wb") as f:
                        f.write(data)
                except OSError:
                    pass  # not writable: the log's last line says it
        return verdict.code

    def _cleanup(self) -> None:
        if self.group is not None and not self.group.finished:
            self.group.stop()
            self.group.grace = min(self.group.grace, self.s.grace)
            self.group.finish()
        if self.link is not None:
            self.link.close()
        if self.server is not None:
            self.server.stop()
        if self.watchdog is not None:
            self.watchdog.close()
        if self.store is not None:  # last: the ranks that used it are gone
            self.store.close()
