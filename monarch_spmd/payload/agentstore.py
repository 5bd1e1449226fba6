"""The agent store: torchrun's TCPStore at MASTER_ADDR:MASTER_PORT, hosted by rank 0's agent.

Where it sits: in the payload (standard library only), below :mod:`.agent`, which starts it when
MONARCH_SPMD_AGENT_STORE is on and the agent is member 0's (the worker of rank 0).

torchrun's agent hosts a TCPStore on MASTER_PORT and tells its ranks so with
TORCHELASTIC_USE_AGENT_STORE=True: every rank is then a client of it. torch's own rendezvous
(``init_process_group`` with ``env://``) follows the flag, and programs that never call
``init_process_group`` rely on it: torchft's ``Manager`` opens
``TCPStore(MASTER_ADDR, MASTER_PORT, is_master=False)`` and waits forever when nobody hosts it.
Without the input, rank 0 hosts the store itself (TORCHELASTIC_USE_AGENT_STORE=False), as before.

The agent does not import torch (the payload is standard library only and pods may run it with an
interpreter that lacks torch): it runs the store in a child process, ``python -c``
:data:`SERVER`, with the same interpreter its ranks use. The store lives as long as the agent:

* up before the first round: the agent waits for the child's ``ready`` line (the store listens
  by then) before it starts any rank;
* the same process and port across restarts in place, with a fresh, empty store for every round:
  when a round's ranks are gone the agent asks the child to renew it (the old TCPStore closed, a
  new one listening on the same port, milliseconds, torch already imported) before the agent
  reports the round ended, so before any rank of the next round can start, on any member. torch
  expects that ("We create a new TCPStore for every retry so no need to add prefix for each
  attempt", ``_create_c10d_store``): its clients and torchft's Manager write unprefixed keys, and a
  key left by the round that failed misleads the next one. torchft's rank 0 publishes its
  Manager's address under ``manager_addr``; with one store for every round a restarted rank 1
  that reads before the new rank 0 writes gets the dead Manager's address and the group's quorum
  times out (seen with a store kept across rounds; torchrun's cached store has the same race);
* gone with the agent: the child reads its stdin, a pipe whose only writer is the agent, and
  exits at its EOF, which comes when the agent exits however it ends (SIGKILL too, and as a
  container's PID 1 where no parent-death signal is set). Where Linux offers it the child also
  gets SIGKILL as the parent-death signal (:func:`.procs.parent_death_hook`), the hook the agent
  gives its ranks. The child leads its own process group, so a signal meant for the agent's
  group (a terminal's Ctrl-C) does not end the store before the ranks that use it.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Final

from .names import EX_TEMPFAIL, EX_USAGE
from .procs import parent_death_hook

#: The line the child writes once its TCPStore listens.
READY: Final = "ready"
#: The line that asks the child for a fresh store on the same port (it answers :data:`READY`).
RENEW: Final = "renew"
#: Seconds the agent waits for a renewed store.
RENEW_TIMEOUT: Final = 30.0
#: Seconds the agent waits for the store to listen (the child imports torch first).
START_TIMEOUT: Final = 120.0

#: The child (``python -c SERVER ADDR PORT``): a TCPStore server until its stdin ends. Without
#: torch it exits 64 (EX_USAGE, permanent); a port it cannot bind exits 75 (EX_TEMPFAIL).
SERVER: Final = f"""\
import sys
try:
    from torch.distributed import TCPStore
except ImportError as e:
    sys.stderr.write("monarch-spmd worker: the agent store (MONARCH_SPMD_AGENT_STORE) needs torch: " + sys.executable
                     + " cannot import torch.distributed (" + str(e) + ")\\n")
    sys.exit({EX_USAGE})
try:
    store = TCPStore(sys.argv[1], int(sys.argv[2]), is_master=True, multi_tenant=True, wait_for_workers=False)
except Exception as e:
    sys.stderr.write("monarch-spmd worker: the agent store cannot listen on MASTER_PORT " + sys.argv[2] + ": "
                     + str(e) + "\\n")
    sys.exit({EX_TEMPFAIL})
sys.stdout.write("{READY}\\n")
sys.stdout.flush()
for line in sys.stdin:
    if line.strip() == "{RENEW}":
        del store
        store = TCPStore(sys.argv[1], int(sys.argv[2]), is_master=True, multi_tenant=True, wait_for_workers=False)
        sys.stdout.write("{READY}\\n")
        sys.stdout.flush()
"""


class AgentStoreError(RuntimeError):
    """The store did not start; ``code`` is the worker's exit code for it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class AgentStore:
    """A running agent store (see the module docstring); :meth:`close` ends it."""

    def __init__(self, proc: subprocess.Popen[bytes], addr: str, port: int) -> None:
        self.proc = proc
        self.addr = addr
        self.port = port

    @classmethod
    def start(cls, addr: str, port: int, *, python: str | None = None,
              timeout: float = START_TIMEOUT) -> AgentStore:
        """Starts the store on ``port`` and returns once it listens.

        Raises:
            AgentStoreError: the child exited (no torch: code 64; the port taken: 75) or said
                nothing within ``timeout`` seconds (75); nothing is left running.
        """
        proc = subprocess.Popen(
            [python or sys.executable, "-c", SERVER, addr, str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
            preexec_fn=parent_death_hook())
        store = cls(proc, addr, port)
        store._await_ready(timeout, "listened")
        return store

    def renew(self, timeout: float = RENEW_TIMEOUT) -> None:
        """A fresh, empty store on the same port, once this returns (see the module docstring).

        Raises:
            AgentStoreError: the child is gone or did not answer; it is ended.
        """
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{RENEW}\n".encode())
            self.proc.stdin.flush()
        except OSError:
            pass  # gone: the wait below says so
        self._await_ready(timeout, "renewed its store")

    def _await_ready(self, timeout: float, what: str) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([stdout], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(stdout.fileno(), 64) if ready else b""
            if chunk:
                line += chunk
                continue
            self.close(grace=1.0)
            code = self.proc.returncode
            if ready:  # EOF: the child is gone
                raise AgentStoreError(f"the agent store exited with code {code} before it {what} on "
                                      f"{self.addr}:{self.port}", EX_USAGE if code == EX_USAGE else EX_TEMPFAIL)
            raise AgentStoreError(f"the agent store had not {what} on {self.addr}:{self.port} after {timeout:g}s",
                                  EX_TEMPFAIL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self, grace: float = 5.0) -> None:
        """Ends the store: its stdin closed (it exits), SIGKILL after ``grace`` seconds."""
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
