"""A gang of local processes that start together and stop together, with rank-prefixed output.

Where it sits: in the payload (standard library only), beside :mod:`.worker`. Two things are
such a gang: the procs of one host in a PerHost pod (the worker starts them, as torchrun's agent
does) and the ranks of a job on a laptop (:mod:`monarch_spmd.runner` starts one worker each).

Behaviour, that of torchrun's local worker group:

* every member starts at once, each leading its own process group;
* each line a member writes is copied to the same stream of this process, prefixed with the
  member's rank (``[rank 3] ...``), whole lines only; a member whose output already carries rank
  prefixes (a PerHost worker) is passed through untouched;
* the first member to exit non-zero is the gang's failure: every other member gets SIGTERM at
  once, then SIGKILL (to its whole process group) after a grace period;
* :meth:`Gang.stop` does the same on request (a signal, a deadline).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final

#: How this process writes: (stream number 1 or 2, bytes).
Writer = Callable[[int, bytes], None]

_PREFIX: Final = b"[rank %d] "


def exit_code(returncode: int) -> int:
    """A shell's view of a return code: 128+N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def stream_writer(out: IO[Any], err: IO[Any]) -> Writer:
    """A :data:`Writer` onto two text streams (their byte buffers when they have one)."""
    streams = {1: out, 2: err}

    def write(which: int, data: bytes) -> None:
        stream = streams[which]
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            stream.flush()
            buffer.write(data)
            buffer.flush()
        else:
            stream.write(data.decode("utf-8", "replace"))
            stream.flush()

    return write


@dataclass(frozen=True)
class Member:
    """One process of a gang.

    Attributes:
        rank: the global rank it is known by (the prefix of its lines, and in messages).
        command: its argv.
        env: its whole environment.
        prefix: prefix its lines with ``[rank N]`` (False: they carry rank prefixes already).
    """

    rank: int
    command: Sequence[str]
    env: Mapping[str, str]
    prefix: bool = True


@dataclass
class _Proc:
    member: Member
    popen: subprocess.Popen[bytes]
    partial: dict[int, bytes] = field(default_factory=dict)
    code: int | None = None


class Gang:
    """The members of one attempt: their processes, their output and their stopping.

    Args:
        members: what to start.
        write: where the members' (prefixed) lines go.
        grace: seconds between SIGTERM and SIGKILL when stopping members.
        on_failure: called once with (rank, exit code) when the first member fails.
        preexec: a hook run in each child before exec (e.g. to die with this process).
    """

    def __init__(self, members: Sequence[Member], write: Writer, grace: float,
                 on_failure: Callable[[int, int], None] | None = None,
                 preexec: Callable[[], None] | None = None) -> None:
        self.members = list(members)
        self.write = write
        self.grace = grace
        self.on_failure = on_failure
        self.preexec = preexec
        self.selector = selectors.DefaultSelector()
        self.procs: list[_Proc] = []
        self.first_failure: _Proc | None = None
        self.stop_deadline: float | None = None
        self.killed = False
        self.finished = False

    def start(self) -> None:
        """Starts every member at once, each in its own process group."""
        for member in self.members:
            popen = subprocess.Popen(
                list(member.command),
                env=dict(member.env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=self.preexec,
            )
            proc = _Proc(member, popen)
            self.procs.append(proc)
            for which, pipe in ((1, popen.stdout), (2, popen.stderr)):
                if pipe is not None:
                    os.set_blocking(pipe.fileno(), False)
                    self.selector.register(pipe, selectors.EVENT_READ, (proc, which))

    @property
    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.procs]

    # --- output -----------------------------------------------------------------------------

    def _emit(self, proc: _Proc, which: int, data: bytes, final: bool = False) -> None:
        buf = proc.partial.get(which, b"") + data
        *lines, rest = buf.split(b"\n")
        if final and rest:
            lines.append(rest)
            rest = b""
        proc.partial[which] = rest
        if lines:
            prefix = _PREFIX % proc.member.rank if proc.member.prefix else b""
            self.write(which, b"".join(prefix + line + b"\n" for line in lines))

    def pump(self, timeout: float) -> None:
        """Copies whatever output is ready, waiting at most ``timeout`` seconds for some."""
        if not self.selector.get_map():
            time.sleep(timeout)
            return
        try:
            ready = self.selector.select(timeout)
        except InterruptedError:
            return
        for key, _ in ready:
            proc, which = key.data
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                self._emit(proc, which, data)
            else:
                self._close(key.fileobj, proc, which)

    def _close(self, fileobj: Any, proc: _Proc, which: int) -> None:
        self.selector.unregister(fileobj)
        fileobj.close()
        self._emit(proc, which, b"", final=True)

    # --- processes --------------------------------------------------------------------------

    def running(self) -> list[_Proc]:
        return [p for p in self.procs if p.code is None]

    def reap(self) -> None:
        """Records exits; on the first failure starts stopping the others."""
        for proc in self.running():
            rc = proc.popen.poll()
            if rc is None:
                continue
            proc.code = exit_code(rc)
            if proc.code != 0 and self.first_failure is None:
                self.first_failure = proc
                if self.on_failure is not None:
                    self.on_failure(proc.member.rank, proc.code)
                self.stop()

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Sends ``signum`` to every running member; SIGKILL follows after the grace period."""
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + self.grace
        for proc in self.running():
            try:
                proc.popen.send_signal(signum)
            except ProcessLookupError:
                pass

    def kill_groups(self) -> None:
        """SIGKILL to every member's process group: nothing started by the gang survives it."""
        for proc in self.procs:
            try:
                os.killpg(proc.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def step(self, timeout: float = 0.1) -> bool:
        """One turn of the loop; False once every member has exited."""
        self.pump(timeout)
        self.reap()
        if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline and self.running():
            self.killed = True
            self.kill_groups()
            self.stop_deadline = float("inf")
        return bool(self.running())

    def finish(self) -> None:
        """Kills leftovers, reaps every member and drains the rest of the output (once)."""
        if self.finished:
            return
        self.finished = True
        self.kill_groups()
        for proc in self.procs:
            proc.popen.wait()
        self.reap()
        deadline = time.monotonic() + 2.0
        while self.selector.get_map() and time.monotonic() < deadline:
            self.pump(0.05)
        for key in list(self.selector.get_map().values()):
            proc, which = key.data
            self._close(key.fileobj, proc, which)
        self.selector.close()
