"""Fixtures for the library's process tests (worker, local runner) and Monarch tests.

Everything here starts real processes and opens real sockets. The scripts the tests run live in
tests/lib/scripts/; actors that look inside Monarch procs live in tests/lib/spmd_actors.py, and
PYTHONPATH is extended with the repository root so that Monarch's procs can import them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_spmd import ports

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"

# Monarch procs inherit the client's environment: let them import tests.lib.spmd_actors.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def free_port() -> int:
    return ports.free_port("127.0.0.1")


def script(name: str) -> str:
    return str(SCRIPTS / name)


def worker_inputs(
    mesh: str = "hosts=1",
    coords: str = "0",
    port: int | None = None,
    addr: str = "127.0.0.1",
    **extra: str,
) -> dict[str, str]:
    """A process environment with the MONARCH_SPMD_* inputs of one proc."""
    env = dict(os.environ)
    env.update(
        {
            "MONARCH_SPMD_MESH": mesh,
            "MONARCH_SPMD_COORDS": coords,
            "MONARCH_SPMD_MASTER_ADDR": addr,
            "MONARCH_SPMD_MASTER_PORT": str(port or free_port()),
        }
    )
    env.update(extra)
    return env


def worker_cmd(*argv: str) -> list[str]:
    return [sys.executable, "-m", "monarch_spmd.payload.worker", "--", *argv]


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "monarch_spmd.cli", *args]


def pids_in(text: str) -> set[int]:
    """Pids the worker's start line (``pid N``) and the example scripts (``pid N``) printed."""
    return {int(p) for p in re.findall(r"\bpid (\d+)", text)}


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, or a pid reused by something else, is not it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and (b"monarch_spmd" in cmdline or b"tests/lib/scripts" in cmdline)


def wait_dead(pids: set[int], timeout: float = 10.0) -> set[int]:
    """Waits for every pid to be gone; returns those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = {p for p in pids if alive(p)}
        if not left:
            return set()
        time.sleep(0.1)
    return {p for p in pids if alive(p)}


class LineReader:
    """Reads a process's stdout and stderr in threads, so a test can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._pump, args=(stream,), daemon=True)
            for stream in (proc.stdout, proc.stderr)
            if stream is not None
        ]
        for t in self._threads:
            t.start()

    def _pump(self, stream) -> None:
        for line in stream:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    @property
    def text(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 120.0) -> str:
        """Waits until ``count`` lines match ``pattern`` (a regex); returns all output so far."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        with self._cond:
            while sum(1 for line in self.lines if regex.search(line)) < count:
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not any(t.is_alive() for t in self._threads)):
                    raise AssertionError(f"no {count} line(s) matching {pattern!r}; output:\n{''.join(self.lines)}")
                self._cond.wait(min(left, 0.2))
            return "".join(self.lines)

    def finish(self, timeout: float = 120.0) -> int:
        code = self.proc.wait(timeout)
        for t in self._threads:
            t.join(10)
        return code


@pytest.fixture
def spawn() -> Iterator:
    """Starts processes each leading its own process group (signals reach only them); kills leftovers after."""
    started: list[subprocess.Popen[str]] = []

    def start(cmd: list[str], **kwargs) -> LineReader:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            cwd=kwargs.pop("cwd", ROOT),
            **kwargs,
        )
        started.append(proc)
        return LineReader(proc)

    yield start
    for proc in started:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 180.0, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=kwargs.pop("cwd", ROOT), **kwargs)
