"""A group of local processes that start together and stop together, with rank-prefixed output.

Where it sits: in the payload (standard library only), below :mod:`.agent`. Two things are such
a group: the processes of one round in an agent (the procs of a pod, as torchrun's agent runs its
local worker group) and the workers of a job on a laptop (:mod:`monarch_spmd.runner` starts one
worker per pod the operator would create). (A *gang* is the pods of one attempt, and a *member*
one place in it, throughout the project; a group is what runs on one host.)

Behaviour, that of torchrun's local worker group:

* every process starts at once, each leading its own process group (so a stop reaches what it
  started too), with an optional pre-exec hook (the agent's: die with the agent);
* output is copied as it arrives, partial lines and ``\\r`` included (a progress bar updates in
  place), each line (and each ``\\r``-rewritten line) prefixed with the process's rank
  (``[rank 3] ...``) by a :class:`Prefixer`, which ends a line left open by one process before
  another's output, so prefixes never land mid-line; a process whose output carries rank
  prefixes already (a PerHost worker) is passed through unprefixed;
* optionally each process's stdout and stderr also (tee) or only (redirect) go to files, laid
  out as torchrun lays them out (:func:`log_files`);
* :meth:`ProcGroup.stop` sends a signal to every running process and SIGKILL to each process
  group after the grace period; a process that exits after it was stopped is marked
  ``stopped``, so it is never mistaken for a failure of its own;
* each process remembers when it last wrote anything and its last lines, for the progress
  timeout and for failure reports.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final

#: How this process writes: (stream number 1 or 2, bytes).
Writer = Callable[[int, bytes], None]

_PREFIX: Final = b"[rank %d] "
_SEPARATORS: Final = re.compile(rb"(\r\n|\n|\r)")
#: Lines of output each process keeps for its failure report.
TAIL_LINES: Final = 20


def _wake() -> None:
    """A process's pidfd became readable: it exited; the step's reap collects it."""


def exit_code(returncode: int) -> int:
    """A shell's view of a return code: 128+N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(returncode: int | None) -> str | None:
    """``SIGKILL`` for a return code of -9 (a process killed by a signal), else None."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def describe_returncode(returncode: int | None) -> str:
    """A return code as torchrun prints it: ``3``, or ``-9 (SIGKILL)``."""
    if returncode is None:
        return "-"
    name = signal_name(returncode)
    return f"{returncode} ({name})" if name else str(returncode)


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


class Prefixer:
    """Copies the output of several sources onto one writer, keeping rank prefixes at line starts.

    Each source (a process of the group, or this process's own lines) writes to stream 1 or 2. A source's text
    is passed on as it arrives; the prefix goes before the first text of every line and after
    every ``\\r`` (a progress bar rewriting its line keeps its prefix). When a source writes while
    another source's line is still open on the same stream, a newline ends that line first, and
    the other source's next text starts a new prefixed line. Thread-safe.
    """

    def __init__(self, write: Writer) -> None:
        self.write = write
        self.lock = threading.Lock()
        self.owner: dict[int, object] = {}  # stream -> the source whose line is open on it
        self.at_start: dict[tuple[object, int], bool] = {}
        # Sources whose open line was ended for them: the newline they send next is theirs already.
        self.broken: set[tuple[object, int]] = set()

    def feed(self, source: object, which: int, data: bytes, prefix: bytes = b"") -> None:
        """Passes ``data`` of ``source`` on, prefixing each line with ``prefix``."""
        if not data:
            return
        with self.lock:
            out = bytearray()
            key = (source, which)
            for piece in _SEPARATORS.split(data):
                if not piece:
                    continue
                if key in self.broken:
                    self.broken.discard(key)
                    if piece in (b"\n", b"\r\n"):
                        continue
                if piece in (b"\n", b"\r\n"):
                    if self.owner.get(which) not in (None, source):
                        self._break(which, out)
                    out += piece
                    self.at_start[key] = True
                    self.owner.pop(which, None)
                    continue
                if piece == b"\r":
                    out += piece
                    self.at_start[key] = True
                    self.owner[which] = source
                    continue
                if self.owner.get(which) not in (None, source):
                    self._break(which, out)
                if self.at_start.get(key, True):
                    out += prefix
                    self.at_start[key] = False
                out += piece
                self.owner[which] = source
            if out:
                self.write(which, bytes(out))

    def _break(self, which: int, out: bytearray) -> None:
        other = self.owner.pop(which)
        self.at_start[(other, which)] = True
        self.broken.add((other, which))
        out += b"\n"

    def end(self, source: object, which: int) -> None:
        """``source`` wrote its last byte on ``which``: end its open line, if any."""
        with self.lock:
            if self.owner.get(which) == source:
                self.owner.pop(which)
                self.write(which, b"\n")
            self.at_start[(source, which)] = True

    def line(self, which: int, text: str) -> None:
        """One whole line of this process's own (a note), on a line of its own."""
        self.feed(self, which, text.rstrip("\n").encode() + b"\n")


# --- torchrun's log files ------------------------------------------------------------------------

#: torchrun's ``Std``: which of a rank's streams a setting covers.
STD_NONE: Final = 0
STD_OUT: Final = 1
STD_ERR: Final = 2
STD_ALL: Final = 3
_STD_VALUE: Final = re.compile(r"^[0-3]$")
_STD_MAPPING: Final = re.compile(r"^(\d+:[0-3],)*(\d+:[0-3])$")


def parse_std(text: str, name: str) -> int | dict[int, int]:
    """torchrun's ``--redirects``/``--tee`` value: ``3``, or per local rank ``0:3,1:0``.

    Raises:
        ValueError: naming ``name`` and what is valid.
    """
    value = text.strip()
    if _STD_VALUE.match(value):
        return int(value)
    if _STD_MAPPING.match(value):
        return {int(k): int(v) for k, v in (part.split(":") for part in value.split(","))}
    raise ValueError(f"{name}: {text!r} is not valid; expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), "
                     "or per local rank, e.g. 0:3,1:0")


def std_of(setting: int | Mapping[int, int], local_rank: int) -> int:
    """The setting of one local rank (torchrun's ``to_map``)."""
    if isinstance(setting, Mapping):
        return int(setting.get(local_rank, STD_NONE))
    return int(setting)


@dataclass(frozen=True)
class LogFiles:
    """Where one process's output goes besides (tee) or instead of (redirect) the console.

    Attributes:
        stdout, stderr: the file of each stream, or None (console only).
        console_out, console_err: whether each stream also reaches the console.
        error_file: torchrun's TORCHELASTIC_ERROR_FILE for the process.
    """

    stdout: str | None = None
    stderr: str | None = None
    console_out: bool = True
    console_err: bool = True
    error_file: str | None = None


def log_files(attempt_dir: str, local_rank: int, redirects: int | Mapping[int, int],
              tee: int | Mapping[int, int]) -> LogFiles:
    """torchrun's files of one local rank in ``<run dir>/attempt_<N>``: ``<local rank>/stdout.log``,
    ``stderr.log`` and ``error.json``. A redirected stream goes only to its file, a tee'd one to
    its file and the console (torchrun's DefaultLogsSpecs)."""
    directory = os.path.join(attempt_dir, str(local_rank))
    os.makedirs(directory, exist_ok=True)
    redirect, teed = std_of(redirects, local_rank), std_of(tee, local_rank)
    files = redirect | teed
    return LogFiles(
        stdout=os.path.join(directory, "stdout.log") if files & STD_OUT else None,
        stderr=os.path.join(directory, "stderr.log") if files & STD_ERR else None,
        console_out=not (redirect & STD_OUT) or bool(teed & STD_OUT),
        console_err=not (redirect & STD_ERR) or bool(teed & STD_ERR),
        error_file=os.path.join(directory, "error.json"),
    )


# --- the group -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcSpec:
    """One process of a group, before it starts.

    Attributes:
        rank: the global rank it is known by (the prefix of its lines, and in messages).
        command: its argv.
        env: its whole environment.
        prefix: prefix its lines with ``[rank N]`` (False: they carry rank prefixes already).
        local_rank: its index among the group's processes on this host.
        logs: files its output also or only goes to (None: the console only).
    """

    rank: int
    command: Sequence[str]
    env: Mapping[str, str]
    prefix: bool = True
    local_rank: int = 0
    logs: LogFiles | None = None


@dataclass(eq=False)
class Proc:
    """A started process: what it was started as, its process and what is known of it."""

    spec: ProcSpec
    popen: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    last_output: float = field(default_factory=time.monotonic)
    last_line: str = ""
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    line_buffer: dict[int, bytes] = field(default_factory=dict)
    files: dict[int, IO[bytes]] = field(default_factory=dict)
    code: int | None = None
    returncode: int | None = None
    exited_at: float | None = None
    stopped: bool = False
    reason: str | None = None
    message: str | None = None
    pidfd: int | None = None  # readable when the process exits (Linux 5.3+): the loop wakes at once

    @property
    def pid(self) -> int:
        return self.popen.pid

    def row(self) -> dict[str, Any]:
        """The process as a protocol row: rank, local rank, pid, exit code, return code, signal."""
        return {"rank": self.spec.rank, "local_rank": self.spec.local_rank, "pid": self.pid,
                "exit_code": self.code, "returncode": self.returncode, "signal": signal_name(self.returncode),
                "stopped": self.stopped}


class ProcGroup:
    """The processes of one round on this host: their start, their output and their stopping.

    Args:
        specs: what to start.
        write: where the processes' (prefixed) output goes, or a :class:`Prefixer` shared with
            this process's own lines.
        grace: seconds between the stop signal and SIGKILL when stopping.
        on_failure: called once with the first process to exit non-zero without being stopped.
        preexec: a hook run in each child before exec (e.g. to die with this process).
        stop_on_failure: stop the others when one fails (torchrun's local worker group); the
            local runner's workers decide that themselves.
        selector: a selector to share with other sources (the agent's connection, the watchdog's
            pipe): a key whose data is callable is called when ready. The group unregisters its
            pipes when done and leaves a shared selector open.
    """

    def __init__(self, specs: Sequence[ProcSpec], write: Writer | Prefixer, grace: float,
                 on_failure: Callable[[Proc], None] | None = None,
                 preexec: Callable[[], None] | None = None,
                 selector: selectors.BaseSelector | None = None, stop_on_failure: bool = True) -> None:
        self.specs = list(specs)
        self.out = write if isinstance(write, Prefixer) else Prefixer(write)
        self.grace = grace
        self.on_failure = on_failure
        self.preexec = preexec
        self.stop_on_failure = stop_on_failure
        self.own_selector = selector is None
        self.selector = selector if selector is not None else selectors.DefaultSelector()
        self.pipes: set[Any] = set()
        self.procs: list[Proc] = []
        self.first_failure: Proc | None = None
        self.stop_deadline: float | None = None
        self.stop_signal: int | None = None
        self.killed = False
        self.finished = False

    def start(self, between: Callable[[], None] | None = None) -> None:
        """Starts every process at once, each in its own process group (``between`` is called after
        each start: the agent's heartbeat)."""
        for spec in self.specs:
            self.procs.append(self._spawn(spec))
            if between is not None:
                between()

    def _spawn(self, spec: ProcSpec) -> Proc:
        popen = subprocess.Popen(
            list(spec.command),
            env=dict(spec.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=self.preexec,
        )
        proc = Proc(spec, popen)
        if spec.logs is not None:
            for which, path in ((1, spec.logs.stdout), (2, spec.logs.stderr)):
                if path:
                    proc.files[which] = open(path, "ab")  # noqa: SIM115 (closed when the stream ends)
        for which, pipe in ((1, popen.stdout), (2, popen.stderr)):
            if pipe is not None:
                os.set_blocking(pipe.fileno(), False)
                self.selector.register(pipe, selectors.EVENT_READ, (proc, which))
                self.pipes.add(pipe)
        if hasattr(os, "pidfd_open"):
            try:
                proc.pidfd = os.pidfd_open(popen.pid)
                self.selector.register(proc.pidfd, selectors.EVENT_READ, _wake)
            except OSError:
                proc.pidfd = None
        return proc

    def _forget_pidfd(self, proc: Proc) -> None:
        if proc.pidfd is not None:
            try:
                self.selector.unregister(proc.pidfd)
            except (KeyError, ValueError):
                pass
            os.close(proc.pidfd)
            proc.pidfd = None

    def respawn(self, index: int, spec: ProcSpec) -> Proc:
        """Starts ``spec`` in place of the exited process ``index`` (a replaced worker)."""
        old = self.procs[index]
        if old.code is None:
            raise ValueError(f"process {index} (rank {old.spec.rank}) is still running")
        self.specs[index] = spec
        self.procs[index] = self._spawn(spec)
        return self.procs[index]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    # --- output -----------------------------------------------------------------------------

    def _emit(self, proc: Proc, which: int, data: bytes) -> None:
        proc.last_output = time.monotonic()
        spec = proc.spec
        file = proc.files.get(which)
        if file is not None:
            file.write(data)
            file.flush()
        console = spec.logs is None or (spec.logs.console_out if which == 1 else spec.logs.console_err)
        if console:
            self.out.feed(proc, which, data, _PREFIX % spec.rank if spec.prefix else b"")
        lines = (proc.line_buffer.get(which, b"") + data).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        proc.line_buffer[which] = lines.pop()[-4096:]
        for line in lines:
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                proc.tail.append(text)
                proc.last_line = text

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
            if callable(key.data):
                key.data()
                continue
            self._read(key)

    def _read(self, key: selectors.SelectorKey) -> bool:
        """Copies one chunk of a pipe's output, closing it at its end; False when it had nothing
        now or has ended."""
        proc, which = key.data
        try:
            data = os.read(key.fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._close(key.fileobj, proc, which)
            return False
        self._emit(proc, which, data)
        return True

    def _drain(self, proc: Proc) -> None:
        """Copies whatever output of ``proc`` its pipes hold now, without waiting (a child it
        left behind may keep a pipe open)."""
        for key in list(self.selector.get_map().values()):
            if not callable(key.data) and key.data[0] is proc:
                while self._read(key):
                    pass

    def _close(self, fileobj: Any, proc: Proc, which: int) -> None:
        self.selector.unregister(fileobj)
        self.pipes.discard(fileobj)
        fileobj.close()
        self.out.end(proc, which)
        text = proc.line_buffer.pop(which, b"").decode("utf-8", "replace").rstrip()
        if text:
            proc.tail.append(text)
            proc.last_line = text
        file = proc.files.pop(which, None)
        if file is not None:
            file.close()

    # --- processes --------------------------------------------------------------------------

    def running(self) -> list[Proc]:
        return [p for p in self.procs if p.code is None]

    def reap(self) -> None:
        """Records exits; on the first failure calls on_failure and starts stopping the others."""
        for proc in self.running():
            rc = proc.popen.poll()
            if rc is None:
                continue
            self._forget_pidfd(proc)
            proc.returncode = rc
            proc.code = exit_code(rc)
            proc.exited_at = time.time()
            if proc.code != 0 and not proc.stopped and self.first_failure is None:
                self.first_failure = proc
                # What it wrote just before it exited may still be in its pipes: its last lines
                # are the failure's record, so read them before the failure is reported.
                self._drain(proc)
                if self.on_failure is not None:
                    self.on_failure(proc)
                if self.stop_on_failure:
                    self.stop()

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Sends ``signum`` to every running process (marking it stopped); SIGKILL to each process
        group follows after the grace period."""
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + self.grace
            self.stop_signal = signum
        for proc in self.running():
            proc.stopped = True
            try:
                proc.popen.send_signal(signum)
            except ProcessLookupError:
                pass

    def hurry(self, grace: float) -> None:
        """At most ``grace`` seconds from now until the SIGKILL, whatever the grace before."""
        self.grace = min(self.grace, grace)
        if self.stop_deadline is not None:
            self.stop_deadline = min(self.stop_deadline, time.monotonic() + grace)

    def kill(self, proc: Proc, reason: str, message: str) -> None:
        """Kills one process's whole process group at once (a hung rank), recording why: its exit
        will be a failure with this reason."""
        proc.reason, proc.message = reason, message
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_groups(self) -> None:
        """SIGKILL to every process's group: nothing started by the group survives it."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def step(self, timeout: float = 0.1) -> bool:
        """One turn of the loop; False once every process has exited."""
        self.pump(timeout)
        self.reap()
        if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline and self.running():
            self.killed = True
            self.kill_groups()
            self.stop_deadline = float("inf")
        return bool(self.running())

    def finish(self) -> None:
        """Kills leftovers, reaps every process and drains the rest of the output (once)."""
        if self.finished:
            return
        self.finished = True
        self.kill_groups()
        for proc in self.procs:
            proc.popen.wait()
        self.reap()
        deadline = time.monotonic() + 2.0
        while self.pipes and time.monotonic() < deadline:
            self.pump(0.05)
        for pipe in list(self.pipes):
            proc, which = self.selector.get_key(pipe).data
            self._close(pipe, proc, which)
        for proc in self.procs:
            self._forget_pidfd(proc)
        if self.own_selector:
            self.selector.close()
