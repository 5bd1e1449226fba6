"""Names, labels and fixed paths of everything the SPMDJob operator creates.

The bottom layer of ``spmd_operator``: plain constants and name functions, imported by the
builders, the lifecycle logic and the handlers alike. docs/interfaces.md is the contract these
values follow; change it first.
"""

from __future__ import annotations

from typing import Final

from monarch_spmd.spec import API_VERSION, GROUP, KIND, MAX_JOB_NAME_LENGTH, TRAINER_CONTAINER, VERSION

__all__ = [
    "API_VERSION",
    "CONTAINER_NAME",
    "COORD_LABEL_PREFIX",
    "GROUP",
    "KIND",
    "LABEL_JOB",
    "LABEL_PREFIX",
    "LABEL_RANK",
    "LABEL_RESTART",
    "MAX_JOB_NAME_LENGTH",
    "PLURAL",
    "VERSION",
    "WORKER_FILES",
    "WORKER_MOUNT_PATH",
    "WORKER_SCRIPT",
    "WORKER_VOLUME",
    "configmap_name",
    "coord_label",
    "master_addr",
    "pod_name",
    "service_name",
]

PLURAL: Final = "spmdjobs"

LABEL_PREFIX: Final = f"{GROUP}/"
#: On every child: the job's name. Pods are watched with this label as the server-side selector.
LABEL_JOB: Final = f"{LABEL_PREFIX}job"
#: On every pod: its global rank.
LABEL_RANK: Final = f"{LABEL_PREFIX}rank"
#: On every pod: the gang attempt (restart count) it belongs to.
LABEL_RESTART: Final = f"{LABEL_PREFIX}restart"
#: Followed by a mesh dimension's name: the pod's coordinate on that dimension.
COORD_LABEL_PREFIX: Final = f"{LABEL_PREFIX}coord-"

CONTAINER_NAME: Final = TRAINER_CONTAINER
#: The ConfigMap volume that carries the worker into pods whose image lacks the project.
WORKER_VOLUME: Final = "monarch-spmd-worker"
WORKER_MOUNT_PATH: Final = "/opt/monarch-spmd/monarch_spmd"
#: The files of ``monarch_spmd/`` shipped in the ConfigMap (standard library only).
WORKER_FILES: Final = ("__init__.py", "contract.py", "worker.py")
WORKER_SCRIPT: Final = f"{WORKER_MOUNT_PATH}/worker.py"


def pod_name(job: str, restart: int, rank: int) -> str:
    """The pod of ``rank`` in gang attempt ``restart``: ``<job>-r<restart>-<rank>``, e.g. hello-r0-3.

    Deterministic, so creating a pod twice is a 409 rather than a duplicate.
    """
    return f"{job}-r{restart}-{rank}"


def service_name(job: str) -> str:
    """The headless Service that resolves to the current attempt's rank-0 pod."""
    return f"{job}-master"


def configmap_name(job: str) -> str:
    """The ConfigMap holding the worker's files."""
    return f"{job}-worker"


def master_addr(job: str, namespace: str) -> str:
    """MASTER_ADDR of every proc: the Service's DNS name, ``<job>-master.<namespace>.svc``."""
    return f"{service_name(job)}.{namespace}.svc"


def coord_label(dim: str) -> str:
    """The label key holding a pod's coordinate on mesh dimension ``dim``."""
    return f"{COORD_LABEL_PREFIX}{dim}"
