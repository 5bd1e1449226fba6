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
* in an elastic job (``--nnodes MIN:MAX``) a killed worker is a lost node, as on the cluster: a
  disruption, never counted; the next round starts without it after the elastic wait, and once
  it runs the runner starts the worker again (the operator's new pod), so the gang grows back
  (:func:`_start_again`); rank 0's worker lost recreates the gang, uncounted too. The notes and
  the failed run's table say each size, which worker was lost and what was counted;
* every output line is prefixed with its rank (``[rank 3] ...``), partial lines and ``\\r`` (a
  progress bar) passed on as they arrive; stdout to stdout, stderr to stderr; the runner's own
  lines start with ``[monarch-spmd]`` and go to stderr. torchrun's ``--tee``, ``--redirects``
  and ``--log-dir`` write each rank's files as torchrun lays them out;
* a failed run ends with a table of every rank's last process (rank, local rank, pid, exit code
  with the signal's name, the first failure marked, the ranks the agents stopped marked as
  such) and a last line naming the failing rank;
* with ``agent_store`` (``--agent-store``) rank 0's worker hosts the TCPStore on the master port
  for its whole life, as torchrun's agent does, and the ranks see TORCHELASTIC_USE_AGENT_STORE=True
  (:mod:`monarch_spmd.payload.agentstore`; torchft needs it, docs/torchft.md);
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
#: Seconds an elastic job's round, with its minimum of workers, waits for the others (the spec's
#: default of restartPolicy.elasticWaitSeconds; ``--elastic-wait`` sets it).
DEFAULT_ELASTIC_WAIT: Final = spec.DEFAULT_ELASTIC_WAIT_SECONDS
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
    "replicaGroups.*": (REFUSED, "a local run takes replica groups as flags: monarch-spmd run --replica-groups G "
                                 "--min-replicas M -f <a manifest without spec.replicaGroups> (docs/torchft.md)"),
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
_FIELDS_APART: Final = {"template.spec": ("restartPolicy", "containers"), "replicaGroups": ()}


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
        LocalRunError: for ``spec.suspend: true``, ``spec.mode: Monarch``, ``spec.replicaGroups``
            and env the cluster must supply, naming the field.
    """
    s = job.spec
    if s.mode == spec.MODE_MONARCH:
        raise LocalRunError(f"spec.mode: {LOCAL_FIELDS['mode'][1]}")
    if s.suspend:
        raise LocalRunError(f"spec.suspend: {LOCAL_FIELDS['suspend'][1]}")
    if s.replica_groups is not None:
        raise LocalRunError(f"spec.replicaGroups: {LOCAL_FIELDS['replicaGroups.*'][1]}")
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
    elastic_wait: int | None = None,
) -> LocalJob:
    """A :class:`LocalJob` from the CLI's pieces: a manifest and/or ``--mesh``, argv, overrides.

    The command line is turned into the manifest it stands for (a non-empty ``args``, ``mesh``
    and every override given win over the manifest's), which is then checked by the same
    :func:`spec.load_manifest` as a manifest: one set of rules, one kind of error message.
    ``elastic_wait`` is ``restartPolicy.elasticWaitSeconds`` (``--elastic-wait``): only an elastic
    job waits for its absent nodes, so it is refused for a fixed size rather than ignored.

    Raises:
        monarch_spmd.spec.SpecError: naming the field; ValueError for a ``--mesh`` that does not
        parse, or an elastic wait for a job of a fixed size.
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
    if elastic_wait is not None:
        body["restartPolicy"] = {**(body.get("restartPolicy") or {}), "elasticWaitSeconds": elastic_wait}
    overrides = {names.LOCAL_RANK_SCOPE_VAR: local_rank_scope, names.ROLE_NAME_VAR: role_name}
    if any(v is not None for v in overrides.values()):
        body["template"] = _with_trainer_env(body.get("template") or {}, overrides)
    job = job_from_manifest({**doc, "spec": body})
    if elastic_wait is not None and job.spec.min_members is None:
        raise ValueError(f"--elastic-wait {elastic_wait}: only an elastic job waits for absent nodes; give "
                         "--nnodes MIN:MAX (or a manifest with mesh[0].minSize below its size)")
    return job


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
    agent_store: bool = False
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
        agent_store=plan.agent_store or None,
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
    #: ``lost`` events per member, and how many of them the runner has matched with a worker it saw
    #: killed (a worker killed again waits for its own loss, not the last one's).
    lost_seen: dict[int, int] = field(default_factory=dict)
    lost_handled: dict[int, int] = field(default_factory=dict)
    #: An elastic job's shape (0: a fixed size): the fewest workers a round starts with, the
    #: workers of the gang, the procs of each, and the elastic wait.
    min_workers: int = 0
    workers: int = 0
    procs: int = 1
    elastic_wait: float = 0.0
    #: The latest round whose every rank was running (the coordinator's ``all_running``).
    all_running: int | None = None
    #: An elastic gang's rounds as they started: (round, its members), in order.
    starts: list[tuple[int, list[int]]] = field(default_factory=list)
    #: The restarts of this gang (the coordinator's ``restart`` events), in order.
    restarts: list[Mapping[str, Any]] = field(default_factory=list)
    #: An elastic job's lost workers (member -> the round it was lost in) that the runner starts
    #: again once the gang runs without them (:func:`_start_again`).
    absent: dict[int, int] = field(default_factory=dict)

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(self.inbox.get_nowait())
            except queue.Empty:
                return out

    @property
    def elastic(self) -> bool:
        return 0 < self.min_workers < self.workers

    def members_of(self, round_: int) -> list[int] | None:
        """The members an elastic gang's round ``round_`` started with (None: fixed size, or not started)."""
        for r, members in reversed(self.starts):
            if r == round_:
                return members
        return None

    @property
    def disruptions(self) -> int:
        """This gang's restarts that were disruptions (a lost worker, a membership change): not counted."""
        return sum(1 for e in self.restarts if e.get("disruption"))


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
    members = view.members_of(r) if view.elastic else None
    if members is not None:
        world = len(members) * view.procs  # an elastic round's ranks are those of its members
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
    if members is not None and len(members) < view.workers:
        absent = [m for m in range(view.workers) if m not in members]
        lines.append(f"restart {r} ran {len(members)} of {view.workers} workers (elastic, at least "
                     f"{view.min_workers}): {_absences(view, absent)}")
    return lines


def _absences(view: _View, members: Sequence[int]) -> str:
    """Why an elastic round ran without ``members``: ``worker 1, lost in restart 0 (not counted
    against maxRestarts: a lost worker is a disruption)``."""
    parts = []
    for m in members:
        if m in view.lost:
            parts.append(f"worker {m}, lost in restart {view.lost[m]}")
        else:
            parts.append(f"worker {m}, not ready within the elastic wait ({view.elastic_wait:g}s)")
    if not any(m in view.lost for m in members):
        return "; ".join(parts)
    return "; ".join(parts) + " (not counted against maxRestarts: a lost worker is a disruption)"


def _workers_word(count: int) -> str:
    return f"{count} worker" if count == 1 else f"{count} workers"


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
    agent_store: bool = False,
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
        agent_store: rank 0's worker hosts the TCPStore on the master port for the whole run and
            the ranks see TORCHELASTIC_USE_AGENT_STORE=True, as torchrun's agent does
            (``--agent-store``; docs/torchft.md).
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
        gpus=_enough_gpus(job), agent_store=agent_store)
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
    restart = disruptions = 0
    try:
        while True:
            note(f"{'attempt' if restart == 0 else 'new gang at restart'} {restart}: {world} ranks of mesh "
                 f"{contract.format_mesh(job.mesh)}, master {plan.master_addr}:{plan.master_port}, run id {plan.run_id}")
            outcome = _run_gang(plan, restart, disruptions, out, note, deadline, handlers, on_event)
            if isinstance(outcome, int):
                return outcome
            restart, disruptions = outcome  # the gang must be recreated (its rank-0 worker is gone)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _replace(plan: _Plan, **changes: Any) -> _Plan:
    return dataclasses.replace(plan, **changes)


def _run_gang(plan: _Plan, restart: int, disruptions: int, out: procgroup.Prefixer, note: Any,
              deadline: float | None, handlers: Mapping[int, Any], on_event: Any) -> int | tuple[int, int]:
    """One gang of workers, from its start to its end: an exit code, or ``(restart, disruptions)``
    when a new gang must start at that restart count, ``disruptions`` of the restarts before it
    not counted against maxRestarts (MONARCH_SPMD_DISRUPTIONS, as the operator gives a new
    attempt's pods; an elastic job's only: a fixed-size local run counts every recreation)."""
    plan = _replace(plan, token=rendezvous.new_token())  # each gang its own proof of membership
    s = plan.job.spec
    world = s.world_size
    procs = _procs_per_worker(s)
    view = _View(round=restart, procs=procs, workers=world // procs, min_workers=s.min_members or 0,
                 elastic_wait=float(s.elastic_wait_seconds))
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
    workers = [_worker_spec(plan, i, restart, disruptions) for i in range(world // procs)]
    group = procgroup.ProcGroup(workers, out, plan.grace, preexec=agent.parent_death_hook(signal.SIGTERM),
                                stop_on_failure=False, selector=selector)
    observer = agent.Observer(LOCAL_MASTER_ADDR, plan.agent_port, on_message,
                              retry_until=time.monotonic() + s.rendezvous_timeout_seconds + 5, token=plan.token)
    expired = False
    stopped_by: int | None = None
    handled: set[procgroup.Proc] = set()
    lost: list[tuple[str, int, int]] = []  # a killed worker that could not be replaced: why, its code, its round
    coordinator_gone: int | None = None  # rank 0's worker ended without a verdict: its exit code
    coordinator_lost = False  # and it was killed by a signal the runner did not send (a lost node)
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
                    _start_again(plan, group, view, note)
                if (coordinator_gone is None and group.procs[0].code is not None and view.final is None
                        and not expired and stopped_by is None):
                    _hear_out(observer)  # a verdict on its way decides first
                    _follow(view, note, world)
                    if view.final is None:  # rank 0's worker (the coordinator) ended without one
                        coordinator_gone = group.procs[0].code
                        first = group.procs[0]
                        coordinator_lost = first.returncode is not None and first.returncode < 0 and not first.stopped
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
        what, code, lost_in = lost[0]
        for line in _table(view, {"round": lost_in}, world):  # the round it was lost in: the one that ran
            note(line)
        note(f"job failed: {what} (restarts used up: {s.max_restarts} of at most {s.max_restarts})")
        return code
    history = _elastic_history(view, s.max_restarts)

    def last_line(text: str) -> None:
        if history:
            note(history)  # an elastic run's sizes and counts, once, just before its outcome
        note(text)

    if final is not None and final["type"] == rendezvous.EV_SUCCEEDED:
        members = view.members_of(int(final.get("round", view.round))) if view.elastic else None
        if members is not None and len(members) < view.workers:
            last_line(f"all {len(members) * procs} ranks of restart {final.get('round')} succeeded ({len(members)} of "
                      f"{view.workers} workers, elastic)")
        else:
            last_line(f"all {world} ranks succeeded")
        return 0
    if final is not None and not final.get("fallback"):
        for line in _table(view, final, world):
            note(line)
        why = ""
        if final.get("permanent"):
            why = " (not retryable)"
        elif final.get("exhausted") and not final.get("max_restarts"):
            why = f" (no restarts allowed: maxRestarts 0{_uncounted(final)})"
        elif final.get("exhausted"):
            why = (f" (restarts used up: {final.get('counted')} of at most {final.get('max_restarts')}"
                   f"{_uncounted(final)})")
        last_line(f"job failed: {_failed_words(final)}{why}")
        return int(final.get("exit_code") or 1)
    if final is None and all(c == 0 for c in codes):
        last_line(f"all {world} ranks succeeded")
        return 0
    # The gang could not go on in place: a fallback, or the coordinator (rank 0's worker) is gone.
    last = int(final["round"]) if final is not None else view.round
    why = _failed_words(final) if final is not None else (
        f"the worker of rank 0 {_how({'exit_code': group.procs[0].code, 'returncode': group.procs[0].returncode})}")
    if final is None and coordinator_gone and policy.is_permanent(s, coordinator_gone, None):
        last_line(f"job failed: {why} (not retryable)")
        return coordinator_gone
    # An elastic job counts as the operator does: the restarts that were disruptions do not.
    uncounted = disruptions + view.disruptions if view.elastic else 0
    if view.elastic and final is None and coordinator_lost:
        # Rank 0's worker lost (its node): a disruption, the gang is recreated uncounted.
        if history:
            note(history)
        note(f"{why}: worker 0 (the coordinator's) is lost, a disruption not counted against maxRestarts; "
             f"recreating the gang (restart {last + 1}, {last - uncounted} of at most {s.max_restarts} counted)")
        return (last + 1, uncounted + 1)
    if last - uncounted >= s.max_restarts:
        for line in _table(view, final or {"round": last}, world):
            note(line)
        last_line(f"job failed: {why} (restarts used up: {last - uncounted} of at most {s.max_restarts})")
        failing = [c for c in codes if c]
        return failing[0] if failing else 1
    if history:
        note(history)
    if uncounted:
        note(f"{why}; recreating the gang (restart {last + 1}, {last + 1 - uncounted} of at most {s.max_restarts} "
             "counted)")
    else:
        note(f"{why}; recreating the gang (restart {last + 1} of at most {s.max_restarts})")
    return (last + 1, uncounted)


def _uncounted(final: Mapping[str, Any]) -> str:
    """``; 2 more were disruptions, not counted`` when some of the run's restarts (``round``)
    were not counted against maxRestarts (``counted``): a lost worker, a membership change."""
    r, counted = final.get("round"), final.get("counted")
    if not isinstance(r, int) or not isinstance(counted, int) or counted >= r:
        return ""
    return f"; {r - counted} more {'was a disruption' if r - counted == 1 else 'were disruptions'}, not counted"


def _elastic_history(view: _View, max_restarts: int) -> str | None:
    """An elastic run's sizes and what its restarts counted, once its size changed: ``elastic:
    restart 0 ran 2, restart 1 ran 1, restart 2 ran 2 of 2 workers; 2 restarts, 0 counted ...``."""
    if not view.elastic or len({tuple(m) for _, m in view.starts}) <= 1:
        return None
    sizes, before = [], None
    for r, members in view.starts:
        if members != before:
            sizes.append(f"restart {r} ran {len(members)}")
        before = members
    counted = sum(1 for e in view.restarts if not e.get("disruption"))
    return (f"elastic: {', '.join(sizes)} of {view.workers} workers; {len(view.restarts)} restarts, {counted} counted "
            f"against maxRestarts (at most {max_restarts}), {view.disruptions} not (lost workers and workers back "
            "are disruptions)")


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
    elif kind == rendezvous.EV_STARTED and isinstance(event.get("round_members"), list):
        # An elastic round: said here rather than at its ``resize``, which may come in a later
        # read, so that the shrink is said before the runner starts the lost worker again.
        members = [int(m) for m in event["round_members"]]
        before = view.starts[-1][1] if view.starts else list(range(view.workers))
        view.starts.append((int(r), members))
        if members != before and not quiet:
            note(_resize_words(view, int(r), members))
    elif kind == rendezvous.EV_RESIZE and event.get("next_size") is not None and not quiet:
        # A worker ready while a smaller round runs: the gang grows.
        note(f"worker {event.get('member')} is ready: the gang grows from {event.get('size')} to "
             f"{_workers_word(int(event.get('next_size') or 0))}, every rank restarts in place with it "
             "(a membership change, not counted against maxRestarts)")
    elif kind == rendezvous.EV_RESTART:
        view.round = int(event.get("next_round", view.round))
        view.restarts.append(event)
        if not quiet:
            note(_restart_words(view, event))
    elif kind == rendezvous.EV_ALL_RUNNING:
        view.all_running = int(r)
        if event.get("seconds_since_failure") is not None and not quiet:
            grown = bool(view.restarts) and view.restarts[-1].get("reason") == rendezvous.REASON_MEMBERSHIP
            after = "the gang stopped to grow" if grown else "the failure"
            note(f"restart {r}: every rank is running again, {event['seconds_since_failure']:.2f}s after {after}")
    elif kind == rendezvous.EV_LOST:
        view.lost[int(event["member"])] = int(r)
        view.lost_seen[int(event["member"])] = view.lost_seen.get(int(event["member"]), 0) + 1
    elif kind in (rendezvous.EV_SUCCEEDED, rendezvous.EV_FAILED):
        view.final = event


def _restart_words(view: _View, event: Mapping[str, Any]) -> str:
    """The note for a ``restart`` event: what it restarts for, and whether it counts."""
    n, reason, member = event.get("next_round"), event.get("reason"), event.get("member")
    if reason == rendezvous.REASON_MEMBER_LOST and view.elastic:
        return (f"the other ranks restart in place (restart {n}, not counted against maxRestarts: a lost worker is "
                f"a disruption); the round starts without worker {member} unless it is back within the elastic "
                f"wait ({view.elastic_wait:g}s)")
    if reason == rendezvous.REASON_MEMBER_LOST:
        return f"the other ranks restart in place (restart {n}) once a new worker of member {member} joins"
    if reason == rendezvous.REASON_MEMBERSHIP:
        return f"every rank restarts in place (restart {n}): a membership change, not counted against maxRestarts"
    wait = event.get("backoff_seconds") or 0
    after = f", after a back-off of {wait:g}s" if wait else ""
    counted = event.get("counted")
    if isinstance(counted, int) and isinstance(n, int) and counted < n:
        # Earlier restarts of the run were disruptions: say what the limit is counted against.
        other = "1 was a disruption" if n - counted == 1 else f"{n - counted} were disruptions"
        return (f"restarting the gang (restart {n}, {counted} of at most {event.get('max_restarts')} counted: "
                f"{other}) in place{after}")
    return f"restarting the gang (restart {n} of at most {event.get('max_restarts')}) in place{after}"


def _resize_words(view: _View, r: int, members: list[int]) -> str:
    """The note for an elastic round ``r`` that starts with other ``members`` than the round
    before it: ``restart 1 runs 1 of 2 workers (WORLD_SIZE 1 ...): the gang shrank from 2 to 1
    worker without worker 1, lost in restart 0 (not counted ...)``."""
    earlier = [m for rr, m in view.starts if rr < r]
    text = (f"restart {r} runs {len(members)} of {view.workers} workers (WORLD_SIZE {len(members) * view.procs}, "
            f"elastic: at least {view.min_workers})")
    if not earlier:
        absent = [m for m in range(view.workers) if m not in members]
        return f"{text}: without {_absences(view, absent)}" if absent else text
    before = earlier[-1]
    gone = [m for m in before if m not in members]
    back = [m for m in members if m not in before]
    size = f"from {len(before)} to {_workers_word(len(members))}"
    if gone and not back:
        return f"{text}: the gang shrank {size} without {_absences(view, gone)}"
    joined = ", ".join(f"worker {m}" for m in back)
    if back and not gone:
        grew = "grew back" if all(m in view.lost for m in back) else "grew"
        return f"{text}: the gang {grew} {size} with {joined} (a membership change, not counted against maxRestarts)"
    return f"{text}: the gang went {size}, with {joined}, without {_absences(view, gone)}"


def _kill_ranks(view: _View) -> None:
    """SIGKILL to the process group of every rank the workers started (each leads its own): what a
    worker could not stop itself is gone too."""
    for pid in view.pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _replace_lost(plan: _Plan, group: procgroup.ProcGroup, view: _View, note: Any,
                  handled: set[procgroup.Proc]) -> list[tuple[str, int, int]]:
    """Handles a worker (not rank 0's) that was killed, as the operator handles a lost pod.

    A fixed size: it is replaced at once, the others restart in place and wait for it; when the
    restarts are used up every worker is stopped instead, and the loss is returned (why, exit
    code, the round it was lost in) to fail the job with. An elastic job: the loss is a
    disruption, never counted (the coordinator's rule, :mod:`.payload.counting`); the gang goes
    on without the worker after the elastic wait and :func:`_start_again` starts it again."""
    s = plan.job.spec
    for index, proc in enumerate(group.procs):
        if index == 0 or proc.code is None or proc in handled:
            continue
        handled.add(proc)
        if proc.returncode is None or proc.returncode >= 0 or proc.stopped:
            continue  # it ended as the coordinator told it: not lost
        deadline = time.monotonic() + 2.0
        while (time.monotonic() < deadline and view.lost_seen.get(index, 0) <= view.lost_handled.get(index, 0)
               and view.final is None):
            time.sleep(0.05)  # the coordinator's word on it (and any verdict) decides first
            _follow(view, note, s.world_size)
        view.lost_handled[index] = view.lost_seen.get(index, 0)
        if view.final is not None or group.procs[0].code is not None:
            return []
        what = f"the worker of rank {proc.spec.rank} (pid {proc.pid}) {_how(proc.row())}"
        lost_in = view.lost.get(index, view.round)
        if view.elastic:
            view.absent[index] = lost_in
            note(f"{what}: worker {index} is lost in restart {lost_in}, a disruption not counted against "
                 f"maxRestarts; the gang goes on without it (elastic, at least {view.min_workers} of {view.workers} "
                 f"workers) after the elastic wait ({view.elastic_wait:g}s), then a new worker {index} starts, as the "
                 "operator creates a pod for a lost one, and the gang grows back when it joins")
            continue
        restart = lost_in + 1  # the round its loss makes the others restart into
        if restart > s.max_restarts:
            note(f"{what}; stopping every rank")
            view.quiet = True  # the agents' restart in place is not news: the runner stops them
            group.stop()
            return [(what, proc.code or 1, lost_in)]
        note(f"{what}; starting a new one in its place (the other ranks restart in place and wait for it)")
        group.respawn(index, _worker_spec(plan, index, restart))
    return []


def _start_again(plan: _Plan, group: procgroup.ProcGroup, view: _View, note: Any) -> None:
    """Starts an elastic job's lost workers again, as the operator creates a pod for a lost one:
    once the gang runs without them (every rank of a round without them is running: the gang
    shrank), so that it grows back when they join; at once when fewer than the minimum are left
    (no round could start without them). A lost worker stands for a lost node, whose pod comes
    back once the node does, after the elastic wait: a local run goes through what such a job
    goes through on the cluster, a shrink and then a grow. Started at once instead, the worker
    would join within the wait and the gang would never run smaller."""
    if not view.absent or group.procs[0].code is not None:
        return  # nothing to start again, or the coordinator is gone: the gang with it
    left = sum(1 for i, p in enumerate(group.procs) if p.code is None and i not in view.absent)
    latest = view.starts[-1] if view.starts else None
    for index in sorted(view.absent):
        shrunk = latest is not None and index not in latest[1] and view.all_running == latest[0]
        if not shrunk and left >= view.min_workers:
            continue
        del view.absent[index]
        if group.procs[index].code is None:
            continue
        why = (f"restart {view.round} runs without it" if shrunk
               else f"fewer than {view.min_workers} workers are left, no round starts without it")
        note(f"starting worker {index} again ({why}), as the operator creates a pod for a lost one: the gang grows "
             "back when it joins")
        group.respawn(index, _worker_spec(plan, index, view.round))
