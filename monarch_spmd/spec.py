"""The SPMDJob spec: ONE table of its fields and rules, from which come the CRD, the parser and the validator.

Where it sits: above :mod:`monarch_spmd.schema` (the toolkit the table is written in) and the
payload (:mod:`.payload.contract`, :mod:`.payload.names`, and :func:`.payload.worker.argv_error`,
the one statement of the argv rule), below the local runner, ``monarch-spmd validate``
(:mod:`monarch_spmd.validate`) and the Kubernetes operator (``spmd_operator``), which all read an
SPMDJob through :func:`parse_job_spec` / :func:`load_manifest`. Standard library only.

The table is :data:`ROOT` (the whole object; :data:`SPEC` and :data:`STATUS` are its parts). Every
field is one entry: its type, default, bounds, description (the ``kubectl explain`` text) and
:class:`~monarch_spmd.schema.Rule` objects for what one field's schema cannot say. From it:

- ``python -m monarch_spmd.crd`` writes ``crds/spmd.monarch.dev_spmdjobs.yaml`` (schema, CEL rules,
  printer columns); ``tests/unit/test_crd.py`` fails when the committed file differs;
- :func:`parse_job_spec` / :func:`load_manifest` / :func:`check_manifest` check a manifest exactly
  as the API server checks a create with field validation Strict (``kubectl apply``): unknown
  fields, types, required fields, defaults, bounds, patterns, the CEL rules and the job-name
  rule; ``tests/e2e/test_spec_parity.py`` feeds hundreds of random manifests to both and
  requires the same verdict on each. The values are taken as kubectl sends them (a whole number
  written ``3.0`` is the integer 3).

The pod template (``spec.template``) is typed field by field with Kubernetes' own PodTemplateSpec
schema (:mod:`.podtemplate`, generated from the OpenAPI of the Kubernetes version the CRD is made
for), so an unknown or mistyped field anywhere under it is refused as for a Pod. Laid over it are
the properties the table declares so CEL can check them: ``restartPolicy`` (Never or unset), and
per container ``name`` (a DNS-1123 label), ``image``, ``command``, ``args`` and ``env[].name`` (the
``trainer`` container, or the one without a name, must not set image, command or args, nor a
MONARCH_SPMD_* variable other than MONARCH_SPMD_ROLE_NAME and MONARCH_SPMD_LOCAL_RANK_SCOPE, nor a
variable of the torchrun contract or the pod's own identity (:data:`RESERVED_VARS`); at most one
trainer container). What neither the API server nor the table can check before a pod exists, the
validity of the PodSpec itself (volumes, label syntax in ``template.metadata`` ...), is refused
when the operator creates the first pod: the job fails with reason InvalidSpec, its message naming
the field of the SPMDJob and the value (``spmd_operator.podpaths``). One part of that is checked
here all the same, outside the CRD: :func:`pod_problems` finds resource quantities no pod can hold
(the one schema CEL could check them in, int-or-string, would refuse ``cpu: 0.5``, which pods take);
``monarch-spmd validate`` reports them. That is outside the parity claim, as are: a
``metadata.namespace`` other than the one the request goes to (only the request knows it),
``metadata.ownerReferences`` and ``managedFields`` (taken as they are), and JSON that kubectl would
never send (``2.0`` written with its fraction by another client is an integer to the schema but a
float to CEL).

Rules that came in a later version than the objects they may meet are *policies*
(:attr:`monarch_spmd.schema.Rule.policy`): the API server refuses new jobs that break them, while
:func:`parse_stored` still parses a stored job that does (the operator keeps it running and says
so). On an update (``check_manifest(..., old=...)``) the pod-shaping fields
(:data:`POD_SHAPING_FIELDS`) change only while the job is suspended, and unchanged values are not
checked again, as the API server ratchets.

To add a field: add one entry to the table below (and, for the parser's users, the attribute of
the same snake_case name to :class:`JobSpec`), then regenerate the CRD (``bash
scripts/gen-crd.sh``); a unit test checks that the table and JobSpec agree.

A spec in one picture (camelCase as in the manifest; defaults shown)::

    spec:
      mesh: [{name: hosts, size: 2}, {name: gpus, size: 4}]   # required; the last dim is local
      args: ["-m", "train", "--lr", "0.001"]                  # required (mode Program); SPMDActor.main's argv
      image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime    # required on Kubernetes
      python: python3
      masterPort: 29500
      gpusPerProc: 0
      colocate: false
      restartPolicy: {maxRestarts: 3, permanentExitCodes: [], retryableExitCodes: [],
                      permanentReasons: [], podReplacementPolicy: Failed,
                      replacementTimeoutSeconds: 120}
      rendezvousTimeoutSeconds: 300
      activeDeadlineSeconds: null
      ttlSecondsAfterFinished: null
      suspend: false
      mode: Program                                           # Monarch: pods serve a Monarch client
      template: {metadata: {labels: {}, annotations: {}}, spec: {}}
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, NamedTuple

from . import podtemplate, quantity, schema
from .payload import contract, names, worker
from .schema import MISSING, Arr, Bool, Int, Matches, Obj, ObjectMeta, Pattern, Rule, Str

GROUP: Final = names.GROUP
VERSION: Final = names.VERSION
API_VERSION: Final = names.API_VERSION
KIND: Final = names.KIND
PLURAL: Final = names.PLURAL

#: A job's name is a DNS-1035 label of at most this many characters, so that every child's name
#: (``<job>-<id>-r<restart>-<rank>``, ``<job>-<id>-m<restart>``) stays a valid DNS label.
MAX_JOB_NAME_LENGTH: Final = 50
#: A mesh dimension name becomes the label key ``spmd.monarch.dev/coord-<name>``, whose name part
#: may hold 63 characters, so a dimension name may hold 63 - len("coord-") = 57.
MAX_DIM_NAME_LENGTH: Final = 57
MAX_RESTARTS_LIMIT: Final = 100
MAX_GPUS_PER_PROC: Final = 16
#: Hot spares of one job, at most.
MAX_SPARES: Final = 64
#: Replica groups of one job (spec.replicaGroups.count), at most; each is an SPMDJob of its own
#: named <job>-g<index>, so a job with replica groups has a name of at most
#: MAX_JOB_NAME_LENGTH - REPLICA_GROUP_SUFFIX characters.
MAX_REPLICA_GROUPS: Final = 99
REPLICA_GROUP_SUFFIX: Final = len("-g98")
#: torchft's defaults: the Lighthouse's port, and the port of each rank's Manager server.
DEFAULT_LIGHTHOUSE_PORT: Final = 29510
DEFAULT_MANAGER_PORT: Final = 29512
DEFAULT_QUORUM_RETRIES: Final = 10
DEFAULT_LIGHTHOUSE_JOIN_TIMEOUT: Final = 60
DEFAULT_LIGHTHOUSE_HEARTBEAT_TIMEOUT: Final = 5
MAX_TORCHFT_TIMEOUT: Final = 86400
MAX_RENDEZVOUS_TIMEOUT: Final = 86400
MAX_REPLACEMENT_TIMEOUT: Final = 86400
MAX_ARGS: Final = 4096
MAX_EXIT_CODES: Final = 256
MAX_PERMANENT_REASONS: Final = 32
MAX_REASON_LENGTH: Final = 128
MAX_IMAGE_LENGTH: Final = 4096
MAX_PYTHON_LENGTH: Final = 1024
#: Containers of the pod template, and env entries of each: bounds the CEL rules over them need
#: (the API server refuses a rule whose cost it cannot bound).
MAX_CONTAINERS: Final = 64
MAX_CONTAINER_ENV: Final = 1024
#: The container of the pod template that the operator merges into (the others are sidecars).
TRAINER_CONTAINER: Final = names.TRAINER_CONTAINER

DEFAULT_PYTHON: Final = "python3"
DEFAULT_MASTER_PORT: Final = 29500
DEFAULT_MAX_RESTARTS: Final = 3
DEFAULT_RENDEZVOUS_TIMEOUT: Final = 300
#: spec.restartPolicy.podReplacementPolicy (the Kubernetes Job naming).
POD_REPLACEMENT_FAILED: Final = "Failed"
POD_REPLACEMENT_TERMINATING_OR_FAILED: Final = "TerminatingOrFailed"
POD_REPLACEMENT_POLICIES: Final = (POD_REPLACEMENT_FAILED, POD_REPLACEMENT_TERMINATING_OR_FAILED)
DEFAULT_POD_REPLACEMENT_POLICY: Final = POD_REPLACEMENT_FAILED
DEFAULT_REPLACEMENT_TIMEOUT: Final = 120
#: spec.restartPolicy.mode: how a retryable failure restarts the gang. InPlace: the agents in the
#: pods stop and start the processes again, the pods stay (torchrun's agent, across pods);
#: RecreatePods: every pod is deleted and the gang created again (the behaviour before InPlace).
RESTART_IN_PLACE: Final = "InPlace"
RESTART_RECREATE_PODS: Final = "RecreatePods"
RESTART_MODES: Final = (RESTART_IN_PLACE, RESTART_RECREATE_PODS)
DEFAULT_RESTART_MODE: Final = RESTART_IN_PLACE
#: The restart-in-place back-off and bounds (docs/restart-in-place.md): the agents' defaults.
DEFAULT_BACKOFF_SECONDS: Final = 10
DEFAULT_MAX_BACKOFF_SECONDS: Final = 300
DEFAULT_BACKOFF_RESET_SECONDS: Final = 300
DEFAULT_JOIN_TIMEOUT_SECONDS: Final = 120
#: An elastic job's round, once mesh[0].minSize pods joined, waits this long for the others.
DEFAULT_ELASTIC_WAIT_SECONDS: Final = 10
MAX_BACKOFF_LIMIT: Final = 86400
MAX_JOIN_TIMEOUT: Final = 86400
MAX_PROGRESS_TIMEOUT: Final = 7 * 86400
#: spec.failureOutput: whether the end of the failing rank's output reaches the job's status.
FAILURE_OUTPUT_TAIL: Final = names.FAILURE_OUTPUT_TAIL
FAILURE_OUTPUT_NONE: Final = names.FAILURE_OUTPUT_NONE
FAILURE_OUTPUTS: Final = names.FAILURE_OUTPUTS
#: spec.scheduling.provider: who admits or gang-schedules the job's pods.
SCHEDULING_NONE: Final = "None"
SCHEDULING_KUEUE: Final = "Kueue"
SCHEDULING_VOLCANO: Final = "Volcano"
SCHEDULING_COSCHEDULING: Final = "Coscheduling"
SCHEDULING_PROVIDERS: Final = (SCHEDULING_NONE, SCHEDULING_KUEUE, SCHEDULING_VOLCANO, SCHEDULING_COSCHEDULING)
MAX_SCHEDULING_TIMEOUT: Final = 7 * 86400
#: spec.podLayout: one pod per proc, or one per host (the last dimension's procs share a pod).
PER_PROC: Final = names.PER_PROC
PER_HOST: Final = names.PER_HOST
POD_LAYOUTS: Final = names.POD_LAYOUTS
#: spec.mode: what the pods run: the training argv once, or Monarch's worker loop for a client.
MODE_PROGRAM: Final = names.MODE_PROGRAM
MODE_MONARCH: Final = names.MODE_MONARCH
MODES: Final = names.MODES

#: Worker input variables a user may set in the template's ``trainer`` container (the user's value
#: wins). Every other ``MONARCH_SPMD_*`` variable belongs to the operator and is rejected.
USER_SETTABLE_VARS: Final = names.USER_SETTABLE_VARS
_RESERVED_PREFIX: Final = names.RESERVED_PREFIX
#: The contract's two "unless set" rows (payload.contract.torch_elastic_env): the user's value wins.
USER_CONTRACT_VARS: Final = frozenset({"TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"})
#: The torchrun variables of the environment contract, computed from the spec and the proc's mesh
#: coordinates: a trainer container that sets one is refused (the worker would replace its value).
CONTRACT_VARS: Final = frozenset(contract.torch_elastic_env([("procs", 2)], [0], "localhost", 1)) - USER_CONTRACT_VARS
#: The pod's own identity, from the downward API, in every pod (Monarch mode advertises POD_IP):
#: (variable, fieldPath). A trainer container that sets one is refused.
DOWNWARD_ENV: Final = (
    ("POD_NAME", "metadata.name"),
    ("POD_NAMESPACE", "metadata.namespace"),
    ("POD_IP", "status.podIP"),
    ("NODE_NAME", "spec.nodeName"),
)
#: Every variable the trainer container may not set: the contract's and the pod's own.
RESERVED_VARS: Final = CONTRACT_VARS | frozenset(var for var, _ in DOWNWARD_ENV)
#: Where the spec already says what a reserved variable would: said in the refusal.
RESERVED_VAR_HINTS: Final = {
    "RANK": "the row-major index of the proc's coordinates in spec.mesh",
    "WORLD_SIZE": "the product of spec.mesh's sizes",
    "LOCAL_RANK": "the coordinate on the last mesh dimension; MONARCH_SPMD_LOCAL_RANK_SCOPE=pod makes it 0",
    "LOCAL_WORLD_SIZE": "the last mesh dimension's size; MONARCH_SPMD_LOCAL_RANK_SCOPE=pod makes it 1",
    "ROLE_NAME": "set MONARCH_SPMD_ROLE_NAME instead",
    "MASTER_ADDR": "the job's headless Service",
    "MASTER_PORT": "set spec.masterPort instead",
    "TORCHELASTIC_MAX_RESTARTS": "set spec.restartPolicy.maxRestarts instead",
    "TORCHELASTIC_RUN_ID": "the job's uid",
}
#: spec.shmSize's range: a memory-backed /dev/shm smaller than 1Mi is no use, and one larger than
#: a node's memory cannot be backed.
SHM_SIZE_MIN: Final = "1Mi"
SHM_SIZE_MAX: Final = "1Ti"
#: A container name (and so the trainer's): a DNS-1123 label, as the API server requires of pods.
DNS_1123_LABEL: Final = Pattern("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_CONTAINER_NAME_LENGTH: Final = 63
#: An environment variable's name in the template (CEL names the one a rule refuses: it needs a bound).
MAX_ENV_NAME_LENGTH: Final = 256
#: Fields that shape the pods: changed only while the job is suspended (as a Job's pod template),
#: so the pods of one gang never disagree (two MASTER_PORTs, two images). The mesh, podLayout and
#: mode never change. The restart policy's fields that only the agents in the pods act on (the
#: restart mode, the progress timeout, the back-off, the join timeout) and failureOutput reach the
#: pods as their environment, so they shape the pods too: a pod replaced alone must agree with the
#: gang it joins. The fields the operator judges every restart with again (maxRestarts, the exit
#: codes and reasons, podReplacementPolicy) change at any time and apply at the next failure.
POD_SHAPING_FIELDS: Final = ("image", "args", "python", "masterPort", "gpusPerProc", "colocate",
                             "rendezvousTimeoutSeconds", "shmSize", "scheduling", "template", "failureOutput",
                             "restartPolicy.mode", "restartPolicy.progressTimeoutSeconds",
                             "restartPolicy.backoffSeconds", "restartPolicy.maxBackoffSeconds",
                             "restartPolicy.backoffResetSeconds", "restartPolicy.joinTimeoutSeconds")

DNS_1035_LABEL: Final = Pattern("^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN: Final = Pattern("^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: An image reference: printable ASCII, no spaces (what a container runtime can pull).
IMAGE_REFERENCE: Final = Pattern("^[!-~]+$")
#: An interpreter name or path: no whitespace, no control character.
INTERPRETER: Final = Pattern(r"^[^\x00-\x20\x7f]+$")
#: A pod or container reason as Kubernetes reports it: OOMKilled, Evicted, OutOfnvidia.com/gpu.
REASON: Final = Pattern("^[A-Za-z][-A-Za-z0-9_.:/]*$")
#: A memory quantity as Kubernetes writes one: 512Mi, 2Gi, 1G, 1000000 (a subset of resource.Quantity).
MEMORY_QUANTITY: Final = Pattern("^[0-9]+([.][0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


class SpecError(ValueError):
    """An SPMDJob spec (or manifest) is invalid.

    Attributes:
        field: the path of the offending field, e.g. ``spec.mesh[1].size``.
        policy: a rule's verdict that the API server gives new jobs, while a job it stored earlier
            still runs (:attr:`monarch_spmd.schema.Rule.policy`; see :func:`parse_stored`).
    """

    def __init__(self, field: str, message: str, *, policy: bool = False) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.policy = policy


@dataclass(frozen=True)
class MeshDim:
    """One named mesh dimension.

    Attributes:
        name: a DNS label of at most MAX_DIM_NAME_LENGTH characters, unique in the mesh.
        size: the number of procs along this dimension, at least 1.
    """

    name: str
    size: int
    min_size: int | None = None


@dataclass(frozen=True)
class ReplicaGroups:
    """spec.replicaGroups: torchft replica groups (docs/torchft.md); the fields' descriptions say
    what each means."""

    count: int
    min_replicas: int = 1
    lighthouse_port: int = DEFAULT_LIGHTHOUSE_PORT
    manager_port: int = DEFAULT_MANAGER_PORT
    join_timeout_seconds: int = DEFAULT_LIGHTHOUSE_JOIN_TIMEOUT
    heartbeat_timeout_seconds: int = DEFAULT_LIGHTHOUSE_HEARTBEAT_TIMEOUT
    quorum_retries: int = DEFAULT_QUORUM_RETRIES
    timeout_seconds: int | None = None
    quorum_timeout_seconds: int | None = None
    connect_timeout_seconds: int | None = None

    @classmethod
    def of(cls, value: Mapping[str, Any] | None) -> ReplicaGroups | None:
        if not value:
            return None
        return cls(**{_snake(k): v for k, v in value.items()})


@dataclass(frozen=True)
class JobSpec:
    """A parsed, validated SPMDJob spec (the blueprint; pods are its instances).

    Each attribute is the snake_case name of a field of the table (``restartPolicy``'s fields
    directly); the table's descriptions say what they mean.

    Attributes:
        mesh: the ordered mesh; the last dimension is the local one.
        args: the training argv, ``("-m", module, ...)`` or ``(script, ...)``; empty in Monarch mode.
        image: the container image of every proc (None only outside Kubernetes).
        python: the interpreter in the image that runs the worker and the training argv.
        master_port: the port of rank 0's TCPStore.
        gpus_per_proc: ``nvidia.com/gpu`` per pod; at least 1 makes each pod its own torchrun
            node (LOCAL_RANK=0, LOCAL_WORLD_SIZE=1).
        colocate: prefer to schedule the procs sharing the first mesh coordinate on one node.
        max_restarts: how many times the whole gang may be replaced after a retryable failure.
        permanent_exit_codes: exit codes that fail the job at once (duplicates dropped).
        retryable_exit_codes: if non-empty, the only exit codes (besides pod loss and the
            worker's 75) that restart the gang; any other code is then permanent.
        permanent_reasons: pod or container reasons (e.g. ``OOMKilled``) that fail the job at once.
        pod_replacement_policy: ``Failed`` (the next attempt waits until every pod of the previous
            one has terminated) or ``TerminatingOrFailed`` (it is created at once).
        replacement_timeout_seconds: with ``Failed``, how long the next attempt waits for the old
            pods before it is created anyway.
        restart_mode: ``InPlace`` (the agents restart the processes in the same pods) or
            ``RecreatePods`` (every pod is deleted and created again).
        progress_timeout_seconds: in place, a gang silent this long is hung (NoProgress); None: off.
        backoff_seconds, max_backoff_seconds, backoff_reset_seconds: in place, the back-off between
            restarts in a row, its ceiling, and the healthy stretch that resets it.
        join_timeout_seconds: in place, how long a restart may wait for every pod at its barrier.
        elastic_wait_seconds: an elastic job's round, once its minimum of pods joined, waits this
            long for the others before it starts smaller.
        rendezvous_timeout_seconds: how long a worker waits for the master to resolve and accept.
        active_deadline_seconds: the job fails with DeadlineExceeded after running this long.
        ttl_seconds_after_finished: the job is deleted this long after it finished.
        suspend: hold the job: no pods run while true.
        pod_layout: ``PerProc`` (one pod per proc) or ``PerHost`` (one pod per coordinate of all
            dimensions but the last; its worker runs the last dimension's procs).
        shm_size: the size limit of the pod's memory-backed /dev/shm, or None (no own limit).
        mode: ``Program`` (each proc runs ``args``) or ``Monarch`` (each pod is a Monarch host
            serving a client; ``args`` is empty).
        scheduling_provider: ``None``, ``Kueue``, ``Volcano`` or ``Coscheduling``.
        scheduling_queue: the Kueue LocalQueue, or the Volcano queue.
        scheduler_name: the scheduler of the pods (a gang scheduler's), or None for the template's.
        scheduling_timeout_seconds: fail the job when a pod stays unschedulable this long.
        failure_output: ``Tail`` (the failing rank's last lines reach status and Events) or ``None``.
        replica_groups: torchft replica groups (each group a gang of its own, an SPMDJob the
            operator makes), or None.
        template: the pod template (``metadata`` labels/annotations, ``spec``), deep-copied.
    """

    mesh: tuple[MeshDim, ...]
    args: tuple[str, ...] = ()
    image: str | None = None
    python: str = DEFAULT_PYTHON
    master_port: int = DEFAULT_MASTER_PORT
    gpus_per_proc: int = 0
    colocate: bool = False
    max_restarts: int = DEFAULT_MAX_RESTARTS
    permanent_exit_codes: tuple[int, ...] = ()
    retryable_exit_codes: tuple[int, ...] = ()
    permanent_reasons: tuple[str, ...] = ()
    pod_replacement_policy: str = DEFAULT_POD_REPLACEMENT_POLICY
    replacement_timeout_seconds: int = DEFAULT_REPLACEMENT_TIMEOUT
    restart_mode: str = DEFAULT_RESTART_MODE
    spares: int = 0
    progress_timeout_seconds: int | None = None
    backoff_seconds: int = DEFAULT_BACKOFF_SECONDS
    max_backoff_seconds: int = DEFAULT_MAX_BACKOFF_SECONDS
    backoff_reset_seconds: int = DEFAULT_BACKOFF_RESET_SECONDS
    join_timeout_seconds: int = DEFAULT_JOIN_TIMEOUT_SECONDS
    elastic_wait_seconds: int = DEFAULT_ELASTIC_WAIT_SECONDS
    rendezvous_timeout_seconds: int = DEFAULT_RENDEZVOUS_TIMEOUT
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    suspend: bool = False
    pod_layout: str = PER_PROC
    shm_size: str | None = None
    mode: str = MODE_PROGRAM
    scheduling_provider: str = SCHEDULING_NONE
    scheduling_queue: str | None = None
    scheduler_name: str | None = None
    scheduling_timeout_seconds: int | None = None
    failure_output: str = FAILURE_OUTPUT_TAIL
    replica_groups: ReplicaGroups | None = None
    template: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=True)

    @property
    def mesh_pairs(self) -> list[tuple[str, int]]:
        """The mesh as ``(name, size)`` pairs, the form :mod:`monarch_spmd.payload.contract` takes."""
        return [(d.name, d.size) for d in self.mesh]

    @property
    def world_size(self) -> int:
        """The number of procs (pods) of the job."""
        return contract.world_size(self.mesh_pairs)

    @property
    def min_members(self) -> int | None:
        """An elastic job's least pods per round (mesh[0].minSize, torchrun's --nnodes MIN), or
        None for a fixed size."""
        first = self.mesh[0]
        return first.min_size if first.min_size is not None and first.min_size < first.size else None


class Manifest(NamedTuple):
    """What :func:`load_manifest` returns."""

    name: str
    namespace: str
    spec: JobSpec


# --- the rules that one field's schema cannot say --------------------------------------------


def _d(text: str) -> str:
    """A description written over several source lines, as one line."""
    return " ".join(text.split())


@dataclass(frozen=True)
class JobName(Rule):
    """metadata.name is a DNS-1035 label of at most MAX_JOB_NAME_LENGTH characters (at the root)."""

    message: str = _d(f"""
        metadata.name: a job name must be a DNS-1035 label of at most {MAX_JOB_NAME_LENGTH} characters
        (lowercase letters, digits and '-', starting with a letter, ending with a letter or digit)
        so that its pods' and service's names stay valid""")

    def cel(self) -> str:
        return (f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH} && "
                f"self.metadata.name.matches({DNS_1035_LABEL.cel()})")

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        metadata = value.get("metadata")
        if not isinstance(metadata, dict) or not (metadata.get("name") or metadata.get("generateName")):
            yield ".metadata.name", "required; name the job, e.g. hello"
            return
        name = metadata.get("name") or _generated(metadata["generateName"])
        error = job_name_error(name)
        if error:
            yield ".metadata.name", error


@dataclass(frozen=True)
class ReplicaGroupsJobName(Rule):
    """A job with spec.replicaGroups has a name short enough for its groups' (<job>-g<index>), at the root."""

    message: str = _d(f"""
        metadata.name: a job with spec.replicaGroups has a name of at most
        {MAX_JOB_NAME_LENGTH - REPLICA_GROUP_SUFFIX} characters: each group is an SPMDJob named
        <job>-g<index>""")

    def cel(self) -> str:
        return (f"!has(self.spec) || !has(self.spec.replicaGroups) || "
                f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH - REPLICA_GROUP_SUFFIX}")

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        metadata, spec = value.get("metadata"), value.get("spec")
        if not isinstance(metadata, dict) or not isinstance(spec, dict) or "replicaGroups" not in spec:
            return
        name = metadata.get("name") or (_generated(metadata["generateName"]) if metadata.get("generateName") else "")
        if isinstance(name, str) and len(name) > MAX_JOB_NAME_LENGTH - REPLICA_GROUP_SUFFIX:
            yield ".metadata.name", f"{name!r} has {len(name)} characters; {self.message.split(': ', 1)[1]}"


@dataclass(frozen=True)
class MinSizeFirst(Rule):
    """Only the mesh's first dimension may be elastic (minSize): its pods are torchrun's nodes."""

    message: str = ("only the first dimension may have minSize (torchrun's --nnodes MIN:MAX: the nodes); the "
                    "others (procs per node) are fixed")

    def cel(self) -> str:
        return "size(self) < 1 || self.all(d, !has(d.minSize)) || (has(self[0].minSize) && size(self.filter(d, has(d.minSize))) == 1)"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        for i, d in enumerate(value):
            if i > 0 and isinstance(d, Mapping) and "minSize" in d:
                yield f"[{i}].minSize", f"not allowed; {self.message}"


@dataclass(frozen=True)
class MinSizeAtMostSize(Rule):
    """A dimension's minSize is at most its size (the MAX)."""

    message: str = "minSize must be at most size (torchrun's --nnodes MIN:MAX needs MIN <= MAX)"
    field_path: str | None = ".minSize"

    def cel(self) -> str:
        return "!has(self.minSize) || self.minSize <= self.size"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        low, high = value.get("minSize"), value.get("size")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            yield ".minSize", f"{low} is more than size {high}; {self.message}"


@dataclass(frozen=True)
class MeshProcs(Rule):
    """The product of the mesh's sizes is at most contract.MAX_PROCS."""

    message: str = f"the product of the sizes (the number of procs) must be at most {contract.MAX_PROCS}"

    def cel(self) -> str:
        # Guarded so that it evaluates without error (no index out of range, no overflow) whatever
        # the bounds checks found; they report those themselves.
        n, limit = contract.MAX_DIMS, contract.MAX_PROCS
        product = " * ".join(["self[0].size"] + [f"(size(self) > {i} ? self[{i}].size : 1)" for i in range(1, n)])
        return f"size(self) < 1 || size(self) > {n} || self.exists(d, d.size < 1 || d.size > {limit}) || {product} <= {limit}"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        sizes = [d["size"] for d in value]
        if 1 <= len(sizes) <= contract.MAX_DIMS and all(1 <= s <= contract.MAX_PROCS for s in sizes):
            procs = contract.world_size([("d", s) for s in sizes])
            if procs > contract.MAX_PROCS:
                yield "", f"{procs} procs in all; {self.message}"


@dataclass(frozen=True)
class Argv(Rule):
    """The training argv's shape: :func:`monarch_spmd.payload.worker.argv_error` in CEL."""

    message: str = ("must be [\"-m\", MODULE, ARGS...] or [SCRIPT, ARGS...]: \"-m\" needs a module name "
                    "after it, and a first argument other than \"-m\" must be a script path (not empty, not an option)")

    def cel(self) -> str:
        return ("size(self) == 0 || (self[0] == '-m' ? (size(self) >= 2 && size(self[1]) > 0) "
                ": (size(self[0]) > 0 && !self[0].startsWith('-')))")

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        error = worker.argv_error(value) if value else None  # an empty list is min_items' to report
        if error:
            yield "", error


_ARGS_EXAMPLE: Final = f"give the training argv: {worker.ARGV_HINT.removeprefix('expected ')}"
_CEL_MONARCH: Final = f"(has(self.mode) && self.mode == '{MODE_MONARCH}')"


@dataclass(frozen=True)
class SparesNeedAGang(Rule):
    """Hot spares take a lost member's place through the gang's coordinator: restartPolicy.mode
    InPlace, mode Program, and more than one pod (the only pod's loss is its coordinator's)."""

    message: str = (f"hot spares take a lost pod's place through the gang's coordinator: they need restartPolicy.mode "
                    f"{RESTART_IN_PLACE} (the default) and mode {MODE_PROGRAM}")
    field_path: str | None = ".spares"

    def cel(self) -> str:
        return (f"!has(self.spares) || self.spares == 0 || ((!has(self.restartPolicy) || !has(self.restartPolicy.mode) "
                f"|| self.restartPolicy.mode == '{RESTART_IN_PLACE}') && !{_CEL_MONARCH})")

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        spares = value.get("spares")
        if not isinstance(spares, int) or isinstance(spares, bool) or spares <= 0:
            return
        restart = value.get("restartPolicy") if isinstance(value.get("restartPolicy"), Mapping) else {}
        mode = restart.get("mode", RESTART_IN_PLACE)
        if mode != RESTART_IN_PLACE or value.get("mode") == MODE_MONARCH:
            yield ".spares", f"{spares} is not allowed; {self.message}"
            return
        mesh = value.get("mesh")
        sizes = [d.get("size") for d in mesh] if isinstance(mesh, list) and all(isinstance(d, Mapping) for d in mesh) else []
        if sizes and all(isinstance(n, int) and not isinstance(n, bool) for n in sizes):
            pods = math.prod(sizes[:-1]) if value.get("podLayout") == PER_HOST else math.prod(sizes)
            if pods < 2:
                yield ".spares", (f"{spares} is not allowed; the job has one pod, whose loss is its coordinator's: a "
                                  "spare can take the place of any pod but rank 0's")


@dataclass(frozen=True)
class ReplicaGroupsForProgram(Rule):
    """spec.replicaGroups: each group is a gang of mode Program (torchft's Managers run in the
    training script); gang admission (Kueue, PodGroups) does not count the groups together yet."""

    message: str = (f"replica groups need mode {MODE_PROGRAM} (torchft's Manager runs in the training script) and "
                    f"scheduling.provider {SCHEDULING_NONE}: gang admission of every group and the Lighthouse "
                    "together is not supported yet")
    field_path: str | None = ".replicaGroups"

    def cel(self) -> str:
        return (f"!has(self.replicaGroups) || (!{_CEL_MONARCH} && (!has(self.scheduling) || "
                f"!has(self.scheduling.provider) || self.scheduling.provider == '{SCHEDULING_NONE}'))")

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        if "replicaGroups" not in value:
            return
        scheduling = value.get("scheduling") if isinstance(value.get("scheduling"), Mapping) else {}
        if value.get("mode") == MODE_MONARCH or scheduling.get("provider", SCHEDULING_NONE) != SCHEDULING_NONE:
            yield ".replicaGroups", f"not allowed here; {self.message}"


@dataclass(frozen=True)
class ManagerPortFree(Rule):
    """spec.replicaGroups.managerPort is none of the ports the pod already listens on: the
    TCPStore's (spec.masterPort) and the agent's (29400, or 29401 when masterPort is 29400)."""

    message: str = ("managerPort (torchft's Manager server in each rank) must differ from masterPort and from the "
                    f"agent's ports {names.DEFAULT_AGENT_PORT} and {names.DEFAULT_AGENT_PORT + 1}")
    field_path: str | None = ".replicaGroups.managerPort"

    def cel(self) -> str:
        port = f"(has(self.masterPort) ? self.masterPort : {DEFAULT_MASTER_PORT})"
        manager = f"(has(self.replicaGroups.managerPort) ? self.replicaGroups.managerPort : {DEFAULT_MANAGER_PORT})"
        return (f"!has(self.replicaGroups) || ({manager} != {port} && {manager} != {names.DEFAULT_AGENT_PORT} "
                f"&& {manager} != {names.DEFAULT_AGENT_PORT + 1})")

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        groups = value.get("replicaGroups")
        if not isinstance(groups, Mapping):
            return
        manager = groups.get("managerPort", DEFAULT_MANAGER_PORT)
        if manager in (value.get("masterPort", DEFAULT_MASTER_PORT), names.DEFAULT_AGENT_PORT,
                       names.DEFAULT_AGENT_PORT + 1):
            yield ".replicaGroups.managerPort", f"{schema.show(manager)} is not allowed; {self.message}"


@dataclass(frozen=True)
class MinReplicasAtMostCount(Rule):
    """spec.replicaGroups.minReplicas is at most count."""

    message: str = "minReplicas (the Lighthouse's --min_replicas, the fewest groups the job goes on with) must be at most count"
    field_path: str | None = ".minReplicas"

    def cel(self) -> str:
        return "!has(self.minReplicas) || self.minReplicas <= self.count"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        low, high = value.get("minReplicas"), value.get("count")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            yield ".minReplicas", f"{low} is more than count {high}; {self.message}"


@dataclass(frozen=True)
class ElasticMesh(Rule):
    """mesh[0].minSize (an elastic job, torchrun's --nnodes MIN:MAX) needs the shape torchrun
    gives: podLayout PerHost and two dimensions (nodes, procs per node), restart in place (the
    gang's coordinator decides each round's pods) and mode Program."""

    message: str = (f"an elastic mesh (minSize on its first dimension, torchrun's --nnodes MIN:MAX) needs podLayout "
                    f"{PER_HOST}, exactly two dimensions (nodes, procs per node), restartPolicy.mode "
                    f"{RESTART_IN_PLACE} (the default) and mode {MODE_PROGRAM}")
    field_path: str | None = ".mesh"

    def cel(self) -> str:
        return (f"!self.mesh.exists(d, has(d.minSize)) || (has(self.podLayout) && self.podLayout == '{PER_HOST}' "
                f"&& size(self.mesh) == 2 && (!has(self.restartPolicy) || !has(self.restartPolicy.mode) "
                f"|| self.restartPolicy.mode == '{RESTART_IN_PLACE}') && !{_CEL_MONARCH})")

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        mesh = value.get("mesh")
        if not isinstance(mesh, list) or not any(isinstance(d, Mapping) and "minSize" in d for d in mesh):
            return
        restart = value.get("restartPolicy") if isinstance(value.get("restartPolicy"), Mapping) else {}
        if (value.get("podLayout") != PER_HOST or len(mesh) != 2 or value.get("mode") == MODE_MONARCH
                or restart.get("mode", RESTART_IN_PLACE) != RESTART_IN_PLACE):
            yield ".mesh", self.message


#: CEL, on spec: the job is elastic (mesh[0].minSize below its size), where the elastic wait applies.
_CEL_ELASTIC: Final = "(size(self.mesh) > 0 && has(self.mesh[0].minSize) && self.mesh[0].minSize < self.mesh[0].size)"


def _cel_restart(key: str, default: int) -> str:
    """CEL, on spec: restartPolicy.<key>, or its default."""
    return f"(has(self.restartPolicy) && has(self.restartPolicy.{key}) ? self.restartPolicy.{key} : {default})"


@dataclass(frozen=True)
class ElasticWaitBelowJoinTimeout(Rule):
    """An elastic job's restartPolicy.elasticWaitSeconds is below its joinTimeoutSeconds.

    A round after the first is given up (RoundTimeout: the gang's pods are recreated) once
    joinTimeoutSeconds pass without it starting; the elastic wait only starts once minSize pods
    are at the barrier, so a wait as long as the join timeout never lets a smaller round start:
    every lost pod would recreate the gang instead. A policy: a job stored before this rule keeps
    running (as it did, recreating its gang).
    """

    message: str = (f"an elastic job (mesh[0].minSize below its size) needs restartPolicy.elasticWaitSeconds (default "
                    f"{DEFAULT_ELASTIC_WAIT_SECONDS}) below restartPolicy.joinTimeoutSeconds (default "
                    f"{DEFAULT_JOIN_TIMEOUT_SECONDS}): a round that waits longer for the missing pods is given up "
                    "(RoundTimeout) and the gang recreated before it could start smaller")
    field_path: str | None = ".restartPolicy.elasticWaitSeconds"
    policy: bool = True

    def cel(self) -> str:
        wait = _cel_restart("elasticWaitSeconds", DEFAULT_ELASTIC_WAIT_SECONDS)
        join = _cel_restart("joinTimeoutSeconds", DEFAULT_JOIN_TIMEOUT_SECONDS)
        return f"!{_CEL_ELASTIC} || {wait} < {join}"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        mesh = value.get("mesh")
        first = mesh[0] if isinstance(mesh, list) and mesh and isinstance(mesh[0], Mapping) else {}
        low, size = first.get("minSize"), first.get("size")
        if not (_is_int(low) and _is_int(size) and low < size):
            return
        restart = value.get("restartPolicy") if isinstance(value.get("restartPolicy"), Mapping) else {}
        wait = restart.get("elasticWaitSeconds", DEFAULT_ELASTIC_WAIT_SECONDS)
        join = restart.get("joinTimeoutSeconds", DEFAULT_JOIN_TIMEOUT_SECONDS)
        if _is_int(wait) and _is_int(join) and wait >= join:
            yield ".restartPolicy.elasticWaitSeconds", (
                f"{wait} is not below restartPolicy.joinTimeoutSeconds ({join}); an elastic job's round is given up "
                f"(RoundTimeout, the gang recreated) {join} s after it opens, before a wait of {wait} s for the "
                f"missing pods ends: give elasticWaitSeconds below {join} (0..{join - 1}), or raise "
                f"joinTimeoutSeconds above {wait}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ArgsForMode(Rule):
    """spec.args is required in Program mode and refused in Monarch mode (on spec itself)."""

    message: str = (f"args is required with mode {MODE_PROGRAM} (the training argv) and not allowed with mode "
                    f"{MODE_MONARCH}, whose pods run Monarch's worker loop: the client runs programs on them "
                    "with SPMDActor.main")
    field_path: str | None = ".args"

    def cel(self) -> str:
        return f"{_CEL_MONARCH} ? !has(self.args) : has(self.args)"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        monarch = value.get("mode") == MODE_MONARCH
        if monarch and "args" in value:
            yield ".args", (f"not allowed with mode {MODE_MONARCH}: its pods run Monarch's worker loop, and the "
                            "client runs programs on them with SPMDActor.main; remove args")
        elif not monarch and "args" not in value:
            yield ".args", f"required; {_ARGS_EXAMPLE}"


@dataclass(frozen=True)
class LayoutForMode(Rule):
    """Monarch mode runs one Monarch host per pod: podLayout PerHost (on spec itself)."""

    message: str = (f"mode {MODE_MONARCH} needs podLayout {PER_HOST}: each pod is one Monarch host, in which the "
                    "client spawns the last mesh dimension's procs")
    field_path: str | None = ".podLayout"

    def cel(self) -> str:
        return f"!{_CEL_MONARCH} || (has(self.podLayout) && self.podLayout == '{PER_HOST}')"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        if value.get("mode") == MODE_MONARCH and value.get("podLayout") != PER_HOST:
            yield ".podLayout", f"{schema.show(value.get('podLayout'))} is not allowed; {self.message}"


@dataclass(frozen=True)
class Equals(Rule):
    """A value equals one constant."""

    value: str
    message: str

    def cel(self) -> str:
        return f"self == '{self.value}'"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        if value != self.value:
            yield "", f"{schema.show(value)} is not allowed; {self.message}"


@dataclass(frozen=True)
class QueueForKueue(Rule):
    """A job admitted by Kueue names its LocalQueue."""

    message: str = "provider Kueue needs queue: the name of a Kueue LocalQueue in the job's namespace"
    field_path: str | None = ".queue"

    def cel(self) -> str:
        return f"!has(self.provider) || self.provider != '{SCHEDULING_KUEUE}' || has(self.queue)"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        if value.get("provider") == SCHEDULING_KUEUE and "queue" not in value:
            yield ".queue", f"required; {self.message}"


#: CEL, on a container: it is a sidecar (named, and not the trainer).
_IS_SIDECAR: Final = f"(has(self.name) && self.name != '{TRAINER_CONTAINER}')"


def _is_trainer(container: Mapping[str, Any]) -> bool:
    return container.get("name", TRAINER_CONTAINER) == TRAINER_CONTAINER


@dataclass(frozen=True)
class OneTrainer(Rule):
    """At most one container of the template is the trainer (named so, or unnamed)."""

    message: str = (f"at most one container may be the trainer (named {TRAINER_CONTAINER!r}, or without a name); "
                    "give the trainer's settings once, and a name to every sidecar")

    def cel(self) -> str:
        return f"self.filter(c, !has(c.name) || c.name == '{TRAINER_CONTAINER}').size() <= 1"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        trainers = [i for i, c in enumerate(value) if _is_trainer(c)]
        if len(trainers) > 1:
            yield f"[{trainers[1]}]", f"a second trainer container (the first is [{trainers[0]}]): {self.message}"


@dataclass(frozen=True)
class TrainerLeaves(Rule):
    """The trainer container does not set a field the operator sets from the spec."""

    key: str
    instead: str

    @property
    def message(self) -> str:  # type: ignore[override]
        return f"the {TRAINER_CONTAINER} container's {self.key} is set by the operator; use {self.instead} instead"

    @property
    def field_path(self) -> str:  # type: ignore[override]
        return f".{self.key}"

    def cel(self) -> str:
        return f"{_IS_SIDECAR} || !has(self.{self.key})"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        if _is_trainer(value) and self.key in value:
            yield f".{self.key}", f"set by the operator; use {self.instead} instead"


@dataclass(frozen=True)
class TrainerEnv(Rule):
    """The trainer container sets no MONARCH_SPMD_* variable but USER_SETTABLE_VARS."""

    message: str = (f"the {TRAINER_CONTAINER} container may set no {_RESERVED_PREFIX}* variable but "
                    f"{' and '.join(sorted(USER_SETTABLE_VARS))}: the operator sets the others from the spec")
    field_path: str = ".env"

    def cel(self) -> str:
        allowed = ", ".join(f"'{v}'" for v in sorted(USER_SETTABLE_VARS))
        return (f"{_IS_SIDECAR} || !has(self.env) || self.env.all(e, !has(e.name) || "
                f"!e.name.startsWith('{_RESERVED_PREFIX}') || e.name in [{allowed}])")

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        if not _is_trainer(value):
            return
        for j, var in enumerate(value.get("env", ())):
            name = var.get("name")
            if name is not None and name.startswith(_RESERVED_PREFIX) and name not in USER_SETTABLE_VARS:
                yield (f".env[{j}].name", f"{name} is set by the operator from the spec; only "
                       f"{', '.join(sorted(USER_SETTABLE_VARS))} may be overridden")


def _cel_list(values: frozenset[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in sorted(values)) + "]"


def _cel_str(text: str) -> str:
    """A CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class ContractEnv(Rule):
    """The trainer container sets no variable of the environment contract and none of the pod's own.

    A policy (added with the contract's table as the list of what the operator owns): a job stored
    before it keeps running, the worker's values winning as they always did.
    """

    message: str = _d(f"""
        the {TRAINER_CONTAINER} container may not set the torchrun variables the operator computes
        from the spec ({', '.join(sorted(CONTRACT_VARS))}) nor the pod's own
        ({', '.join(v for v, _ in DOWNWARD_ENV)}): remove them (ROLE_NAME: set
        MONARCH_SPMD_ROLE_NAME; MASTER_PORT: spec.masterPort; TORCH_NCCL_ASYNC_ERROR_HANDLING and
        OMP_NUM_THREADS may be set)""")
    field_path: str = ".env"
    policy: bool = True

    def cel(self) -> str:
        return (f"{_IS_SIDECAR} || !has(self.env) || self.env.all(e, !has(e.name) || "
                f"!(e.name in {_cel_list(RESERVED_VARS)}))")

    def message_expression(self) -> str:
        found = f"self.env.filter(e, has(e.name) && e.name in {_cel_list(RESERVED_VARS)}).map(e, e.name)"
        rest = (f"{', '.join(sorted(RESERVED_VARS))} are reserved: torchrun variables the operator computes from "
                "the spec, or the pod's own from the downward API; remove it (ROLE_NAME: set MONARCH_SPMD_ROLE_NAME "
                "instead; MASTER_PORT: spec.masterPort; TORCH_NCCL_ASYNC_ERROR_HANDLING and OMP_NUM_THREADS may be set)")
        return f"'the {TRAINER_CONTAINER} container may not set ' + {found}[0] + ': it and ' + {_cel_str(rest)}"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        if not _is_trainer(value):
            return
        for j, var in enumerate(value.get("env", ())):
            name = var.get("name")
            if name in RESERVED_VARS:
                whose = ("the pod's own (downward API)" if name not in CONTRACT_VARS
                         else "a torchrun variable the operator computes from the spec")
                hint = RESERVED_VAR_HINTS.get(name)
                yield (f".env[{j}].name", f"{name} is reserved: {whose}"
                       + (f" ({hint})" if hint else "") + "; remove it")


@dataclass(frozen=True)
class QuantityRange(Rule):
    """A quantity string within ``[low, high]`` (a policy; a string that is no quantity is the pattern's)."""

    low: str
    high: str
    what: str
    policy: bool = True

    @property
    def message(self) -> str:  # type: ignore[override]
        return f"must be {self.what} from {self.low} to {self.high}"

    def cel(self) -> str:
        return (f"!isQuantity(self) || (quantity(self).compareTo(quantity('{self.low}')) >= 0 && "
                f"quantity(self).compareTo(quantity('{self.high}')) <= 0)")

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        amount = quantity.parse(value)
        low, high = quantity.parse(self.low), quantity.parse(self.high)
        assert low is not None and high is not None
        if amount is not None and not low <= amount <= high:
            yield "", f"{schema.show(value)} is not valid: {self.message}"


@dataclass(frozen=True)
class FrozenUnlessSuspended(Rule):
    """A pod-shaping field of spec changes only while the job is suspended (a transition rule on spec).

    As a Kubernetes Job's pod template: the pods of one gang never disagree. Suspending deletes
    the pods, so the change applies to every pod of the resumed gang alike. ``key`` is a field of
    spec, or a dotted path into one of its objects (``restartPolicy.mode``).
    """

    key: str
    transition: ClassVar[bool] = True

    @property
    def message(self) -> str:  # type: ignore[override]
        return (f"spec.{self.key} shapes the pods and may change only while the job is suspended: set "
                "spec.suspend to true (its pods are deleted), change it, then set spec.suspend to false "
                "(or delete the job and create it again)")

    @property
    def field_path(self) -> str:  # type: ignore[override]
        return f".{self.key}"

    def cel(self) -> str:
        parts = self.key.split(".")

        def present(root: str) -> str:
            text = " && ".join(f"has({root}.{'.'.join(parts[:i + 1])})" for i in range(len(parts)))
            return text if len(parts) == 1 else f"({text})"

        k = self.key
        return ("(has(self.suspend) && self.suspend) || (has(oldSelf.suspend) && oldSelf.suspend) || "
                f"({present('self')} ? ({present('oldSelf')} && self.{k} == oldSelf.{k}) : !{present('oldSelf')})")

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        if old is MISSING or not isinstance(old, Mapping) or value.get("suspend") or old.get("suspend"):
            return
        if _dig(value, self.key) != _dig(old, self.key):
            yield f".{self.key}", (f"is immutable while the job is not suspended (it shapes the pods, as a "
                                   "Job's template does): set spec.suspend to true, change it, then set "
                                   "spec.suspend to false; or delete the job and create it again")


def _dig(value: Any, path: str) -> Any:
    """The value at a dotted path of nested mappings, or MISSING."""
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


# --- the table --------------------------------------------------------------------------------


def _codes(kind: str) -> Arr:
    return Arr(
        max_items=MAX_EXIT_CODES,
        items=Int(minimum=1, maximum=255, description="An exit code, 1..255 (128+N means killed by signal N)."),
        convert=lambda v: tuple(dict.fromkeys(v or ())),
        description=kind,
    )


_EXAMPLE_MESH: Final = "give the ordered dimensions, e.g. [{name: hosts, size: 2}, {name: gpus, size: 4}]"

RESTART_POLICY: Final = Obj(
    default={},
    flatten=True,
    description=_d("""
        How the gang restarts. A failure is retryable unless it matches a permanent rule; on a
        retryable failure the whole gang restarts (TORCHELASTIC_RESTART_COUNT + 1) until
        maxRestarts is used up, then the job fails. With mode InPlace (default) every pod's worker
        stops its processes and starts them again in the same pods, as torchrun's agent does; a
        lost pod other than rank 0's is replaced alone; the gang's pods are recreated when that
        cannot work (rank 0's pod or a node lost, the same pod failing three times in a row, a
        round that does not come together within joinTimeoutSeconds). With RecreatePods every
        failure deletes every pod and creates the gang again. The worker's own exit codes: 64 (bad
        input) is permanent, 75 (the gang must be recreated) retryable. A pod deleted, evicted or
        lost under a running job is a retryable failure. mode, progressTimeoutSeconds, the back-off
        fields and joinTimeoutSeconds reach the pods and change only while the job is suspended;
        the others change at any time and apply from the next failure."""),
    rules=(schema.Disjoint("permanentExitCodes", "retryableExitCodes",
                           "an exit code must not be both in permanentExitCodes and in retryableExitCodes"),),
    properties={
        "maxRestarts": Int(default=DEFAULT_MAX_RESTARTS, minimum=0, maximum=MAX_RESTARTS_LIMIT,
                           description=f"How many times the whole gang may be replaced, 0..{MAX_RESTARTS_LIMIT}. Default {DEFAULT_MAX_RESTARTS}."),
        "permanentExitCodes": _codes(_d("""
            Exit codes (1..255) of a proc that fail the job at once, without a restart. The
            worker's 64 is always permanent.""")),
        "retryableExitCodes": _codes(_d("""
            If non-empty, the only exit codes (1..255) that restart the gang; any other non-zero
            exit code is then permanent. Pod loss and the worker's 75 stay retryable. Empty
            (default): every exit code not listed as permanent is retryable.""")),
        "permanentReasons": Arr(
            max_items=MAX_PERMANENT_REASONS,
            convert=lambda v: tuple(dict.fromkeys(v or ())),
            description=_d("""
                Pod or container reasons that fail the job at once, e.g. OOMKilled or Evicted.
                InvalidImageName and ErrImageNeverPull are always permanent."""),
            items=Str(min_length=1, max_length=MAX_REASON_LENGTH,
                      rules=(Matches(REASON, "a reason is one word as Kubernetes reports it, e.g. OOMKilled or Evicted"),),
                      description="A reason as Kubernetes reports it (pod status.reason or a container's terminated reason)."),
        ),
        "podReplacementPolicy": Str(
            enum=POD_REPLACEMENT_POLICIES, default=DEFAULT_POD_REPLACEMENT_POLICY,
            description=_d(f"""
                When the next gang attempt is created after a retryable failure, named as in
                Kubernetes Jobs. Failed (default): only once every pod of the previous attempt has
                terminated (its processes gone, its GPUs and ports free), or once
                replacementTimeoutSeconds have passed. TerminatingOrFailed: at once, while pods of
                the previous attempt may still be terminating; restarts sooner, but old and new
                ranks may briefly share nodes, GPUs and the master's address."""),
        ),
        "replacementTimeoutSeconds": Int(
            default=DEFAULT_REPLACEMENT_TIMEOUT, minimum=1, maximum=MAX_REPLACEMENT_TIMEOUT,
            description=_d(f"""
                With podReplacementPolicy Failed: how long the next attempt waits for the previous
                attempt's pods to terminate before it is created anyway (a pod stuck terminating,
                e.g. on a lost node, must not hold the job forever). 1..{MAX_REPLACEMENT_TIMEOUT},
                default {DEFAULT_REPLACEMENT_TIMEOUT}."""),
        ),
        "mode": Str(
            enum=RESTART_MODES, default=DEFAULT_RESTART_MODE, attr="restart_mode",
            description=_d(f"""
                How a retryable failure restarts the gang. {RESTART_IN_PLACE} (default): the
                worker in every pod (torchrun's elastic agent) stops its processes (SIGTERM, then
                SIGKILL after the pod's terminationGracePeriodSeconds) and starts them again in
                the same pods, with the same MASTER_ADDR and TORCHELASTIC_RESTART_COUNT + 1, once
                every process of the gang is gone; a lost pod (deleted, evicted, OOM-killed) other
                than rank 0's is created again alone while the others wait for it; the whole gang
                is recreated when that cannot work. {RESTART_RECREATE_PODS}: every failure deletes
                every pod and creates the gang again. Restarts count against maxRestarts alike. In
                place, the pods listen on TCP port 29400 (29401 when masterPort is 29400), the
                container port named spmd-agent, which the operator must reach. mode Monarch
                always recreates pods."""),
        ),
        "progressTimeoutSeconds": Int(
            minimum=1, maximum=MAX_PROGRESS_TIMEOUT,
            description=_d(f"""
                With mode {RESTART_IN_PLACE}: when no rank of the gang writes anything (no byte on
                stdout or stderr) for this many seconds, the gang is hung: the rank to blame is
                killed and the gang restarts (reason NoProgress, naming the rank and its last
                line). A script that prints on rank 0 only is not hung while rank 0 prints. For scripts that do not arm
                torchrun's watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1 in the trainer's env, with
                torch.distributed.elastic.timer.expires), which is honoured either way (reason
                WatchdogTimeout). 1..{MAX_PROGRESS_TIMEOUT}. Unset (default): off."""),
        ),
        "backoffSeconds": Int(
            default=DEFAULT_BACKOFF_SECONDS, minimum=0, maximum=MAX_BACKOFF_LIMIT,
            description=_d(f"""
                With mode {RESTART_IN_PLACE}: the first restart after a healthy stretch starts at
                once; each further restart in a row waits this long, doubled for each one after
                (10, 20, 40 ... s), at most maxBackoffSeconds. The processes are stopped at once;
                only the next start waits. 0: no back-off. Default {DEFAULT_BACKOFF_SECONDS}."""),
        ),
        "maxBackoffSeconds": Int(
            default=DEFAULT_MAX_BACKOFF_SECONDS, minimum=0, maximum=MAX_BACKOFF_LIMIT,
            description=_d(f"""
                With mode {RESTART_IN_PLACE}: the longest back-off between two restarts.
                0..{MAX_BACKOFF_LIMIT}, default {DEFAULT_MAX_BACKOFF_SECONDS}."""),
        ),
        "backoffResetSeconds": Int(
            default=DEFAULT_BACKOFF_RESET_SECONDS, minimum=0, maximum=MAX_BACKOFF_LIMIT,
            description=_d(f"""
                With mode {RESTART_IN_PLACE}: a round whose processes all ran this long before it
                failed ends the run of restarts in a row: its restart starts at once again.
                0..{MAX_BACKOFF_LIMIT}, default {DEFAULT_BACKOFF_RESET_SECONDS}."""),
        ),
        "elasticWaitSeconds": Int(
            default=DEFAULT_ELASTIC_WAIT_SECONDS, minimum=0, maximum=MAX_JOIN_TIMEOUT,
            description=_d(f"""
                An elastic job (mesh[0].minSize): how long a round, once minSize pods are at its
                barrier, waits for the others before it starts with those it has (torchrun's last
                call). A lost pod's replacement that joins within it keeps the full size.
                0..{MAX_JOIN_TIMEOUT}, default {DEFAULT_ELASTIC_WAIT_SECONDS}; below joinTimeoutSeconds,
                which gives up a round (RoundTimeout) before a longer wait could end."""),
        ),
        "joinTimeoutSeconds": Int(
            default=DEFAULT_JOIN_TIMEOUT_SECONDS, minimum=1, maximum=MAX_JOIN_TIMEOUT,
            description=_d(f"""
                With mode {RESTART_IN_PLACE}: how long, after its back-off, a restart in place may
                wait for every pod to be back at the start barrier (a pod replaced alone must be
                scheduled and start in that time) before the agents give up and the whole gang is
                recreated. Raise it where pods take long to schedule or pull their image.
                1..{MAX_JOIN_TIMEOUT}, default {DEFAULT_JOIN_TIMEOUT_SECONDS}; an elastic job's must be
                above its elasticWaitSeconds."""),
        ),
    },
)

_CONTAINER: Final = Obj(
    preserve_unknown=True,
    description=_d("""
        A container (see `kubectl explain pod.spec.containers`), typed as a Pod's; the trainer's
        image, command and args come from the spec."""),
    rules=(
        TrainerLeaves("image", "spec.image"),
        TrainerLeaves("command", "spec.python"),
        TrainerLeaves("args", "spec.args"),
        TrainerEnv(),
        ContractEnv(),
    ),
    properties={
        "name": Str(
            max_length=MAX_CONTAINER_NAME_LENGTH,
            rules=(Matches(DNS_1123_LABEL, "a container name is a DNS-1123 label: lowercase letters, digits and "
                           "'-', starting and ending with a letter or digit"),),
            description=_d(f"""
                The container's name, a DNS-1123 label. "{TRAINER_CONTAINER}" (or no name) makes it
                the proc's container; any other name makes it a sidecar, which may set anything.""")),
        "image": Str(description="A sidecar's image. The trainer's image is spec.image."),
        "command": Arr(items=Str(description="One word."),
                       description="A sidecar's command. The trainer's command is the worker, run by spec.python."),
        "args": Arr(items=Str(description="One argument."),
                    description="A sidecar's arguments. The trainer's argv is spec.args."),
        "env": Arr(
            max_items=MAX_CONTAINER_ENV,
            description=_d(f"""
                Environment variables, at most {MAX_CONTAINER_ENV}. The trainer may not set the
                torchrun variables the operator computes ({', '.join(sorted(CONTRACT_VARS))}), the
                pod's own ({', '.join(v for v, _ in DOWNWARD_ENV)}), nor MONARCH_SPMD_* variables
                other than {' and '.join(sorted(USER_SETTABLE_VARS))}; what it sets otherwise wins
                (TORCH_NCCL_ASYNC_ERROR_HANDLING and OMP_NUM_THREADS included)."""),
            items=Obj(preserve_unknown=True, description="A variable (name, value or valueFrom).",
                      properties={"name": Str(max_length=MAX_ENV_NAME_LENGTH,
                                              description=f"The variable's name, at most {MAX_ENV_NAME_LENGTH} characters.")}),
        ),
    },
)

TEMPLATE: Final = podtemplate.overlay(podtemplate.pod_template_spec(), Obj(
    convert=lambda v: copy.deepcopy(v) if v is not None else {},
    description=_d("""
        The pod template for everything else set on a pod: resources, env, volumes, nodeSelector,
        tolerations, affinity, serviceAccountName, priorityClassName, schedulerName,
        terminationGracePeriodSeconds, sidecars... The container named "trainer" (or the one
        without a name) is merged into the proc's container: its env wins where it sets a variable,
        but image, command and args come from the spec and MONARCH_SPMD_* variables other than
        MONARCH_SPMD_ROLE_NAME and MONARCH_SPMD_LOCAL_RANK_SCOPE belong to the operator.
        restartPolicy is always Never (the gang restarts as a whole)."""),
    properties={
        "metadata": Obj(
            description="Labels and annotations copied onto every pod (the operator's own labels win).",
            properties={
                "labels": Obj(description="Labels for every pod.", values=Str(description="A label value.")),
                "annotations": Obj(description="Annotations for every pod.", values=Str(description="An annotation value.")),
            },
        ),
        "spec": Obj(
            preserve_unknown=True,
            description=_d("""
                A PodSpec (see `kubectl explain pod.spec`), merged with what the operator sets: the
                trainer container, restartPolicy Never, the worker volume and the environment."""),
            properties={
                "restartPolicy": Str(
                    description="Never, or unset: a failed proc is replaced with its whole gang (spec.restartPolicy), never alone.",
                    rules=(Equals("Never", "pods run with Never; the gang's restarts are set by spec.restartPolicy"),),
                ),
                "containers": Arr(
                    max_items=MAX_CONTAINERS,
                    rules=(OneTrainer(),),
                    description=_d(f"""
                        The pod's containers, at most {MAX_CONTAINERS}: the trainer (named
                        "{TRAINER_CONTAINER}", or without a name; at most one) and any sidecars."""),
                    items=_CONTAINER,
                ),
            },
        ),
    },
))

SPEC: Final = Obj(
    description=_d(f"""
        What to run and how: the mesh, the training argv, the image, the pod template and the
        gang's restart policy. The mesh, podLayout and mode never change. The fields that shape
        the pods ({', '.join(POD_SHAPING_FIELDS)}) change only while the job is suspended, as a
        Job's pod template: suspend it (its pods are deleted), change them, resume it. The others
        (restartPolicy, activeDeadlineSeconds, ttlSecondsAfterFinished, suspend) change at any
        time."""),
    rules=(ArgsForMode(), LayoutForMode(), SparesNeedAGang(), ElasticMesh(), ElasticWaitBelowJoinTimeout(),
           ReplicaGroupsForProgram(), ManagerPortFree(),
           *(FrozenUnlessSuspended(key) for key in POD_SHAPING_FIELDS)),
    properties={
        "mesh": Arr(
            required=True,
            example=_EXAMPLE_MESH,
            min_items=1,
            max_items=contract.MAX_DIMS,
            convert=lambda v: tuple(MeshDim(d["name"], d["size"], d.get("minSize")) for d in v),
            rules=(
                schema.UniqueBy("name", "dimension names must be unique"),
                MinSizeFirst(),
                MeshProcs(),
                schema.Immutable("spec.mesh is immutable: delete the job and create it again to change its shape"),
            ),
            description=_d(f"""
                The ORDERED mesh: 1 to {contract.MAX_DIMS} named dimensions, e.g. [{{name: hosts,
                size: 2}}, {{name: gpus, size: 4}}]. One proc (pod) per point; a proc's rank is
                the row-major index of its coordinates; the LAST dimension is the local one
                (LOCAL_RANK is the coordinate on it, LOCAL_WORLD_SIZE its size) unless gpusPerProc
                is set. At most {contract.MAX_PROCS} procs in all. Immutable after creation."""),
            items=Obj(
                description="One named mesh dimension.",
                properties={
                    "name": Str(
                        required=True,
                        max_length=MAX_DIM_NAME_LENGTH,
                        rules=(Matches(DNS_1035_LABEL, "a dimension name is a DNS label: lowercase letters, "
                                       "digits and '-', starting with a letter, ending with a letter or digit"),),
                        description=_d(f"""
                            The dimension's name: a DNS label of at most {MAX_DIM_NAME_LENGTH}
                            characters (lowercase letters, digits and '-', starting with a letter),
                            unique in the mesh. Each pod carries the label
                            spmd.monarch.dev/coord-<name>=<coordinate>."""),
                    ),
                    "size": Int(required=True, minimum=1, maximum=contract.MAX_PROCS,
                                description=_d(f"""
                                    The number of procs along this dimension, 1..{contract.MAX_PROCS}
                                    (and the product of all sizes at most {contract.MAX_PROCS}).""")),
                    "minSize": Int(minimum=1, maximum=contract.MAX_PROCS,
                                   description=_d(f"""
                                    Elastic sizes, on the first dimension only (torchrun's --nnodes
                                    MIN:MAX, with size the MAX): the job's rounds may run with as few
                                    as minSize of its size pods (each a node of nproc-per-node procs).
                                    The first round starts once minSize pods are ready and
                                    restartPolicy.elasticWaitSeconds passed without the others (at
                                    once with all); a pod lost with nothing to take its place (no hot
                                    spare, its replacement not back within that wait) makes the next
                                    round smaller, never below minSize; a pod ready again while a
                                    smaller round runs restarts every rank in a round with it (a
                                    membership change, not counted against maxRestarts). Each round
                                    renumbers its pods in mesh order: WORLD_SIZE, RANK, GROUP_RANK and
                                    GROUP_WORLD_SIZE are the round's, as after a torchrun
                                    re-rendezvous; MASTER_ADDR stays rank 0's pod. Needs podLayout
                                    {PER_HOST}, two dimensions and restart in place. 1..size.""")),
                },
                rules=(MinSizeAtMostSize(),),
            ),
        ),
        "args": Arr(
            example=_ARGS_EXAMPLE,
            min_items=1,
            max_items=MAX_ARGS,
            convert=lambda v: tuple(v or ()),
            rules=(Argv(),),
            description=_d("""
                The training argv, as torchrun's or SPMDActor.main's script_args: either ["-m",
                MODULE, ARGS...] (run a module, like python -m) or [SCRIPT.py, ARGS...] (a path
                inside the image). Run by the worker with spec.python after the rendezvous; the
                pod's exit code is the program's exit code. Required with mode Program (the
                default); not allowed with mode Monarch."""),
            items=Str(description="One argument."),
        ),
        "image": Str(
            required=True,
            example="name the container image every proc runs, e.g. pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
            max_length=MAX_IMAGE_LENGTH,
            rules=(Matches(IMAGE_REFERENCE, "an image reference is printable ASCII without spaces, "
                           "e.g. pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"),),
            description=_d("""
                The container image of every proc, e.g. a stock
                pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime. It needs only a Python 3.10+
                interpreter (spec.python) and your training code's dependencies: the worker
                (standard library only) is mounted into each pod from a ConfigMap, so the image
                need not contain this project."""),
        ),
        "python": Str(
            default=DEFAULT_PYTHON,
            max_length=MAX_PYTHON_LENGTH,
            rules=(Matches(INTERPRETER, "an interpreter name or path has no spaces or control characters"),),
            description=_d("""
                The Python interpreter in the image (a name on PATH or an absolute path), used for
                both the worker and the training program. Default python3."""),
        ),
        "masterPort": Int(
            default=DEFAULT_MASTER_PORT, minimum=1, maximum=65535,
            description=_d("""
                The port rank 0's TCPStore listens on (MASTER_PORT). MASTER_ADDR is the headless
                Service of the current attempt, <job>-<id>-m<attempt>.<namespace>.svc (<id>: five
                hex digits of the job's uid), which selects that attempt's rank-0 pod. Default 29500."""),
        ),
        "gpusPerProc": Int(
            default=0, minimum=0, maximum=MAX_GPUS_PER_PROC,
            description=_d(f"""
                GPUs per proc: sets the nvidia.com/gpu limit of every pod. When at least 1, each pod
                is its own torchrun node, as with torchrun --nproc-per-node=1 per pod (the
                PyTorchJob convention): LOCAL_RANK=0 and LOCAL_WORLD_SIZE=1 in every pod, so
                torch.cuda.set_device(LOCAL_RANK) selects the pod's own GPU; RANK and WORLD_SIZE
                still come from the mesh. 0 (default) keeps LOCAL_RANK as the coordinate on the last
                mesh dimension. At most {MAX_GPUS_PER_PROC}."""),
        ),
        "colocate": Bool(
            default=False,
            description=_d("""
                When true, the procs that share a coordinate on the FIRST mesh dimension (e.g. one
                "host") prefer to be scheduled on the same node (a preferred podAffinity on the
                label spmd.monarch.dev/coord-<first dimension>). A preference, not a rule: pods
                still start when no node fits them all. Default false."""),
        ),
        "restartPolicy": RESTART_POLICY,
        "spares": Int(
            default=0, minimum=0, maximum=MAX_SPARES,
            description=_d(f"""
                Hot spares: this many extra pods, created with the gang's and like its pods
                (scheduled, image pulled, worker running, holding their resources) that take no
                part in training; gang admission (Kueue, PodGroups) counts them. When a pod other
                than rank 0's is lost (its node frozen, the pod deleted or evicted), the gang's
                coordinator gives its place to a ready spare at once: every rank restarts in place
                with the spare as that pod, the restart is not counted against maxRestarts, and a
                new spare is created in the background. Needs restartPolicy.mode InPlace and more
                than one pod. 0..{MAX_SPARES}, default 0."""),
        ),
        "replicaGroups": Obj(
            convert=ReplicaGroups.of,
            rules=(MinReplicasAtMostCount(),
                   schema.Immutable("spec.replicaGroups is immutable: delete the job and create it again to change it")),
            description=_d(f"""
                torchft replica groups (docs/torchft.md): count groups, each the whole mesh as a
                gang of its own (an SPMDJob named <job>-g<index> that the operator makes and owns:
                its own rank-0 Service and MASTER_ADDR, coordinator, restarts in place, spares and
                node-loss handling, RANK and WORLD_SIZE of its own world, restartPolicy.maxRestarts
                its own budget), plus one torchft Lighthouse pod and Service of the job, from
                spec.image, which must have torchft installed (torchft_lighthouse on PATH). Every
                rank gets REPLICA_GROUP_ID, NUM_REPLICA_GROUPS, TORCHFT_LIGHTHOUSE,
                TORCHFT_MANAGER_PORT and TORCHFT_QUORUM_RETRIES (and the timeouts set here), and
                rank 0's worker hosts the group's TCPStore (TORCHELASTIC_USE_AGENT_STORE=True), as
                under torchrun. A failure restarts its group only. The job is Running while at
                least minReplicas groups are, Succeeded when every group succeeded, and Failed once
                fewer than minReplicas groups can still run (the others failed for good).
                Immutable after creation; needs mode {MODE_PROGRAM} and no scheduling.provider.
                Unset (default): one gang."""),
            properties={
                "count": Int(
                    required=True, minimum=1, maximum=MAX_REPLICA_GROUPS,
                    description=f"How many replica groups, 1..{MAX_REPLICA_GROUPS}.",
                ),
                "minReplicas": Int(
                    default=1, minimum=1, maximum=MAX_REPLICA_GROUPS,
                    description=_d("""
                        The Lighthouse's --min_replicas: the fewest groups a quorum (and the job)
                        goes on with, 1..count. Default 1, torchft's launcher's."""),
                ),
                "lighthousePort": Int(
                    default=DEFAULT_LIGHTHOUSE_PORT, minimum=1, maximum=65535,
                    description=f"The Lighthouse's port (its pod and Service). Default {DEFAULT_LIGHTHOUSE_PORT}.",
                ),
                "managerPort": Int(
                    default=DEFAULT_MANAGER_PORT, minimum=1, maximum=65535,
                    description=_d(f"""
                        TORCHFT_MANAGER_PORT: the port of the Manager server in each group's rank 0.
                        Default {DEFAULT_MANAGER_PORT}; not masterPort nor the agent's port."""),
                ),
                "joinTimeoutSeconds": Int(
                    default=DEFAULT_LIGHTHOUSE_JOIN_TIMEOUT, minimum=1, maximum=MAX_TORCHFT_TIMEOUT,
                    description=_d(f"""
                        The Lighthouse's --join_timeout_ms, in seconds: how long a quorum waits for
                        groups that heartbeat but have not asked to join. Default
                        {DEFAULT_LIGHTHOUSE_JOIN_TIMEOUT}."""),
                ),
                "heartbeatTimeoutSeconds": Int(
                    default=DEFAULT_LIGHTHOUSE_HEARTBEAT_TIMEOUT, minimum=1, maximum=MAX_TORCHFT_TIMEOUT,
                    description=_d(f"""
                        The Lighthouse's --heartbeat_timeout_ms, in seconds: a group silent this long
                        is out of the quorum. Default {DEFAULT_LIGHTHOUSE_HEARTBEAT_TIMEOUT}."""),
                ),
                "quorumRetries": Int(
                    default=DEFAULT_QUORUM_RETRIES, minimum=0, maximum=1000,
                    description=_d(f"""
                        TORCHFT_QUORUM_RETRIES: how many times a Manager asks for a quorum again
                        before its rank fails (the groups ride out a Lighthouse restarted meanwhile).
                        Default {DEFAULT_QUORUM_RETRIES}."""),
                ),
                "timeoutSeconds": Int(
                    minimum=1, maximum=MAX_TORCHFT_TIMEOUT,
                    description="TORCHFT_TIMEOUT_SEC: torchft's timeout of its collectives. Unset: torchft's default.",
                ),
                "quorumTimeoutSeconds": Int(
                    minimum=1, maximum=MAX_TORCHFT_TIMEOUT,
                    description="TORCHFT_QUORUM_TIMEOUT_SEC: how long a quorum may take. Unset: torchft's default.",
                ),
                "connectTimeoutSeconds": Int(
                    minimum=1, maximum=MAX_TORCHFT_TIMEOUT,
                    description="TORCHFT_CONNECT_TIMEOUT_SEC: how long a Manager may take to connect. Unset: torchft's default.",
                ),
            },
        ),
        "rendezvousTimeoutSeconds": Int(
            default=DEFAULT_RENDEZVOUS_TIMEOUT, minimum=1, maximum=MAX_RENDEZVOUS_TIMEOUT,
            description=_d(f"""
                How long each worker waits for MASTER_ADDR to resolve and (ranks other than 0) for
                MASTER_PORT to accept, before it exits with 75 (retryable).
                1..{MAX_RENDEZVOUS_TIMEOUT}, default {DEFAULT_RENDEZVOUS_TIMEOUT}."""),
        ),
        "activeDeadlineSeconds": Int(
            minimum=1, format="int64",
            description=_d("""
                The job fails with reason DeadlineExceeded (its pods are stopped) once it has been
                active this many seconds, counted from its start or last resume, restarts included.
                Unset: no deadline."""),
        ),
        "ttlSecondsAfterFinished": Int(
            minimum=0, format="int64",
            description=_d("""
                The job (and, through garbage collection, its pods) is deleted this many seconds
                after it succeeded or failed. Unset: kept."""),
        ),
        "suspend": Bool(
            default=False,
            description=_d("""
                When true, no pods run: the running gang is deleted and the job is Suspended;
                setting it back to false creates the gang again (same attempt number) and restarts
                the activeDeadlineSeconds clock. The convention Kueue uses to admit jobs. Default
                false."""),
        ),
        "podLayout": Str(
            enum=POD_LAYOUTS, default=PER_PROC,
            rules=(schema.Immutable("spec.podLayout is immutable: delete the job and create it again to change it"),),
            description=_d("""
                How procs map to pods. PerProc (default): one pod per proc, each its own container;
                with gpusPerProc each pod holds its GPUs and is its own torchrun node. PerHost: one
                pod per coordinate of every dimension but the last (a "host"), whose worker starts
                the last dimension's procs as local processes, as torchrun --nproc-per-node does:
                LOCAL_RANK is the proc's index in the pod, LOCAL_WORLD_SIZE the last dimension's
                size, and the pod requests gpusPerProc times that many GPUs. Use PerHost on GPU
                nodes: NCCL reaches the other GPUs of the pod through NVLink and shared memory,
                which it cannot across containers. Immutable after creation."""),
        ),
        "mode": Str(
            enum=MODES, default=MODE_PROGRAM,
            rules=(schema.Immutable("spec.mode is immutable: delete the job and create it again to change it"),),
            description=_d(f"""
                What the pods run. Program (default): every proc runs spec.args once, and the job
                succeeds when every rank exited 0. Monarch: every pod is one Monarch host for a
                single controller: its worker runs Monarch's worker loop
                (monarch.actor.run_worker_loop_forever on TCP port {names.DEFAULT_MONARCH_PORT},
                the container port named "{names.MONARCH_PORT_NAME}"; without TLS, which
                torchmonarch 0.7.0 lacks, so keep the port inside the cluster's network) and waits
                for a client, which attaches to the pods (monarch_spmd.kubernetes.proc_mesh) and
                runs programs on them again and again (setup_torch_elastic_env, SPMDActor.main)
                without new pods. Monarch needs podLayout PerHost (one pod per coordinate of every
                dimension but the last; the client spawns the last dimension's procs in it), no
                args, and torchmonarch in the image (spec.python must import monarch; the worker
                exits 64, a permanent failure, when it cannot). Its pods stay up until the job is
                deleted or suspended or activeDeadlineSeconds passes; the job never succeeds, and a
                pod that exits (with any code) or is lost replaces the whole gang. It is Running
                when every pod is Ready: a readiness probe checks the worker's port. Immutable after
                creation."""),
        ),
        "shmSize": Str(
            max_length=32,
            rules=(Matches(MEMORY_QUANTITY, "a memory quantity such as 512Mi, 2Gi or 1G"),
                   QuantityRange(SHM_SIZE_MIN, SHM_SIZE_MAX, "a memory quantity")),
            description=_d(f"""
                Size limit of the memory-backed /dev/shm every pod gets (NCCL, gloo and DataLoader
                workers use shared memory; a container runtime's default is often 64 MiB). A
                memory quantity from {SHM_SIZE_MIN} to {SHM_SIZE_MAX} such as 2Gi; it counts
                against the pod's memory limit. Unset: no limit of its own. A volume the template
                mounts at /dev/shm replaces it."""),
        ),
        "scheduling": Obj(
            default={},
            flatten=True,
            rules=(QueueForKueue(),),
            description=_d("""
                Who admits or gang-schedules the job's pods, and how long a pod may wait to be
                placed. provider None (default): the cluster's scheduler places pods one by one.
                Kueue: the job waits, with no pod, until Kueue admits its whole gang on quota
                (the operator writes a Kueue Workload; queue names the LocalQueue). Volcano or
                Coscheduling (scheduler-plugins): each attempt gets a PodGroup with minMember = its
                pods, so the scheduler binds all of them or none; the pods use that scheduler
                (schedulerName) and join the group. See the README's GPU guide."""),
            properties={
                "provider": Str(
                    enum=SCHEDULING_PROVIDERS, default=SCHEDULING_NONE, attr="scheduling_provider",
                    description="None (default), Kueue, Volcano or Coscheduling.",
                ),
                "queue": Str(
                    attr="scheduling_queue", max_length=253,
                    rules=(Matches(DNS_1123_SUBDOMAIN, "a queue name is a DNS subdomain: lowercase letters, digits, '-' and '.'"),),
                    description=_d("""
                        Kueue: the LocalQueue (in the job's namespace) that admits the job;
                        required. Volcano: the queue of the PodGroup (default: Volcano's default
                        queue)."""),
                ),
                "schedulerName": Str(
                    attr="scheduler_name", max_length=253,
                    rules=(Matches(DNS_1123_SUBDOMAIN, "a scheduler name is a DNS subdomain"),),
                    description=_d("""
                        The scheduler of the pods. Default: volcano for Volcano,
                        scheduler-plugins-scheduler for Coscheduling, else the template's
                        schedulerName (or the cluster's default scheduler)."""),
                ),
                "timeoutSeconds": Int(
                    attr="scheduling_timeout_seconds", minimum=1, maximum=MAX_SCHEDULING_TIMEOUT,
                    description=_d(f"""
                        Fail the job (reason SchedulingTimeout, no restart) when one of its pods
                        has been unschedulable this many seconds since it was created; also the
                        PodGroup's scheduleTimeoutSeconds for Coscheduling. Unset: wait for as
                        long as it takes (the job's status and Events say why it waits).
                        1..{MAX_SCHEDULING_TIMEOUT}."""),
                ),
            },
        ),
        "failureOutput": Str(
            enum=FAILURE_OUTPUTS, default=FAILURE_OUTPUT_TAIL,
            description=_d(f"""
                Whether the end of the failing rank's output reaches what anyone who may read the
                SPMDJob sees. {FAILURE_OUTPUT_TAIL} (default): its last lines (stdout and stderr,
                a traceback) are in status.failure.message, the Restarting and failure Events and
                the pods' termination messages. {FAILURE_OUTPUT_NONE}: never; the failure names
                the rank, its pod, exit code and reason, and the output stays in the pods' logs
                (pods/log rights). For jobs whose output may hold secrets. Changes only while the
                job is suspended."""),
        ),
        "template": TEMPLATE,
    },
)

_TIME: Final = "date-time"

STATUS: Final = Obj(
    description="The observed state of the job, written by the operator only.",
    properties={
        "phase": Str(
            enum=("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"),
            description=_d("""
                Pending: pods created, not all running yet. Running: every proc's pod is running.
                Restarting: the gang is being replaced after a retryable failure. Succeeded: every
                rank exited 0. Failed: a permanent failure, the restart limit, the deadline or an
                invalid spec (see failure and conditions). Suspended: spec.suspend."""),
        ),
        "reason": Str(description=_d("""
            Why the job is in its phase, in one word: AllProcsRunning, Unschedulable,
            ImagePullBackOff, WaitingForAdmission, GangRestart, PermanentFailure ...""")),
        "message": Str(description="What the reason means for this job, in one line (kubectl get spmdjob -o wide)."),
        "mesh": Str(description="The ordered mesh as name=size pairs, e.g. hosts=2,gpus=4."),
        "procs": Int(description="The number of procs (pods per attempt)."),
        "restarts": Int(description=_d("""
            How many times the gang restarted, in place or by recreating its pods: the current
            attempt's number (TORCHELASTIC_RESTART_COUNT).""")),
        "gangRestart": Int(description=_d("""
            The restart count the current gang of pods was created for: their
            spmd.monarch.dev/restart label and the master Service they use. Present only while
            restarts in place have raised restarts above it (mode InPlace).""")),
        "lastProgressTime": Str(format=_TIME, description=_d("""
            Mode InPlace: when the rank that has been silent longest last wrote output, as the
            agents report it (every 5 s) while the gang runs. Written at most every 5 minutes while
            it moves, so a job whose ranks all write output shows a time within the last 5
            minutes; a hung rank leaves it behind (see restartPolicy.progressTimeoutSeconds).
            The metric spmdjob_seconds_since_progress has it at every scrape.""")),
        "disruptions": Int(description=_d("""
            How many of those replacements followed a disruption (a pod preempted, evicted, drained
            or lost with its node): they do not count against restartPolicy.maxRestarts.""")),
        "spares": Obj(
            description="spec.spares: the hot spares of the current attempt, as its coordinator reports them.",
            properties={
                "ready": Int(description="Spares connected to the gang's coordinator and waiting to take a lost pod's place."),
                "used": Int(description=_d("""
                    Lost pods whose place a spare took in the current attempt (each pod then runs as
                    that pod, labelled with its rank; a new spare replaces it).""")),
                "attempt": Int(description="The attempt (gang) these spares are of."),
                "next": Int(description=_d("""
                    The index the attempt's next spare pod is named with (<job>-<id>-r<attempt>-s<next>):
                    an index is never used twice in an attempt, so a new spare never takes the name
                    of one that crashed or took a place.""")),
                "crashed": Int(description=_d("""
                    Spare pods of the current attempt that ended failing in a row (each deleted):
                    the next one waits a back-off of 10 s, doubling up to 300 s, until a spare is
                    ready again.""")),
                "retryTime": Str(format=_TIME, description=_d("""
                    While spares crash: when the next spare pod may be created.""")),
            },
        ),
        "badNodes": Arr(
            description=_d("""
                Nodes where the job's ranks failed (counted failures, never disruptions) within the
                last hour, at most 32: at 3 such failures a node is bad for the job, its new pods
                keep off it (required node affinity hostname NotIn) and its in-place members there
                are replaced elsewhere, unless that left a pod unschedulable (avoided false)."""),
            items=Obj(
                description="A node's counted rank failures within the hour.",
                properties={
                    "node": Str(description="The node's name."),
                    "failures": Int(description="Counted rank failures on it within the hour (at most 10)."),
                    "times": Arr(items=Str(format=_TIME, description="When a counted failure came."),
                                 description="When each of them came, oldest first."),
                    "avoided": Bool(description=_d("""
                        Present once it is bad (3 failures within the hour): true while new pods keep
                        off it; false once a pod could not be scheduled elsewhere (not kept off).""")),
                    "since": Str(format=_TIME, description="When it became bad."),
                },
            ),
        ),
        "groups": Arr(
            description=_d("""
                spec.replicaGroups: each group job (<job>-g<index>) as its own status says it: a
                group restarts, loses pods and fails on its own."""),
            items=Obj(
                description="One replica group.",
                properties={
                    "index": Int(description="The group's index, REPLICA_GROUP_ID."),
                    "name": Str(description="Its SPMDJob's name."),
                    "phase": Str(description="Its phase."),
                    "restarts": Int(description="Its restarts (its own maxRestarts is its budget)."),
                    "disruptions": Int(description="Of those, the disruptions (not counted)."),
                    "reason": Str(description="Its reason."),
                },
            ),
        ),
        "replicaGroups": Obj(
            description="spec.replicaGroups: how many groups run, succeeded and failed for good.",
            properties={
                "count": Int(description="spec.replicaGroups.count."),
                "minReplicas": Int(description="spec.replicaGroups.minReplicas."),
                "running": Int(description="Groups Running now."),
                "succeeded": Int(description="Groups that succeeded."),
                "failed": Int(description="Groups failed for good."),
            },
        ),
        "lostNodes": Arr(
            description=_d("""
                Nodes lost under this job in the last 10 minutes (a pod's agent fell silent while the
                pod showed Running, its node stopped reporting, or a pod deleted stayed Running well
                past its grace): the job's pods there never hold a new attempt up, and new pods keep
                off such a node while a pod of the job there has not ended."""),
            items=Obj(
                description="A node judged lost, and when.",
                properties={
                    "node": Str(description="The node's name."),
                    "time": Str(format=_TIME, description="When it was judged lost."),
                },
            ),
        ),
        "size": Obj(
            description=_d("""
                An elastic job's (mesh[0].minSize) current size: the pods and procs of the round
                that runs (or ran last), as its coordinator started it."""),
            properties={
                "pods": Int(description="Pods in the round, from mesh[0].minSize to mesh[0].size."),
                "procs": Int(description="Procs in the round: its WORLD_SIZE."),
                "members": Arr(description="The pods' indices (their first mesh coordinate) in the round, in rank order.",
                               items=Int(description="A pod's index.")),
            },
        ),
        "running": Int(description="Procs of the current attempt whose pod is running."),
        "succeeded": Int(description="Procs of the current attempt that exited 0."),
        "failed": Int(description="Procs of the current attempt that failed."),
        "masterAddr": Str(description="MASTER_ADDR of every proc of the current attempt: the DNS name of its headless Service, <job>-<id>-m<attempt>.<namespace>.svc."),
        "startTime": Str(format=_TIME, description="When the job started (or was last resumed); activeDeadlineSeconds counts from here."),
        "completionTime": Str(format=_TIME, description="When the job succeeded or failed; ttlSecondsAfterFinished counts from here."),
        "observedGeneration": Int(format="int64", description="The metadata.generation this status was computed from."),
        "failure": Obj(
            description=_d("""
                Root cause of the most recent gang failure: the rank that failed first in that
                attempt, with its pod, node, exit code, reason and the last lines of its message
                (the container's termination message, the end of its log, or what its agent
                reported; none of the program's output with spec.failureOutput None)."""),
            properties={
                "rank": Int(description="The rank that failed first."),
                "pod": Str(description="Its pod."),
                "node": Str(description="The node the pod ran on."),
                "exitCode": Int(description="The trainer container's exit code (absent when the pod was lost or deleted)."),
                "reason": Str(description=_d("""
                    Why, e.g. Error, Signal, OOMKilled, WatchdogTimeout, NoProgress, MemberLost,
                    Evicted, PodDeleted, PodMissing, InvalidImageName.""")),
                "message": Str(description="The last lines of the termination message or log."),
                "restart": Int(description="The attempt (restart count) that failed."),
                "permanent": Bool(description="Whether the failure was judged permanent (no restart)."),
                "disruption": Bool(description="Whether the cluster took the pod away (preemption, eviction, node loss): not counted against maxRestarts."),
                "time": Str(format=_TIME, description="When the failure happened (or was observed)."),
                "inPlace": Bool(description="Whether the gang restarted in place after it (mode InPlace)."),
                "backoffSeconds": Int(description="In place: how long the next round waited (back-off) before it started."),
            },
        ),
        "refusal": Obj(
            description=_d("""
                Set while the API server refuses to create a child of the job (403: a
                ResourceQuota, Pod Security admission, another admission plugin or RBAC): the job
                waits in its phase, retrying with back-off, and releases the pods of a gang left
                incomplete for 30 s. Removed once every child exists. A 400/422 (an invalid pod)
                fails the job instead (reason InvalidSpec, see failure)."""),
            properties={
                "reason": Str(description="QuotaExceeded, PodSecurity or Forbidden."),
                "message": Str(description=_d("""
                    The refusal in the job's terms: the quota and resources (requested, used,
                    limited), or the Pod Security level and the fields of spec.template to set.""")),
                "cause": Str(description="What the refusal is about (the quota and resources, the level): one Warning Event per cause."),
                "kind": Str(description="The refused child's kind: Pod, Service, ConfigMap, PodGroup or Workload."),
                "name": Str(description="The refused child's name."),
                "code": Int(description="The HTTP status of the refusal (403)."),
                "since": Str(format=_TIME, description="The first refusal of this cause in a row."),
                "lastTime": Str(format=_TIME, description="The latest refusal."),
                "retries": Int(description="Refusals of this cause in a row."),
                "retryAt": Str(format=_TIME, description="No child is created before this time (back-off)."),
                "heldSince": Str(format=_TIME, description="Since when the incomplete gang has held pods."),
                "releases": Int(description="How many times the incomplete gang's pods were deleted to free what they held."),
                "releasedAt": Str(format=_TIME, description="When they were last deleted."),
                "probe": Str(description="After a back-off, the one pod tried first; the rest follow once it exists."),
                "probed": Bool(description="The probe was taken: the rest of the gang is created at once."),
            },
        ),
        "startFailures": Obj(
            description=_d("""
                Pods of the current attempt whose container cannot start (ErrImagePull,
                ImagePullBackOff, CreateContainerConfigError ...), by pod name, with when the
                problem was first seen: the start-failure limit counts from there (an operator
                restart does not reset it; a problem that clears does)."""),
            values=Obj(
                description="One pod's start failure.",
                properties={
                    "reason": Str(description="The container's waiting reason."),
                    "since": Str(format=_TIME, description="When the operator first saw the container unable to start."),
                },
            ),
        ),
        "specWarnings": Arr(
            items=Str(description="A rule and what breaks it, as spec.field: message."),
            description=_d("""
                Rules of this operator version that the job's spec breaks although the job was
                admitted before them (e.g. after an upgrade): the job keeps running, a Warning
                Event OutdatedSpec said so once, and a new job with the same spec would be
                refused."""),
        ),
        "conditions": Arr(
            list_type="map",
            map_keys=("type",),
            description="Standard conditions; types Created, Running, Restarting, Succeeded, Failed, Suspended, and "
                        "CoordinatorReachable (restart in place: False while the operator has not heard the gang's "
                        "coordinator for 30s).",
            items=Obj(
                description="One condition.",
                properties={
                    "type": Str(required=True, description="Created, Running, Restarting, Succeeded, Failed or Suspended."),
                    "status": Str(required=True, enum=("True", "False", "Unknown"), description="True, False or Unknown."),
                    "reason": Str(description="A CamelCase reason for the last transition."),
                    "message": Str(description="A human-readable explanation."),
                    "lastTransitionTime": Str(format=_TIME, description="When the status last changed."),
                    "observedGeneration": Int(format="int64", description="The metadata.generation the condition was set from."),
                },
            ),
        ),
    },
)

ROOT: Final = Obj(
    description=_d(f"""
        SPMDJob runs one training program as a gang of processes ("procs") laid out on an ordered
        mesh of named dimensions, one pod per proc, each with the torchrun environment (RANK,
        WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, TORCHELASTIC_* ...) computed from its mesh
        coordinates. The gang starts, restarts and finishes as a whole. The job's name must be a
        DNS-1035 label of at most {MAX_JOB_NAME_LENGTH} characters."""),
    rules=(JobName(), ReplicaGroupsJobName()),
    properties={
        "apiVersion": Str(description=f"The versioned schema of this object, {API_VERSION}."),
        "kind": Str(description=f"The kind of this object, {KIND}."),
        "metadata": ObjectMeta(description="The object's metadata (the CRD may declare only its type)."),
        "spec": dataclasses.replace(SPEC, required=True, example="an SPMDJob needs at least spec.mesh, spec.args and spec.image"),
        "status": STATUS,
    },
)

#: ``kubectl get spmdjob`` columns.
PRINTER_COLUMNS: Final = (
    {"name": "Mesh", "type": "string", "jsonPath": ".status.mesh", "description": "The ordered mesh, e.g. hosts=2,gpus=4."},
    {"name": "Procs", "type": "integer", "jsonPath": ".status.procs", "description": "Number of procs (one pod each)."},
    {"name": "Running", "type": "integer", "jsonPath": ".status.running", "description": "Procs of the current attempt whose pod is running."},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Pending, Running, Restarting, Succeeded, Failed or Suspended."},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "description": "Gang restarts so far."},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1, "description": "Why the job is in its phase (a waiting or failure reason)."},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1, "description": "What the reason means for this job."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": "Time since the job was created."},
)
SHORT_NAMES: Final = ("spmd", "sj")


# --- the parser -------------------------------------------------------------------------------


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()


def attributes(node: Obj, value: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSpec attributes of a validated, defaulted spec: one per table entry (snake_case)."""
    out: dict[str, Any] = {}
    for key, child in node.properties.items():
        raw = value.get(key)
        if isinstance(child, Obj) and child.flatten:
            out.update(attributes(child, raw or {}))
        else:
            out[child.attr or _snake(key)] = child.convert(raw) if child.convert else raw
    return out


def _errors(problems: list[schema.Problem]) -> list[SpecError]:
    return [SpecError(p.path, p.message, policy=p.policy) for p in problems]


def check_job_spec(spec: object, *, require_image: bool = False) -> tuple[Any, list[SpecError]]:
    """Checks an SPMDJob ``spec`` as the API server would; returns ``(defaulted spec, errors)``."""
    optional = () if require_image else ("spec.image",)
    value, problems = schema.validate(SPEC, spec, "spec", optional=optional)
    return value, _errors(problems)


def parse_job_spec(spec: Mapping[str, Any], *, require_image: bool = False) -> JobSpec:
    """Parses and validates an SPMDJob ``spec`` (the manifest's camelCase mapping).

    Args:
        spec: the ``spec`` of an SPMDJob manifest.
        require_image: the operator needs ``image``; the local runner does not.

    Returns:
        The validated :class:`JobSpec`, defaults filled in.

    Raises:
        SpecError: the first problem, naming the field path and what would be valid.
    """
    value, errors = check_job_spec(spec, require_image=require_image)
    if errors:
        raise errors[0]
    return JobSpec(**attributes(SPEC, value))


class Stored(NamedTuple):
    """What :func:`parse_stored` returns."""

    spec: JobSpec
    #: The policy rules the spec breaks (rules the API server gives new jobs; see SpecError.policy).
    outdated: tuple[SpecError, ...]


def parse_stored(spec: Mapping[str, Any]) -> Stored:
    """Parses the spec of a job the API server has stored, which may predate this version's rules.

    A stricter rule added later (a policy, :attr:`monarch_spmd.schema.Rule.policy`: the shmSize
    range, reserved variables, template quantities ...) must not stop a job that was admitted
    before it: such a spec is parsed, and its violations returned for the operator to report
    (it refuses them only for a job that never started). What the operator cannot run at all
    (a wrong type, a missing field, an argv of the wrong form, a mesh too large) still raises.

    Raises:
        SpecError: the first problem that is not a policy's, naming the field.
    """
    value, errors = check_job_spec(spec, require_image=True)
    hard = [e for e in errors if not e.policy]
    if hard:
        raise hard[0]
    return Stored(JobSpec(**attributes(SPEC, value)), tuple(errors))


_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _quantities(pod_spec: Mapping[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) of every resource quantity of a PodSpec: container resources, overhead, emptyDir sizes."""
    def key(name: str) -> str:
        return f".{name}" if _KEY.fullmatch(name) else f"[{name}]"

    for kind in ("initContainers", "containers"):
        containers = pod_spec.get(kind)
        for i, container in enumerate(containers if isinstance(containers, list) else []):
            resources = container.get("resources") if isinstance(container, Mapping) else None
            for part in ("limits", "requests"):
                values = resources.get(part) if isinstance(resources, Mapping) else None
                for name, value in (values.items() if isinstance(values, Mapping) else ()):
                    yield f"{path}.{kind}[{i}].resources.{part}{key(str(name))}", value
    overhead = pod_spec.get("overhead")
    for name, value in (overhead.items() if isinstance(overhead, Mapping) else ()):
        yield f"{path}.overhead{key(str(name))}", value
    volumes = pod_spec.get("volumes")
    for i, volume in enumerate(volumes if isinstance(volumes, list) else []):
        empty = volume.get("emptyDir") if isinstance(volume, Mapping) else None
        if isinstance(empty, Mapping) and empty.get("sizeLimit") is not None:
            yield f"{path}.volumes[{i}].emptyDir.sizeLimit", empty["sizeLimit"]


def pod_problems(spec: Mapping[str, Any]) -> list[SpecError]:
    """What the API server would refuse in every pod built from a spec the CRD accepts: each
    resource quantity of the template that no pod can hold, naming the field and the value.

    Beyond the CRD on purpose: the one schema CEL could check a quantity in
    (``x-kubernetes-int-or-string``) would refuse ``cpu: 0.5``, which pods take. The operator
    names the same field when the API server refuses the pod (:mod:`spmd_operator.podpaths`);
    ``monarch-spmd validate`` reports it before the job is applied.
    """
    template = spec.get("template") if isinstance(spec, Mapping) else None
    pod_spec = template.get("spec") if isinstance(template, Mapping) else None
    if not isinstance(pod_spec, Mapping):
        return []
    out = []
    for path, value in _quantities(pod_spec, "spec.template.spec"):
        if isinstance(value, str):
            ok = quantity.is_quantity(value.strip())  # the pod's decoder trims spaces first
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            out.append(SpecError(path, f"{schema.show(value)} is not a resource quantity: every pod of the job would "
                                       "be refused; write a number or digits with a suffix, e.g. 500m, 2, 4Gi or 1e3"))
    return out


def job_name_error(name: object) -> str | None:
    """Why ``name`` is not a valid job name, or None."""
    if not isinstance(name, str) or not name:
        return "required; name the job, e.g. hello"
    if len(name) > MAX_JOB_NAME_LENGTH or not DNS_1035_LABEL.matches(name):
        return (f"{name!r} is not valid; a job name is a DNS-1035 label of at most {MAX_JOB_NAME_LENGTH} "
                "characters (lowercase letters, digits and '-', starting with a letter, ending with a "
                "letter or digit) so that its pods' and service's names stay valid")
    return None


def check_job_name(name: object, path: str = "metadata.name") -> str:
    """Checks that ``name`` is a DNS-1035 label of at most MAX_JOB_NAME_LENGTH characters.

    Raises:
        SpecError: saying what a valid name looks like.
    """
    error = job_name_error(name)
    if error:
        raise SpecError(path, error)
    assert isinstance(name, str)
    return name


_GENERATED_SUFFIX: Final = "bcdfghjklmnpqrstvwxz2456789"


def _generated(prefix: str) -> str:
    """A name as the API server makes one from generateName (prefix cut to 58, 5 random characters)."""
    return prefix[:58] + "".join(random.choice(_GENERATED_SUFFIX) for _ in range(5))


def check_manifest(doc: object, *, require_image: bool = True, old: object = MISSING) -> tuple[Any, list[SpecError]]:
    """Checks a whole SPMDJob manifest as the API server checks a create (an update with ``old``,
    the object as stored: the fields that shape the pods may then change only while suspended).

    Returns:
        ``(the object as the server would store it, every error found)``; the errors name their
        field (``spec.mesh[1].size``, ``metadata.name``) and say what would be valid.
    """
    if not isinstance(doc, Mapping):
        return doc, [SpecError("manifest", f"expected an {KIND} object (a mapping), got {type(doc).__name__}")]
    errors = []
    if doc.get("apiVersion") != API_VERSION:
        errors.append(SpecError("apiVersion", f"{doc.get('apiVersion')!r} is not valid; expected {API_VERSION}"))
    if doc.get("kind") != KIND:
        errors.append(SpecError("kind", f"{doc.get('kind')!r} is not valid; expected {KIND}"))
    if errors:
        return doc, errors
    optional = () if require_image else ("spec.image",)
    if isinstance(old, Mapping):
        old, _ = schema.validate(ROOT, old, "", optional=optional)  # as the server stored it: defaulted
    value, problems = schema.validate(ROOT, doc, "", old=old, optional=optional, reset=("status",))
    return value, _errors(problems)


def load_manifest(doc: object, *, require_image: bool = False) -> Manifest:
    """Checks a whole SPMDJob manifest (a mapping read from YAML or JSON) and parses its spec.

    Args:
        doc: the manifest: apiVersion, kind, metadata (name, optional namespace) and spec.
        require_image: the operator and ``kubectl apply`` need ``spec.image``; the local runner
            does not.

    Returns:
        ``(name, namespace, spec)``; the namespace defaults to ``default``, and a manifest with only
        ``metadata.generateName`` gets a name made from it, as the API server would.

    Raises:
        SpecError: the first problem, naming the field and what would be valid.
    """
    value, errors = check_manifest(doc, require_image=require_image)
    if errors:
        raise errors[0]
    metadata = value["metadata"]
    name = metadata.get("name") or _generated(metadata["generateName"])
    return Manifest(name, metadata.get("namespace") or "default", JobSpec(**attributes(SPEC, value["spec"])))
