"""A member's and a spare's connection to the coordinator, and the TCP options every protocol connection gets.

Where it sits: in the payload (standard library only), above :mod:`.rendezvous` (messages, line
framing, the TCP options' values), below :mod:`.agent` (a member's :class:`Link`), :mod:`.server`
(the coordinator's listening socket and :func:`keepalive`) and :mod:`.worker` (a hot spare's
:func:`wait_as_spare`).
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from . import rendezvous
from .names import EX_TEMPFAIL

#: How often a waiting spare's loop turns at the least (seconds).
TICK: Final = 0.1


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def keepalive(sock: socket.socket) -> None:
    """TCP keepalive and the user timeout on a protocol connection (rendezvous.TCP_OPTIONS): a
    peer whose node is gone is noticed by the kernel within ~8 s, whatever the CPU load of either
    side."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in rendezvous.TCP_OPTIONS:
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def listen(addr: str, port: int, bind_any: bool) -> socket.socket:
    """The coordinator's listening socket: every interface (IPv6 and IPv4 where both exist) or
    ``addr`` only."""
    if bind_any:
        if socket.has_dualstack_ipv6():
            try:
                return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=4096)
            except OSError:
                pass
        return socket.create_server(("", port), backlog=4096)
    return socket.create_server((addr, port), family=_family(addr), backlog=4096)



class Link:
    """A member's connection to the coordinator: lines in through the agent's selector, lines out
    with a bounded blocking send."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lines = rendezvous.LineBuffer()
        self.inbox: list[dict[str, Any]] = []
        self.closed = False
        #: It ended by an error (reset, timed out), not by the coordinator closing it.
        self.broken = False
        self.heard = time.monotonic()
        self.sent = time.monotonic()
        #: When a rank of the gang last wrote output, as the coordinator's latest heartbeat said
        #: (monotonic; None: it has not said).
        self.gang_output: float | None = None

    @classmethod
    def connect(cls, addr: str, port: int, deadline: float, should_stop: Callable[[], bool]) -> Link:
        """Connects, retrying refused connections and names that do not resolve yet, until
        ``deadline`` (monotonic).

        Raises:
            TimeoutError: naming the address and the last error.
            InterruptedError: when ``should_stop`` says so.
        """
        last = "no attempt"
        while True:
            if should_stop():
                raise InterruptedError("stopped while connecting to the coordinator")
            try:
                sock = socket.create_connection((addr, port), timeout=min(5.0, max(0.5, deadline - time.monotonic())))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                keepalive(sock)
                sock.settimeout(rendezvous.HEARTBEAT_TIMEOUT)
                return cls(sock)
            except OSError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the coordinator at {addr}:{port} was not reachable; last error: {last}")
            time.sleep(0.1)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Mapping[str, Any]) -> bool:
        if self.closed:
            return False
        try:
            self.sock.sendall(rendezvous.encode(message))
            self.sent = time.monotonic()
            return True
        except OSError:
            self.broken = True
            self.close()
            return False

    def readable(self) -> None:
        """Reads what arrived (called when the selector says the socket is readable)."""
        if self.closed:
            return
        try:
            data = self.sock.recv(65536, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
            self.broken = True
        if not data:
            self.close()
            return
        self.heard = time.monotonic()
        try:
            for m in self.lines.feed(data):
                if m["type"] != rendezvous.HEARTBEAT:
                    self.inbox.append(m)
                    continue
                since = m.get("progress")
                if isinstance(since, (int, float)) and not isinstance(since, bool) and 0 <= since < 1e9:
                    self.gang_output = self.heard - float(since)
        except rendezvous.ProtocolError:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


@dataclass(frozen=True)
class SpareOutcome:
    """How a spare's wait ended: a member's place to take (``member``), or an exit code."""

    member: int | None = None
    code: int = 0
    why: str = ""


def wait_as_spare(addr: str, port: int, *, spare: int, token: str, node: str, connect_timeout: float,
                  interrupted: Callable[[], int | None]) -> SpareOutcome:
    """A hot spare's wait (docs/restart-in-place.md, "Hot spares"): connected to the coordinator
    as spare ``spare``, heartbeats both ways, until ``assign`` gives it a lost member's place.

    It ends without a place (exit 0) when the gang finishes or fails or its coordinator is gone:
    the attempt it was a spare of is over. ``interrupted()`` returns a stop signal's number.
    """
    try:
        link = Link.connect(addr, port, time.monotonic() + connect_timeout, lambda: interrupted() is not None)
    except InterruptedError:
        return SpareOutcome(code=128 + (interrupted() or signal.SIGTERM), why="stopped while connecting")
    except TimeoutError as e:
        return SpareOutcome(code=EX_TEMPFAIL, why=f"{e} within {connect_timeout:g}s")
    selector = selectors.DefaultSelector()
    selector.register(link.fileno(), selectors.EVENT_READ)
    link.send({"type": rendezvous.HELLO, "v": rendezvous.VERSION, "versions": list(rendezvous.VERSIONS),
               "role": rendezvous.ROLE_SPARE, "token": token, "spare": spare, "incarnation": uuid.uuid4().hex,
               "node": node, "pid": os.getpid()})
    try:
        while True:
            signum = interrupted()
            if signum is not None:
                link.send({"type": rendezvous.LEAVE, "signal": signum})
                return SpareOutcome(code=128 + signum, why=f"stopped by signal {signum}")
            for _ in selector.select(TICK):
                link.readable()
            for message in link.inbox:
                kind = message.get("type")
                if kind == rendezvous.ASSIGN and isinstance(message.get("member"), int):
                    return SpareOutcome(member=int(message["member"]))
                if kind in (rendezvous.FINISH, rendezvous.FAIL):
                    return SpareOutcome(code=0, why=f"the gang ended ({kind}) before a member's place was free")
                if kind == rendezvous.REFUSED:
                    return SpareOutcome(code=EX_TEMPFAIL, why=f"the coordinator refused this spare: {message.get('reason')}")
            link.inbox = []
            if link.closed or time.monotonic() - link.heard > rendezvous.HEARTBEAT_TIMEOUT:
                return SpareOutcome(code=0, why=f"the coordinator at {addr}:{port} is gone: its attempt is over")
            if time.monotonic() - link.sent >= rendezvous.HEARTBEAT_INTERVAL:
                link.send({"type": rendezvous.HEARTBEAT})
    finally:
        selector.close()
        link.close()
