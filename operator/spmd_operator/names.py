"""Names, labels and fixed paths of everything the SPMDJob operator creates.

The bottom layer of ``spmd_operator``: plain constants and name functions, imported by the
builders, the lifecycle logic and the handlers alike. docs/interfaces.md is the contract these
values follow; change it first.
"""

from __future__ import annotations

from typing import Final

from monarch_spmd.payload.names import (
    API_VERSION,
    COORD_LABEL_PREFIX,
    GROUP,
    KIND,
    LABEL_JOB,
    LABEL_JOB_UID,
    LABEL_PREFIX,
    LABEL_RANK,
    LABEL_RESTART,
    PLURAL,
    TRAINER_CONTAINER,
    VERSION,
    coord_label,
)
from monarch_spmd.spec import MAX_JOB_NAME_LENGTH

__all__ = [
    "API_VERSION",
    "CONTAINER_NAME",
    "COORD_LABEL_PREFIX",
    "GROUP",
    "KIND",
    "LABEL_JOB",
    "LABEL_JOB_UID",
    "LABEL_PREFIX",
    "LABEL_RANK",
    "LABEL_RESTART",
    "MAX_JOB_NAME_LENGTH",
    "PLURAL",
    "VERSION",
    "WORKER_MOUNT_PATH",
    "WORKER_SCRIPT",
    "WORKER_VOLUME",
    "configmap_name",
    "coord_label",
    "master_addr",
    "pod_name",
    "service_name",
]

CONTAINER_NAME: Final = TRAINER_CONTAINER
#: The ConfigMap volume that carries the payload (the worker) into pods whose image lacks the project.
WORKER_VOLUME: Final = "monarch-spmd-worker"
WORKER_MOUNT_PATH: Final = "/opt/monarch-spmd/payload"
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
