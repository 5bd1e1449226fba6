"""The local runner: an SPMDJob on this machine, one process per proc, no cluster needed.

Where it sits: above :mod:`monarch_spmd.worker` (every local process IS the worker, started with
exactly the MONARCH_SPMD_* inputs the operator injects into pods) and :mod:`monarch_spmd.spec`
(which checks a manifest with the operator's rules), below :mod:`monarch_spmd.cli`
(``monarch-spmd run``). It never imports Monarch or Kubernetes code; PyYAML is needed only to read
a manifest.

Behaviour, modelled on torchrun's local agent:

* one process per proc of the mesh, ``sys.executable -m monarch_spmd.worker -- ARGV``, each in its
  own process group, with MASTER_ADDR 127.0.0.1 and a free port unless one is given;
* every output line is prefixed with its rank (``[rank 3] ...``): stdout to stdout, stderr to
  stderr; the runner's own lines start with ``[monarch-spmd]`` and go to stderr;
* when a rank exits non-zero the other ranks are stopped at once (SIGTERM, which the worker
  forwards to the training process, then SIGKILL to each process group after a grace period);
  the gang is then restarted, up to ``max_restarts`` times, with MONARCH_SPMD_RESTART_COUNT
  (TORCHELASTIC_RESTART_COUNT) incremented, unless the code is permanent (64, bad worker input,
  or one of ``permanent_exit_codes``) or not among a non-empty ``retryable_exit_codes`` (75, the
  rendezvous timeout, is always retryable);
* the exit code is 0 when every rank succeeded, else the first failing rank's exit code;
* Ctrl-C (SIGINT) or SIGTERM stops every rank the same way and exits 130 / 143;
* after each attempt every process group is killed, so no process is left behind.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final

from . import spec
from .payload import contract, worker
from .ports import free_port

#: The master address of local runs: every proc is on this machine.
LOCAL_MASTER_ADDR: Final = "127.0.0.1"
#: Seconds between SIGTERM and SIGKILL when stopping ranks.
DEFAULT_GRACE_PERIOD: Final = 5.0

_TAG: Final = "[monarch-spmd]"


@dataclass
class LocalJob:
    """What the runner needs of an SPMDJob (the fields mean what the CRD's fields mean).

    Attributes:
        mesh: ordered ``(name, size)`` dimensions (``spec.mesh``).
        args: the training argv, ``["-m", MODULE, ...]`` or ``[PATH, ...]`` (``spec.args``).
        name: the job's name; the run id is derived from it.
        master_port: rank 0's port (``spec.masterPort``); None picks a free one per attempt.
        max_restarts: gang restarts allowed (``spec.restartPolicy.maxRestarts``).
        permanent_exit_codes: codes that fail the job at once (``...permanentExitCodes``).
        retryable_exit_codes: if non-empty, only these codes are restarted (``...retryableExitCodes``).
        rendezvous_timeout: seconds each worker waits for the master (``spec.rendezvousTimeoutSeconds``).
        local_rank_scope: ``mesh``, or ``pod`` (``spec.gpusPerProc`` >= 1): see the worker.
        role_name: becomes ROLE_NAME.
        env: extra variables for every proc (the ``trainer`` container's plain ``env`` values);
            they win over the runner's, as the user's env wins in a pod.
    """

    mesh: list[tuple[str, int]]
    args: list[str]
    name: str = "local"
    master_port: int | None = None
    max_restarts: int = 0
    permanent_exit_codes: frozenset[int] = frozenset()
    retryable_exit_codes: frozenset[int] = frozenset()
    rendezvous_timeout: float = worker.DEFAULT_RENDEZVOUS_TIMEOUT
    local_rank_scope: str = worker.SCOPE_MESH
    role_name: str = contract.DEFAULT_ROLE_NAME
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.mesh = contract.validate_mesh(self.mesh)
        worker.command_for(self.args)  # raises WorkerInputError naming argv
        if self.master_port is not None and (
            isinstance(self.master_port, bool)
            or not isinstance(self.master_port, int)
            or not 1 <= self.master_port <= 65535
        ):
            raise ValueError(f"master_port: {self.master_port!r} is out of range; valid is 1..65535")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts: {self.max_restarts!r} is not valid; it is an integer of at least 0")
        if self.local_rank_scope not in worker.LOCAL_RANK_SCOPES:
            raise ValueError(
                f"local_rank_scope: {self.local_rank_scope!r} is not valid; expected one of "
                f"{', '.join(worker.LOCAL_RANK_SCOPES)}"
            )
        if not self.rendezvous_timeout > 0:
            raise ValueError(f"rendezvous_timeout: {self.rendezvous_timeout!r} is not valid; it is > 0 seconds")


# --- manifests ---------------------------------------------------------------------------------
# The manifest is parsed and checked by monarch_spmd.spec, the same rules the operator applies.

_GPU_RESOURCE: Final = "nvidia.com/gpu"


def _trainer_container(template: Mapping[str, Any]) -> Mapping[str, Any]:
    for container in (template.get("spec") or {}).get("containers") or []:
        if isinstance(container, Mapping) and container.get("name") in (None, spec.TRAINER_CONTAINER):
            return container
    return {}


def _holds_gpus(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    for kind in ("limits", "requests"):
        value = (resources.get(kind) or {}).get(_GPU_RESOURCE)
        if value is not None and str(value).strip() not in ("", "0"):
            return True
    return False


def job_from_manifest(doc: Mapping[str, Any]) -> LocalJob:
    """Builds a :class:`LocalJob` from one SPMDJob manifest, checked by :func:`spec.load_manifest`.

    As on Kubernetes: ``gpusPerProc`` >= 1 or a GPU limit on the ``trainer`` container selects the
    ``pod`` local-rank scope; the container's plain ``env`` values reach every proc and win over
    the runner's (only MONARCH_SPMD_ROLE_NAME and MONARCH_SPMD_LOCAL_RANK_SCOPE may be among
    them). Locally the master port is a free one unless the manifest sets ``masterPort``
    explicitly, so that two local runs do not collide on the default port.

    Raises:
        monarch_spmd.spec.SpecError: naming the manifest field (e.g. ``spec.mesh[1].size``).
    """
    name, _, job = spec.load_manifest(doc)
    raw_spec = doc.get("spec") or {}
    trainer = _trainer_container(job.template)
    env: dict[str, str] = {}
    for item in trainer.get("env") or []:
        if isinstance(item, Mapping) and "name" in item and "value" in item:
            env[str(item["name"])] = str(item["value"])
    scope = worker.SCOPE_POD if job.gpus_per_proc >= 1 or _holds_gpus(trainer) else worker.SCOPE_MESH
    return LocalJob(
        mesh=job.mesh_pairs,
        args=list(job.args),
        name=name,
        master_port=job.master_port if "masterPort" in raw_spec else None,
        max_restarts=job.max_restarts,
        permanent_exit_codes=frozenset(job.permanent_exit_codes),
        retryable_exit_codes=frozenset(job.retryable_exit_codes),
        rendezvous_timeout=float(job.rendezvous_timeout_seconds),
        local_rank_scope=scope,
        env=env,
    )


def load_manifest(path: str) -> LocalJob:
    """Reads the SPMDJob document of a YAML file (the file ``kubectl apply -f`` takes).

    Other documents in the file (a ConfigMap holding the script, say) are ignored.
    """
    try:
        import yaml
    except ImportError:
        raise RuntimeError("reading a manifest needs PyYAML: pip install 'monarch-spmd[cli]'") from None
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    jobs = [d for d in docs if isinstance(d, Mapping) and d.get("kind") == spec.KIND]
    if len(jobs) != 1:
        raise ValueError(f"{path}: expected one document of kind {spec.KIND} ({spec.API_VERSION}), found {len(jobs)}")
    return job_from_manifest(jobs[0])


# --- running ---------------------------------------------------------------------------------


def free_local_port() -> int:
    """A TCP port free on 127.0.0.1 now, and unlikely to be taken before rank 0 binds it."""
    return free_port(LOCAL_MASTER_ADDR)


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class _Proc:
    rank: int
    popen: subprocess.Popen[bytes]
    partial: dict[int, bytes] = field(default_factory=dict)
    code: int | None = None


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Output:
    """Writes prefixed lines to the runner's stdout/stderr (bytes when the stream has a buffer)."""

    def __init__(self, out: IO[str], err: IO[str]) -> None:
        self.streams = {1: out, 2: err}

    def write(self, which: int, data: bytes) -> None:
        stream = self.streams[which]
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            stream.flush()
            buffer.write(data)
            buffer.flush()
        else:
            stream.write(data.decode("utf-8", "replace"))
            stream.flush()

    def note(self, message: str) -> None:
        self.write(2, f"{_TAG} {message}\n".encode())


class _Gang:
    """One attempt: the worker processes of every rank, their output and their stopping."""

    def __init__(self, job: LocalJob, attempt: int, run_id: str, python: str, output: _Output, grace: float) -> None:
        self.output = output
        self.grace = grace
        self.selector = selectors.DefaultSelector()
        self.procs: list[_Proc] = []
        self.first_failure: _Proc | None = None
        self.stop_deadline: float | None = None
        self.finished = False
        self.job = job
        self.attempt = attempt
        self.run_id = run_id
        self.python = python
        self.port = job.master_port if job.master_port is not None else free_local_port()

    def start(self) -> None:
        """Starts one worker per rank, each in its own process group."""
        job, port = self.job, self.port
        base = dict(os.environ)
        base.setdefault("PYTHONUNBUFFERED", "1")
        for rank in range(contract.world_size(job.mesh)):
            inputs = worker.worker_input_env(
                job.mesh,
                contract.coords_of(job.mesh, rank),
                LOCAL_MASTER_ADDR,
                port,
                restart_count=self.attempt,
                max_restarts=job.max_restarts,
                run_id=self.run_id,
                role_name=job.role_name,
                rendezvous_timeout=job.rendezvous_timeout,
                local_rank_scope=job.local_rank_scope,
            )
            popen = subprocess.Popen(
                [self.python, "-m", "monarch_spmd.payload.worker", "--", *job.args],
                env={**base, **inputs, **job.env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            proc = _Proc(rank, popen)
            self.procs.append(proc)
            for which, pipe in ((1, popen.stdout), (2, popen.stderr)):
                if pipe is not None:
                    os.set_blocking(pipe.fileno(), False)
                    self.selector.register(pipe, selectors.EVENT_READ, (proc, which))

    # output

    def _emit(self, proc: _Proc, which: int, data: bytes, final: bool = False) -> None:
        buf = proc.partial.get(which, b"") + data
        *lines, rest = buf.split(b"\n")
        if final and rest:
            lines.append(rest)
            rest = b""
        proc.partial[which] = rest
        if lines:
            prefix = f"[rank {proc.rank}] ".encode()
            self.output.write(which, b"".join(prefix + line + b"\n" for line in lines))

    def pump(self, timeout: float) -> None:
        """Copies whatever output is ready, waiting at most ``timeout`` seconds for some."""
        if not self.selector.get_map():
            time.sleep(timeout)
            return
        for key, _ in self.selector.select(timeout):
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

    # processes

    def running(self) -> list[_Proc]:
        return [p for p in self.procs if p.code is None]

    def reap(self) -> None:
        """Records exits; on the first failure starts stopping the others."""
        for proc in self.running():
            rc = proc.popen.poll()
            if rc is None:
                continue
            proc.code = _exit_code(rc)
            if proc.code != 0 and self.first_failure is None:
                self.first_failure = proc
                self.output.note(f"rank {proc.rank} exited with code {proc.code}; stopping the other ranks")
                self.stop()

    def stop(self) -> None:
        """SIGTERM to every running worker (forwarded to its training process); SIGKILL later."""
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + self.grace
        for proc in self.running():
            try:
                proc.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill_groups(self) -> None:
        """SIGKILL to every rank's process group: nothing started by this attempt survives it."""
        for proc in self.procs:
            try:
                os.killpg(proc.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def step(self) -> bool:
        """One turn of the loop; False once every rank has exited."""
        self.pump(0.1)
        self.reap()
        if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline and self.running():
            self.output.note(f"ranks still running {self.grace:g}s after SIGTERM; sending SIGKILL")
            self.kill_groups()
            self.stop_deadline = float("inf")
        return bool(self.running())

    def finish(self) -> None:
        """Kills leftovers, reaps every worker and drains the rest of the output (once)."""
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


def _restartable(code: int, job: LocalJob) -> bool:
    if code == worker.EX_USAGE or code in job.permanent_exit_codes:
        return False
    if job.retryable_exit_codes and code not in job.retryable_exit_codes and code != worker.EX_TEMPFAIL:
        return False
    return True


def run(
    job: LocalJob,
    *,
    python: str | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    run_id: str | None = None,
) -> int:
    """Runs ``job`` locally (see the module docstring) and returns the exit code.

    Args:
        job: what to run.
        python: the interpreter for the workers (default ``sys.executable``).
        stdout, stderr: where the prefixed output goes (default the process's own).
        grace_period: seconds between SIGTERM and SIGKILL when stopping ranks.
        run_id: TORCHELASTIC_RUN_ID (default ``<job name>-<8 hex digits>``, stable across restarts).
    """
    output = _Output(stdout or sys.stdout, stderr or sys.stderr)
    run_id = run_id or f"{job.name}-{uuid.uuid4().hex[:8]}"
    exe = python or sys.executable
    world = contract.world_size(job.mesh)

    def interrupted(signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.signal(s, interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        attempt = 0
        while True:
            gang = _Gang(job, attempt, run_id, exe, output, grace_period)
            output.note(
                f"attempt {attempt}: {world} ranks of mesh {contract.format_mesh(job.mesh)}, master "
                f"{LOCAL_MASTER_ADDR}:{gang.port}, run id {run_id}"
            )
            try:
                gang.start()
                while gang.step():
                    pass
            except _Interrupted as e:
                name = signal.Signals(e.signum).name
                output.note(f"{name} received; stopping all ranks")
                for s in handlers:
                    signal.signal(s, signal.SIG_IGN)
                gang.stop()
                while gang.step():
                    pass
                return 128 + e.signum
            finally:
                gang.finish()
            failure = gang.first_failure
            if failure is None:
                output.note(f"all {world} ranks succeeded")
                return 0
            code = failure.code if failure.code is not None else 1
            if attempt < job.max_restarts and _restartable(code, job):
                attempt += 1
                output.note(f"restarting the gang (restart {attempt} of at most {job.max_restarts})")
                continue
            why = "" if _restartable(code, job) else " (not retryable)"
            output.note(f"job failed: rank {failure.rank} exited with code {code}{why}")
            return code
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def job_from_args(
    mesh: str | None,
    args: Sequence[str],
    manifest: str | None = None,
    **overrides: Any,
) -> LocalJob:
    """A :class:`LocalJob` from the CLI's pieces: a manifest and/or ``--mesh``, argv, overrides.

    Values given on the command line (a non-empty ``args``, ``mesh``, and overrides that are not
    None) win over the manifest's.
    """
    if manifest:
        job = load_manifest(manifest)
        if mesh:
            job.mesh = contract.parse_mesh(mesh)
        if args:
            worker.command_for(args)
            job.args = list(args)
    else:
        if not mesh:
            raise ValueError("mesh: give --mesh NAME=SIZE,... (e.g. hosts=2,gpus=2) or -f job.yaml")
        job = LocalJob(mesh=contract.parse_mesh(mesh), args=list(args))
    for key, value in overrides.items():
        if value is not None:
            setattr(job, key, value)
    job.__post_init__()
    return job
