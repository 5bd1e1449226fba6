"""The SPMDJob spec: its defaults, its parser and its validation, shared by cluster and laptop.

Where it sits: above :mod:`monarch_spmd.payload.contract` and :mod:`monarch_spmd.worker` (it reuses the
mesh validation of the one and the variable names of the other), below the local runner and the
Kubernetes operator (``spmd_operator``), which both read an SPMDJob through
:func:`parse_job_spec` / :func:`load_manifest`. Standard library only.

The CustomResourceDefinition (``crds/spmd.monarch.dev_spmdjobs.yaml``) rejects most bad input at
admission; this module checks the same rules again (for the local runner, which has no API
server) and what the CRD cannot express: the contents of the free-form pod template. Every error
is a :class:`SpecError` naming the field path (``spec.mesh[1].size``) and what would be valid.

A spec in one picture (camelCase as in the manifest; defaults shown)::

    spec:
      mesh: [{name: hosts, size: 2}, {name: gpus, size: 4}]   # required; the last dim is local
      args: ["-m", "train", "--lr", "0.001"]                  # required; SPMDActor.main's argv
      image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime    # required on Kubernetes
      python: python3
      masterPort: 29500
      gpusPerProc: 0
      colocate: false
      restartPolicy: {maxRestarts: 3, permanentExitCodes: [], retryableExitCodes: [],
                      permanentReasons: []}
      rendezvousTimeoutSeconds: 300
      activeDeadlineSeconds: null
      ttlSecondsAfterFinished: null
      suspend: false
      template: {metadata: {labels: {}, annotations: {}}, spec: {}}
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from .payload import contract, names

GROUP: Final = names.GROUP
VERSION: Final = names.VERSION
API_VERSION: Final = names.API_VERSION
KIND: Final = names.KIND

#: A job's name is a DNS-1035 label of at most this many characters, so that every child's name
#: (``<job>-r<restart>-<rank>``, ``<job>-master``, ``<job>-worker``) stays a valid DNS label.
MAX_JOB_NAME_LENGTH: Final = 50
#: A mesh dimension name becomes the label key ``spmd.monarch.dev/coord-<name>``, whose name part
#: may hold 63 characters, so a dimension name may hold 63 - len("coord-") = 57.
MAX_DIM_NAME_LENGTH: Final = 57
MAX_RESTARTS_LIMIT: Final = 100
MAX_GPUS_PER_PROC: Final = 16
MAX_RENDEZVOUS_TIMEOUT: Final = 86400
#: The container of the pod template that the operator merges into (the others are sidecars).
TRAINER_CONTAINER: Final = names.TRAINER_CONTAINER

DEFAULT_PYTHON: Final = "python3"
DEFAULT_MASTER_PORT: Final = 29500
DEFAULT_MAX_RESTARTS: Final = 3
DEFAULT_RENDEZVOUS_TIMEOUT: Final = 300

#: Worker input variables a user may set in the template's ``trainer`` container (the user's value
#: wins). Every other ``MONARCH_SPMD_*`` variable belongs to the operator and is rejected.
USER_SETTABLE_VARS: Final = names.USER_SETTABLE_VARS
_RESERVED_PREFIX: Final = names.RESERVED_PREFIX

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class SpecError(ValueError):
    """An SPMDJob spec (or manifest) is invalid.

    Attributes:
        field: the path of the offending field, e.g. ``spec.mesh[1].size``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class MeshDim:
    """One named mesh dimension.

    Attributes:
        name: a DNS label of at most MAX_DIM_NAME_LENGTH characters, unique in the mesh.
        size: the number of procs along this dimension, at least 1.
    """

    name: str
    size: int


@dataclass(frozen=True)
class JobSpec:
    """A parsed, validated SPMDJob spec (the blueprint; pods are its instances).

    Attributes:
        mesh: the ordered mesh; the last dimension is the local one.
        args: the training argv, ``("-m", module, ...)`` or ``(script, ...)``.
        image: the container image of every proc (None only outside Kubernetes).
        python: the interpreter in the image that runs the worker and the training argv.
        master_port: the port of rank 0's TCPStore.
        gpus_per_proc: ``nvidia.com/gpu`` per pod; at least 1 makes each pod its own torchrun
            node (LOCAL_RANK=0, LOCAL_WORLD_SIZE=1).
        colocate: prefer to schedule the procs sharing the first mesh coordinate on one node.
        max_restarts: how many times the whole gang may be replaced after a retryable failure.
        permanent_exit_codes: exit codes that fail the job at once.
        retryable_exit_codes: if non-empty, the only exit codes (besides pod loss and the
            worker's 75) that restart the gang; any other code is then permanent.
        permanent_reasons: pod or container reasons (e.g. ``OOMKilled``) that fail the job at once.
        rendezvous_timeout_seconds: how long a worker waits for the master to resolve and accept.
        active_deadline_seconds: the job fails with DeadlineExceeded after running this long.
        ttl_seconds_after_finished: the job is deleted this long after it finished.
        suspend: hold the job: no pods run while true.
        template: the pod template (``metadata`` labels/annotations, ``spec``), deep-copied.
    """

    mesh: tuple[MeshDim, ...]
    args: tuple[str, ...]
    image: str | None = None
    python: str = DEFAULT_PYTHON
    master_port: int = DEFAULT_MASTER_PORT
    gpus_per_proc: int = 0
    colocate: bool = False
    max_restarts: int = DEFAULT_MAX_RESTARTS
    permanent_exit_codes: tuple[int, ...] = ()
    retryable_exit_codes: tuple[int, ...] = ()
    permanent_reasons: tuple[str, ...] = ()
    rendezvous_timeout_seconds: int = DEFAULT_RENDEZVOUS_TIMEOUT
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    suspend: bool = False
    template: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=True)

    @property
    def mesh_pairs(self) -> list[tuple[str, int]]:
        """The mesh as ``(name, size)`` pairs, the form :mod:`monarch_spmd.payload.contract` takes."""
        return [(d.name, d.size) for d in self.mesh]

    @property
    def world_size(self) -> int:
        """The number of procs (pods) of the job."""
        return contract.world_size(self.mesh_pairs)


class Manifest(NamedTuple):
    """What :func:`load_manifest` returns."""

    name: str
    namespace: str
    spec: JobSpec


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(spec: Mapping[str, Any], key: str, path: str, default: int | None, low: int, high: int | None) -> int | None:
    value = spec.get(key)
    if value is None:
        return default
    valid = f"an integer in {low}..{high}" if high is not None else f"an integer of at least {low}"
    if not _is_int(value) or value < low or (high is not None and value > high):
        raise SpecError(f"{path}.{key}", f"{value!r} is not valid; expected {valid}")
    return value


def _bool(spec: Mapping[str, Any], key: str, path: str) -> bool:
    value = spec.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise SpecError(f"{path}.{key}", f"{value!r} is not valid; expected true or false")
    return value


def _str(spec: Mapping[str, Any], key: str, path: str, default: str | None) -> str | None:
    value = spec.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise SpecError(f"{path}.{key}", f"{value!r} is not valid; expected a non-empty string without surrounding spaces")
    return value


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(path, f"expected an object, got {type(value).__name__}")
    return value


def _list(value: object, path: str) -> Sequence[Any]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise SpecError(path, f"expected a list, got {type(value).__name__}")
    return value


def _parse_mesh(raw: object) -> tuple[MeshDim, ...]:
    if raw is None:
        raise SpecError("spec.mesh", "required; give the ordered dimensions, e.g. [{name: hosts, size: 2}, {name: gpus, size: 4}]")
    items = _list(raw, "spec.mesh")
    pairs: list[tuple[Any, Any]] = []
    for i, item in enumerate(items):
        dim = _mapping(item, f"spec.mesh[{i}]")
        extra = set(dim) - {"name", "size"}
        if extra:
            raise SpecError(f"spec.mesh[{i}]", f"unknown field(s) {sorted(extra)}; a dimension has only name and size")
        name, size = dim.get("name"), dim.get("size")
        if isinstance(name, str) and len(name) > MAX_DIM_NAME_LENGTH:
            raise SpecError(
                f"spec.mesh[{i}].name",
                f"{name!r} has {len(name)} characters; at most {MAX_DIM_NAME_LENGTH} are allowed "
                "(it becomes the label key spmd.monarch.dev/coord-<name>)",
            )
        pairs.append((name, size))
    try:
        checked = contract.validate_mesh(pairs)
    except ValueError as e:
        where, _, what = str(e).partition(": ")
        raise SpecError(f"spec.{where}", what) from None
    return tuple(MeshDim(name, size) for name, size in checked)


def _parse_args(raw: object) -> tuple[str, ...]:
    hint = "expected ['-m', MODULE, ARGS...] or [SCRIPT.py, ARGS...]"
    if raw is None:
        raise SpecError("spec.args", f"required; {hint}")
    items = _list(raw, "spec.args")
    for i, arg in enumerate(items):
        if not isinstance(arg, str):
            raise SpecError(f"spec.args[{i}]", f"{arg!r} is not a string; quote it in YAML")
    args = tuple(items)
    if not args:
        raise SpecError("spec.args", f"must not be empty; {hint}")
    if args[0] == "-m":
        if len(args) < 2 or not args[1]:
            raise SpecError("spec.args", f"'-m' needs a module name after it; {hint}")
    elif not args[0] or args[0].startswith("-"):
        raise SpecError("spec.args[0]", f"{args[0]!r} is not a script path or '-m'; {hint}")
    return args


def _parse_codes(raw: object, path: str) -> tuple[int, ...]:
    codes = _list(raw, path)
    for i, code in enumerate(codes):
        if not _is_int(code) or not 1 <= code <= 255:
            raise SpecError(f"{path}[{i}]", f"{code!r} is not valid; an exit code is an integer in 1..255 (0 means success)")
    return tuple(dict.fromkeys(codes))


def _parse_restart_policy(raw: object) -> dict[str, Any]:
    path = "spec.restartPolicy"
    policy = _mapping(raw, path)
    extra = set(policy) - {"maxRestarts", "permanentExitCodes", "retryableExitCodes", "permanentReasons"}
    if extra:
        raise SpecError(path, f"unknown field(s) {sorted(extra)}; see `kubectl explain spmdjob.spec.restartPolicy`")
    permanent = _parse_codes(policy.get("permanentExitCodes"), f"{path}.permanentExitCodes")
    retryable = _parse_codes(policy.get("retryableExitCodes"), f"{path}.retryableExitCodes")
    both = sorted(set(permanent) & set(retryable))
    if both:
        raise SpecError(f"{path}.retryableExitCodes", f"exit code(s) {both} are also listed as permanent; keep each code in one list")
    reasons = _list(policy.get("permanentReasons"), f"{path}.permanentReasons")
    for i, reason in enumerate(reasons):
        if not isinstance(reason, str) or not reason:
            raise SpecError(f"{path}.permanentReasons[{i}]", f"{reason!r} is not valid; expected a reason such as OOMKilled or Evicted")
    return {
        "max_restarts": _int(policy, "maxRestarts", path, DEFAULT_MAX_RESTARTS, 0, MAX_RESTARTS_LIMIT),
        "permanent_exit_codes": permanent,
        "retryable_exit_codes": retryable,
        "permanent_reasons": tuple(dict.fromkeys(reasons)),
    }


def _check_string_map(raw: object, path: str) -> None:
    for key, value in _mapping(raw, path).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SpecError(f"{path}.{key}", f"{value!r} is not valid; labels and annotations are strings (quote numbers in YAML)")


def _parse_template(raw: object) -> dict[str, Any]:
    path = "spec.template"
    template = _mapping(raw, path)
    extra = set(template) - {"metadata", "spec"}
    if extra:
        raise SpecError(path, f"unknown field(s) {sorted(extra)}; a template has metadata and spec")
    metadata = _mapping(template.get("metadata"), f"{path}.metadata")
    extra = set(metadata) - {"labels", "annotations"}
    if extra:
        raise SpecError(f"{path}.metadata", f"unknown field(s) {sorted(extra)}; only labels and annotations are copied to pods")
    _check_string_map(metadata.get("labels"), f"{path}.metadata.labels")
    _check_string_map(metadata.get("annotations"), f"{path}.metadata.annotations")
    pod = _mapping(template.get("spec"), f"{path}.spec")
    policy = pod.get("restartPolicy")
    if policy not in (None, "Never"):
        raise SpecError(
            f"{path}.spec.restartPolicy",
            f"{policy!r} is not allowed; pods run with Never and the gang restart policy is spec.restartPolicy",
        )
    containers = _list(pod.get("containers"), f"{path}.spec.containers")
    trainers = 0
    for i, raw_container in enumerate(containers):
        cpath = f"{path}.spec.containers[{i}]"
        container = _mapping(raw_container, cpath)
        name = container.get("name")
        if name not in (None, TRAINER_CONTAINER):
            continue
        trainers += 1
        if trainers > 1:
            raise SpecError(cpath, f"a second {TRAINER_CONTAINER!r} container; give the trainer's settings once")
        for owned, instead in (("image", "spec.image"), ("command", "spec.python"), ("args", "spec.args")):
            if owned in container:
                raise SpecError(f"{cpath}.{owned}", f"set by the operator; use {instead} instead")
        for j, var in enumerate(_list(container.get("env"), f"{cpath}.env")):
            var_name = _mapping(var, f"{cpath}.env[{j}]").get("name")
            if isinstance(var_name, str) and var_name.startswith(_RESERVED_PREFIX) and var_name not in USER_SETTABLE_VARS:
                raise SpecError(
                    f"{cpath}.env[{j}].name",
                    f"{var_name} is set by the operator from the spec; only {', '.join(sorted(USER_SETTABLE_VARS))} may be overridden",
                )
    return copy.deepcopy(dict(template))


_SPEC_FIELDS: Final = frozenset(
    {
        "mesh", "args", "image", "python", "masterPort", "gpusPerProc", "colocate", "restartPolicy",
        "rendezvousTimeoutSeconds", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "suspend",
        "template",
    }
)


def parse_job_spec(spec: Mapping[str, Any], *, require_image: bool = False) -> JobSpec:
    """Parses and validates an SPMDJob ``spec`` (the manifest's camelCase mapping).

    Args:
        spec: the ``spec`` of an SPMDJob manifest.
        require_image: the operator needs ``image``; the local runner does not.

    Returns:
        The validated :class:`JobSpec`, defaults filled in.

    Raises:
        SpecError: naming the field path and what would be valid.
    """
    spec = _mapping(spec, "spec")
    extra = set(spec) - _SPEC_FIELDS
    if extra:
        raise SpecError("spec", f"unknown field(s) {sorted(extra)}; see `kubectl explain spmdjob.spec`")
    image = _str(spec, "image", "spec", None)
    if image is None and require_image:
        raise SpecError("spec.image", "required; name the container image every proc runs, e.g. pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime")
    if image is not None and any(c.isspace() for c in image):
        raise SpecError("spec.image", f"{image!r} contains whitespace; expected an image reference")
    return JobSpec(
        mesh=_parse_mesh(spec.get("mesh")),
        args=_parse_args(spec.get("args")),
        image=image,
        python=_str(spec, "python", "spec", DEFAULT_PYTHON) or DEFAULT_PYTHON,
        master_port=_int(spec, "masterPort", "spec", DEFAULT_MASTER_PORT, 1, 65535) or DEFAULT_MASTER_PORT,
        gpus_per_proc=_int(spec, "gpusPerProc", "spec", 0, 0, MAX_GPUS_PER_PROC) or 0,
        colocate=_bool(spec, "colocate", "spec"),
        rendezvous_timeout_seconds=_int(
            spec, "rendezvousTimeoutSeconds", "spec", DEFAULT_RENDEZVOUS_TIMEOUT, 1, MAX_RENDEZVOUS_TIMEOUT
        )
        or DEFAULT_RENDEZVOUS_TIMEOUT,
        active_deadline_seconds=_int(spec, "activeDeadlineSeconds", "spec", None, 1, None),
        ttl_seconds_after_finished=_int(spec, "ttlSecondsAfterFinished", "spec", None, 0, None),
        suspend=_bool(spec, "suspend", "spec"),
        template=_parse_template(spec.get("template")),
        **_parse_restart_policy(spec.get("restartPolicy")),
    )


def check_job_name(name: object, path: str = "metadata.name") -> str:
    """Checks that ``name`` is a DNS-1035 label of at most MAX_JOB_NAME_LENGTH characters.

    Raises:
        SpecError: saying what a valid name looks like.
    """
    if not isinstance(name, str) or not name:
        raise SpecError(path, "required; name the job, e.g. hello")
    if len(name) > MAX_JOB_NAME_LENGTH or not _DNS_1035.match(name):
        raise SpecError(
            path,
            f"{name!r} is not valid; a job name is a DNS-1035 label of at most {MAX_JOB_NAME_LENGTH} "
            "characters (lowercase letters, digits and '-', starting with a letter, ending with a "
            "letter or digit) so that its pods' and service's names stay valid",
        )
    return name


def load_manifest(doc: object, *, require_image: bool = False) -> Manifest:
    """Checks a whole SPMDJob manifest (a mapping read from YAML or JSON) and parses its spec.

    Args:
        doc: the manifest: apiVersion, kind, metadata (name, optional namespace) and spec.
        require_image: passed on to :func:`parse_job_spec`.

    Returns:
        ``(name, namespace, spec)``; the namespace defaults to ``default``.

    Raises:
        SpecError: naming the field and what would be valid.
    """
    manifest = _mapping(doc, "manifest")
    if manifest.get("apiVersion") != API_VERSION:
        raise SpecError("apiVersion", f"{manifest.get('apiVersion')!r} is not valid; expected {API_VERSION}")
    if manifest.get("kind") != KIND:
        raise SpecError("kind", f"{manifest.get('kind')!r} is not valid; expected {KIND}")
    metadata = _mapping(manifest.get("metadata"), "metadata")
    name = check_job_name(metadata.get("name"))
    namespace = metadata.get("namespace") or "default"
    if not isinstance(namespace, str) or len(namespace) > 63 or not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", namespace):
        raise SpecError("metadata.namespace", f"{namespace!r} is not a valid namespace name (a DNS label)")
    if manifest.get("spec") is None:
        raise SpecError("spec", "required; an SPMDJob needs at least spec.mesh and spec.args")
    return Manifest(name, namespace, parse_job_spec(manifest["spec"], require_image=require_image))
