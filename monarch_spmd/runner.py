"""The local runner: an SPMDJob on this machine, one process per proc, no cluster needed.

Where it sits: above the payload (every local process IS the worker, started with exactly the
MONARCH_SPMD_* inputs the operator gives pods), :mod:`monarch_spmd.spec` (the same job spec type
and validation as the operator) and :mod:`monarch_spmd.policy` (the same failure classes, GPU and
trainer rules); below :mod:`monarch_spmd.cli` (``monarch-spmd run``). It never imports Monarch or
Kubernetes code; PyYAML is needed only to read a manifest.

Behaviour, modelled on torchrun's local agent:

* one worker process per pod the operator would create, all started at once,
  ``sys.executable -m monarch_spmd.payload.worker -- ARGV``, each in its own process group, with
  MASTER_ADDR 127.0.0.1 (or another address of this machine the caller names) and a free port
  unless the manifest (or ``--master-port``) sets one; in
  the PerHost layout each worker runs its host's procs itself, as in a pod;
* every output line is prefixed with its rank (``[rank 3] ...``): stdout to stdout, stderr to
  stderr; the runner's own lines start with ``[monarch-spmd]`` and go to stderr;
* when a rank exits non-zero at any moment the other ranks are stopped at once (SIGTERM, which
  the worker forwards to the training process, then SIGKILL to each process group after a grace
  period), and the gang is restarted up to ``restartPolicy.maxRestarts`` times with
  TORCHELASTIC_RESTART_COUNT incremented, unless :func:`monarch_spmd.policy.is_permanent` says
  the failure is permanent (the operator's rule); the next attempt starts only once every
  process of the last one is gone;
* ``activeDeadlineSeconds`` stops the job when it passes (exit code 124, as ``timeout`` uses);
* the exit code is 0 when every rank succeeded, else the first failing rank's exit code;
* Ctrl-C (SIGINT) or SIGTERM stops every rank the same way and exits 130 / 143;
* after each attempt every process group is killed, so no process is left behind.

Every field of the spec is honoured or refused: ``suspend: true`` and values the cluster must
supply (``valueFrom``, ``envFrom``) are refused with a message naming the field; what describes
the container rather than the program (``image``, ``python``, pod-level template fields such as
resources or node selectors) has no local meaning, and the runner says so in one note line.
"""

from __future__ import annotations

import copy
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Final

from . import policy, spec
from .payload import contract, gang, names, worker
from .ports import free_port
from .spec import JobSpec

#: The master address of local runs: every proc is on this machine.
LOCAL_MASTER_ADDR: Final = "127.0.0.1"
#: Seconds between SIGTERM and SIGKILL when stopping ranks.
DEFAULT_GRACE_PERIOD: Final = 5.0
#: The exit code when activeDeadlineSeconds passes (that of coreutils' ``timeout``).
EX_DEADLINE: Final = 124

_TAG: Final = "[monarch-spmd]"
#: Pod-spec fields that describe where and how a container runs, not what the program sees.
_POD_ONLY: Final = ("resources", "volumeMounts", "securityContext", "ports", "livenessProbe", "readinessProbe",
                    "startupProbe", "imagePullPolicy", "workingDir")


@dataclass(frozen=True)
class LocalJob:
    """An SPMDJob to run on this machine.

    Attributes:
        name: the job's name; the run id is derived from it.
        spec: the parsed spec, exactly as the operator sees it.
        fixed_port: rank 0's port was set explicitly (``masterPort`` in the manifest, or
            ``--master-port``); otherwise a free port is picked per attempt, so two local runs do
            not collide on the default 29500.
    """

    name: str
    spec: JobSpec
    fixed_port: bool = False

    @property
    def mesh(self) -> list[tuple[str, int]]:
        return self.spec.mesh_pairs


class LocalRunError(ValueError):
    """A spec field the local runner cannot honour; the message names it."""


def check_local(job: LocalJob) -> tuple[dict[str, str], list[str]]:
    """Checks what a local run can honour; returns the trainer's env and notes for the user.

    Raises:
        LocalRunError: for ``spec.suspend: true`` and env the cluster must supply, naming the field.
    """
    s = job.spec
    if s.mode == spec.MODE_MONARCH:
        raise LocalRunError("spec.mode: Monarch serves Monarch's worker loop in pods for a client "
                            "(monarch_spmd.kubernetes.proc_mesh); on this machine, spawn the procs with "
                            "monarch.actor.this_host().spawn_procs instead, or run a Program-mode job")
    if s.suspend:
        raise LocalRunError("spec.suspend: true holds the job until a cluster (Kueue) releases it; "
                            "there is nothing to hold locally: set it to false to run here")
    try:
        env = policy.trainer_env(s)
    except policy.UnsupportedLocally as e:
        raise LocalRunError(str(e)) from None
    unused = []
    if s.image:
        unused.append(f"spec.image ({s.image})")
    if s.python != spec.DEFAULT_PYTHON:
        unused.append(f"spec.python ({s.python})")
    pod = dict(s.template.get("spec") or {})
    pod.pop("containers", None)
    unused.extend(f"spec.template.spec.{k}" for k in sorted(pod))
    trainer = policy.trainer_container(s.template) or {}
    unused.extend(f"the trainer container's {k}" for k in _POD_ONLY if k in trainer)
    if s.ttl_seconds_after_finished is not None:
        unused.append("spec.ttlSecondsAfterFinished (nothing to delete)")
    notes = []
    if unused:
        notes.append("not used locally (every rank runs with this machine's Python): " + ", ".join(unused))
    if s.pod_replacement_policy != "Failed":
        notes.append(f"restartPolicy.podReplacementPolicy {s.pod_replacement_policy}: locally the next attempt "
                     "starts once every process of the last one is gone")
    return env, notes


# --- manifests ---------------------------------------------------------------------------------


def read_manifest(path: str) -> dict[str, Any]:
    """The SPMDJob document of a YAML file (the file ``kubectl apply -f`` takes), unparsed.

    The YAML is read as kubectl reads it (:func:`monarch_spmd.validate.load_documents`: ``1e3``
    is a number, ``y`` is true), so a manifest means here what it means on the cluster. Other
    documents in the file (a ConfigMap holding the script, say) are ignored.
    """
    try:
        from .validate import load_documents
    except ImportError:
        raise RuntimeError("reading a manifest needs PyYAML: pip install 'monarch-spmd[cli]'") from None
    with open(path, encoding="utf-8") as f:
        docs = load_documents(f.read())
    jobs = [d for d in docs if isinstance(d, Mapping) and d.get("kind") == spec.KIND]
    if len(jobs) != 1:
        raise ValueError(f"{path}: expected one document of kind {spec.KIND} ({spec.API_VERSION}), found {len(jobs)}")
    return dict(jobs[0])


def job_from_manifest(doc: Mapping[str, Any]) -> LocalJob:
    """A :class:`LocalJob` from one SPMDJob manifest, checked by :func:`spec.load_manifest`.

    Raises:
        monarch_spmd.spec.SpecError: naming the manifest field (e.g. ``spec.mesh[1].size``).
    """
    name, _, parsed = spec.load_manifest(doc)
    return LocalJob(name=name, spec=parsed, fixed_port="masterPort" in (doc.get("spec") or {}))


def job_from_args(
    mesh: str | None,
    args: Sequence[str],
    manifest: str | None = None,
    *,
    master_port: int | None = None,
    max_restarts: int | None = None,
    rendezvous_timeout: int | None = None,
    local_rank_scope: str | None = None,
    role_name: str | None = None,
    pod_layout: str | None = None,
) -> LocalJob:
    """A :class:`LocalJob` from the CLI's pieces: a manifest and/or ``--mesh``, argv, overrides.

    The command line is turned into the manifest it stands for (a non-empty ``args``, ``mesh``
    and every override given win over the manifest's), which is then checked by the same
    :func:`spec.load_manifest` as a manifest: one set of rules, one kind of error message.

    Raises:
        monarch_spmd.spec.SpecError: naming the field; ValueError for a ``--mesh`` that does not
        parse.
    """
    if manifest:
        doc = read_manifest(manifest)
    elif not mesh:
        raise ValueError("mesh: give --mesh NAME=SIZE,... (e.g. hosts=2,gpus=2) or -f job.yaml")
    else:
        doc = {"apiVersion": spec.API_VERSION, "kind": spec.KIND, "metadata": {"name": "local"}, "spec": {}}
    body = dict(doc.get("spec") or {}) if isinstance(doc.get("spec"), Mapping) else {}
    if mesh:
        body["mesh"] = [{"name": n, "size": s} for n, s in contract.parse_mesh(mesh)]
    if args:
        body["args"] = list(args[1:] if args[0] == "--" else args)
    if master_port is not None:
        body["masterPort"] = master_port
    if rendezvous_timeout is not None:
        body["rendezvousTimeoutSeconds"] = rendezvous_timeout
    if pod_layout is not None:
        body["podLayout"] = pod_layout
    if max_restarts is not None:
        body["restartPolicy"] = {**(body.get("restartPolicy") or {}), "maxRestarts": max_restarts}
    elif not manifest:
        body["restartPolicy"] = {"maxRestarts": 0}  # a bare command line does not retry unless asked
    overrides = {names.LOCAL_RANK_SCOPE_VAR: local_rank_scope, names.ROLE_NAME_VAR: role_name}
    if any(v is not None for v in overrides.values()):
        body["template"] = _with_trainer_env(body.get("template") or {}, overrides)
    return job_from_manifest({**doc, "spec": body})


def _with_trainer_env(template: Mapping[str, Any], values: Mapping[str, str | None]) -> dict[str, Any]:
    """The template with ``values`` set in its trainer container's env (the container added if needed)."""
    out = copy.deepcopy(dict(template))
    pod = out.setdefault("spec", {})
    containers = pod.setdefault("containers", [])
    trainer = policy.trainer_container(out)
    if trainer is None:
        trainer = {"name": names.TRAINER_CONTAINER}
        containers.insert(0, trainer)
    env = [e for e in trainer.get("env") or [] if e.get("name") not in {k for k, v in values.items() if v is not None}]
    env.extend({"name": k, "value": v} for k, v in values.items() if v is not None)
    trainer["env"] = env
    return out


# --- running ---------------------------------------------------------------------------------


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _gpu_env(job: LocalJob, first_rank: int, procs: int, base: Mapping[str, str]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for a worker whose procs hold ``gpusPerProc`` GPUs each: its own slice,
    as a pod gets its own devices."""
    per = job.spec.gpus_per_proc
    if per < 1 or "CUDA_VISIBLE_DEVICES" in base:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in range(first_rank * per, (first_rank + procs) * per))}


def _members(job: LocalJob, env: Mapping[str, str], attempt: int, run_id: str, python: str, port: int,
             master_addr: str = LOCAL_MASTER_ADDR) -> list[gang.Member]:
    """One worker per pod the operator would create: per proc, or per host (PerHost)."""
    s = job.spec
    base = dict(os.environ)
    base.setdefault("PYTHONUNBUFFERED", "1")
    per_host = s.pod_layout == names.PER_HOST
    procs = s.mesh[-1].size if per_host else 1
    members = []
    for index in range(s.world_size // procs):
        first = index * procs
        coords = contract.coords_of(job.mesh, first)
        inputs = worker.worker_input_env(
            job.mesh,
            coords[:-1] if per_host else coords,
            master_addr,
            port,
            restart_count=attempt,
            max_restarts=s.max_restarts,
            run_id=run_id,
            rendezvous_timeout=s.rendezvous_timeout_seconds,
            local_rank_scope=policy.local_rank_scope(s),
            pod_layout=s.pod_layout,
        )
        members.append(gang.Member(
            rank=first,
            command=[python, "-m", "monarch_spmd.payload.worker", "--", *s.args],
            env={**base, **inputs, **_gpu_env(job, first, procs, {**base, **env}), **env},
            prefix=not per_host,  # a PerHost worker prefixes its procs' lines itself
        ))
    return members


def run(
    job: LocalJob,
    *,
    python: str | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    run_id: str | None = None,
    master_addr: str | None = None,
) -> int:
    """Runs ``job`` locally (see the module docstring) and returns the exit code.

    Args:
        job: what to run.
        python: the interpreter for the workers (default ``sys.executable``).
        stdout, stderr: where the prefixed output goes (default the process's own).
        grace_period: seconds between SIGTERM and SIGKILL when stopping ranks.
        run_id: TORCHELASTIC_RUN_ID (default ``<job name>-<8 hex digits>``, stable across restarts).
        master_addr: MASTER_ADDR, a name or address of this machine (default 127.0.0.1); rank 0
            listens here, on every interface.

    Raises:
        LocalRunError: for a spec field that cannot be honoured locally (nothing is started).
    """
    env, notes = check_local(job)
    write = gang.stream_writer(stdout or sys.stdout, stderr or sys.stderr)

    def note(message: str) -> None:
        write(2, f"{_TAG} {message}\n".encode())

    run_id = run_id or f"{job.name}-{uuid.uuid4().hex[:8]}"
    master_addr = master_addr or LOCAL_MASTER_ADDR
    exe = python or sys.executable
    s = job.spec
    world = s.world_size
    per_host = s.pod_layout == names.PER_HOST
    for message in notes:
        note(message)

    def what(rank: int) -> str:
        if not per_host:
            return f"rank {rank}"
        return f"the worker of ranks {rank}..{rank + s.mesh[-1].size - 1}"

    def on_failure(rank: int, code: int) -> None:
        note(f"{what(rank)} exited with code {code}; stopping the other ranks")
    deadline = time.monotonic() + s.active_deadline_seconds if s.active_deadline_seconds else None

    def interrupted(signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        attempt = 0
        while True:
            port = s.master_port if job.fixed_port else free_port(LOCAL_MASTER_ADDR)
            group = gang.Gang(_members(job, env, attempt, run_id, exe, port, master_addr), write, grace_period,
                              on_failure)
            note(f"attempt {attempt}: {world} ranks of mesh {contract.format_mesh(job.mesh)}, master "
                 f"{master_addr}:{port}, run id {run_id}")
            expired = False
            try:
                group.start()
                while group.step():
                    if group.killed:
                        note(f"ranks still running {grace_period:g}s after SIGTERM; sent SIGKILL")
                        group.killed = False
                    if deadline is not None and not expired and time.monotonic() >= deadline:
                        expired = True
                        note(f"activeDeadlineSeconds ({s.active_deadline_seconds}s) passed; stopping all ranks")
                        group.stop()
            except _Interrupted as e:
                note(f"{signal.Signals(e.signum).name} received; stopping all ranks")
                for sig in handlers:
                    signal.signal(sig, signal.SIG_IGN)
                group.stop()
                while group.step():
                    pass
                return 128 + e.signum
            finally:
                group.finish()
            if expired:
                note(f"job failed: DeadlineExceeded (active longer than {s.active_deadline_seconds}s)")
                return EX_DEADLINE
            failure = group.first_failure
            if failure is None:
                note(f"all {world} ranks succeeded")
                return 0
            code = failure.code if failure.code is not None else 1
            permanent = policy.is_permanent(s, code, None)
            if attempt < s.max_restarts and not permanent:
                attempt += 1
                note(f"restarting the gang (restart {attempt} of at most {s.max_restarts})")
                continue
            why = " (not retryable)" if permanent else ""
            note(f"job failed: {what(failure.member.rank)} exited with code {code}{why}")
            return code
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
