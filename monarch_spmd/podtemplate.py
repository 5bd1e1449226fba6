"""The pod template's schema: Kubernetes' own PodTemplateSpec, typed field by field, under ``spec.template``.

Where it sits: beside :mod:`monarch_spmd.spec` (above :mod:`monarch_spmd.schema`, the toolkit,
and :mod:`monarch_spmd.podspec_openapi`, the Kubernetes OpenAPI schemas it reads). Standard
library only. :mod:`monarch_spmd.crd` writes the CRD with it and ``monarch-spmd validate``
(:mod:`monarch_spmd.validate`) checks manifests with it, so that a field the API server does not
know under ``spec.template`` (``resoures:``, ``toleration:``) is refused at ``kubectl apply`` and
offline alike, naming its path, instead of being dropped from every pod without a word.

The tree is generated, never written by hand: :func:`pod_template_spec` converts the OpenAPI v3
schemas of ``io.k8s.api.core.v1.PodTemplateSpec`` and every type it uses (the committed subset in
:mod:`monarch_spmd.podspec_openapi`, Kubernetes |version|) into schema nodes by the rules a CRD's
structural schema follows (as controller-gen applies them to Go types):

- every ``$ref`` is inlined (each type is converted once and shared);
- ``IntOrString`` is ``x-kubernetes-int-or-string``; a resource quantity, which pods take as a
  string or a number (``cpu: 0.5``), is a value of any type (``x-kubernetes-preserve-unknown-fields``
  without a type: the one structural schema that takes both), checked offline by
  :func:`monarch_spmd.spec.pod_problems` and by the API server when the pod is created; a free-form
  object (``FieldsV1``) keeps its fields; nothing else does;
- ``x-kubernetes-list-type``, ``x-kubernetes-list-map-keys`` and ``x-kubernetes-map-type`` are
  kept where a CRD may carry them: a map list only when each of its keys is required or has a
  default in its items (else it is an atomic list);
- ``required`` is kept; a default is kept where Kubernetes declares one (``protocol: TCP``), not
  the zero value ``""``/``0``/``{}`` its generator writes on every field it cannot omit;
- formats, unions and patch strategies are dropped (the pod's own validation checks them when the
  pod is created), and descriptions are shortened to their first sentence (the CRD's size);
- a string field whose Go type is an enum gets its values (:data:`ENUMS`): the OpenAPI document
  carries none, so without them ``operator: Exist`` under a toleration would pass ``kubectl
  apply`` and fail the job when its first pod is created.

:func:`with_template` lays the SPMDJob table's own declarations of the template
(:data:`monarch_spmd.spec.TEMPLATE`: descriptions, bounds and CEL rules of the trainer
container, ``restartPolicy`` ...) over that tree: where the table's object keeps unknown fields
(``x-kubernetes-preserve-unknown-fields``, "the rest is Kubernetes'"), it gets every field of
the Kubernetes type; where it does not (``template.metadata``: labels and annotations), its own
fields stay the only ones. A field the table declares without ``required`` is optional even where
Kubernetes requires it (a container's ``name``: the trainer may be unnamed; the operator names it).

Usage (when moving to another Kubernetes version)::

    python -m monarch_spmd.podtemplate extract api__v1_openapi.json > monarch_spmd/podspec_openapi.py
    bash scripts/gen-crd.sh

``tests/unit/test_pod_template.py`` checks that the committed subset is what ``extract`` makes of
the document in the Go module cache (where it is) and that the CRD is what the subset makes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from . import schema
from .schema import Arr, Bool, Free, Int, IntOrStr, Node, Num, Obj, Str

#: The type at the root of the subset.
ROOT_TYPE: Final = "io.k8s.api.core.v1.PodTemplateSpec"
_REF: Final = "#/components/schemas/"
_QUANTITY: Final = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING: Final = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
#: A description is cut after its first sentence, and at most this long.
MAX_DESCRIPTION: Final = 160
#: The end of a sentence: a full stop before a space and a capital (or the end), not in "e.g. X".
_SENTENCE_END: Final = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)\.(?=\s+[A-Z`\"']|\s*$)")

_CORE: Final = "io.k8s.api.core.v1."
_PULL_POLICIES: Final = ("Always", "Never", "IfNotPresent")
_NODE_INCLUSION: Final = ("Ignore", "Honor")
_PROFILE_TYPES: Final = ("Unconfined", "RuntimeDefault", "Localhost")
_LINUX_SIGNALS: Final = (
    "SIGABRT", "SIGALRM", "SIGBUS", "SIGCHLD", "SIGCLD", "SIGCONT", "SIGFPE", "SIGHUP", "SIGILL", "SIGINT", "SIGIO",
    "SIGIOT", "SIGKILL", "SIGPIPE", "SIGPOLL", "SIGPROF", "SIGPWR", "SIGQUIT", "SIGSEGV", "SIGSTKFLT", "SIGSTOP",
    "SIGSYS", "SIGTERM", "SIGTRAP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG", "SIGUSR1", "SIGUSR2", "SIGVTALRM",
    "SIGWINCH", "SIGXCPU", "SIGXFSZ", "SIGRTMIN", *(f"SIGRTMIN+{n}" for n in range(1, 16)),
    *(f"SIGRTMAX-{n}" for n in range(14, 0, -1)), "SIGRTMAX")
#: The values the API server takes for the pod template's string fields of an enum type, by
#: (OpenAPI type, property); of a list of strings, for each item. Kubernetes' OpenAPI document
#: declares no ``enum`` (its generator leaves them out), so they are taken from the Go types
#: (``+enum`` in k8s.io/api/core/v1/types.go, and the selector operators its validation holds to
#: their constants). ``""`` is listed where a pod takes an empty value: Kubernetes' defaulting fills
#: it in (imagePullPolicy, dnsPolicy ...) or it means "any" (a toleration's effect). Where a pod's
#: validation is stricter than the values (stopSignal: SIGKILL and SIGTERM only on Windows, which
#: only the pod's OS says), the values are the widest, so nothing a pod takes is refused.
#: tests/unit/test_validate_rules.py checks the table against the Go sources in the module cache.
ENUMS: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    (_CORE + "AppArmorProfile", "type"): _PROFILE_TYPES,
    (_CORE + "AzureDiskVolumeSource", "cachingMode"): ("None", "ReadOnly", "ReadWrite"),
    (_CORE + "Container", "imagePullPolicy"): (*_PULL_POLICIES, ""),
    (_CORE + "Container", "terminationMessagePolicy"): ("File", "FallbackToLogsOnError", ""),
    (_CORE + "ContainerPort", "protocol"): ("TCP", "UDP", "SCTP", ""),
    (_CORE + "EphemeralContainer", "imagePullPolicy"): (*_PULL_POLICIES, ""),
    (_CORE + "EphemeralContainer", "terminationMessagePolicy"): ("File", "FallbackToLogsOnError", ""),
    (_CORE + "HTTPGetAction", "scheme"): ("HTTP", "HTTPS", ""),
    (_CORE + "HostPathVolumeSource", "type"): ("", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket",
                                               "CharDevice", "BlockDevice"),
    (_CORE + "ImageVolumeSource", "pullPolicy"): (*_PULL_POLICIES, ""),
    (_CORE + "Lifecycle", "stopSignal"): _LINUX_SIGNALS,
    (_CORE + "NodeSelectorRequirement", "operator"): ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"),
    (_CORE + "PersistentVolumeClaimSpec", "accessModes"): ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany",
                                                          "ReadWriteOncePod"),
    (_CORE + "PersistentVolumeClaimSpec", "volumeMode"): ("Block", "Filesystem"),
    (_CORE + "PodOS", "name"): ("linux", "windows"),
    (_CORE + "PodSecurityContext", "fsGroupChangePolicy"): ("OnRootMismatch", "Always"),
    (_CORE + "PodSecurityContext", "supplementalGroupsPolicy"): ("Merge", "Strict"),
    (_CORE + "PodSpec", "dnsPolicy"): ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None", ""),
    (_CORE + "PodSpec", "preemptionPolicy"): ("PreemptLowerPriority", "Never"),
    (_CORE + "PodSpec", "restartPolicy"): ("Always", "OnFailure", "Never", ""),
    (_CORE + "SeccompProfile", "type"): _PROFILE_TYPES,
    (_CORE + "SecurityContext", "procMount"): ("Default", "Unmasked"),
    (_CORE + "Toleration", "effect"): ("NoSchedule", "PreferNoSchedule", "NoExecute", ""),
    (_CORE + "Toleration", "operator"): ("Exists", "Equal", ""),
    (_CORE + "TopologySpreadConstraint", "nodeAffinityPolicy"): _NODE_INCLUSION,
    (_CORE + "TopologySpreadConstraint", "nodeTaintsPolicy"): _NODE_INCLUSION,
    (_CORE + "TopologySpreadConstraint", "whenUnsatisfiable"): ("DoNotSchedule", "ScheduleAnyway"),
    (_CORE + "VolumeMount", "mountPropagation"): ("None", "HostToContainer", "Bidirectional"),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement", "operator"): ("In", "NotIn", "Exists",
                                                                                    "DoesNotExist"),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class KubeEnum(Str):
    """A string field of the pod template that takes one of Kubernetes' values (:data:`ENUMS`);
    its refusal lists them, and says when an empty value is taken too."""

    def describe(self) -> str:
        values = self.enum or ()
        text = "one of " + ", ".join(v for v in values if v)
        return f"{text} (or empty)" if "" in values else text


def _with_enum(node: Node, values: tuple[str, ...] | None) -> Node:
    """``node`` (a string, or a list of strings) holding ``values``; as it is without them."""
    if values is None:
        return node
    if isinstance(node, Str):
        return KubeEnum(**{**{f.name: getattr(node, f.name) for f in dataclasses.fields(node) if f.init}, "enum": values})
    if isinstance(node, Arr) and isinstance(node.items, Str):
        return dataclasses.replace(node, items=_with_enum(node.items, values))
    raise ValueError(f"an enum on a {type(node).__name__}: only strings and lists of strings take one")


def short_description(text: str | None) -> str:
    """The first sentence of an OpenAPI description, on one line, at most :data:`MAX_DESCRIPTION` characters."""
    text = " ".join((text or "").split())
    m = _SENTENCE_END.search(text)
    if m:
        text = text[:m.start() + 1]
    if len(text) > MAX_DESCRIPTION:
        text = text[:MAX_DESCRIPTION - 3].rsplit(" ", 1)[0] + "..."
    return text


def _is_zero(value: Any) -> bool:
    return value is False or (value in ("", 0) and not isinstance(value, bool))


class _Converter:
    """Converts the OpenAPI schemas to schema nodes, each named type once."""

    def __init__(self, schemas: Mapping[str, Any]) -> None:
        self.schemas = schemas
        self.types: dict[str, Node] = {}
        self.converting: set[str] = set()

    def named(self, name: str) -> Node:
        if name in self.types:
            return self.types[name]
        if name in self.converting:
            raise ValueError(f"{name} refers to itself: a CRD's structural schema cannot hold it")
        self.converting.add(name)
        node = self.node(self.schemas[name], name)
        self.converting.discard(name)
        self.types[name] = node
        return node

    def field(self, raw: Mapping[str, Any], required: bool, *, property: bool = True) -> Node:
        """A property (else an item or a map value): its own description and default over its type's."""
        ref = _ref_of(raw)
        node = self.named(ref) if ref else self.node(raw, None)
        description = short_description(raw.get("description")) or node.description
        default = raw.get("default", schema.MISSING)
        # Kubernetes' generator writes the zero value as the default of every field it cannot omit
        # (a required one, an item, a map value); any other default is declared (+default).
        keep = default is not schema.MISSING and not isinstance(default, (dict, list)) and (
            not _is_zero(default) or (property and not required))
        changes: dict[str, Any] = {"description": description, "required": required}
        if keep and not ref:
            changes["default"] = default
        return dataclasses.replace(node, **changes)

    def node(self, raw: Mapping[str, Any], name: str | None) -> Node:
        description = short_description(raw.get("description"))
        if name == _QUANTITY:
            return Free(description=description or "A resource quantity: a number, or digits with a suffix (500m, 4Gi).")
        if name == _INT_OR_STRING or raw.get("format") == "int-or-string":
            return IntOrStr(description=description)
        kind = raw.get("type")
        if kind == "string":
            return Str(description=description)
        if kind == "integer":
            return Int(description=description)
        if kind == "number":
            return Num(description=description)
        if kind == "boolean":
            return Bool(description=description)
        if kind == "array":
            items = self.field(raw["items"], False, property=False)
            list_type = raw.get("x-kubernetes-list-type")
            keys = tuple(raw.get("x-kubernetes-list-map-keys") or ())
            if list_type == "map" and not _map_keys_valid(items, keys):
                list_type, keys = None, ()
            if list_type == "set" and isinstance(items, (Obj, Arr)):
                list_type = None
            return Arr(description=description, items=items, list_type=list_type, map_keys=keys or None)
        if kind == "object":
            required = set(raw.get("required") or ())
            properties = {k: _with_enum(self.field(v, k in required), ENUMS.get((name or "", k)))
                          for k, v in (raw.get("properties") or {}).items()}
            values = raw.get("additionalProperties")
            map_type = raw.get("x-kubernetes-map-type")
            if isinstance(values, Mapping):
                return Obj(description=description, values=self.field(values, False, property=False), map_type=map_type)
            if not properties:
                return Obj(description=description, preserve_unknown=True)
            return Obj(description=description, properties=properties, map_type=map_type)
        raise ValueError(f"{name or 'a schema'}: no CRD type for {json.dumps(raw)[:200]}")


def _ref_of(raw: Mapping[str, Any]) -> str | None:
    """The type a property refers to (``$ref``, or ``allOf: [{$ref}]`` as OpenAPI v3 writes it)."""
    if "$ref" in raw:
        return str(raw["$ref"]).removeprefix(_REF)
    parts = raw.get("allOf")
    if isinstance(parts, list) and len(parts) == 1 and "$ref" in parts[0]:
        return str(parts[0]["$ref"]).removeprefix(_REF)
    return None


def _map_keys_valid(items: Node, keys: Sequence[str]) -> bool:
    """A CRD's map list needs scalar keys, each required or defaulted in the items."""
    if not isinstance(items, Obj) or not keys:
        return False
    for key in keys:
        node = items.properties.get(key)
        if not isinstance(node, (Str, Int, Num, Bool)) or not (node.required or node.default is not schema.MISSING):
            return False
    return True


@functools.cache
def pod_template_spec() -> Obj:
    """Kubernetes' PodTemplateSpec (metadata and spec) as schema nodes, from the committed subset."""
    from . import podspec_openapi

    node = _Converter(podspec_openapi.SCHEMAS).named(ROOT_TYPE)
    assert isinstance(node, Obj)
    return node


def overlay(kube: Node, table: Node, path: str = "spec.template") -> Node:
    """The Kubernetes node ``kube`` with the table's declaration ``table`` of the same field laid over it.

    The table's description, bounds, default, rules and ``required`` win; Kubernetes gives the
    type and, where the table's object keeps unknown fields, the fields it did not declare.

    Raises:
        ValueError: the table declares a field Kubernetes does not have, or with another type.
    """
    if not isinstance(kube, type(table)):  # a KubeEnum is a string: the table's declaration replaces it
        raise ValueError(f"{path}: the table declares {type(table).__name__}, Kubernetes {type(kube).__name__}")
    own = {f.name: getattr(table, f.name) for f in dataclasses.fields(table) if f.init}
    if isinstance(table, Obj):
        assert isinstance(kube, Obj)
        if table.values is not None:
            if kube.values is None:
                raise ValueError(f"{path}: the table declares a map, Kubernetes an object")
            own["values"] = overlay(kube.values, table.values, path + "{}")
        for key in table.properties:
            if key not in kube.properties:
                raise ValueError(f"{path}.{key}: not a field of the Kubernetes type")
        merged = {key: overlay(kube.properties[key], node, f"{path}.{key}") for key, node in table.properties.items()}
        if table.preserve_unknown or not table.properties and table.values is None:
            merged = {key: merged.get(key, node) for key, node in kube.properties.items()}
            own["preserve_unknown"] = kube.preserve_unknown
            own["map_type"] = table.map_type or kube.map_type
        own["properties"] = merged
    elif isinstance(table, Arr):
        assert isinstance(kube, Arr)
        items = overlay(kube.items, table.items, path + "[]")
        own["items"] = items
        list_type, keys = table.list_type or kube.list_type, table.map_keys or kube.map_keys
        if list_type == "map" and not _map_keys_valid(items, keys or ()):
            list_type, keys = None, None
        own["list_type"], own["map_keys"] = list_type, keys
    return type(table)(**own)


def with_template(root: Obj) -> Obj:
    """``root`` (the SPMDJob table) with its ``spec.template`` typed as Kubernetes' PodTemplateSpec."""
    spec = root.properties["spec"]
    assert isinstance(spec, Obj)
    template = overlay(pod_template_spec(), spec.properties["template"])
    spec = dataclasses.replace(spec, properties={**spec.properties, "template": template})
    return dataclasses.replace(root, properties={**root.properties, "spec": spec})


# --- the committed subset of Kubernetes' OpenAPI ---------------------------------------------------


def closure(schemas: Mapping[str, Any], root: str = ROOT_TYPE) -> dict[str, Any]:
    """``root``'s schema and that of every type it refers to, directly or not, sorted by name."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_refs(schemas[name]))
    return {name: schemas[name] for name in sorted(seen)}


def _refs(value: Any) -> list[str]:
    if isinstance(value, Mapping):
        out = [str(value["$ref"]).removeprefix(_REF)] if "$ref" in value else []
        for v in value.values():
            out.extend(_refs(v))
        return out
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def render_subset(document: Mapping[str, Any], version: str, source: str) -> str:
    """The text of :mod:`monarch_spmd.podspec_openapi`: the subset of ``document``, one type a line."""
    subset = closure(document["components"]["schemas"])
    lines = [
        f'"""GENERATED: the OpenAPI v3 schemas of Kubernetes {version}\'s PodTemplateSpec and of every type it uses.',
        "",
        f"Source: {source}, ``components.schemas``: ``{ROOT_TYPE}`` and the types it refers to,",
        "directly or not, verbatim (descriptions included). Do not edit: to move to another Kubernetes",
        "version, run ``python -m monarch_spmd.podtemplate extract PATH/api__v1_openapi.json VERSION >",
        "monarch_spmd/podspec_openapi.py``, then ``bash scripts/gen-crd.sh``.",
        "",
        "Where it sits: data, read by :mod:`monarch_spmd.podtemplate` (which makes the pod template's",
        "schema of the CRD and of ``monarch-spmd validate`` from it).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any, Final",
        "",
        f"KUBERNETES_VERSION: Final = {version!r}",
        f"SOURCE: Final = {source!r}",
        "",
        "# fmt: off",
        "SCHEMAS: Final[dict[str, Any]] = {",
        *(f"    {name!r}: {_sorted(raw)!r}," for name, raw in subset.items()),
        "}",
        "",
    ]
    return "\n".join(lines)


def _committed_version() -> str:
    from . import podspec_openapi

    return podspec_openapi.KUBERNETES_VERSION


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) in (2, 3) and args[0] == "extract":
        with open(args[1], encoding="utf-8") as f:
            document = json.load(f)
        version = args[2] if len(args) == 3 else _committed_version()
        source = f"k8s.io/kubernetes@{version} api/openapi-spec/v3/api__v1_openapi.json"
        sys.stdout.write(render_subset(document, version, source))
        return 0
    print("usage: python -m monarch_spmd.podtemplate extract API__V1_OPENAPI.JSON [VERSION]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
