"""What runs in a simulated pod: the worker as a hot spare or as a member's agent, and strangers.

The decisions are the product's own: a member's side of the protocol is the real
:class:`monarch_spmd.payload.member.Member`; member 0 serves the real
:class:`monarch_spmd.payload.hub.Hub` around the real :class:`~monarch_spmd.payload.coordinator.Coordinator`;
a pod's inputs are read by the real ``worker.read_inputs`` from the env the operator's real
builder wrote, and turned into the agent's settings by ``worker.agent_settings``. What is
simulated is the I/O the real :class:`monarch_spmd.payload.agent.Agent` does around them, step by
step as its loop does it (``Agent._serve``): processes, signals, the connection, its reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from monarch_spmd.payload import agent as agent_mod
from monarch_spmd.payload import hub as hub_mod
from monarch_spmd.payload import coordinator, elastic, member, rendezvous, worker
from monarch_spmd.payload.names import EX_TEMPFAIL

from .cluster import Pod, Rank
from .core import Conn, Proc

#: The real agent's loop turns at least this often (agent.TICK); a wake-up waits up to this long.
TICK = agent_mod.TICK
#: How often the coordinator's clock is ticked (the real server ticks every 0.1 s).
HUB_TICK = 0.25


class Worker(Proc):
    """The container's first process: ``worker.main`` (a spare's wait, then the agent)."""

    def __init__(self, sim: Any, pod: Pod) -> None:
        super().__init__(sim.world, pod.node, f"worker {pod.name}")
        self.sim = sim
        self.pod = pod
        pod.procs.append(self)
        self.base = pod.resolved_env()
        self.base["NODE_NAME"] = pod.node.name
        self.inputs = worker.read_inputs(self.base)
        self.role = "starting"
        self.link: Conn | None = None
        self.lines = rendezvous.LineBuffer()
        self.inbox: list[dict[str, Any]] = []
        self.link_closed = False
        self.link_broken = False
        self.received: list[int] = []
        self.signalled_at: float | None = None
        self.exit_code: int | None = None
        self.deadline = self.world.now + self.inputs.rendezvous_timeout
        # the agent's state (once a member)
        self.settings: agent_mod.Settings | None = None
        self.member: member.Member | None = None
        self.incarnation = ""
        self.hub: hub_mod.Hub | None = None
        self.server: Server | None = None
        self.group: list[Rank] = []
        self.group_done = True
        self.exits: list[Rank] = []
        self.first_failure: Rank | None = None
        self.failure_sent = False
        self.stop_deadline: float | None = None
        self.ending: tuple[str, Any] | None = None
        self.wake_pending = False
        self.later(0.01, self._wait_for_master)

    # --- helpers ----------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self.world.say(f"{self.pod.name}: {text}")

    def rng(self) -> Any:
        return self.world.rng

    def _wait_for_master(self) -> None:
        """The worker waits for MASTER_ADDR to resolve (the gang's rank-0 pod has an address)."""
        if self.sim.resolve(self.inputs.master_addr) is not None:
            if self.inputs.spare is not None:
                self.role = "spare"
                if self.world.now < self.sim.spares_crash_until:
                    self._exit(1, "a spare's worker crashes at once (a bad image, a broken node)")
                    return
                self._dial()
            else:
                self._become_agent(self.inputs)
            return
        if self.world.now >= self.deadline:
            self._exit(EX_TEMPFAIL, "rendezvous timeout")
            return
        self.later(0.5, self._wait_for_master)

    # --- the connection -----------------------------------------------------------------------

    def _address(self) -> str:
        if self.settings is not None and self.settings.member == 0:
            return "127.0.0.1"
        return self.inputs.agent_addr or self.inputs.master_addr

    def _dial(self) -> None:
        self.sim.dial(self, self._address(), self._connected, self._dial_failed, (self._data, self._closed))

    def _dial_failed(self, error: str = "") -> None:
        if self.exit_code is not None:
            return
        if self.received:
            self._exit(128 + self.received[0], "stopped while connecting")
            return
        if self.world.now >= self.deadline:
            self._exit(EX_TEMPFAIL, "the coordinator was not reachable (CoordinatorUnreachable)")
            return
        self.later(0.1, self._dial)

    def _connected(self, conn: Conn) -> None:
        self.link = conn
        self.lines = rendezvous.LineBuffer()
        self.inbox = []
        self.link_closed = False
        if self.role == "spare":
            self._send({"type": rendezvous.HELLO, "v": rendezvous.VERSION, "versions": list(rendezvous.VERSIONS),
                        "role": rendezvous.ROLE_SPARE, "token": self.inputs.agent_token or "",
                        "spare": self.inputs.spare, "incarnation": self._new_incarnation(), "node": self.node.name})
            self.later(rendezvous.HEARTBEAT_INTERVAL, self._beat, conn)
            return
        assert self.settings is not None
        self._send({"type": rendezvous.HELLO, "v": rendezvous.VERSION, "versions": list(rendezvous.VERSIONS),
                    "role": rendezvous.ROLE_MEMBER, "token": self.settings.token, "member": self.settings.member,
                    "incarnation": self.incarnation, "round": self.settings.first_round,
                    "disruptions": self.settings.policy.disruptions, "node": self.settings.node,
                    "pod": self.settings.pod,
                    "procs": self.settings.procs, "first_rank": self.settings.first_rank,
                    **({"spare": self.settings.spare} if self.settings.spare is not None else {})})
        self.later(rendezvous.HEARTBEAT_INTERVAL, self._beat, conn)
        self.wake()

    def _new_incarnation(self) -> str:
        return "%032x" % self.rng().getrandbits(128)

    def _send(self, message: Mapping[str, Any]) -> bool:
        if self.link is None or self.link_closed:
            return False
        if not self.link.send(self, rendezvous.encode(message)):
            self.link_closed = True
            return False
        return True

    def _data(self, conn: Conn, data: bytes) -> None:
        if conn is not self.link:
            return
        try:
            messages = self.lines.feed(data)
        except rendezvous.ProtocolError:
            self.link_closed = True
            conn.close(self)
            self.wake()
            return
        self.inbox.extend(m for m in messages if m.get("type") != rendezvous.HEARTBEAT)
        if self.role == "spare":
            self._spare_messages()
        else:
            self.wake()

    def _closed(self, conn: Conn) -> None:
        if conn is not self.link:
            return
        self.link_closed = True
        self.link_broken = conn.broken
        if self.role == "spare":
            self._spare_exit(0, "the coordinator is gone: its attempt is over")
        else:
            self.wake()

    def _beat(self, conn: Conn) -> None:
        if conn is not self.link or self.link_closed or self.exit_code is not None:
            return
        if self.role == "agent" and self.ending is not None:
            return  # stopping and waiting: the real agent's loop sends none then
        self._send({"type": rendezvous.HEARTBEAT})
        self.later(rendezvous.HEARTBEAT_INTERVAL, self._beat, conn)

    # --- signals ----------------------------------------------------------------------------

    def signal(self, signum: int) -> None:
        """The kubelet's SIGTERM (a pod deleted): handled when the process runs."""
        self.world.after(0.0, self.run, self._on_signal, (signum,))

    def _on_signal(self, signum: int) -> None:
        if self.exit_code is not None:
            return
        if not self.received:
            self.signalled_at = self.world.wall()
        self.received.append(signum)
        if self.role == "spare":
            self._send({"type": rendezvous.LEAVE, "signal": signum})
            self._spare_exit(128 + signum, f"stopped by signal {signum}")
            return
        if self.role != "agent":
            return  # waiting for the master: the next poll sees it
        # The agent's handler: the processes get the signal at once; the kubelet decides when
        # it is enough (no SIGKILL of the agent's own).
        for rank in self.group:
            if rank.alive:
                rank.stopped = True
                rank.term()
        if self.server is not None and self.server.hub.machine.unseen() and any(r.alive for r in self.group):
            self.later(rendezvous.FENCE_GRACE, self._kill_group, list(self.group))
        self.wake()

    # --- a spare ------------------------------------------------------------------------------

    def _spare_messages(self) -> None:
        messages, self.inbox = self.inbox, []
        for message in messages:
            kind = message.get("type")
            if kind == rendezvous.ASSIGN and isinstance(message.get("member"), int):
                taken = int(message["member"])
                self.say(f"spare takes member {taken}'s place")
                if self.link is not None:
                    self.link.close(self)
                self.link = None
                self._become_agent(self.inputs.as_member(taken))
                return
            if kind in (rendezvous.FINISH, rendezvous.FAIL):
                self._spare_exit(0, "the gang ended")
                return
            if kind == rendezvous.REFUSED:
                self._spare_exit(EX_TEMPFAIL, "refused")
                return

    def _spare_exit(self, code: int, why: str) -> None:
        self.say(f"spare exits {code}: {why}")
        self._exit(code, None)

    # --- a member's agent ---------------------------------------------------------------------

    def _become_agent(self, inputs: worker.WorkerInputs) -> None:
        self.role = "agent"
        self.inputs = inputs
        self.settings = worker.agent_settings(inputs, self.base)
        self.member = member.Member(self.settings.first_round, self.settings.member)
        self.incarnation = self._new_incarnation()
        self.first_rank = self.settings.first_rank
        self.deadline = self.world.now + self.settings.connect_timeout
        if self.received:
            self._exit(128 + self.received[0], None)
            return
        if self.settings.member == 0:
            self.server = Server(self)
            self.hub = self.server.hub
            self.sim.listening(self.server)
        self._dial()

    def wake(self, at_once: bool = False) -> None:
        """The loop turns soon: at once for a process's exit (its pidfd wakes the selector), else
        within TICK (a signal, the connection)."""
        if not self.wake_pending and self.exit_code is None:
            self.wake_pending = True
            self.later(self.world.uniform(0.0005, 0.005) if at_once else self.world.uniform(0.001, TICK),
                       self._iterate)

    def child_exited(self, rank: Rank) -> None:
        self.world.after(0.0, self.run, self._child_exited, (rank,))

    def _child_exited(self, rank: Rank) -> None:
        if rank in self.group:
            self.exits.append(rank)
            self.wake(at_once=True)

    def _iterate(self) -> None:
        """One turn of the real agent's loop (``Agent._serve``), from the end of its wait: the
        exits that came while it waited, the coordinator's messages, its connection, then the
        top of the next turn (a signal that came)."""
        self.wake_pending = False
        if self.exit_code is not None or self.member is None:
            return
        self._reap()
        if self.ending is not None:
            self._maybe_end()
            return
        machine = self.member
        if not self.group_done:
            if all(not r.alive for r in self.group):
                self.group_done = True
                if self.received:
                    self._carry_out(machine.on_signal(self.received[0], self.signalled_at))
                    self._exit(self._signal_code(), None)
                    return
                if self._carry_out(machine.on_round_ended(self._rows())):
                    return
        elif self.received:
            self._carry_out(machine.on_signal(self.received[0], self.signalled_at))
            self._exit(128 + self.received[0], None)
            return
        messages, self.inbox = self.inbox, []
        for message in messages:
            if self._carry_out(machine.on_message(message, procs_running=self._procs_running())):
                return
        if self.link is not None and self.link_closed:
            if self.link_broken and any(r.alive for r in self.group):
                self.later(rendezvous.FENCE_GRACE, self._kill_group, list(self.group))  # cut off: its fence
            where = self._address()
            lost = machine.on_link_lost(where, signalled=self.received[0] if self.received else None,
                                        procs_running=self._procs_running(), all_succeeded=self._all_succeeded())
            self._carry_out([lost])
            return
        if self.received and self._carry_out(machine.on_signal(self.received[0], self.signalled_at)):
            return

    def _reap(self) -> None:
        exits, self.exits = self.exits, []
        for rank in exits:
            if rank.code != 0 and not rank.stopped and self.first_failure is None:
                self.first_failure = rank
                self._on_failure(rank)
                self._stop_group()

    def _on_failure(self, rank: Rank) -> None:
        if self.received:
            return
        if not self.failure_sent:
            self.failure_sent = True
            code = rank.code
            self._send({"type": rendezvous.FAILURE, "round": self.member.round, "rank": rank.rank,
                        "local_rank": rank.local, "pid": rank.pid, "exit_code": code, "returncode": rank.returncode,
                        "signal": None, "reason": rendezvous.REASON_SIGNAL if (rank.returncode or 0) < 0
                        else rendezvous.REASON_ERROR, "message": f"rank {rank.rank} exited with code {code}",
                        "tail": [], "at": self.sim.wall_of(rank)})

    def _procs_running(self) -> bool:
        return bool(self.group) and not self.group_done

    def _all_succeeded(self) -> bool:
        return bool(self.group) and all(r.code == 0 for r in self.group)

    def _rows(self) -> list[dict[str, Any]]:
        return [{"rank": r.rank, "local_rank": r.local, "pid": r.pid, "exit_code": r.code, "returncode": r.returncode,
                 "signal": None, "stopped": r.stopped} for r in self.group]

    def _signal_code(self) -> int:
        codes = [r.code for r in self.group if r.code]
        return codes[0] if codes else 0

    def _carry_out(self, actions: Sequence[member.Do]) -> bool:
        """Does what the member's machine says; True once the agent is ending."""
        for do in actions:
            if do.what == member.SEND:
                self._send(do.message)
            elif do.what == member.SAY:
                self.say(do.text)
            elif do.what == member.START:
                if self.link is not None and self.link_closed:
                    continue  # its coordinator is gone (a go read before a freeze): start nothing
                self._start_round(do.round, do.message.get("members"))
            elif do.what == member.STOP:
                if not self.received:
                    self._stop_group()
                if do.message.get("fence") and any(r.alive for r in self.group):
                    self.later(rendezvous.FENCE_GRACE, self._kill_group, list(self.group))
            elif do.what in (member.FREEZE, member.DUMP):
                pass  # no hang is simulated
            elif do.what == member.EXIT:
                self._exit(do.code, None)
                return True
            else:
                self.ending = (do.what, do)
                if do.what != member.SIGNAL_EXIT and not self.received:
                    self._stop_group()
                if do.what == member.FAIL and do.message.get("fallback") and any(r.alive for r in self.group):
                    self.later(rendezvous.FENCE_GRACE, self._kill_group, list(self.group))  # its fence
                self._maybe_end()
                return True
        return False

    def _maybe_end(self) -> None:
        """The ending waits until the round's processes are gone (``Agent._stop_and_wait``)."""
        if self.group and any(r.alive for r in self.group):
            return
        assert self.ending is not None
        what, do = self.ending
        if what == member.SIGNAL_EXIT:
            self._exit(self._signal_code(), None)
        elif what == member.FINISH:
            self._exit(0, agent_mod.finished_line(do.message))
        elif what == member.FAIL:
            verdict = agent_mod.Agent._verdict(self._as_agent(), do.message)
            self._exit(verdict.code, self._termination(verdict))
        else:
            line = f"monarch-spmd worker: {do.text} ({do.reason}); the gang must be recreated"
            self._exit(EX_TEMPFAIL, line)

    def _as_agent(self) -> Any:
        """The real agent's verdict wording needs its settings and round only."""
        settings, member_ = self.settings, self.member

        class _A:
            s = settings
            round = member_.round

            def _failure_line(self, rank: int, local: int | None, code: int, outcome: str) -> str:
                return agent_mod.failure_line(rank, local if settings.procs > 1 else None, code, self.round, outcome)
        return _A()

    def _termination(self, verdict: Any) -> str | None:
        if not verdict.line:
            return None
        return "\n".join([*verdict.tail, verdict.line])

    def _start_round(self, round_: int, listed: Any) -> None:
        s = self.settings
        assert s is not None
        group = None
        if isinstance(listed, list) and all(isinstance(m, int) and not isinstance(m, bool) for m in listed):
            group = elastic.group_of(s.member, listed)
        self.first_rank = s.first_rank if group is None else group[0] * s.procs
        self.first_failure = None
        self.failure_sent = False
        self.stop_deadline = None
        self.exits = []
        self.group = [self.sim.start_rank(self, self.first_rank + local, local, round_) for local in range(s.procs)]
        self.group_done = False
        self._send({"type": rendezvous.RUNNING, "round": round_,
                    "procs": [{"rank": r.rank, "local_rank": r.local, "pid": r.pid} for r in self.group]})

    def _stop_group(self) -> None:
        """SIGTERM to every running rank of the round, SIGKILL after the stop grace."""
        assert self.settings is not None
        running = [r for r in self.group if r.alive]
        for rank in running:
            rank.stopped = True
            rank.term()
        if running and self.stop_deadline is None:
            self.stop_deadline = self.world.now + self.settings.grace
            self.later(self.settings.grace, self._kill_group, list(self.group))

    def _kill_group(self, group: list[Rank]) -> None:
        for rank in group:
            rank.kill()
        self.wake()

    # --- the end ------------------------------------------------------------------------------

    def _exit(self, code: int, message: str | None) -> None:
        if self.exit_code is not None:
            return
        self.exit_code = code
        self.say(f"exits {code}{f': {message.splitlines()[-1]}' if message else ''}")
        if self.server is not None:
            self.sim.listening(self.server, False)
            self.server.die()
        for rank in self.group:
            rank.kill()
        self.die()
        self.sim.kubelet(self.pod).container_ended(self.pod, code, message)


class Server(Proc):
    """Member 0's coordinator thread: the real hub on the agent port (``server.CoordinatorServer``)."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(worker.world, worker.node, f"coordinator {worker.pod.name}")
        self.worker = worker
        self.pod = worker.pod
        worker.pod.procs.append(self)
        s = worker.settings
        assert s is not None
        machine = coordinator.Coordinator(s.members, s.first_round, s.policy, self.world.now,
                                         world_size=s.world_size, run_id=s.run_id, wall=self.world.wall)
        self.hub = hub_mod.Hub(machine, s.token, self._send, self._close)
        self.peers: dict[int, hub_mod.Peer] = {}
        self.hub.start()
        self.later(HUB_TICK, self._tick)

    def accept(self, conn: Conn) -> None:
        """A connection to the coordinator's port."""
        self.peers[id(conn)] = self.hub.accepted(conn, self.world.now)

    def server_data(self, conn: Conn, data: bytes) -> None:
        peer = self.peers.get(id(conn))
        if peer is not None:
            self.hub.received(peer, data, self.world.now)

    def server_closed(self, conn: Conn) -> None:
        peer = self.peers.pop(id(conn), None)
        if peer is not None:
            self.hub.received(peer, b"", self.world.now, error=conn.broken)

    def _send(self, peer: hub_mod.Peer, data: bytes) -> bool:
        return bool(peer.handle.send(self, data))

    def _close(self, peer: hub_mod.Peer) -> None:
        peer.handle.close(self)
        self.peers.pop(id(peer.handle), None)

    def _tick(self) -> None:
        self.hub.tick(self.world.now)
        self.later(HUB_TICK, self._tick)


class Stranger(Proc):
    """A pod of another namespace speaking to the coordinator's port: no token, junk, silence."""

    def __init__(self, sim: Any, node: Any, kind: str, target: str) -> None:
        super().__init__(sim.world, node, f"stranger {kind}")
        self.sim = sim
        self.kind = kind
        sim.dial(self, target, self._connected, lambda error="": None, (lambda c, d: None, lambda c: None))

    def _connected(self, conn: Conn) -> None:
        if self.kind == "junk":
            conn.send(self, b"\x00\xff not json\n")
        elif self.kind == "hello":
            conn.send(self, rendezvous.encode({"type": "hello", "role": "member", "versions": [1], "member": 1,
                                               "token": "not-the-token", "incarnation": "x"}))
        elif self.kind == "observer":
            conn.send(self, rendezvous.encode({"type": "hello", "role": "observer", "versions": [1],
                                               "token": "wrong"}))
        # "silent": says nothing (the hub closes it after HELLO_TIMEOUT)
