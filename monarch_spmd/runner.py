"""The local runner: an SPMDJob on this machine, one process per proc, no cluster needed.

Where it sits: above the payload (every local process IS the worker, started with exactly the
MONARCH_SPMD_* inputs the operator gives pods, and the workers restart their ranks in place
through the same agent and coordinator as pods: :mod:`monarch_spmd.payload.agent`),
:mod:`monarch_spmd.spec` (the same job spec type and validation as the operator) and
:mod:`monarch_spmd.policy` (the same failure classes, GPU and trainer rules); below
:mod:`monarch_spmd.cli` (``monarch-spmd run``). It never imports Monarch or Kubernetes code;
PyYAML is needed only to read a manifest.

Behaviour, modelled on torchrun:

* one worker process per pod the operator would create, all started at once,
  ``sys.executable -m monarch_spmd.payload.worker -- ARGV``, each in its own process group, with
  MASTER_ADDR 127.0.0.1 (or another address of this machine the caller names) and a port that
  stays the same for the whole run (torchrun keeps it across restarts), a free one unless the
  manifest (or ``--master-port``) sets one; in the PerHost layout each worker runs its host's
  procs itself, as in a pod;
* the workers are the agents of docs/restart-in-place.md: the worker of rank 0 runs the
  coordinator on loopback, and a failed rank restarts the gang in place (TORCHELASTIC_RESTART_COUNT
  incremented, same MASTER_PORT, back-off between consecutive restarts) up to
  ``restartPolicy.maxRestarts`` times unless the failure is permanent (the operator's rule,
  :mod:`monarch_spmd.payload.failures`); the runner watches as an observer and says what happens
  (rank 0's worker waits for that observer before it joins its gang,
  :data:`.payload.agent.OBSERVER_WAIT_VAR`, so a gang that fails at once is seen live too);
* a worker that dies (killed) is replaced alone when it is not rank 0's, as the operator replaces
  a lost pod; when rank 0's worker dies the others exit 75 and the runner starts a new gang,
  counted as a restart;
* every output line is prefixed with its rank (``[rank 3] ...``), partial lines and ``\\r`` (a
  progress bar) passed on as they arrive; stdout to stdout, stderr to stderr; the runner's own
  lines start with ``[monarch-spmd]`` and go to stderr. torchrun's ``--tee``, ``--redirects``
  and ``--log-dir`` write each rank's files as torchrun lays them out;
* a failed run ends with a table of every rank's last process (rank, local rank, pid, exit code
  with the signal's name, the first failure marked, the ranks the agents stopped marked as
  such) and a last line naming the failing rank;
* ``activeDeadlineSeconds`` stops the job when it passes (exit code 124, as ``timeout`` uses);
* the exit code is 0 when every rank succeeded, else the failing rank's exit code;
* SIGINT (Ctrl-C), SIGTERM and SIGHUP reach every rank as they are (a KeyboardInterrupt, a
  ``finally`` that saves a checkpoint) and the runner exits 128+N; SIGKILL after the grace
  period; if the runner itself is killed, its workers get SIGTERM (a parent-death signal) and
  stop their ranks the same way: no process is left behind in any case.

Every field of the spec is honoured, noted or refused (:data:`LOCAL_FIELDS`): ``suspend: true``,
``mode: Monarch`` and values the cluster must supply (``valueFrom``, ``envFrom``) are refused
with a message naming the field; what describes the cluster rather than the program (``image``,
``python``, scheduling, pod-level template fields, ``shmSize``, GPUs this machine does not have)
gets one note line per field present in the manifest.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import queue
import selectors
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final

from . import policy, schema, spec
from .payload import agent, contract, names, procgroup, rendezvous, timer, worker
from .ports import free_port
from .spec import JobSpec

#: The master address of local runs: every proc is on this machine.
LOCAL_MASTER_ADDR: Final = "127.0.0.1"
#: Seconds between SIGTERM and SIGKILL when stopping ranks.
DEFAULT_GRACE_PERIOD: Final = 5.0
#: The exit code when activeDeadlineSeconds passes (that of coreutils' ``timeout``).
EX_DEADLINE: Final = 124
#: A failed run's table lists every rank up to this many; beyond, the failed ones and a summary.
TABLE_ROWS: Final = 32
#: Seconds rank 0's worker waits, once its coordinator listens, for the runner's observer to be
#: connected before it joins its gang (the observer retries every 50 ms, so this bounds only a
#: runner that is gone or starved).
OBSERVER_WAIT: Final = 10.0

_TAG: Final = "[monarch-spmd]"

# --- what the local runner does with each field of the spec ---------------------------------------

HONOURED: Final = "honoured"
NOTED: Final = "noted"
REFUSED: Final = "refused"

#: Every leaf of the spec's schema (:func:`spec_leaves`) and what a local run does with it:
#: honoured, a note when the manifest sets it, or refused (with the value that cannot be honoured).
#: tests/lib/test_runner_fields.py walks the schema, so a field added to the spec fails that test
#: until it is listed here.
LOCAL_FIELDS: Final[Mapping[str, tuple[str, str]]] = {
    "mesh": (HONOURED, ""),
    "args": (HONOURED, ""),
    "image": (NOTED, "every rank runs with this machine's Python"),
    "python": (NOTED, "every rank runs with this machine's Python"),
    "masterPort": (HONOURED, ""),
    "gpusPerProc": (HONOURED, "each worker gets its own CUDA_VISIBLE_DEVICES slice, when this machine has the GPUs"),
    "colocate": (NOTED, "every rank runs on this machine"),
    "restartPolicy.maxRestarts": (HONOURED, ""),
    "restartPolicy.permanentExitCodes": (HONOURED, ""),
    "restartPolicy.retryableExitCodes": (HONOURED, ""),
    "restartPolicy.permanentReasons": (HONOURED, ""),
    "restartPolicy.podReplacementPolicy": (NOTED, "the gang restarts in place: a new round starts once every "
                                                  "process of the last one is gone"),
    "restartPolicy.replacementTimeoutSeconds": (NOTED, "no pod is replaced locally"),
    "restartPolicy.progressTimeoutSeconds": (HONOURED, ""),
    "restartPolicy.mode": (NOTED, "a local run always restarts its processes in place, as torchrun does"),
    "restartPolicy.backoffSeconds": (HONOURED, ""),
    "restartPolicy.maxBackoffSeconds": (HONOURED, ""),
    "restartPolicy.backoffResetSeconds": (HONOURED, ""),
    "restartPolicy.joinTimeoutSeconds": (HONOURED, ""),
    "restartPolicy.elasticWaitSeconds": (HONOURED, ""),
    "spares": (NOTED, "no spare workers are started locally: a worker that dies is replaced alone"),
    "failureOutput": (NOTED, "every rank's output is on this terminal"),
    "rendezvousTimeoutSeconds": (HONOURED, ""),
    "activeDeadlineSeconds": (HONOURED, ""),
    "ttlSecondsAfterFinished": (NOTED, "nothing to delete"),
    "suspend": (REFUSED, "true holds the job until a cluster (Kueue) releases it; there is nothing to hold "
                         "locally: set it to false to run here"),
    "podLayout": (HONOURED, ""),
    "mode": (REFUSED, "Monarch serves Monarch's worker loop in pods for a client "
                      "(monarch_spmd.kubernetes.proc_mesh); on this machine, spawn the procs with "
                      "monarch.actor.this_host().spawn_procs instead, or run a Program-mode job"),
    "shmSize": (NOTED, "/dev/shm is this machine's"),
    "scheduling.provider": (NOTED, "no scheduler: every rank starts at once on this machine"),
    "scheduling.queue": (NOTED, "no queue: the job runs now"),
    "scheduling.schedulerName": (NOTED, "no scheduler: every rank starts at once on this machine"),
    "scheduling.timeoutSeconds": (NOTED, "nothing waits for a scheduler locally"),
    "template.metadata.labels": (NOTED, "there are no pods to label"),
    "template.metadata.annotations": (NOTED, "there are no pods to annotate"),
    "template.spec.restartPolicy": (HONOURED, "Never: a failure restarts the gang, as here"),
    "template.spec.containers": (HONOURED, "the trainer container's env; its other fields and sidecars are noted"),
    "template.spec.*": (NOTED, "a pod-level field: every rank is a process of this machine"),
}
#: Fields of the trainer container that describe where and how a container runs, not what the
#: program sees (noted when set; env is honoured, envFrom and valueFrom refused).
_CONTAINER_NOTED: Final = ("resources", "volumeMounts", "securityContext", "ports", "livenessProbe",
                           "readinessProbe", "startupProbe", "imagePullPolicy", "workingDir", "lifecycle",
                           "volumeDevices", "stdin", "tty", "terminationMessagePath", "terminationMessagePolicy")


#: Objects whose fields a local run tells apart only by these: the pod template's PodSpec is typed
#: field by field (Kubernetes' schema), but every other pod-level field is one thing here
#: (``template.spec.*``: there is no pod).
_FIELDS_APART: Final = {"template.spec": ("restartPolicy", "containers")}


def _walked(node: schema.Obj, path: str) -> dict[str, schema.Node]:
    """The properties of ``node`` a local run tells apart (see :data:`_FIELDS_APART`)."""
    apart = _FIELDS_APART.get(path)
    return dict(node.properties) if apart is None else {k: node.properties[k] for k in apart}


def spec_leaves(node: schema.Node = spec.SPEC, path: str = "") -> Iterator[str]:
    """The leaf fields of the spec's schema, as dotted paths (``restartPolicy.maxRestarts``): an
    object with declared properties is walked (plus ``<path>.*`` for the undeclared fields it
    keeps, or those a local run does not tell apart), anything else (a scalar, a list, a map) is
    a leaf."""
    if isinstance(node, schema.Obj) and node.properties:
        for key, child in _walked(node, path).items():
            yield from spec_leaves(child, f"{path}.{key}" if path else key)
        if node.preserve_unknown or path in _FIELDS_APART:
            yield f"{path}.*"
        return
    yield path


def present_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The leaf fields (see :func:`spec_leaves`) a manifest's spec sets, with their values; an
    undeclared field kept by the schema maps to ``<path>.*`` with ``{name: value}``."""
    out: dict[str, Any] = {}

    def walk(node: schema.Node, value: Any, path: str) -> None:
        if isinstance(node, schema.Obj) and node.properties and isinstance(value, Mapping):
            walked = _walked(node, path)
            for key, item in value.items():
                child = walked.get(key)
                if child is not None:
                    walk(child, item, f"{path}.{key}" if path else key)
                elif node.preserve_unknown or path in _FIELDS_APART:
                    out.setdefault(f"{path}.*", {})[key] = item
            return
        if value is not None:
            out[path] = value

    walk(spec.SPEC, body, "")
    return out


@dataclass(frozen=True)
class LocalJob:
    """An SPMDJob to run on this machine.

    Attributes:
        name: the job's name; the run id is derived from it.
        spec: the parsed spec, exactly as the operator sees it.
        fixed_port: rank 0's port was set explicitly (``masterPort`` in the manifest, or
            ``--master-port``); otherwise a free port is picked once for the run, so two local
            runs do not collide on the default 29500.
        fields: the spec's leaf fields the manifest set (:func:`present_fields`), for the notes.
    """

    name: str
    spec: JobSpec
    fixed_port: bool = False
    fields: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def mesh(self) -> list[tuple[str, int]]:
        return self.spec.mesh_pairs


@dataclass(frozen=True)
class LogOptions:
    """torchrun's ``--log-dir``, ``--redirects`` and ``--tee`` (values in torchrun's syntax)."""

    log_dir: str | None = None
    redirects: str = "0"
    tee: str = "0"


class LocalRunError(ValueError):
    """A spec field the local runner cannot honour; the message names it."""


def visible_gpus() -> int:
    """The NVIDIA GPUs this process may use, without torch: the driver's devices
    (/proc/driver/nvidia/gpus), at most as many as CUDA_VISIBLE_DEVICES lists."""
    try:
        present = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    listed = 0
    for entry in visible.split(","):
        if not entry.strip() or entry.strip().startswith("-"):
            break
        listed += 1
    return min(present, listed)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_local(job: LocalJob, gpus: int | None = None) -> tuple[dict[str, str], list[str]]:
    """Checks what a local run can honour; returns the trainer's env and one note per field.

    Args:
        job: the job.
        gpus: the GPUs this machine has (default: :func:`visible_gpus`).

    Raises:
        LocalRunError: for ``spec.suspend: true``, ``spec.mode: Monarch`` and env the cluster
            must supply, naming the field.
    """
    s = job.spec
    if s.mode == spec.MODE_MONARCH:
        raise LocalRunError(f"spec.mode: {LOCAL_FIELDS['mode'][1]}")
    if s.suspend:
        raise LocalRunError(f"spec.suspend: {LOCAL_FIELDS['suspend'][1]}")
    try:
        env = policy.trainer_env(s)
    except policy.UnsupportedLocally as e:
        raise LocalRunError(str(e)) from None
    notes = []
    for path, value in job.fields.items():
        treatment, why = LOCAL_FIELDS.get(path, (NOTED, "not known to this runner"))
        if treatment != NOTED:
            continue
        if path.endswith(".*"):
            for key, item in value.items():
                notes.append(f"not used locally: spec.{path[:-1]}{key} ({_short(item)}): {why}")
        else:
            notes.append(f"not used locally: spec.{path} ({_short(value)}): {why}")
    containers = (s.template.get("spec") or {}).get("containers") or []
    trainer = policy.trainer_container(s.template)
    for i, container in enumerate(containers):
        if not isinstance(container, Mapping):
            continue
        where = f"spec.template.spec.containers[{i}]"
        if container is not trainer:
            notes.append(f"not used locally: {where} (the sidecar {container.get('name')!r}): only the trainer's "
                         "program runs here")
            continue
        for key in _CONTAINER_NOTED:
            if key in container:
                notes.append(f"not used locally: {where}.{key} ({_short(container[key])}): every rank is a process "
                             "of this machine")
    if s.gpus_per_proc >= 1:
        have = visible_gpus() if gpus is None else gpus
        need = s.gpus_per_proc * s.world_size
        if have < need:
            notes.append(f"spec.gpusPerProc: {s.gpus_per_proc} asks for {need} GPUs in all and this machine has "
                         f"{have}: CUDA_VISIBLE_DEVICES is left as it is (the ranks see what this machine has)")
    return env, notes


def _enough_gpus(job: LocalJob, gpus: int | None = None) -> bool:
    have = visible_gpus() if gpus is None else gpus
    return job.spec.gpus_per_proc >= 1 and have >= job.spec.gpus_per_proc * job.spec.world_size


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
    body = doc.get("spec") or {}
    return LocalJob(name=name, spec=parsed, fixed_port="masterPort" in body,
                    fields=present_fields(body) if isinstance(body, Mapping) else {})


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
    min_nodes: int | None = None,
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
    if min_nodes is not None and body.get("mesh"):
        body["mesh"] = [{**body["mesh"][0], "minSize": min_nodes}, *body["mesh"][1:]]  # torchrun's --nnodes MIN:MAX
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


# --- the workers -------------------------------------------------------------------------------


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass(frozen=True)
class _Plan:
    """What every worker of a run shares."""

    job: LocalJob
    env: Mapping[str, str]
    run_id: str
    python: str
    master_addr: str
    master_port: int
    agent_port: int
    grace: float
    progress_timeout: float
    backoff: float | None
    member_failure_limit: int | None
    logs: LogOptions | None
    gpus: bool
    token: str = field(default_factory=rendezvous.new_token, repr=False)  # the coordinator's proof of membership


def _gpu_env(job: LocalJob, first_rank: int, procs: int, base: Mapping[str, str]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for a worker whose procs hold ``gpusPerProc`` GPUs each: its own slice,
    as a pod gets its own devices."""
    per = job.spec.gpus_per_proc
    if per < 1 or "CUDA_VISIBLE_DEVICES" in base:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in range(first_rank * per, (first_rank + procs) * per))}


def _procs_per_worker(s: JobSpec) -> int:
    return s.mesh[-1].size if s.pod_layout == names.PER_HOST else 1


def _worker_spec(plan: _Plan, index: int, restart: int, disruptions: int = 0) -> procgroup.ProcSpec:
    """Worker ``index`` (one per pod the operator would create) of the gang created at ``restart``."""
    job, s = plan.job, plan.job.spec
    procs = _procs_per_worker(s)
    first = index * procs
    coords = contract.coords_of(job.mesh, first)
    base = {k: v for k, v in os.environ.items() if not k.startswith(names.RESERVED_PREFIX)}
    base.setdefault("PYTHONUNBUFFERED", "1")
    if timer.FILE_VAR in base and s.world_size // procs > 1:  # one watchdog pipe per worker
        base[timer.FILE_VAR] = f"{base[timer.FILE_VAR]}.{index}"
    backoff: dict[str, Any] = {"backoff": float(s.backoff_seconds) if plan.backoff is None else plan.backoff,
                               "max_backoff": float(s.max_backoff_seconds),
                               "backoff_reset": float(s.backoff_reset_seconds),
                               "join_timeout": float(s.join_timeout_seconds)}
    if plan.member_failure_limit is not None:
        backoff["member_failure_limit"] = plan.member_failure_limit
    if s.min_members:
        backoff.update(min_members=s.min_members, elastic_wait=float(s.elastic_wait_seconds))
    logs = {}
    if plan.logs is not None:
        logs = {"log_dir": plan.logs.log_dir, "redirects": plan.logs.redirects, "tee": plan.logs.tee}
    inputs = worker.worker_input_env(
        job.mesh,
        coords[:-1] if s.pod_layout == names.PER_HOST else coords,
        plan.master_addr,
        plan.master_port,
        restart_count=restart,
        max_restarts=s.max_restarts,
        run_id=plan.run_id,
        rendezvous_timeout=s.rendezvous_timeout_seconds,
        local_rank_scope=policy.local_rank_scope(s),
        pod_layout=s.pod_layout,
        agent_port=plan.agent_port,
        agent_addr=LOCAL_MASTER_ADDR,
        agent_token=plan.token,
        disruptions=disruptions or None,
        permanent_exit_codes=s.permanent_exit_codes or None,
        retryable_exit_codes=s.retryable_exit_codes or None,
        permanent_reasons=s.permanent_reasons or None,
        progress_timeout=plan.progress_timeout or None,
        stop_grace=float(plan.grace),
        **backoff,
        **logs,
    )
    gpus = _gpu_env(job, first, procs, {**base, **plan.env}) if plan.gpus else {}
    # Rank 0's worker (the coordinator) starts its gang once the runner's observer is connected, so
    # that the observer sees every event live (a late one's welcome has no ``exited`` rows) and the
    # table is the coordinator's however fast the gang fails.
    wait = {agent.OBSERVER_WAIT_VAR: f"{OBSERVER_WAIT:g}"}
    return procgroup.ProcSpec(
        rank=first,
        command=[plan.python, "-m", "monarch_spmd.payload.worker", "--", *s.args],
        env={**base, **inputs, **wait, **gpus, **plan.env},
        prefix=s.pod_layout != names.PER_HOST,  # a PerHost worker prefixes its procs' lines itself
        local_rank=index,
    )


# --- what the runner learns from the coordinator -----------------------------------------------


@dataclass
class _View:
    """The coordinator's events as the runner saw them (filled by the observer's thread)."""

    inbox: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    round: int = 0
    final: dict[str, Any] | None = None
    rows: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)  # round -> rank -> row
    pids: set[int] = field(default_factory=set)
    announced: set[int] = field(default_factory=set)  # rounds whose first failure was said
    quiet: bool = False  # the runner is stopping everything itself: the agents' reactions are not news
    lost: dict[int, int] = field(default_factory=dict)  # member -> the round it was lost in

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(self.inbox.get_nowait())
            except queue.Empty:
                return out


def _how(row: Mapping[str, Any]) -> str:
    code, returncode = row.get("rank_exit_code", row.get("exit_code")), row.get("returncode")
    name = procgroup.signal_name(returncode) if isinstance(returncode, int) else None
    if name:
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def _failed_words(event: Mapping[str, Any]) -> str:
    """``rank 2 exited with code 3`` for a failure or ``failed`` event."""
    rank, reason = event.get("rank"), event.get("reason")
    if rank is None:
        return f"the gang could not restart in place ({reason}: {event.get('message')})"
    text = f"rank {rank} {_how(event)}"
    if reason not in (None, rendezvous.REASON_ERROR, rendezvous.REASON_SIGNAL):
        text += f": {reason}"
        if reason in (rendezvous.REASON_WATCHDOG, rendezvous.REASON_NO_PROGRESS) and event.get("message"):
            text += f" ({event['message']})"
    return text


def _table(view: _View, final: Mapping[str, Any], world: int) -> list[str]:
    """The failed run's last round, one row per rank (docs: torchrun prints its root cause alike)."""
    r = int(final.get("round", view.round))
    rows = view.rows.get(r, {})
    root = final.get("rank")
    lines = [f"restart {r}, every rank's last process:",
             f"  {'rank':<6}{'local rank':<12}{'process':<13}exit code"]
    shown = []
    for rank in range(world):
        row = rows.get(rank)
        if row is None:
            shown.append((rank, f"  {rank:<6}{'-':<12}{'-':<13}{'-':<16}lost (its worker is gone)", True))
            continue
        code = procgroup.describe_returncode(row.get("returncode"))
        if rank == root:
            mark = "first failure"
            if final.get("reason") not in (None, rendezvous.REASON_ERROR, rendezvous.REASON_SIGNAL):
                mark += f" ({final.get('reason')})"
        elif row.get("stopped"):
            mark = "stopped (after the first failure)"
        elif row.get("exit_code"):
            mark = "failed too"
        else:
            mark = "ok"
        pid = f"pid {row.get('pid')}"
        interesting = rank == root or mark not in ("ok", "stopped (after the first failure)")
        shown.append((rank, f"  {rank:<6}{row.get('local_rank', '-')!s:<12}{pid:<13}{code:<16}{mark}", interesting))
    if len(shown) <= TABLE_ROWS:
        lines.extend(text for _, text, _ in shown)
    else:
        lines.extend(text for _, text, keep in shown if keep)
        rest = sum(1 for _, _, keep in shown if not keep)
        lines.append(f"  ... and {rest} other ranks, stopped after the first failure or done")
    return lines


def run(
    job: LocalJob,
    *,
    python: str | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    run_id: str | None = None,
    master_addr: str | None = None,
    logs: LogOptions | None = None,
    progress_timeout: float | None = None,
    backoff: float | None = None,
    member_failure_limit: int | None = None,
    agent_port: int | None = None,
    on_event: Any = None,
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
        logs: torchrun's ``--log-dir``/``--redirects``/``--tee``.
        progress_timeout: seconds without output before a rank fails (NoProgress); default the
            spec's ``restartPolicy.progressTimeoutSeconds``, else off.
        backoff: the back-off before the second restart in a row (default the spec's
            ``restartPolicy.backoffSeconds``, 10 s).
        member_failure_limit: restarts in place in a row caused by one worker before the gang is
            recreated instead (default the agents' 3).
        agent_port: the coordinator's port (default a free one).
        on_event: called with every observer message (welcome and events), in the observer's
            thread (the benchmark's clock).

    Raises:
        LocalRunError: for a spec field that cannot be honoured locally (nothing is started).
    """
    env, notes = check_local(job)
    out = procgroup.Prefixer(procgroup.stream_writer(stdout or sys.stdout, stderr or sys.stderr))

    def note(message: str) -> None:
        out.line(2, f"{_TAG} {message}")

    s = job.spec
    world = s.world_size
    if progress_timeout is None:
        progress_timeout = float(getattr(s, "progress_timeout_seconds", None) or 0)
    plan = _Plan(
        job=job, env=env, run_id=run_id or f"{job.name}-{uuid.uuid4().hex[:8]}", python=python or sys.executable,
        master_addr=master_addr or LOCAL_MASTER_ADDR,
        master_port=s.master_port if job.fixed_port else free_port(LOCAL_MASTER_ADDR),
        agent_port=agent_port or free_port(LOCAL_MASTER_ADDR), grace=grace_period,
        progress_timeout=progress_timeout, backoff=backoff, member_failure_limit=member_failure_limit, logs=logs,
        gpus=_enough_gpus(job))
    if plan.agent_port == plan.master_port:
        plan = _replace(plan, agent_port=free_port(LOCAL_MASTER_ADDR))
    for message in notes:
        note(message)

    def interrupted(signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, interrupted) for sig in agent.STOP_SIGNALS}
    deadline = time.monotonic() + s.active_deadline_seconds if s.active_deadline_seconds else None
    restart = 0
    try:
        while True:
            note(f"{'attempt' if restart == 0 else 'new gang at restart'} {restart}: {world} ranks of mesh "
                 f"{contract.format_mesh(job.mesh)}, master {plan.master_addr}:{plan.master_port}, run id {plan.run_id}")
            outcome = _run_gang(plan, restart, out, note, deadline, handlers, on_event)
            if isinstance(outcome, int):
                return outcome
            restart = outcome[0]  # the gang must be recreated (its rank-0 worker is gone)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _replace(plan: _Plan, **changes: Any) -> _Plan:
    return dataclasses.replace(plan, **changes)


def _run_gang(plan: _Plan, restart: int, out: procgroup.Prefixer, note: Any, deadline: float | None,
              handlers: Mapping[int, Any], on_event: Any) -> int | tuple[int]:
    """One gang of workers, from its start to its end: an exit code, or ``(restart,)`` when a new
    gang must start at that restart count."""
    plan = _replace(plan, token=rendezvous.new_token())  # each gang its own proof of membership
    s = plan.job.spec
    world = s.world_size
    procs = _procs_per_worker(s)
    view = _View(round=restart)
    # The observer's thread wakes the loop through a pipe, so an event is said when it happens,
    # between the ranks' lines around it.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    selector = selectors.DefaultSelector()

    def on_message(message: dict[str, Any]) -> None:
        if on_event is not None:
            on_event(message)
        view.inbox.put(message)
        try:
            os.write(wake_w, b"x")
        except OSError:
            pass

    def woken() -> None:
        try:
            os.read(wake_r, 4096)
        except OSError:
            pass
        _follow(view, note, world)

    selector.register(wake_r, selectors.EVENT_READ, woken)
    workers = [_worker_spec(plan, i, restart) for i in range(world // procs)]
    group = procgroup.ProcGroup(workers, out, plan.grace, preexec=agent.parent_death_hook(signal.SIGTERM),
                                stop_on_failure=False, selector=selector)
    observer = agent.Observer(LOCAL_MASTER_ADDR, plan.agent_port, on_message,
                              retry_until=time.monotonic() + s.rendezvous_timeout_seconds + 5, token=plan.token)
    expired = False
    stopped_by: int | None = None
    handled: set[int] = set()
    lost: list[tuple[str, int]] = []  # a killed worker that could not be replaced: why, and its code
    coordinator_gone: int | None = None  # rank 0's worker ended without a verdict: its exit code
    try:
        try:
            group.start()
            observer.start()
            while True:
                alive = group.step(0.1)
                _follow(view, note, world)
                if group.killed:
                    note(f"ranks still running {plan.grace:g}s after the signal; sent SIGKILL")
                    _kill_ranks(view)
                    group.killed = False
                if deadline is not None and not expired and stopped_by is None and time.monotonic() >= deadline:
                    expired = view.quiet = True
                    note(f"activeDeadlineSeconds ({s.active_deadline_seconds}s) passed; stopping all ranks")
                    group.stop()
                if not expired and stopped_by is None and view.final is None and not lost:
                    lost.extend(_replace_lost(plan, group, view, note, handled))
                if (coordinator_gone is None and group.procs[0].code is not None and view.final is None
                        and not expired and stopped_by is None):
                    _hear_out(observer)  # a verdict on its way decides first
                    _follow(view, note, world)
                    if view.final is None:  # rank 0's worker (the coordinator) ended without one
                        coordinator_gone = group.procs[0].code
                        group.stop()  # those still waiting for it would wait out the rendezvous timeout
                if not alive:
                    break
        except _Interrupted as e:
            stopped_by = e.signum
            view.quiet = True
            note(f"{signal.Signals(e.signum).name} received; passing it to every rank and stopping")
            for sig in handlers:
                signal.signal(sig, signal.SIG_IGN)
            group.stop(e.signum)
            while group.step(0.1):
                if group.killed:
                    _kill_ranks(view)
                    group.killed = False
    finally:
        group.finish()
        time.sleep(0.05)
        _follow(view, note, world)
        observer.stop()
        _follow(view, note, world)
        _kill_ranks(view)
        selector.close()
        os.close(wake_r)
        os.close(wake_w)
    if stopped_by is not None:
        return 128 + stopped_by
    if expired:
        note(f"job failed: DeadlineExceeded (active longer than {s.active_deadline_seconds}s)")
        return EX_DEADLINE
    final = view.final
    codes = [p.code for p in group.procs]
    if lost and final is None:
        what, code = lost[0]
        for line in _table(view, {"round": view.round}, world):
            note(line)
        note(f"job failed: {what} (restarts used up: {s.max_restarts} of at most {s.max_restarts})")
        return code
    if final is not None and final["type"] == rendezvous.EV_SUCCEEDED:
        note(f"all {world} ranks succeeded")
        return 0
    if final is not None and not final.get("fallback"):
        for line in _table(view, final, world):
            note(line)
        why = ""
        if final.get("permanent"):
            why = " (not retryable)"
        elif final.get("exhausted") and not final.get("max_restarts"):
            why = " (no restarts allowed: maxRestarts 0)"
        elif final.get("exhausted"):
            why = f" (restarts used up: {final.get('counted')} of at most {final.get('max_restarts')})"
        note(f"job failed: {_failed_words(final)}{why}")
        return int(final.get("exit_code") or 1)
    if final is None and all(c == 0 for c in codes):
        note(f"all {world} ranks succeeded")
        return 0
    # The gang could not go on in place: a fallback, or the coordinator (rank 0's worker) is gone.
    last = int(final["round"]) if final is not None else view.round
    why = _failed_words(final) if final is not None else (
        f"the worker of rank 0 {_how({'exit_code': group.procs[0].code, 'returncode': group.procs[0].returncode})}")
    if final is None and coordinator_gone and policy.is_permanent(s, coordinator_gone, None):
        note(f"job failed: {why} (not retryable)")
        return coordinator_gone
    if last >= s.max_restarts:
        for line in _table(view, final or {"round": last}, world):
            note(line)
        note(f"job failed: {why} (restarts used up: {last} of at most {s.max_restarts})")
        failing = [c for c in codes if c]
        return failing[0] if failing else 1
    note(f"{why}; recreating the gang (restart {last + 1} of at most {s.max_restarts})")
    return (last + 1,)


def _hear_out(observer: agent.Observer, timeout: float = 10.0) -> None:
    """Waits, once rank 0's worker (the coordinator) has ended, until the observer has read all it
    was sent. The observer was connected before the gang started
    (:data:`.payload.agent.OBSERVER_WAIT_VAR`) and the coordinator sends what is pending before it
    closes, so once the connection has ended every event, the verdict too, is in the inbox; never
    connected (the coordinator could not listen): nothing is on its way."""
    if observer.connected.is_set():
        observer.thread.join(timeout)


def _follow(view: _View, note: Any, world: int) -> None:
    """Turns the coordinator's events into the runner's notes and its view of the ranks. The
    observer (:class:`.payload.follow.Follower`) hands over each event once: an observer that
    connected late gets the events it missed (a rank that failed at once, the restart) from the
    welcome's history first, and they are said as if they had come live."""
    for event in view.drain():
        if event.get("type") == rendezvous.WELCOME:
            view.round = int(event.get("round", view.round))
        else:
            _take(view, event, note)


def _take(view: _View, event: Mapping[str, Any], note: Any) -> None:
    """One coordinator event."""
    quiet = view.quiet
    kind = event.get("type")
    r = event.get("round")
    if kind == rendezvous.EV_RUNNING:
        for row in event.get("procs") or []:
            if isinstance(row.get("pid"), int):
                view.pids.add(row["pid"])
    elif kind == rendezvous.EV_EXITED:
        for row in event.get("procs") or []:
            view.rows.setdefault(int(r), {})[int(row["rank"])] = row
    elif kind == rendezvous.EV_FAILURE and not quiet:
        if r not in view.announced:
            view.announced.add(r)
            if event.get("reason") == rendezvous.REASON_MEMBER_LOST:
                note(f"{event.get('message')}; stopping the other ranks")
            else:
                note(f"{_failed_words(event)}; stopping the other ranks")
    elif kind == rendezvous.EV_RESTART:
        view.round = int(event.get("next_round", view.round))
        if not quiet and event.get("reason") == rendezvous.REASON_MEMBER_LOST:
            note(f"the other ranks restart in place (restart {event.get('next_round')}) once a new worker of "
                 f"member {event.get('member')} joins")
        elif not quiet:
            wait = event.get("backoff_seconds") or 0
            after = f", after a back-off of {wait:g}s" if wait else ""
            note(f"restarting the gang (restart {event.get('next_round')} of at most {event.get('max_restarts')}) "
                 f"in place{after}")
    elif kind == rendezvous.EV_ALL_RUNNING and event.get("seconds_since_failure") is not None and not quiet:
        note(f"restart {r}: every rank is running again, {event['seconds_since_failure']:.2f}s after the failure")
    elif kind == rendezvous.EV_LOST:
        view.lost[int(event["member"])] = int(r)
    elif kind in (rendezvous.EV_SUCCEEDED, rendezvous.EV_FAILED):
        view.final = event


def _kill_ranks(view: _View) -> None:
    """SIGKILL to the process group of every rank the workers started (each leads its own): what a
    worker could not stop itself is gone too."""
    for pid in view.pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _replace_lost(plan: _Plan, group: procgroup.ProcGroup, view: _View, note: Any, handled: set[int]) -> list[tuple[str, int]]:
    """Replaces a worker (not rank 0's) that was killed, as the operator replaces a lost pod: the
    others restart in place and wait for it. When the restarts are used up every worker is
    stopped instead, and the loss is returned (why, exit code) to fail the job with."""
    s = plan.job.spec
    for index, proc in enumerate(group.procs):
        if index == 0 or proc.code is None or id(proc) in handled:
            continue
        handled.add(id(proc))
        if proc.returncode is None or proc.returncode >= 0 or proc.stopped:
            continue  # it ended as the coordinator told it: not lost
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and index not in view.lost and view.final is None:
            time.sleep(0.05)  # the coordinator's word on it (and any verdict) decides first
            _follow(view, note, s.world_size)
        if view.final is not None or group.procs[0].code is not None:
            return []
        what = f"the worker of rank {proc.spec.rank} (pid {proc.pid}) {_how(proc.row())}"
        restart = view.lost.get(index, view.round) + 1  # the round its loss makes the others restart into
        if restart > s.max_restarts:
            note(f"{what}; stopping every rank")
            group.stop()
            return [(what, proc.code or 1)]
        note(f"{what}; starting a new one in its place (the other ranks restart in place and wait for it)")
        group.respawn(index, _worker_spec(plan, index, restart))
    return []
