"""The rules the laptop and the cluster must apply alike: failure classes, trainer, GPUs, env.

Where it sits: above :mod:`monarch_spmd.spec` (it reads a parsed :class:`~monarch_spmd.spec.JobSpec`)
and the payload, below both the local runner (:mod:`monarch_spmd.runner`) and the operator's
builders and lifecycle (``spmd_operator``), which import these functions instead of keeping
their own copies. Standard library only.

Failure classes, in order (the first that matches decides):

1. a reason in ``restartPolicy.permanentReasons``, or one no waiting fixes
   (:data:`FATAL_REASONS`): permanent;
2. a disruption (:func:`is_disruption`: preemption, eviction, node drain or loss): retryable,
   and it does not use up ``maxRestarts``;
3. an exit code in ``permanentExitCodes``: permanent; in ``retryableExitCodes``: retryable
   (what the user lists explicitly wins over the defaults below);
4. the worker's 64 (bad input): permanent; its 75 (MASTER_ADDR never resolved): retryable;
5. when ``retryableExitCodes`` is non-empty, any other exit code: permanent;
6. anything else (another exit code, a pod lost): retryable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .payload import failures
from .payload.names import DEFAULT_AGENT_PORT, MODE_MONARCH, PER_HOST, TRAINER_CONTAINER
from .payload.worker import DEFAULT_STOP_GRACE, SCOPE_MESH, SCOPE_POD
from .spec import FAILURE_OUTPUT_NONE, RESTART_IN_PLACE, JobSpec

GPU_RESOURCE: Final = "nvidia.com/gpu"
#: How every line the worker (the agent) writes itself begins (payload.agent): what status may
#: show of a failure with failureOutput None, where no line of the program's output may appear.
WORKER_OUTPUT_PREFIX: Final = "monarch-spmd worker:"

#: Pod or container reasons that no amount of waiting or retrying fixes (the payload's rule).
FATAL_REASONS: Final = failures.FATAL_REASONS
#: Waiting reasons of a container that cannot start; a problem that lasts START_FAILURE_SECONDS
#: (counted from when it was first seen) fails the attempt, rather than leaving it Pending forever.
START_FAILURE_REASONS: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
START_FAILURE_SECONDS: Final = 300.0
#: Start failures that are permanent once they last START_FAILURE_SECONDS: a ConfigMap or Secret the
#: container needs is missing or malformed (the wait lets one be created). Every other start
#: failure is retryable (a registry down, a rate limit), unless listed in permanentReasons;
#: FATAL_REASONS fail at once.
PERMANENT_START_FAILURES: Final = frozenset({"CreateContainerConfigError"})

#: Reasons that mean the cluster took the pod away (see :data:`.payload.failures.DISRUPTION_REASONS`).
DISRUPTION_REASONS: Final = failures.DISRUPTION_REASONS
is_disruption = failures.is_disruption


def is_permanent(spec: JobSpec, exit_code: int | None, reason: str | None) -> bool:
    """Whether a failure with this exit code and reason fails the job without a restart.

    See the module docstring for the order of the rules; they are stated once, in
    :func:`monarch_spmd.payload.failures.is_permanent`, which the in-pod agent applies too.
    ``exit_code`` is None when the pod was lost without a container exit code (deleted, evicted,
    its node gone).
    """
    return failures.is_permanent(
        exit_code,
        reason,
        permanent_reasons=spec.permanent_reasons,
        permanent_exit_codes=spec.permanent_exit_codes,
        retryable_exit_codes=spec.retryable_exit_codes,
    )


def start_failure_is_permanent(spec: JobSpec, reason: str | None) -> bool:
    """Whether a container that could not start for START_FAILURE_SECONDS fails the job for good.

    Retryable by default (the gang is replaced, using up a restart); permanent for
    PERMANENT_START_FAILURES, FATAL_REASONS and a reason in ``restartPolicy.permanentReasons``.
    """
    return bool(reason) and (reason in PERMANENT_START_FAILURES or is_permanent(spec, None, reason))


def trainer_container(template: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod template's container that becomes the proc's container: ``trainer`` or unnamed."""
    for container in (template.get("spec") or {}).get("containers") or []:
        if isinstance(container, Mapping) and container.get("name") in (None, TRAINER_CONTAINER):
            return container
    return None


def _gpus_of(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    for kind in ("limits", "requests"):
        value = (resources.get(kind) or {}).get(GPU_RESOURCE)
        if value is not None and str(value).strip() not in ("", "0"):
            return True
    return False


def procs_per_pod(spec: JobSpec) -> int:
    """How many procs one pod (one worker) runs: 1, or the last dimension's size in PerHost."""
    return spec.mesh[-1].size if spec.pod_layout == PER_HOST else 1


def pods_per_attempt(spec: JobSpec) -> int:
    """How many pods (workers) one attempt of the gang has."""
    return spec.world_size // procs_per_pod(spec)


def gpus_per_pod(spec: JobSpec) -> int:
    """The ``nvidia.com/gpu`` limit of one pod: gpusPerProc for each of its procs."""
    return spec.gpus_per_proc * procs_per_pod(spec)


def local_rank_scope(spec: JobSpec) -> str:
    """``pod`` when each pod of one proc holds GPUs, else ``mesh`` (see the worker's table).

    GPUs are held when ``gpusPerProc`` is at least 1 or the trainer container of the template
    asks for ``nvidia.com/gpu``. With ``pod`` every proc is its own torchrun node (LOCAL_RANK=0,
    LOCAL_WORLD_SIZE=1), so ``torch.cuda.set_device(LOCAL_RANK)`` picks the one GPU it sees. In
    the PerHost layout a pod holds its host's procs and their GPUs, and LOCAL_RANK is always the
    coordinate on the last dimension (``mesh``), as under ``torchrun --nproc-per-node``.
    """
    if spec.pod_layout == PER_HOST:
        return SCOPE_MESH
    if spec.gpus_per_proc >= 1:
        return SCOPE_POD
    trainer = trainer_container(spec.template)
    if trainer is not None and _gpus_of(trainer):
        return SCOPE_POD
    return SCOPE_MESH


def restarts_in_place(spec: JobSpec) -> bool:
    """Whether the gang restarts in place (restartPolicy.mode InPlace); a Monarch-mode job's pods
    serve a client, not an argv the agent could restart, so it always recreates its pods."""
    return spec.restart_mode == RESTART_IN_PLACE and spec.mode != MODE_MONARCH


def agent_port(spec: JobSpec) -> int | None:
    """The restart-in-place coordinator's port in the pods (torchrun's rendezvous port, 29400, or
    29401 when masterPort takes 29400), or None when the gang does not restart in place."""
    if not restarts_in_place(spec):
        return None
    return DEFAULT_AGENT_PORT + 1 if spec.master_port == DEFAULT_AGENT_PORT else DEFAULT_AGENT_PORT


def stop_grace(spec: JobSpec) -> float:
    """Seconds from SIGTERM to SIGKILL when an agent stops its processes for a restart in place:
    the pod's own terminationGracePeriodSeconds (30 when the template leaves it unset), so a
    restart gives a rank the time a pod deletion would."""
    value = (spec.template.get("spec") or {}).get("terminationGracePeriodSeconds")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return DEFAULT_STOP_GRACE


def in_place_inputs(spec: JobSpec, disruptions: int = 0) -> dict[str, Any]:
    """The restart-in-place inputs of every pod (the optional keywords of
    :func:`monarch_spmd.payload.worker.worker_input_env`); empty when the gang does not restart in
    place, so its pods run as before (the first failure ends the worker with its code).

    Args:
        spec: the job's spec.
        disruptions: restarts so far that do not count against maxRestarts (status.disruptions).
    """
    port = agent_port(spec)
    out: dict[str, Any] = {}
    if spec.failure_output == FAILURE_OUTPUT_NONE:
        out["failure_output"] = FAILURE_OUTPUT_NONE
    if port is None:
        return out
    out.update(
        agent_port=port,
        disruptions=disruptions,
        permanent_exit_codes=spec.permanent_exit_codes or None,
        retryable_exit_codes=spec.retryable_exit_codes or None,
        permanent_reasons=spec.permanent_reasons or None,
        backoff=float(spec.backoff_seconds),
        max_backoff=float(spec.max_backoff_seconds),
        backoff_reset=float(spec.backoff_reset_seconds),
        join_timeout=float(spec.join_timeout_seconds),
        min_members=spec.min_members,
        elastic_wait=float(spec.elastic_wait_seconds) if spec.min_members else None,
        progress_timeout=float(spec.progress_timeout_seconds) if spec.progress_timeout_seconds else None,
        stop_grace=stop_grace(spec),
    )
    return out


def failure_text(spec: JobSpec, message: str | None) -> str | None:
    """What of a failure's message may reach the job's status and Events: all of it, or with
    ``failureOutput: None`` only the worker's own lines (``monarch-spmd worker: ...``), never a
    line of the program's output (a runtime may copy the end of the log into the termination
    message whatever the pod asked)."""
    if not message or spec.failure_output != FAILURE_OUTPUT_NONE:
        return message
    kept = [line for line in message.splitlines() if line.startswith(WORKER_OUTPUT_PREFIX)]
    return "\n".join(kept) or None


class UnsupportedLocally(ValueError):
    """A spec field that has no meaning off the cluster; the message names it and says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def trainer_env(spec: JobSpec) -> dict[str, str]:
    """The plain ``env`` values of the trainer container, for processes off the cluster.

    Raises:
        UnsupportedLocally: for a variable taken from the cluster (``valueFrom``) and for
            ``envFrom``, naming the field: no local value exists for them.
    """
    trainer = trainer_container(spec.template)
    if trainer is None:
        return {}
    index = next(i for i, c in enumerate((spec.template.get("spec") or {}).get("containers") or []) if c is trainer)
    path = f"spec.template.spec.containers[{index}]"
    if trainer.get("envFrom"):
        raise UnsupportedLocally(f"{path}.envFrom", "reads ConfigMaps or Secrets of a cluster; set the variables with env values to run locally")
    env: dict[str, str] = {}
    for j, item in enumerate(trainer.get("env") or []):
        if not isinstance(item, Mapping):
            continue
        if "valueFrom" in item:
            raise UnsupportedLocally(
                f"{path}.env[{j}].valueFrom",
                f"{item.get('name')} comes from the cluster (valueFrom); give it a value to run locally",
            )
        env[str(item["name"])] = str(item.get("value", ""))
    return env
