"""From a pod's terms to the SPMDJob's: which field of the job a field of a built pod came from.

Where it sits: beside :mod:`spmd_operator.builders` (it reads a pod built by
:func:`~spmd_operator.builders.build_pod` and the rules that function follows), below the
lifecycle's refusal policy (:mod:`spmd_operator.lifecycle.refusal`), which turns the API server's
refusal of a pod into a message that names what the user wrote. Pure: no I/O.

The API server names a pod's fields (``spec.containers[1].resources.limits[memory]``), in a pod
the user never wrote: the operator inserted or merged the trainer container, appended its own
volumes, environment and mounts. :func:`job_path` finds the source by building the pod from a
template whose list entries carry a marker of where they came from
(``spec.template.spec.containers[0].env[3]``), then walking the pod along the path: the deepest
marked entry is the source, and what the operator sets from other fields of the spec is named as
such (``spec.image``, ``spec.args``, ``spec.gpusPerProc``, ``spec.shmSize``).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Final

from monarch_spmd.spec import JobSpec

from . import builders, names
from .names import JobRef

_STRICT_FIELD: Final = re.compile(r'(unknown|duplicate) field "([^"]+)"')


def strict_message(message: str) -> str:
    """A refusal for fields its type does not have (``strict decoding error: unknown field
    "spec.containers[0].resoures"``), written as the API server writes other invalid fields
    (``spec.containers[0].resoures: unknown field``), each path before a colon, so that the
    lifecycle can name the job's field it came from (:func:`translate`). The operator's creates
    and ``monarch-spmd pods --dry-run=server`` both use it. Any other message is returned as it is."""
    if "strict decoding error" not in message:
        return message
    return _STRICT_FIELD.sub(lambda m: f"{m.group(2)}: {m.group(1)} field", message)


#: The key under which a template entry carries its own path while a pod is built from it.
_SOURCE: Final = "\x00source"
_TOKEN: Final = re.compile(r"\.?([A-Za-z_$][A-Za-z0-9_$-]*)|\[([^\]]*)\]")
_SIMPLE_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A pod field path in an API server message: at the start of a cause, before its colon.
_PATH_IN_MESSAGE: Final = re.compile(r"(?<![\w.\]\"])((?:metadata|spec)(?:\.[A-Za-z_][A-Za-z0-9_]*|\[[^\]\s]*\])+)(?=:)")
#: Go's JSON decoder naming a field without indexes: "Go struct field PodSpec.spec.containers.ports".
_GO_FIELD: Final = re.compile(r"Go struct field \w+\.((?:spec|metadata)(?:\.\w+)+)")


def parse_path(path: str) -> list[str | int]:
    """``spec.containers[0].resources.limits[memory]`` -> ``["spec", "containers", 0, ..., "memory"]``."""
    out: list[str | int] = []
    for m in _TOKEN.finditer(path):
        name, bracket = m.groups()
        if name is not None:
            out.append(name)
        elif bracket is not None and bracket.isdigit():
            out.append(int(bracket))
        else:
            out.append(bracket or "")
    return out


def format_path(parts: list[str | int]) -> str:
    """The inverse of :func:`parse_path`, a map key written ``.key`` when it is a plain word."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _SIMPLE_KEY.fullmatch(part):
            text += f".{part}" if text else part
        else:
            text += f"[{part}]"
    return text


def _marked(template: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the template whose list entries (containers, env, volumes, mounts ...) carry their path."""
    def mark(value: Any, path: str) -> Any:
        if isinstance(value, Mapping):
            return {k: mark(v, f"{path}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            out = []
            for i, item in enumerate(value):
                item = mark(item, f"{path}[{i}]")
                if isinstance(item, dict):
                    item[_SOURCE] = f"{path}[{i}]"
                out.append(item)
            return out
        return value
    return mark(copy.deepcopy(dict(template)), "spec.template")


def marked_pod(job: JobRef, spec: JobSpec, index: int, restart: int) -> dict[str, Any]:
    """Pod ``index`` of attempt ``restart`` as :func:`builders.build_pod` makes it, its entries marked."""
    return builders.build_pod(job, dataclasses.replace(spec, template=_marked(spec.template)), index, restart)


def _operator_field(spec: JobSpec, rest: list[str | int]) -> str | None:
    """What the operator sets in the trainer container from the spec, by the field under it."""
    head = rest[0] if rest else None
    if head == "image":
        return "spec.image"
    if head in ("command", "args"):
        return "spec.args" if len(rest) > 1 and isinstance(rest[1], int) and rest[1] >= 3 else "spec.python"
    if head == "resources" and builders.GPU_RESOURCE in rest and spec.gpus_per_proc >= 1:
        return "spec.gpusPerProc"
    return None


def job_path(job: JobRef, spec: JobSpec, pod_path: str, index: int = 0, restart: int = 0) -> str | None:
    """The SPMDJob field a field of pod ``index`` came from, or None when the operator made it alone.

    >>> job_path(job, spec, "spec.containers[0].resources.limits[memory]")   # doctest: +SKIP
    'spec.template.spec.containers[0].resources.limits.memory'
    """
    parts = parse_path(pod_path)
    if not parts:
        return None
    if parts[0] == "metadata":
        if len(parts) > 1 and parts[1] in ("labels", "annotations"):
            return format_path(["spec", "template", *parts])
        return None
    if parts[0] != "spec":
        return None
    try:
        pod = marked_pod(job, spec, index, restart)
    except (ValueError, KeyError, TypeError):
        return format_path(["spec", "template", *parts])
    node: Any = pod
    source: tuple[str, int] | None = None
    added: Mapping[str, Any] | None = None  # a list entry the operator added (no marker)
    trainer_at: int | None = None
    for depth, part in enumerate(parts):
        if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            if isinstance(node, Mapping):
                if node.get(_SOURCE):
                    source, added = (str(node[_SOURCE]), depth + 1), None
                else:
                    source, added = None, node
        elif isinstance(node, Mapping) and part in node:
            node = node[part]
        else:
            break
        if parts[:2] == ["spec", "containers"] and depth == 2 and isinstance(node, Mapping) \
                and node.get("name") == names.CONTAINER_NAME:
            trainer_at = depth + 1
    if trainer_at is not None and (source is None or source[1] <= trainer_at) \
            and (added is None or added.get("name") == names.CONTAINER_NAME):
        own = _operator_field(spec, parts[trainer_at:])
        if own is not None:
            return own
    if source is not None:
        return format_path(parse_path(source[0]) + parts[source[1]:])
    if added is not None:
        return "spec.shmSize" if added.get("name") == builders.SHM_VOLUME else None
    if parts[:2] in (["spec", "containers"], ["spec", "volumes"]):
        return None
    if parts[1:2] == ["schedulerName"] and builders.scheduler_name(spec):
        return "spec.scheduling"
    return format_path(["spec", "template", *parts])


def translate(job: JobRef, spec: JobSpec, message: str, index: int = 0, restart: int = 0) -> str:
    """An API server message about a pod with every pod field path it names replaced by the job's."""
    def swap(m: re.Match[str]) -> str:
        found = job_path(job, spec, m.group(1), index, restart)
        return found if found is not None else f"{m.group(1)} (set by the operator)"

    out = _PATH_IN_MESSAGE.sub(swap, message)
    return _GO_FIELD.sub(lambda m: "Go struct field " + format_path(["spec", "template", *parse_path(m.group(1))]), out)


def container_path(spec: JobSpec, name: str) -> str:
    """Where the template sets the pod's container ``name``: its index, or where to add it."""
    for i, container in enumerate((spec.template.get("spec") or {}).get("containers") or []):
        cname = container.get("name") if isinstance(container, Mapping) else None
        if cname == name or (name == names.CONTAINER_NAME and cname is None):
            return f"spec.template.spec.containers[{i}]"
    if name == names.CONTAINER_NAME:
        return f"spec.template.spec.containers[] (add a container named {name})"
    return f"spec.template.spec.containers[] ({name})"
