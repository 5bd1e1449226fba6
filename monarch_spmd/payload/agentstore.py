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
* kept across restarts in place: rounds come and go, the child stays (torch's clients prefix
  their keys with the attempt, TORCHELASTIC_RESTART_COUNT);
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
while sys.stdin.buffer.read(65536):
    pass
"""


class AgentStoreError(RuntimeError):
    """The store did not start; ``code`` is the worker's exit code for it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class AgentStore:
    """A running agent store (see the module docstring); :meth:`close` ends it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

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
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
            chunk = os.read(proc.stdout.fileno(), 64) if ready else b""
            if not chunk:
                store = cls(proc)
                if ready:  # EOF: the child is gone
                    code = proc.wait()
                    raise AgentStoreError(f"the agent store exited with code {code} before it listened on "
                                          f"{addr}:{port}", EX_USAGE if code == EX_USAGE else EX_TEMPFAIL)
                store.close()
                raise AgentStoreError(f"the agent store did not listen on {addr}:{port} within {timeout:g}s",
                                      EX_TEMPFAIL)
            line += chunk
        proc.stdout.close()
        return cls(proc)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self, grace: float = 5.0) -> None:
        """Ends the store: its stdin closed (it exits), SIGKILL after ``grace`` seconds."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
