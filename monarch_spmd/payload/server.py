"""The coordinator's sockets: rank 0's agent serves its gang's :class:`.hub.Hub` on the agent port.

Where it sits: in the payload (standard library only), above :mod:`.hub` (who each connection
is, the routing; no I/O) and :mod:`.rendezvous` (the state machine), below :mod:`.agent`, whose
member 0 starts it. One thread, one selector: it accepts, reads what arrived into the hub, sends
what the hub routes (each connection's outbox bounded by MAX_OUTBOX), and ticks the hub's clock
every 0.1 s. TCP keepalive and the user timeout (:func:`.link.keepalive`) notice a peer whose
node is gone in ~8 s.
"""

from __future__ import annotations

import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

from . import coordinator, hub, rendezvous
from .link import keepalive

_PREFIX = "monarch-spmd worker"


class _Wire:
    """A peer's socket and the bytes waiting to be sent to it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = bytearray()


class CoordinatorServer:
    """The coordinator's sockets around :class:`.hub.Hub`, in a thread of its own.

    Members and observers connect to the listening socket; the first line of each says which it
    is (``hello``). Heartbeats go out every HEARTBEAT_INTERVAL; a member silent for
    HEARTBEAT_TIMEOUT is lost, and one whose node is gone sooner, by TCP keepalive.

    Attributes:
        conns: every open connection's peer, by socket.
        lock: the state machine's (held while the hub runs; tests take it to act on the machine).
    """

    def __init__(self, sock: socket.socket, machine: coordinator.Coordinator, token: str = "") -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self.machine = machine
        self.hub = hub.Hub(machine, token, self._transmit, self._shut)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ, None)
        self.conns: dict[socket.socket, hub.Peer] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="monarch-spmd-coordinator", daemon=True)
        self.lock = threading.RLock()

    @property
    def observers(self) -> list[hub.Peer]:
        return self.hub.observers

    def start(self) -> None:
        with self.lock:
            self.hub.start()
        self.thread.start()

    def await_observer(self, seconds: float, interrupted: Callable[[], bool]) -> None:
        """Waits up to ``seconds`` until an observer is connected (the local runner's wait)."""
        until = time.monotonic() + seconds
        while not self.hub.observers and time.monotonic() < until and not interrupted():
            time.sleep(0.01)

    def stop(self) -> None:
        """Sends what is pending (a last ``fail`` or ``finish``), then closes every connection."""
        self.stopped.set()
        self.thread.join(5)
        deadline = time.monotonic() + 2.0
        for peer in list(self.conns.values()):
            wire: _Wire = peer.handle
            wire.sock.setblocking(True)
            wire.sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                if wire.out:
                    wire.sock.sendall(bytes(wire.out))
            except OSError:
                pass
            wire.sock.close()
        self.sock.close()
        self.selector.close()

    def _apply(self, outs: Sequence[rendezvous.Out]) -> None:
        """Carries out what the machine returned (tests act on the machine under :attr:`lock`)."""
        self.hub.apply(outs)

    def _close(self, peer: hub.Peer) -> None:
        self.hub.close(peer, time.monotonic())

    # --- the loop --------------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self.stopped.is_set():
            ready = self.selector.select(0.1)
            with self.lock:
                self.hub.awake(time.monotonic())
            for key, events in ready:
                if key.fileobj is self.sock:
                    self._accept()
                    continue
                peer = self.conns.get(key.fileobj)  # type: ignore[call-overload]
                if peer is None:
                    continue
                if events & selectors.EVENT_READ:
                    self._read(peer)
                if events & selectors.EVENT_WRITE and peer.open:
                    self._flush(peer)
            with self.lock:
                self.hub.tick(time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:  # BlockingIOError: none left
                return
            if len(self.hub.pending()) >= rendezvous.MAX_PENDING:
                # Full: read what the waiting ones sent first, so a member whose hello is in is
                # never the one closed to make room (the hub closes the oldest still silent).
                for peer in self.hub.pending():
                    self._read(peer)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keepalive(sock)
            with self.lock:
                peer = self.hub.accepted(_Wire(sock), time.monotonic())
            self.conns[sock] = peer
            self.selector.register(sock, selectors.EVENT_READ, None)

    def _read(self, peer: hub.Peer) -> None:
        wire: _Wire = peer.handle
        error = False
        try:
            data = wire.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            data, error = b"", e.errno or True  # ETIMEDOUT: the kernel gave up on a silent peer
        with self.lock:
            try:
                self.hub.received(peer, data, time.monotonic(), error=error)
            except Exception as e:  # noqa: BLE001 - one connection's trouble never ends the coordinator
                print(f"{_PREFIX}: coordinator: closed a connection after {type(e).__name__}: {e}", file=sys.stderr,
                      flush=True)
                if peer.role in (rendezvous.ROLE_MEMBER, rendezvous.ROLE_SPARE):
                    self.hub.broken(peer, rendezvous.LOST_DISCONNECTED, time.monotonic())
                else:
                    self.hub.close(peer, time.monotonic())

    # --- the hub's transport ---------------------------------------------------------------------

    def _transmit(self, peer: hub.Peer, data: bytes) -> bool:
        wire: _Wire = peer.handle
        if len(wire.out) + len(data) > rendezvous.MAX_OUTBOX and wire.out:
            wire.out.clear()  # a peer that does not read: the hub drops it
            return False
        wire.out += data
        self._flush(peer)
        return True

    def _flush(self, peer: hub.Peer) -> None:
        wire: _Wire = peer.handle
        while wire.out and peer.open:
            try:
                n = wire.sock.send(wire.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                wire.out.clear()
                with self.lock:
                    self.hub.broken(peer, rendezvous.LOST_DISCONNECTED, time.monotonic())
                return
            del wire.out[:n]
        if not peer.open:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if wire.out else 0)
        try:
            self.selector.modify(wire.sock, events, None)
        except (KeyError, ValueError):
            pass

    def _shut(self, peer: hub.Peer) -> None:
        wire: _Wire = peer.handle
        self.conns.pop(wire.sock, None)
        try:
            self.selector.unregister(wire.sock)
        except (KeyError, ValueError):
            pass
        if wire.out:
            try:
                wire.sock.setblocking(True)
                wire.sock.settimeout(1.0)
                wire.sock.sendall(bytes(wire.out))
            except OSError:
                pass
        wire.sock.close()
