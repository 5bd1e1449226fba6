"""The local runner's observer of a coordinator: a thread that follows its events.

Where it sits: in the payload (standard library only), above :mod:`.follow` (the observer's side
of the protocol, without I/O) and :mod:`.rendezvous`; used by :mod:`monarch_spmd.runner` and the
tests. The operator's observer is its asyncio twin (``spmd_operator.observer``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from . import follow, rendezvous


class Observer:
    """An observer of a coordinator (the local runner's; the operator has an asyncio twin): a
    thread that connects, says hello and hands each event to ``on_message``, once, in order.

    The protocol (hello, the welcome or refusal, the run, the history's replay, the sequence
    numbers) is :class:`.follow.Follower`'s: ``on_message`` gets the events a welcome's history
    holds that were not taken before, then the welcome itself without its history (the
    coordinator's round and phase now), then every event as it comes.

    Args:
        addr, port: the coordinator.
        on_message: called (in the observer's thread) with each message.
        retry_until: keep trying to connect until this monotonic time.
        token: the attempt's agent token.
    """

    def __init__(self, addr: str, port: int, on_message: Callable[[dict[str, Any]], None],
                 retry_until: float, token: str = "") -> None:
        self.addr, self.port = addr, port
        self.follower = follow.Follower(token)
        self.on_message = on_message
        self.retry_until = retry_until
        self.error: str | None = None
        self.stopped = threading.Event()
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._run, name="monarch-spmd-observer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(5)

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                sock = socket.create_connection((self.addr, self.port), timeout=1.0)
            except OSError:
                if time.monotonic() >= self.retry_until:
                    return
                self.stopped.wait(0.05)
                continue
            try:
                self._read(sock)
            except (ConnectionError, rendezvous.ProtocolError) as e:
                self.error = str(e)
            finally:
                self.follower.disconnected()
                sock.close()
            return

    def _read(self, sock: socket.socket) -> None:
        sock.settimeout(0.2)
        sock.sendall(rendezvous.encode(self.follower.hello()))
        self.connected.set()
        lines = rendezvous.LineBuffer()
        beat = rendezvous.encode({"type": rendezvous.HEARTBEAT})
        sent = time.monotonic()
        while not self.stopped.is_set():
            if time.monotonic() - sent >= rendezvous.HEARTBEAT_INTERVAL:
                sent = time.monotonic()
                try:
                    sock.sendall(beat)  # the coordinator knows it is still heard
                except OSError:
                    return
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            for message in lines.feed(data):
                for event in self.follower.take(message):
                    self.on_message(event)
                if message.get("type") == rendezvous.WELCOME:
                    self.on_message({k: v for k, v in message.items() if k != "history"})

