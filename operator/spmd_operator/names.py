"""Identity, names, labels and fixed paths of everything the SPMDJob operator creates.

The bottom layer of ``spmd_operator``: a job's identity (:class:`JobRef`) and the names of its
children, imported by the builders, the lifecycle policies and the controller alike. The label
and group names themselves live in :mod:`monarch_spmd.payload.names` (the worker and the local
runner use them too); ``docs/interfaces.md`` is the contract these values follow.

Every child's name starts with ``<job>-<id>``, where ``<id>`` is five hex digits of the job's uid
(:func:`job_id`). A job created under the name of a deleted one therefore never meets the older
job's pods or Services by name, even while they are still terminating or after a
``kubectl delete --cascade=orphan`` left them behind; and ownership is decided by the controller
owner reference (the job's uid), never by name or by the job-name label alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from monarch_spmd.payload.names import (
    API_VERSION,
    COORD_LABEL_PREFIX,
    DEFAULT_MONARCH_PORT,
    GROUP,
    KIND,
    LABEL_JOB,
    LABEL_JOB_UID,
    LABEL_PREFIX,
    LABEL_PROCS,
    LABEL_RANK,
    LABEL_RESTART,
    MODE_MONARCH,
    MODE_PROGRAM,
    MONARCH_PORT_NAME,
    PER_HOST,
    PER_PROC,
    PLURAL,
    TRAINER_CONTAINER,
    VERSION,
    coord_label,
)
from monarch_spmd.spec import MAX_JOB_NAME_LENGTH

__all__ = [
    "AGENT_PORT_NAME",
    "API_VERSION",
    "CONTAINER_NAME",
    "COORD_LABEL_PREFIX",
    "DEFAULT_MONARCH_PORT",
    "GROUP",
    "JOB_ID_LENGTH",
    "KIND",
    "LABEL_JOB",
    "LABEL_JOB_UID",
    "LABEL_PAYLOAD",
    "LABEL_PREFIX",
    "LABEL_PROCS",
    "LABEL_RANK",
    "LABEL_REPLACEMENT",
    "LABEL_RESTART",
    "MAX_JOB_NAME_LENGTH",
    "MODE_MONARCH",
    "MODE_PROGRAM",
    "MONARCH_PORT_NAME",
    "PAYLOAD_HASH_ANNOTATION",
    "PER_HOST",
    "PER_PROC",
    "PLURAL",
    "VERSION",
    "WORKER_MOUNT_PATH",
    "WORKER_SCRIPT",
    "WORKER_VOLUME",
    "JobRef",
    "coord_label",
    "job_id",
    "master_addr",
    "owner_uid",
    "payload_configmap_name",
    "pod_name",
    "podgroup_name",
    "service_name",
    "workload_name",
]

CONTAINER_NAME: Final = TRAINER_CONTAINER
#: The ConfigMap volume that carries the payload (the worker) into pods whose image lacks the project.
WORKER_VOLUME: Final = "monarch-spmd-worker"
WORKER_MOUNT_PATH: Final = "/opt/monarch-spmd/payload"
WORKER_SCRIPT: Final = f"{WORKER_MOUNT_PATH}/worker.py"
#: On the payload ConfigMap: a hash of the payload it holds (its name ends in the same hash).
PAYLOAD_HASH_ANNOTATION: Final = f"{GROUP}/payload-hash"
#: On the payload ConfigMap (one per namespace and payload, shared by the namespace's jobs): the
#: payload's hash. Its informer selects on it; jobs' children carry LABEL_JOB instead.
LABEL_PAYLOAD: Final = f"{LABEL_PREFIX}payload"
#: The payload ConfigMaps' name before the hash.
PAYLOAD_CONFIGMAP_PREFIX: Final = "monarch-spmd-payload-"
#: Hex digits of the job's uid in every child's name.
JOB_ID_LENGTH: Final = 5
#: On a pod created alone in place of a lost one of its gang (restart in place): the how-manieth
#: replacement of its index in the gang it is (1, 2 ...); absent on the gang's own pods.
LABEL_REPLACEMENT: Final = f"{LABEL_PREFIX}replacement"
#: On a hot spare's pod (spec.spares): its index among the job's spares (0, 1 ...); no rank label
#: until it takes a lost pod's place, when the operator relabels it as that pod's replacement.
LABEL_SPARE: Final = f"{LABEL_PREFIX}spare"
#: The pods of a job that run no rank (spec.replicaGroups: the Lighthouse) say what they are.
LABEL_ROLE: Final = f"{LABEL_PREFIX}role"
ROLE_LIGHTHOUSE: Final = "lighthouse"
#: The container port of the restart-in-place coordinator (every pod declares it; rank 0's listens).
AGENT_PORT_NAME: Final = "spmd-agent"


@dataclass(frozen=True)
class JobRef:
    """The identity of an SPMDJob: what every child needs to name itself and its owner.

    Attributes:
        name: the job's name (a DNS-1035 label of at most 50 characters).
        namespace: the job's namespace; every child lives there.
        uid: the job's uid: the owner reference, the job-uid label, TORCHELASTIC_RUN_ID, and
            (shortened) part of every child's name.
    """

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> JobRef:
        """Reads the identity from an SPMDJob object as the API server returns it."""
        meta = body.get("metadata") or {}
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])

    @property
    def key(self) -> tuple[str, str]:
        """``(namespace, name)``: how the controller and the caches index jobs."""
        return (self.namespace, self.name)


def job_id(uid: str) -> str:
    """Five lowercase hex digits of ``uid``: two jobs of the same name get different children."""
    digits = "".join(c for c in uid.lower() if c in "0123456789abcdef")
    return (digits + "0" * JOB_ID_LENGTH)[:JOB_ID_LENGTH]


def _prefix(job: JobRef) -> str:
    return f"{job.name}-{job_id(job.uid)}"


def pod_name(job: JobRef, restart: int, index: int, replacement: int = 0) -> str:
    """Pod ``index`` of gang attempt ``restart``: ``<job>-<id>-r<restart>-<index>``, e.g. hello-3fa9c-r0-3;
    its ``replacement``-th replacement (restart in place) adds ``-<replacement>``: hello-3fa9c-r0-3-1.

    Deterministic, so creating a pod twice is a 409 rather than a duplicate; a replacement's name
    never collides with the pod it replaces, which may still be terminating.
    """
    base = f"{_prefix(job)}-r{restart}-{index}"
    return f"{base}-{replacement}" if replacement else base


def spare_pod_name(job: JobRef, restart: int, spare: int) -> str:
    """Hot spare ``spare`` of gang attempt ``restart``: ``<job>-<id>-r<restart>-s<spare>``, e.g.
    hello-3fa9c-r0-s0. A spare index is never used twice in an attempt: a name never in use."""
    return f"{_prefix(job)}-r{restart}-s{spare}"


def service_name(job: JobRef, restart: int) -> str:
    """The headless Service of attempt ``restart``, resolving to that attempt's rank-0 pod.

    One name per attempt (``<job>-<id>-m<restart>``, at most 61 characters): a rank of a new
    attempt can never reach a pod of an older one through MASTER_ADDR, whatever a DNS cache holds.
    """
    return f"{_prefix(job)}-m{restart}"


def podgroup_name(job: JobRef, restart: int) -> str:
    """The PodGroup of attempt ``restart`` (Volcano or coscheduling): ``<job>-<id>-r<restart>``."""
    return f"{_prefix(job)}-r{restart}"


def workload_name(job: JobRef) -> str:
    """The job's Kueue Workload."""
    return f"{_prefix(job)}-spmdjob"


def network_policy_name(job: JobRef) -> str:
    """The job's NetworkPolicy (one per job, for every attempt's pods): ``<job>-<id>-isolation``."""
    return f"{_prefix(job)}-isolation"


def payload_configmap_name(payload_hash: str) -> str:
    """The ConfigMap holding payload ``payload_hash`` (the worker) in a namespace: one per
    namespace and payload, mounted by every pod of the namespace's jobs, never rewritten (a new
    payload is a new name)."""
    return f"{PAYLOAD_CONFIGMAP_PREFIX}{payload_hash}"


def master_addr(job: JobRef, restart: int) -> str:
    """MASTER_ADDR of every proc of attempt ``restart``: its Service's DNS name."""
    return f"{service_name(job, restart)}.{job.namespace}.svc"


def owner_uid(body: Mapping[str, Any]) -> str | None:
    """The uid of an object's controller owner of kind SPMDJob, if it has one."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            return ref.get("uid")
    return None
