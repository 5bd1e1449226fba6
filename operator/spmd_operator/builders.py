"""Pure functions that build an SPMDJob's children as plain dicts: Service, ConfigMap and Pods.

Where it sits: above :mod:`spmd_operator.names` and the library (:mod:`monarch_spmd.spec` for the
parsed spec, :mod:`monarch_spmd.worker` for the worker's input variables), below
:mod:`spmd_operator.handlers`, which sends what these functions return to the API server. Nothing
here talks to Kubernetes, so every child can be unit-tested as a dict; nothing is rendered from
YAML text.

What a pod gets (docs/interfaces.md is the contract):

* command ``[spec.python, /opt/monarch-spmd/monarch_spmd/payload/worker.py, --, *spec.args]``: the worker,
  shipped in the ``<job>-worker`` ConfigMap and mounted read-only, so a stock PyTorch image works;
* the MONARCH_SPMD_* inputs of :func:`monarch_spmd.worker.worker_input_env` plus POD_NAME,
  POD_NAMESPACE, POD_IP and NODE_NAME from the downward API; a variable the user's ``trainer``
  container sets keeps the user's value (the spec parser lets users set only the harmless ones);
* labels job, rank, restart and one ``coord-<dim>`` per mesh dimension; the owner reference of
  the job (controller), so deleting the job deletes the pod;
* GPUs: ``gpusPerProc`` >= 1 sets the ``nvidia.com/gpu`` limit and MONARCH_SPMD_LOCAL_RANK_SCOPE=pod,
  so LOCAL_RANK=0 and LOCAL_WORLD_SIZE=1 in every pod (each pod is one torchrun node, as with
  ``torchrun --nproc-per-node=1``) and ``torch.cuda.set_device(LOCAL_RANK)`` picks the pod's own
  GPU. A GPU limit set only in the template gets the same scope.
"""

from __future__ import annotations

import copy
import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from monarch_spmd.payload import contract, worker
from monarch_spmd.spec import JobSpec

from . import names

GPU_RESOURCE: Final = "nvidia.com/gpu"
#: Scheduling topology for ``colocate``: one node.
COLOCATE_TOPOLOGY_KEY: Final = "kubernetes.io/hostname"
COLOCATE_WEIGHT: Final = 100
#: Downward-API variables every pod gets (name -> fieldPath).
DOWNWARD_ENV: Final = (
    ("POD_NAME", "metadata.name"),
    ("POD_NAMESPACE", "metadata.namespace"),
    ("POD_IP", "status.podIP"),
    ("NODE_NAME", "spec.nodeName"),
)


@dataclass(frozen=True)
class JobRef:
    """The identity of an SPMDJob: what every child needs to name itself and its owner.

    Attributes:
        name: the job's name (a DNS-1035 label of at most 50 characters).
        namespace: the job's namespace; every child lives there.
        uid: the job's uid; the owner reference and TORCHELASTIC_RUN_ID.
    """

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> JobRef:
        """Reads the identity from an SPMDJob object as the API server returns it."""
        meta = body.get("metadata") or {}
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def owner_reference(job: JobRef) -> dict[str, Any]:
    """The controller owner reference to ``job`` (garbage collection deletes children with it)."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(job: JobRef, name: str, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": job.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner_reference(job)],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def service_selector(job: JobRef, restart: int) -> dict[str, str]:
    """The rank-0 pod of attempt ``restart``: what MASTER_ADDR resolves to."""
    return {names.LABEL_JOB: job.name, names.LABEL_RANK: "0", names.LABEL_RESTART: str(restart)}


def build_service(job: JobRef, spec: JobSpec, restart: int) -> dict[str, Any]:
    """The headless Service ``<job>-master`` selecting the rank-0 pod of attempt ``restart``.

    ``publishNotReadyAddresses`` makes the name resolve as soon as the pod has an IP (the pods
    have no readiness probe that could gate a rendezvous); ``clusterIP: None`` makes it resolve to
    the pod IP itself, so the port list is informational.
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.service_name(job.name), {names.LABEL_JOB: job.name}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": service_selector(job, restart),
            "ports": [{"name": "master", "port": spec.master_port, "targetPort": spec.master_port, "protocol": "TCP"}],
        },
    }


def worker_files() -> dict[str, str]:
    """Reads the payload (every ``*.py`` of ``monarch_spmd/payload``) from the installed package.

    Called once at operator start; the texts go into every job's ConfigMap. The package boundary
    is the list: whatever the payload package holds is shipped, nothing else.

    Raises:
        FileNotFoundError: when the payload is missing; reinstall the project (``pip install .``).
    """
    root = importlib.resources.files("monarch_spmd.payload")
    files = {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in root.iterdir()
        if entry.name.endswith(".py") and entry.is_file()
    }
    if "worker.py" not in files:
        raise FileNotFoundError(
            f"monarch_spmd/payload/worker.py is missing from the installed package ({root}); "
            "reinstall the project (pip install .) so the operator can ship the worker"
        )
    return dict(sorted(files.items()))


def build_worker_configmap(job: JobRef, files: Mapping[str, str]) -> dict[str, Any]:
    """The ConfigMap ``<job>-worker``: the worker's files, mounted into every pod.

    Args:
        job: the owning job.
        files: file name -> text, as :func:`worker_files` returns.
    """
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, names.configmap_name(job.name), {names.LABEL_JOB: job.name}),
        "data": dict(files),
    }


def pod_labels(job: JobRef, spec: JobSpec, rank: int, restart: int) -> dict[str, str]:
    """The operator's labels of a pod: job, rank, restart and one coordinate per mesh dimension."""
    coords = contract.coords_of(spec.mesh_pairs, rank)
    labels = {names.LABEL_JOB: job.name, names.LABEL_RANK: str(rank), names.LABEL_RESTART: str(restart)}
    for dim, c in zip(spec.mesh, coords):
        labels[names.coord_label(dim.name)] = str(c)
    return labels


def _trainer_index(containers: list[Any]) -> int | None:
    for i, c in enumerate(containers):
        if isinstance(c, Mapping) and c.get("name") in (None, names.CONTAINER_NAME):
            return i
    return None


def _sets_gpus(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    for kind in ("limits", "requests"):
        value = (resources.get(kind) or {}).get(GPU_RESOURCE)
        if value is not None and str(value).strip() not in ("", "0"):
            return True
    return False


def local_rank_scope(spec: JobSpec) -> str:
    """``pod`` when each pod holds GPUs (gpusPerProc >= 1, or a GPU limit in the template), else ``mesh``.

    With ``pod`` every proc is its own torchrun node: LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, so
    ``torch.cuda.set_device(LOCAL_RANK)`` selects the one GPU the pod sees.
    """
    if spec.gpus_per_proc >= 1:
        return worker.SCOPE_POD
    containers = list(((spec.template.get("spec") or {}).get("containers")) or [])
    idx = _trainer_index(containers)
    if idx is not None and _sets_gpus(containers[idx]):
        return worker.SCOPE_POD
    return worker.SCOPE_MESH


def pod_env(job: JobRef, spec: JobSpec, rank: int, restart: int) -> list[dict[str, Any]]:
    """The operator's env of a pod: the downward API variables, then the MONARCH_SPMD_* inputs."""
    inputs = worker.worker_input_env(
        spec.mesh_pairs,
        contract.coords_of(spec.mesh_pairs, rank),
        names.master_addr(job.name, job.namespace),
        spec.master_port,
        restart_count=restart,
        max_restarts=spec.max_restarts,
        run_id=job.uid,
        rendezvous_timeout=spec.rendezvous_timeout_seconds,
        local_rank_scope=local_rank_scope(spec),
    )
    env: list[dict[str, Any]] = [
        {"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}} for var, path in DOWNWARD_ENV
    ]
    env.extend({"name": k, "value": v} for k, v in inputs.items())
    return env


def _merge_env(ours: list[dict[str, Any]], user: list[Any]) -> list[dict[str, Any]]:
    """Ours first (so the user's values may refer to them as $(POD_NAME)), minus what the user sets."""
    user_names = {e.get("name") for e in user if isinstance(e, Mapping)}
    return [e for e in ours if e["name"] not in user_names] + [copy.deepcopy(e) for e in user]


def _colocate_term(job: JobRef, spec: JobSpec, rank: int, restart: int) -> dict[str, Any]:
    first = spec.mesh[0].name
    coord = contract.coords_of(spec.mesh_pairs, rank)[0]
    return {
        "weight": COLOCATE_WEIGHT,
        "podAffinityTerm": {
            "labelSelector": {
                "matchLabels": {
                    names.LABEL_JOB: job.name,
                    names.LABEL_RESTART: str(restart),
                    names.coord_label(first): str(coord),
                }
            },
            "topologyKey": COLOCATE_TOPOLOGY_KEY,
        },
    }


def build_pod(job: JobRef, spec: JobSpec, rank: int, restart: int) -> dict[str, Any]:
    """The pod of ``rank`` in gang attempt ``restart``, merged with the user's pod template.

    Args:
        job: the owning job.
        spec: the parsed spec (``spec.image`` must be set).
        rank: the proc's global rank, 0..world_size-1.
        restart: the gang attempt, 0 first; goes into the name, a label and the env.

    Raises:
        ValueError: for a rank out of range or a spec without an image (parse the spec with
            ``require_image=True`` first).
    """
    if not spec.image:
        raise ValueError("spec.image: required to build a pod; parse the spec with require_image=True")
    template = spec.template
    user_meta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = copy.deepcopy(dict(template.get("spec") or {}))

    containers = list(pod_spec.get("containers") or [])
    idx = _trainer_index(containers)
    trainer: dict[str, Any] = copy.deepcopy(dict(containers[idx])) if idx is not None else {}
    trainer["name"] = names.CONTAINER_NAME
    trainer["image"] = spec.image
    trainer["command"] = [spec.python, names.WORKER_SCRIPT, "--", *spec.args]
    trainer.pop("args", None)
    trainer["env"] = _merge_env(pod_env(job, spec, rank, restart), list(trainer.get("env") or []))
    mounts = [m for m in trainer.get("volumeMounts") or [] if m.get("name") != names.WORKER_VOLUME]
    mounts.append({"name": names.WORKER_VOLUME, "mountPath": names.WORKER_MOUNT_PATH, "readOnly": True})
    trainer["volumeMounts"] = mounts
    # The end of the log becomes the termination message when the program fails without writing
    # one: status.failure then shows the traceback.
    trainer.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    if spec.gpus_per_proc >= 1:
        resources = trainer.setdefault("resources", {})
        resources.setdefault("limits", {})[GPU_RESOURCE] = str(spec.gpus_per_proc)
        if GPU_RESOURCE in (resources.get("requests") or {}):
            resources["requests"][GPU_RESOURCE] = str(spec.gpus_per_proc)
    if idx is None:
        containers.insert(0, trainer)
    else:
        containers[idx] = trainer
    pod_spec["containers"] = containers

    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != names.WORKER_VOLUME]
    volumes.append({"name": names.WORKER_VOLUME, "configMap": {"name": names.configmap_name(job.name)}})
    pod_spec["volumes"] = volumes
    pod_spec["restartPolicy"] = "Never"

    if spec.colocate:
        affinity = pod_spec.setdefault("affinity", {})
        preferred = affinity.setdefault("podAffinity", {}).setdefault(
            "preferredDuringSchedulingIgnoredDuringExecution", []
        )
        preferred.append(_colocate_term(job, spec, rank, restart))

    labels = {**(user_meta.get("labels") or {}), **pod_labels(job, spec, rank, restart)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(job, names.pod_name(job.name, restart, rank), labels, user_meta.get("annotations")),
        "spec": pod_spec,
    }
