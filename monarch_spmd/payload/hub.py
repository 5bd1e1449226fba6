"""The coordinator's connections without I/O: who each one is, what it may say, where answers go.

Where it sits: in the payload (standard library only), between :mod:`.rendezvous` (the protocol's
messages and the coordinator's state machine) and whatever carries bytes: :mod:`.server` (the
sockets and the thread rank 0's agent runs) and the test suite's deterministic simulation
(tests/sim), which drives this same code over simulated connections and a virtual clock.

A :class:`Peer` is one connection. Its first line must be a ``hello`` carrying the attempt's
token (:func:`.rendezvous.token_matches`); that line makes it a member, a hot spare or an
observer. A member's later messages are checked (:func:`.rendezvous.check_member_message`) and
fed to the :class:`.coordinator.Coordinator`; what the coordinator returns is routed here: to one
member, to every member, to a spare, or to the observers. A bad message closes its own
connection and nothing else (a member closed so is lost, as if its connection had broken).

The transport is two callbacks: ``send(peer, data) -> bool`` (False: the peer does not read and
its outbox is full: it is dropped) and ``close(peer)`` (after the last bytes were sent).
Nothing here reads a clock: every entry point takes ``now`` (monotonic seconds).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from typing import Any, Final

from . import coordinator, rendezvous

#: A read's errors that mean nothing answered from the peer's node (its kernel would have reset
#: or closed the connection): the user timeout, keepalive, no route.
TIMED_OUT: Final = frozenset({errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN})


#: The role of a member's connection after its ``leave``: it stays open until its agent ends.
DEPARTING = "departing"


class Peer:
    """One connection to the coordinator, as the hub knows it.

    Attributes:
        handle: the transport's own object for it (a socket's record; a simulated connection).
        role: None until a valid ``hello``; then member, spare or observer.
        member, spare, incarnation: who said hello.
        heard: when it last said anything; accepted: when it connected.
        open: False once closed (nothing more is sent or read).
    """

    def __init__(self, handle: Any, now: float) -> None:
        self.handle = handle
        self.lines = rendezvous.LineBuffer(rendezvous.MAX_HELLO_LINE)
        self.role: str | None = None
        self.member: int | None = None
        self.spare: int | None = None
        self.incarnation = ""
        self.heard = now
        self.accepted = now
        self.open = True
        #: Its connection ended by an error (a reset, the kernel's timeout), not closed by it.
        self.error = False
        self.timed_out = False


class Hub:
    """Every connection of one coordinator and the routing of its answers.

    Args:
        machine: the coordinator's state machine.
        token: the attempt's proof of membership ("" accepts any hello).
        send: the transport's send: ``send(peer, data)``; False when the peer's outbox is full.
        close: the transport's close: ``close(peer)``.
    """

    def __init__(self, machine: coordinator.Coordinator, token: str,
                 send: Callable[[Peer, bytes], bool], close: Callable[[Peer], None]) -> None:
        self.machine = machine
        self.token = token
        self._send_bytes = send
        self._close_transport = close
        self.peers: list[Peer] = []
        self.by_member: dict[int, Peer] = {}
        self.by_spare: dict[int, Peer] = {}
        self.observers: list[Peer] = []
        self.last_beat: float | None = None
        self.last_turn: float | None = None

    # --- the transport's entry points ---------------------------------------------------------

    def start(self) -> None:
        """The first round's event (call once, before any connection)."""
        self.apply(self.machine.start())

    def accepted(self, handle: Any, now: float) -> Peer:
        """A new connection. Where MAX_PENDING have not said hello yet, the oldest of them goes
        first: a flood of strangers never keeps a member, whose hello comes at once, out (the
        transport reads what the pending ones sent before it accepts more)."""
        pending = self.pending()
        if len(pending) >= rendezvous.MAX_PENDING:
            self.close(min(pending, key=lambda p: p.accepted), now)
        peer = Peer(handle, now)
        self.peers.append(peer)
        return peer

    def pending(self) -> list[Peer]:
        """The open connections that have not said hello yet."""
        return [p for p in self.peers if p.role is None]

    def received(self, peer: Peer, data: bytes, now: float, *, error: bool | int = False) -> None:
        """Bytes read from ``peer``; empty: the connection closed (its member is lost), by an
        error (a reset, the kernel's timeout) when ``error``."""
        if not peer.open:
            return
        if not data:
            peer.error = bool(error)
            # Timed out (the kernel's user timeout, keepalive): nothing answered from the peer's
            # node. A reset or a close came from its kernel: the node is up.
            peer.timed_out = error in TIMED_OUT
            self.broken(peer, rendezvous.LOST_DISCONNECTED, now)
            return
        peer.heard = now
        try:
            for message in peer.lines.messages(data):
                self.handle(peer, message, now)
                if not peer.open:
                    return
        except rendezvous.ProtocolError as e:
            # A bad line or message closes its own connection and nothing else: a member's closing
            # is that member lost, as a broken connection is; one that left has ended.
            if peer.role in (rendezvous.ROLE_MEMBER, DEPARTING):
                self.send(peer, rendezvous.encode({"type": rendezvous.REFUSED, "reason": str(e)}))
                self.broken(peer, rendezvous.LOST_DISCONNECTED, now)
            else:
                self.refuse(peer, str(e), now)

    def awake(self, now: float) -> None:
        """The transport's loop turned (call it first in each turn, before what it read): a turn
        that comes STALL_SECONDS after the one before means the coordinator itself was stopped
        (its node froze) or starved meanwhile."""
        last, self.last_turn = self.last_turn, now
        if last is not None and now - last >= rendezvous.STALL_SECONDS:
            self.apply(self.machine.stalled(now, now - last))

    def tick(self, now: float) -> None:
        """Connections that never said hello close after HELLO_TIMEOUT; the coordinator's
        deadlines; heartbeats to members and spares every HEARTBEAT_INTERVAL, and a member or
        spare silent for HEARTBEAT_TIMEOUT is lost."""
        self.awake(now)
        for peer in self.pending():
            if now - peer.accepted > rendezvous.HELLO_TIMEOUT:
                self.close(peer, now)  # never said hello: a port scanner, a stranger, a wedged client
        self.apply(self.machine.tick(now))
        if self.last_beat is None:
            self.last_beat = now
        if now - self.last_beat < rendezvous.HEARTBEAT_INTERVAL:
            return
        self.last_beat = now
        since = self.machine.since_output(now)
        beat = rendezvous.encode({"type": rendezvous.HEARTBEAT} if since is None else
                                 {"type": rendezvous.HEARTBEAT, "progress": round(since, 3)})
        for peer in list(self.peers):
            if peer.open and peer.role in (rendezvous.ROLE_MEMBER, rendezvous.ROLE_SPARE, DEPARTING):
                self.send(peer, beat)
                if peer.open and now - peer.heard > rendezvous.HEARTBEAT_TIMEOUT:
                    self.broken(peer, rendezvous.LOST_HEARTBEAT, now)

    def broken(self, peer: Peer, reason: str, now: float) -> None:
        """``peer``'s connection is gone (closed, reset, silent, refused): a member's is that
        member lost; a waiting spare's, that spare no longer ready; one that left has ended."""
        member = peer.member
        departing = peer.role == DEPARTING
        self.close(peer, now)
        if member is not None and self.by_member.get(member) is peer:
            del self.by_member[member]
            self.apply(self.machine.lost(member, reason, now, heard=peer.heard,
                                         silent=peer.timed_out or reason == rendezvous.LOST_HEARTBEAT))
        elif departing and member is not None:
            self.apply(self.machine.departed(member, peer.incarnation, now))

    def leave(self, peer: Peer, now: float, at: float | None = None) -> None:
        """A member says ``leave`` (its agent got a stop signal: its pod is being deleted): it is
        lost now (a spare may take its place), and its connection stays open until its agent
        ends, which says that its processes have (the next round waits for that)."""
        member = peer.member
        assert member is not None
        if self.by_member.get(member) is peer:
            del self.by_member[member]
        peer.role = DEPARTING
        m = self.machine
        self.apply(m.lost(member, rendezvous.LOST_LEFT, now, at=at, heard=peer.heard))
        if m.unseen():
            self.fence_departing(peer)

    def fence_departing(self, peer: Peer) -> None:
        """A member left (its pod deleted) while the operator does not see this coordinator (their
        node was cut off and is back): the gang was likely recreated elsewhere meanwhile, so its
        processes end within the fence too, not after its pod's grace (the others' stop says so)."""
        self.send(peer, rendezvous.encode({"type": rendezvous.STOP, "round": self.machine.round, "fence": True}))

    # --- messages -----------------------------------------------------------------------------

    def handle(self, peer: Peer, message: dict[str, Any], now: float) -> None:
        """One message from ``peer``; raises :class:`.rendezvous.ProtocolError` for a bad one."""
        kind = message["type"]
        m = self.machine
        if peer.role is None:
            self._hello(peer, message, now)
            return
        member = peer.member
        if peer.role == rendezvous.ROLE_SPARE:
            if kind == rendezvous.HEARTBEAT:
                return
            if kind == rendezvous.LEAVE:
                self.close(peer, now)
                return
            raise rendezvous.ProtocolError(f"a spare may send only hb and leave, not {str(kind)[:40]!r}")
        if peer.role == DEPARTING:
            return  # a member that left: only the end of its connection matters now
        if peer.role == rendezvous.ROLE_OBSERVER:
            if kind != rendezvous.HEARTBEAT:
                raise rendezvous.ProtocolError(f"an observer may send only hb, not {str(kind)[:40]!r}")
            self.apply(m.observer_beat(now))  # it still hears this coordinator
            return
        if peer.role != rendezvous.ROLE_MEMBER or member is None:
            raise rendezvous.ProtocolError("a connection without a role says nothing but hello")
        message = rendezvous.check_member_message(message)
        r = message.get("round")
        if kind == rendezvous.JOIN:
            self.apply(m.join(member, r, now))
        elif kind == rendezvous.RUNNING:
            self.apply(m.running(member, r, message["procs"], now))
        elif kind == rendezvous.FAILURE:
            self.apply(m.failure(member, r, message, now))
        elif kind == rendezvous.EXITED:
            self.apply(m.exited(member, r, message["procs"], now))
        elif kind == rendezvous.HANG:
            self.apply(m.hang(member, r, message, now))
        elif kind == rendezvous.FROZEN:
            self.apply(m.frozen(member, r, now))
        elif kind == rendezvous.STACKS:
            self.apply(m.stacks(member, r, message["ranks"], message["detail"], now))
        elif kind == rendezvous.LEAVE:
            self.leave(peer, now, message.get("at"))
        elif kind == rendezvous.HEARTBEAT:
            self.apply(m.heartbeat(member, now, idle=message["idle"], rank=message["rank"], line=message["line"],
                                   fresh=message.get("fresh")))

    def _hello(self, peer: Peer, message: dict[str, Any], now: float) -> None:
        if message["type"] != rendezvous.HELLO:
            raise rendezvous.ProtocolError(f"the first message must be hello, not {message['type'][:40]!r}")
        if not rendezvous.token_matches(self.token, message.get("token")):
            # Says nothing of the job: no member id, no round, no output.
            raise rendezvous.ProtocolError("not a member or observer of this job's attempt (wrong token)")
        m = self.machine
        hello = rendezvous.check_hello(message, m.members)
        if rendezvous.VERSION not in hello["versions"]:
            raise rendezvous.ProtocolError(f"protocol versions {hello['versions']} are not spoken here")
        role = hello["role"]
        if role == rendezvous.ROLE_OBSERVER:
            if len(self.observers) >= rendezvous.MAX_OBSERVERS:
                raise rendezvous.ProtocolError(f"{rendezvous.MAX_OBSERVERS} observers are connected already")
            peer.role = role
            self.observers.append(peer)
            self.send(peer, rendezvous.encode(m.observer_welcome()))
            self.apply(m.observer_joined(now))
            return
        peer.lines.limit = rendezvous.MAX_MEMBER_LINE
        peer.incarnation = hello["incarnation"]
        if role == rendezvous.ROLE_SPARE:
            spare = hello["spare"]
            old = self.by_spare.get(spare)
            peer.role, peer.spare = role, spare
            self.by_spare[spare] = peer
            self._superseding(old, peer, m.spare_hello(spare, hello["incarnation"], now, node=hello["node"]), now)
            return
        member = hello["member"]
        refused = m.admits(member, hello["spare"])
        if refused is not None:
            raise rendezvous.ProtocolError(refused)
        old = self.by_member.get(member)
        if old is not None and old.incarnation == hello["incarnation"]:
            self.close(old, now)  # the same agent once more: one connection per member, the newest
        peer.role, peer.member = role, member
        self.by_member[member] = peer
        self._superseding(old, peer, m.hello(member, hello["incarnation"], now, disruptions=hello["disruptions"],
                                             node=hello["node"], pod=hello["pod"], spare=hello["spare"]), now)

    def _superseding(self, old: Peer | None, peer: Peer, outs: Sequence[rendezvous.Out], now: float) -> None:
        """A hello's answers; one that drops (a new incarnation supersedes ``old``) is sent to the
        old connection, which is then closed."""
        for out in outs:
            if out.drop:
                if old is not None and old is not peer:
                    self.send(old, rendezvous.encode(out.message))
                    self.close(old, now)
                continue
            self.apply([out])

    # --- what goes out ------------------------------------------------------------------------

    def apply(self, outs: Sequence[rendezvous.Out]) -> None:
        """Sends what the coordinator returned where it goes."""
        for out in outs:
            data = rendezvous.encode(out.message)
            if out.to == rendezvous.OBSERVERS:
                for peer in list(self.observers):
                    self.send(peer, data)
            elif out.to == rendezvous.ALL:
                for peer in list(self.by_member.values()):
                    self.send(peer, data)
            elif isinstance(out.to, str) and out.to.startswith(f"{rendezvous.ROLE_SPARE}:"):
                peer = self.by_spare.get(int(out.to.split(":", 1)[1]))
                if peer is not None:
                    self.send(peer, data)
            else:
                peer = self.by_member.get(int(out.to))
                if peer is not None:
                    self.send(peer, data)

    def send(self, peer: Peer, data: bytes) -> None:
        """Sends ``data`` to ``peer``; one whose outbox is full (it does not read) is dropped: an
        observer (it may reconnect and get a welcome), or a member (lost, as one whose
        connection broke)."""
        if not peer.open:
            return
        if not self._send_bytes(peer, data):
            if peer.role == rendezvous.ROLE_MEMBER:
                self.broken(peer, rendezvous.LOST_DISCONNECTED, self.machine.now)
            else:
                self.close(peer)

    def refuse(self, peer: Peer, reason: str, now: float | None = None) -> None:
        self.send(peer, rendezvous.encode({"type": rendezvous.REFUSED, "reason": reason,
                                           "versions": list(rendezvous.VERSIONS)}))
        self.close(peer, now)

    def close(self, peer: Peer, now: float | None = None) -> None:
        """Closes ``peer`` (after what waits to be sent); a waiting spare is no longer ready."""
        if not peer.open:
            return
        now = self.machine.now if now is None else now
        peer.open = False
        if peer in self.peers:
            self.peers.remove(peer)
        spare = peer.spare
        if spare is not None and self.by_spare.get(spare) is peer:
            del self.by_spare[spare]
            self.apply(self.machine.spare_lost(spare, peer.incarnation, now))
        if peer in self.observers:
            self.observers.remove(peer)
            self._close_transport(peer)
            self.apply(self.machine.observer_left(peer.error, now))
            return
        self._close_transport(peer)
