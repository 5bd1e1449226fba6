"""torchrun's watchdog (the file timer) served by the agent, standard library only.

Where it sits: in the payload, below :mod:`.agent`, which creates a :class:`FileTimerServer`
when TORCHELASTIC_ENABLE_FILE_TIMER=1, registers :meth:`FileTimerServer.fileno` in its loop, and
kills the ranks whose timers expire (reason WatchdogTimeout). No thread: the agent's loop reads
the pipe whenever it is readable.

The contract is torch's (torch/distributed/elastic/timer/file_based_local_timer.py, as
torchrun's local_elastic_agent serves it): the agent creates a FIFO at TORCHELASTIC_TIMER_FILE
(a fresh ``watchdog_timer_<uuid>`` in the temp folder when unset) and gives its path to every
worker as TORCHELASTIC_TIMER_FILE. A worker's ``FileTimerClient`` opens it non-blocking for
writing, writes one JSON line per request and closes it::

    {"version": 1, "pid": 4242, "scope_id": "step", "expiration_time": 1767000000.5, "signal": 9}

``expiration_time`` is Unix time; a negative one releases the timer ``(pid, scope_id)``. A timer
whose time passed is expired: its pid gets its signal (a signal of 0 or less means "do not
reap", as torch says), and every timer of that pid is dropped.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

#: The variables of torchrun's watchdog contract.
ENABLE_VAR: Final = "TORCHELASTIC_ENABLE_FILE_TIMER"
FILE_VAR: Final = "TORCHELASTIC_TIMER_FILE"


@dataclass(frozen=True)
class TimerRequest:
    """One request of a worker: acquire (``expiration_time`` >= 0) or release a timer."""

    pid: int
    scope_id: str
    expiration_time: float
    signal: int


def parse_request(line: bytes | str) -> TimerRequest | None:
    """A request from one line of the pipe, or None for a line that is not one (ignored, as a
    torch server logs and carries on)."""
    try:
        data = json.loads(line)
        return TimerRequest(int(data["pid"]), str(data["scope_id"]), float(data["expiration_time"]),
                            int(data.get("signal", 0)))
    except (ValueError, KeyError, TypeError):
        return None


class Timers:
    """The armed timers, keyed by (pid, scope_id): the pure part of the server."""

    def __init__(self) -> None:
        self.timers: dict[tuple[int, str], TimerRequest] = {}

    def register(self, request: TimerRequest) -> None:
        key = (request.pid, request.scope_id)
        if request.expiration_time < 0:
            self.timers.pop(key, None)
        else:
            self.timers[key] = request

    def expired(self, now: float) -> list[TimerRequest]:
        """Per pid, its earliest expired timer that carries a signal (torch's choice of which
        signal to reap with); pids whose expired timers carry none are left alone."""
        by_pid: dict[int, list[TimerRequest]] = {}
        for request in self.timers.values():
            if request.expiration_time <= now:
                by_pid.setdefault(request.pid, []).append(request)
        out = []
        for requests in by_pid.values():
            requests.sort(key=lambda r: r.expiration_time)
            signalled = [r for r in requests if r.signal > 0]
            if signalled:
                out.append(signalled[0])
        return out

    def clear(self, pids: Iterable[int]) -> None:
        """Drops every timer of ``pids`` (reaped, or gone)."""
        gone = set(pids)
        for key in [k for k in self.timers if k[0] in gone]:
            del self.timers[key]


class FileTimerServer:
    """The server end of torch's ``FileTimerClient``: a FIFO read from the agent's loop.

    Args:
        path: the FIFO's path (TORCHELASTIC_TIMER_FILE), or None for a fresh one in the temp
            folder. A file already there is replaced, as torch's server does.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.path.join(tempfile.gettempdir(), f"watchdog_timer_{uuid.uuid4()}")
        try:
            if stat.S_ISFIFO(os.stat(self.path).st_mode) or os.path.isfile(self.path):
                os.remove(self.path)
        except FileNotFoundError:
            pass
        os.mkfifo(self.path)
        self.read_fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        # Our own writer keeps the pipe open between clients: no end-of-file, no busy loop.
        self.keep_fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        self.partial = b""
        self.timers = Timers()

    def fileno(self) -> int:
        return self.read_fd

    def read(self) -> None:
        """Registers every complete request waiting in the pipe."""
        while True:
            try:
                data = os.read(self.read_fd, 65536)
            except BlockingIOError:
                return
            if not data:
                return
            *lines, self.partial = (self.partial + data).split(b"\n")
            for line in lines:
                request = parse_request(line) if line.strip() else None
                if request is not None:
                    self.timers.register(request)

    def close(self) -> None:
        """Closes the pipe and removes it."""
        for fd in (self.read_fd, self.keep_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.remove(self.path)
        except OSError:
            pass
