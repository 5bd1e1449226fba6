"""A small structural-schema toolkit: one declaration of a custom resource's fields both renders
the CRD's OpenAPI v3 schema (with CEL ``x-kubernetes-validations``) and checks a Python value the
way the Kubernetes API server checks a create request against that schema.

Where it sits: a leaf of the library (standard library only). :mod:`monarch_spmd.spec` declares
the SPMDJob with it, :mod:`monarch_spmd.podtemplate` converts Kubernetes' PodTemplateSpec into it;
:mod:`monarch_spmd.crd` writes the CRD file from that declaration.

A declaration is a tree of nodes (:class:`Str`, :class:`Int`, :class:`Num`, :class:`Bool`,
:class:`Arr`, :class:`Obj`, :class:`ObjectMeta`; for Kubernetes' types also :class:`IntOrStr`,
``x-kubernetes-int-or-string``, and :class:`Free`, any value). Each node carries its description
(the ``kubectl explain`` text), whether it is required, its default, its bounds, and its
:class:`Rule` objects. A rule is one cross-field check written once: it renders itself as a CEL
rule with a message, and checks a Python value with the same logic.
``tests/e2e/test_spec_parity.py`` holds the two renderings against each other on a real API
server.

What the API server does with a create request, and what :func:`validate` reproduces, in order:

1. the body, as kubectl sends it: kubectl turns YAML into JSON with Go's encoder, so a whole
   number written as a float (``3.0``) arrives as the integer 3 (:func:`as_sent`);
2. decoding with field validation ``Strict`` (what ``kubectl apply`` asks for): a field the schema
   does not declare is an error, except under ``x-kubernetes-preserve-unknown-fields``;
3. null pruning and defaulting: ``null`` in a declared field takes the field's default or is
   dropped (so ``null`` counts as absent), and an absent field with a default gets it;
4. schema validation: types, required fields, enums, bounds, lengths, item counts, the items of a
   ``set`` list and the keys of a ``map`` list unique (``x-kubernetes-list-type``);
5. the CEL rules, each on every value present at its node, unless step 4 found a "blocking"
   error (a wrong type, a missing required field, a value outside an enum), as the server skips
   them then. Transition rules (``oldSelf``) run only when an old object is given (an update).

An error is a :class:`Problem`: the field's path (``spec.mesh[1].size``) and a message that says
what would be valid.
"""

from __future__ import annotations

import copy
import datetime
import difflib
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, NamedTuple


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: The marker of "no default" and "no old value".
MISSING: Final[Any] = _Missing()

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


class Problem(NamedTuple):
    """One validation error.

    Attributes:
        path: the field, e.g. ``spec.mesh[1].size``.
        message: what is wrong and what would be valid.
        blocking: a wrong type, a missing required field or a value outside an enum: the API
            server evaluates no CEL rule of an object with such an error.
        policy: found by a policy rule (:attr:`Rule.policy`): the value can still be built.
    """

    path: str
    message: str
    blocking: bool = False
    policy: bool = False


def join(path: str, key: str | int) -> str:
    """``join("spec", "mesh")`` -> ``spec.mesh``; ``join("spec.mesh", 1)`` -> ``spec.mesh[1]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _under(path: str, relative: str) -> str:
    """``_under("spec", ".image")`` -> ``spec.image``; ``_under("", ".metadata.name")`` -> ``metadata.name``."""
    return path + relative if path else relative.lstrip(".")


def show(value: Any) -> str:
    """A value for an error message, shortened."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_json_int(value: Any) -> bool:
    """True for an integer the API server reads as one (int64; not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and _INT64_MIN <= value <= _INT64_MAX


# --- regular expressions that Go's RE2 and Python read alike ----------------------------------


class Pattern:
    """An anchored regular expression that means the same to Go's RE2 and to Python's ``re``.

    The CRD uses it as an OpenAPI ``pattern`` or in a CEL ``matches()``; both are RE2 searches,
    where ``$`` is the end of the text. Python checks it with ``re.fullmatch`` of the body. To keep
    the two readings equal it must be ``^BODY$`` with no top-level ``|`` and no class escape whose
    meaning differs between the two engines (``\\s \\d \\w \\b``: RE2's are ASCII-only).
    """

    def __init__(self, regex: str) -> None:
        body = regex[1:-1]
        if not (regex.startswith("^") and regex.endswith("$")) or "$" in body or "^" in body.replace("[^", ""):
            raise ValueError(f"pattern {regex!r}: write it as ^BODY$ with no other anchor")
        if re.search(r"\\[sSdDwWbBpPzAZ]", body):
            raise ValueError(f"pattern {regex!r}: \\s, \\d, \\w, \\b ... differ between RE2 and Python; spell the class out")
        depth = 0
        for i, c in enumerate(body):
            escaped = i > 0 and body[i - 1] == "\\"
            if c in "([" and not escaped:
                depth += 1
            elif c in ")]" and not escaped:
                depth -= 1
            elif c == "|" and depth == 0:
                raise ValueError(f"pattern {regex!r}: group a top-level alternative, ^(a|b)$")
        self.regex = regex
        self._compiled = re.compile(body)

    def matches(self, text: str) -> bool:
        return self._compiled.fullmatch(text) is not None

    def cel(self) -> str:
        """The pattern as a CEL raw string literal."""
        if "'" in self.regex:
            raise ValueError(f"pattern {self.regex!r}: a quote cannot go into a CEL raw string")
        return f"r'{self.regex}'"

    def __repr__(self) -> str:
        return f"Pattern({self.regex!r})"


# --- rules --------------------------------------------------------------------------------------


class Rule:
    """One check written once: a CEL rule (with its message) for the CRD, and the same check in Python.

    Subclasses implement :meth:`cel` (the rule's text, with ``self`` the value at the rule's node)
    and :meth:`check`, which yields ``(relative path, message)`` for each violation, ``""`` for
    the node itself. ``check`` may assume what the schema guarantees once no blocking error was
    found (types, required fields) but not the bounds, which are not blocking; the CEL text must
    then still evaluate without error (guard products and indexes), so that the rule fails exactly
    when its Python check does.

    Attributes:
        message: the CEL rule's message (the API server prints it after the field's path).
        field_path: renders as ``fieldPath``: the field, relative to the node, the API server names.
        transition: a rule over ``oldSelf``: checked only on updates.
        policy: a rule the API server enforces on new objects although a value that breaks it can
            still be run: typically one added in a later version. An object stored before the rule
            existed is kept and run (see :func:`validate`'s ``policy`` problems); a rule without
            this mark guards what the value cannot do without (types, shapes, the argv's form).
    """

    message: str = ""
    field_path: str | None = None
    transition: ClassVar[bool] = False
    policy: bool = False

    def cel(self) -> str:
        raise NotImplementedError

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        raise NotImplementedError

    def message_expression(self) -> str | None:
        """A CEL expression for the message that names the offending value, or None."""
        return None

    def openapi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.cel(), "message": self.message}
        expression = self.message_expression()
        if expression:
            out["messageExpression"] = expression
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


@dataclass(frozen=True)
class Matches(Rule):
    """A string matches a :class:`Pattern`; ``message`` says what a valid value looks like."""

    pattern: Pattern
    message: str
    policy: bool = False

    def cel(self) -> str:
        return f"self.matches({self.pattern.cel()})"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        if not self.pattern.matches(value):
            yield "", f"{show(value)} is not valid: {self.message}"


@dataclass(frozen=True)
class UniqueBy(Rule):
    """The objects of a list differ in ``key`` (a required string field of the items)."""

    key: str
    message: str

    def cel(self) -> str:
        return f"self.all(x, self.exists_one(y, y.{self.key} == x.{self.key}))"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        seen: set[Any] = set()
        for i, item in enumerate(value):
            if item[self.key] in seen:
                yield f"[{i}].{self.key}", f"{show(item[self.key])} appears twice: {self.message}"
            seen.add(item[self.key])


@dataclass(frozen=True)
class Disjoint(Rule):
    """Two optional list fields of an object share no element."""

    first: str
    second: str
    message: str

    def cel(self) -> str:
        a, b = self.first, self.second
        return f"!has(self.{a}) || !has(self.{b}) || !self.{a}.exists(x, x in self.{b})"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        both = [x for x in value.get(self.first, ()) if x in value.get(self.second, ())]
        if both:
            yield f".{self.second}", f"{sorted(set(both))} also in {self.first}: {self.message}"


@dataclass(frozen=True)
class Immutable(Rule):
    """The value may not change once created (a transition rule)."""

    message: str
    transition: ClassVar[bool] = True

    def cel(self) -> str:
        return "self == oldSelf"

    def check(self, value: Any, old: Any = MISSING) -> Iterator[tuple[str, str]]:
        if old is not MISSING and value != old:
            yield "", self.message


# --- nodes --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Node:
    """A field of the schema (one entry of the table).

    Attributes:
        description: what ``kubectl explain`` prints: the field's manual.
        required: the parent object must have it.
        default: filled in by the API server when the field is absent or null.
        rules: :class:`Rule` objects checked on the field's value (CEL in the CRD).
        example: shown after "required;" when the field is missing.
        attr: the name of the attribute the parsed value goes to (for the user of the table).
        convert: turns the validated value into that attribute's value.
    """

    description: str
    required: bool = False
    default: Any = MISSING
    rules: tuple[Rule, ...] = ()
    example: str | None = None
    attr: str | None = None
    convert: Callable[[Any], Any] | None = field(default=None, compare=False)

    type_name: ClassVar[str] = ""

    def type_ok(self, value: Any) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        """What a valid value is, for messages: ``an integer in 1..65535``."""
        raise NotImplementedError

    def bounds(self, value: Any) -> Iterator[Problem]:
        """Problems with a value of the right type, relative to the node (path "")."""
        return iter(())

    def openapi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type_name} if self.type_name else {}
        out.update(self._openapi_constraints())
        if self.default is not MISSING:
            out["default"] = copy.deepcopy(self.default)
        if self.description:
            out["description"] = self.description
        out.update(self._openapi_flags())
        if self.rules:
            out["x-kubernetes-validations"] = [r.openapi() for r in self.rules]
        out.update(self._openapi_children())
        return out

    def _openapi_constraints(self) -> dict[str, Any]:
        return {}

    def _openapi_flags(self) -> dict[str, Any]:
        return {}

    def _openapi_children(self) -> dict[str, Any]:
        return {}


def _range(low: int | None, high: int | None, unit: str = "") -> str:
    if low is not None and high is not None:
        return f"in {low}..{high}{unit}"
    if low is not None:
        return f"of at least {low}{unit}"
    if high is not None:
        return f"of at most {high}{unit}"
    return ""


@dataclass(frozen=True, kw_only=True)
class Str(Node):
    """A string: ``min_length``/``max_length`` (characters), ``pattern`` (OpenAPI), ``enum``."""

    min_length: int | None = None
    max_length: int | None = None
    pattern: Pattern | None = None
    enum: tuple[str, ...] | None = None
    format: str | None = None
    type_name: ClassVar[str] = "string"

    def type_ok(self, value: Any) -> bool:
        return isinstance(value, str)

    def describe(self) -> str:
        if self.enum is not None:
            return "one of " + ", ".join(self.enum)
        parts = ["a string"]
        if self.min_length == 1 and self.max_length is not None:
            parts.append(f"of 1 to {self.max_length} characters")
        elif self.min_length is not None or self.max_length is not None:
            parts.append(_range(self.min_length, self.max_length, " characters").replace("in ", "of "))
        if self.pattern is not None:
            parts.append(f"matching {self.pattern.regex}")
        return " ".join(parts)

    def bounds(self, value: Any) -> Iterator[Problem]:
        if self.enum is not None and value not in self.enum:
            yield Problem("", f"{show(value)} is not valid; expected {self.describe()}", blocking=True)
        if self.min_length is not None and len(value) < self.min_length:
            yield Problem("", f"{show(value)} is too short; expected {self.describe()}")
        if self.max_length is not None and len(value) > self.max_length:
            yield Problem("", f"has {len(value)} characters; expected {self.describe()}")
        if self.pattern is not None and not self.pattern.matches(value):
            yield Problem("", f"{show(value)} is not valid; expected {self.describe()}")

    def _openapi_constraints(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.format:
            out["format"] = self.format
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.min_length is not None:
            out["minLength"] = self.min_length
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        if self.pattern is not None:
            out["pattern"] = self.pattern.regex
        return out


@dataclass(frozen=True, kw_only=True)
class Int(Node):
    """An integer (int64): ``minimum``/``maximum`` inclusive."""

    minimum: int | None = None
    maximum: int | None = None
    format: str | None = None
    type_name: ClassVar[str] = "integer"

    def type_ok(self, value: Any) -> bool:
        return is_json_int(value)

    def describe(self) -> str:
        return " ".join(filter(None, ["an integer", _range(self.minimum, self.maximum)]))

    def bounds(self, value: Any) -> Iterator[Problem]:
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            yield Problem("", f"{show(value)} is not valid; expected {self.describe()}")

    def _openapi_constraints(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.format:
            out["format"] = self.format
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out


@dataclass(frozen=True, kw_only=True)
class Bool(Node):
    """A boolean."""

    type_name: ClassVar[str] = "boolean"

    def type_ok(self, value: Any) -> bool:
        return isinstance(value, bool)

    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True, kw_only=True)
class Arr(Node):
    """A list of ``items``: ``min_items``/``max_items``; ``list_type``/``map_keys`` (``set``: unique
    items; ``map``: unique keys) for status lists and Kubernetes' own."""

    items: Node
    min_items: int | None = None
    max_items: int | None = None
    list_type: str | None = None
    map_keys: tuple[str, ...] | None = None
    type_name: ClassVar[str] = "array"

    def type_ok(self, value: Any) -> bool:
        return isinstance(value, list)

    def describe(self) -> str:
        if self.min_items is not None and self.max_items is not None:
            return f"a list of {self.min_items} to {self.max_items} items"
        return " ".join(filter(None, ["a list", _range(self.min_items, self.max_items, " items")]))

    def bounds(self, value: Any) -> Iterator[Problem]:
        if self.min_items is not None and len(value) < self.min_items:
            yield Problem("", f"{'must not be empty' if not value else f'has {len(value)} items'}; "
                          f"{self.example or 'expected ' + self.describe()}")
        if self.max_items is not None and len(value) > self.max_items:
            yield Problem("", f"has {len(value)} items; expected {self.describe()}")
        if self.list_type in ("set", "map"):
            seen: set[str] = set()
            for i, item in enumerate(value):
                if self.list_type == "map":
                    if not isinstance(item, dict):
                        continue
                    key = {k: item.get(k) for k in self.map_keys or ()}
                    what = "an item with " + ", ".join(f"{k} {show(v)}" for k, v in key.items())
                else:
                    key, what = item, show(item)
                text = repr(key)
                if text in seen:
                    unique = " and ".join(self.map_keys or ()) if self.list_type == "map" else "value"
                    yield Problem(f"[{i}]", f"duplicate value: {what} is already in the list; each item's {unique} must differ")
                seen.add(text)

    def _openapi_constraints(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.min_items is not None:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        return out

    def _openapi_flags(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.list_type:
            out["x-kubernetes-list-type"] = self.list_type
        if self.map_keys:
            out["x-kubernetes-list-map-keys"] = list(self.map_keys)
        return out

    def _openapi_children(self) -> dict[str, Any]:
        return {"items": self.items.openapi()}


@dataclass(frozen=True, kw_only=True)
class Obj(Node):
    """An object: declared ``properties``, or a map whose every value is ``values``.

    Attributes:
        properties: field name -> node, in the order ``kubectl explain`` lists them.
        values: for a map (``additionalProperties``): the node of every value.
        preserve_unknown: ``x-kubernetes-preserve-unknown-fields``: undeclared fields are kept
            unchecked (the declared ones are still checked).
        flatten: for the user of the table: the children's attributes belong to the parent.
    """

    properties: Mapping[str, Node] = field(default_factory=dict)
    values: Node | None = None
    preserve_unknown: bool = False
    flatten: bool = False
    map_type: str | None = None
    type_name: ClassVar[str] = "object"

    def type_ok(self, value: Any) -> bool:
        return isinstance(value, dict)


    def describe(self) -> str:
        if self.values is not None:
            return f"a map of {self.values.describe().replace('a ', '', 1)}s"
        if self.properties and not self.preserve_unknown:
            return "an object with " + ", ".join(self.properties)
        return "an object"

    def _openapi_flags(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        required = [k for k, n in self.properties.items() if n.required]
        if required:
            out["required"] = required
        if self.preserve_unknown:
            out["x-kubernetes-preserve-unknown-fields"] = True
        if self.map_type:
            out["x-kubernetes-map-type"] = self.map_type
        return out

    def _openapi_children(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.properties:
            out["properties"] = {k: n.openapi() for k, n in self.properties.items()}
        if self.values is not None:
            out["additionalProperties"] = self.values.openapi()
        return out


@dataclass(frozen=True, kw_only=True)
class Num(Node):
    """A number (an integer or a float)."""

    type_name: ClassVar[str] = "number"

    def type_ok(self, value: Any) -> bool:
        return (is_json_int(value) or isinstance(value, float)) and not isinstance(value, bool)

    def describe(self) -> str:
        return "a number"


@dataclass(frozen=True, kw_only=True)
class IntOrStr(Node):
    """An integer or a string (Kubernetes' IntOrString: ``x-kubernetes-int-or-string``)."""

    type_name: ClassVar[str] = ""

    def type_ok(self, value: Any) -> bool:
        return is_json_int(value) or isinstance(value, str)

    def describe(self) -> str:
        return "an integer or a string"

    def _openapi_flags(self) -> dict[str, Any]:
        return {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}


@dataclass(frozen=True, kw_only=True)
class Free(Node):
    """Any JSON value, kept as it is (``x-kubernetes-preserve-unknown-fields`` without a type):
    what the schema cannot type, e.g. a resource quantity, which is a string or a number."""

    type_name: ClassVar[str] = ""

    def type_ok(self, value: Any) -> bool:
        return True

    def describe(self) -> str:
        return "any value"

    def _openapi_flags(self) -> dict[str, Any]:
        return {"x-kubernetes-preserve-unknown-fields": True}


# --- the object's metadata: Kubernetes' ObjectMeta, checked by the API machinery ---------------

_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: ObjectMeta's fields (strict decoding refuses any other).
_OBJECT_META_FIELDS: Final = (
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields",
)
_ANNOTATIONS_LIMIT: Final = 256 * 1024
_RFC3339: Final = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})")


def _is_time(value: Any) -> bool:
    """A metav1.Time in JSON: an RFC 3339 date and time (Go's time.RFC3339 layout)."""
    m = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if not m:
        return False
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    zone = m.group(8)
    try:
        datetime.datetime(year, month, day, hour, minute, second)
    except ValueError:
        return False
    return zone == "Z" or (int(zone[1:3]) < 24 and int(zone[4:6]) < 60)


#: (field, check, what is expected) of ObjectMeta's scalar and list fields.
_OBJECT_META_TYPES: Final = (
    *((key, lambda v: isinstance(v, str), "a string") for key in ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion")),
    *((key, is_json_int, "an integer") for key in ("generation", "deletionGracePeriodSeconds")),
    *((key, _is_time, "an RFC 3339 time, e.g. 2025-01-31T12:00:00Z") for key in ("creationTimestamp", "deletionTimestamp")),
    *((key, lambda v: isinstance(v, list), "a list") for key in ("finalizers", "ownerReferences", "managedFields")),
)


def qualified_name_error(key: str) -> str | None:
    """Why ``key`` is not a label or annotation key (``[prefix/]name``), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or "/" in prefix):
        return "a key is [DNS subdomain prefix/]name"
    if slash and (len(prefix) > 253 or not _DNS_1123_SUBDOMAIN.fullmatch(prefix)):
        return f"prefix {prefix!r} is not a DNS subdomain (lowercase letters, digits, '-' and '.', at most 253 characters)"
    if not name or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        return (f"name part {name!r} must be 1 to 63 characters: letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit")
    return None


@dataclass(frozen=True, kw_only=True)
class ObjectMeta(Node):
    """The root's ``metadata``: the CRD may declare nothing but its type; the API machinery checks it.

    Checked here as Kubernetes checks them on create: unknown fields; the types of the scalar
    fields (timestamps are RFC 3339); name or generateName (one is required; a generateName is a
    DNS subdomain prefix); namespace (a DNS label); labels and annotations (keys, values, total
    size); finalizers (qualified names). ownerReferences and managedFields are taken as they are.
    """

    type_name: ClassVar[str] = "object"

    def type_ok(self, value: Any) -> bool:
        return isinstance(value, dict)

    def describe(self) -> str:
        return "an object (name, namespace, labels, annotations ...)"

    def openapi(self) -> dict[str, Any]:
        return {"type": "object"}

    def bounds(self, value: Any) -> Iterator[Problem]:
        for key, ok, expected in _OBJECT_META_TYPES:
            if value.get(key) is not None and not ok(value[key]):
                yield Problem(f".{key}", f"{show(value[key])} is not valid; expected {expected}", blocking=True)
        if not value.get("name") and not value.get("generateName"):
            yield Problem(".name", "required; name the object", blocking=True)
        prefix = value.get("generateName")
        if isinstance(prefix, str) and prefix:
            # Kubernetes checks a prefix with its trailing '-' (and the character before) masked.
            masked = prefix[:-2] + "a" if len(prefix) > 1 and prefix.endswith("-") else prefix
            if len(masked) > 253 or not _DNS_1123_SUBDOMAIN.fullmatch(masked):
                yield Problem(".generateName", f"{show(prefix)} is not a name prefix: lowercase letters, digits, "
                              "'-' and '.', starting with a letter or digit")
        for i, finalizer in enumerate(value.get("finalizers") or ()):
            error = qualified_name_error(finalizer) if isinstance(finalizer, str) else "expected a string"
            if error:
                yield Problem(f".finalizers[{i}]", f"{show(finalizer)}: {error}", blocking=not isinstance(finalizer, str))
        namespace = value.get("namespace")
        if isinstance(namespace, str) and namespace and (len(namespace) > 63 or not _DNS_1123_LABEL.fullmatch(namespace)):
            yield Problem(".namespace", f"{show(namespace)} is not a namespace name (a DNS label: lowercase "
                          "letters, digits and '-', at most 63 characters)")
        for kind in ("labels", "annotations"):
            raw = value.get(kind)
            if raw is None:
                continue
            if not isinstance(raw, dict):
                yield Problem(f".{kind}", f"expected a map of strings, got {show(raw)}", blocking=True)
                continue
            for k, v in raw.items():
                if v is not None and not isinstance(v, str):
                    yield Problem(f".{kind}.{k}", f"{show(v)} is not valid; {kind} are strings (quote numbers in YAML)", blocking=True)
                    continue
                error = qualified_name_error(k.lower() if kind == "annotations" else k)
                if error:
                    yield Problem(f".{kind}", f"key {show(k)}: {error}")
                if kind == "labels" and v and (len(v) > 63 or not _LABEL_NAME.fullmatch(v)):
                    yield Problem(f".labels.{k}", f"{show(v)} is not a label value: at most 63 characters, "
                                  "letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
            if kind == "annotations":
                size = sum(len(k.encode()) + len((v or "").encode()) for k, v in raw.items() if isinstance(v, (str, type(None))))
                if size > _ANNOTATIONS_LIMIT:
                    yield Problem(".annotations", f"{size} bytes in all; at most {_ANNOTATIONS_LIMIT} are allowed")


# --- validation ----------------------------------------------------------------------------------


def as_sent(value: Any, path: str, problems: list[Problem]) -> Any:
    """The value as kubectl sends it (JSON written by Go): a copy, whole floats made integers.

    Go writes a float64 that is a whole number below 1e21 without a fraction (``3.0`` -> ``3``);
    the API server then reads an integer. NaN and infinities cannot be written at all, nor can a
    key that is not a string; tuples become lists.
    """
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            problems.append(Problem(path, f"{value!r} is not a number JSON can carry", blocking=True))
            return None
        return int(value) if value == int(value) and abs(value) < 1e21 else value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                problems.append(Problem(path, f"key {show(k)} is not a string", blocking=True))
                continue
            out[k] = as_sent(v, join(path, k), problems)
        return out
    if isinstance(value, (list, tuple)):
        return [as_sent(v, join(path, i), problems) for i, v in enumerate(value)]
    problems.append(Problem(path, f"{show(value)} ({type(value).__name__}) is not a JSON value", blocking=True))
    return None


#: An object with more fields than this is not listed whole in an unknown field's message.
_LISTED_FIELDS: Final = 12


def _fields_hint(node: Obj, key: str, path: str) -> str:
    """What an unknown field's message adds: the object's fields, or the one the key was likely meant as."""
    if not node.properties:
        return f"{path or 'the object'} has no fields"
    close = [k for k in node.properties if k.lower() == key.lower()] or \
        difflib.get_close_matches(key, list(node.properties), n=1, cutoff=0.6)
    if len(node.properties) <= _LISTED_FIELDS:
        meant = f"; did you mean {close[0]}?" if close else ""
        return f"{path or 'the object'} has {', '.join(node.properties)}{meant}"
    if close:
        return f"did you mean {close[0]}? ({path or 'the object'} has {len(node.properties)} fields)"
    return f"{path or 'the object'} has {', '.join(list(node.properties)[:_LISTED_FIELDS])} ... ({len(node.properties)} fields)"


def _unknown_fields(node: Node, value: Any, path: str, problems: list[Problem]) -> None:
    """Step 2: strict decoding. Reports undeclared fields and removes them (the server prunes them)."""
    if isinstance(node, ObjectMeta) and isinstance(value, dict):
        for key in [k for k in value if k not in _OBJECT_META_FIELDS]:
            problems.append(Problem(join(path, key), f"unknown field; metadata has {', '.join(_OBJECT_META_FIELDS[:3])}, labels, annotations ..."))
            del value[key]
    elif isinstance(node, Obj) and isinstance(value, dict):
        if node.values is None and not node.preserve_unknown:
            for key in [k for k in value if k not in node.properties]:
                problems.append(Problem(join(path, key), f"unknown field; {_fields_hint(node, key, path)}"))
                del value[key]
        for key, child in value.items():
            sub = node.properties.get(key) or node.values
            if sub is not None:
                _unknown_fields(sub, child, join(path, key), problems)
    elif isinstance(node, Arr) and isinstance(value, list):
        for i, item in enumerate(value):
            _unknown_fields(node.items, item, join(path, i), problems)


def _default(node: Node, value: Any) -> None:
    """Step 3: null pruning and defaulting, in place."""
    if isinstance(node, Obj) and isinstance(value, dict):
        for key in list(value):
            child = node.properties.get(key) or node.values
            if child is not None and value[key] is None:
                if child.default is not MISSING:
                    value[key] = copy.deepcopy(child.default)
                else:
                    del value[key]
        for key, child in node.properties.items():
            if key not in value and child.default is not MISSING:
                value[key] = copy.deepcopy(child.default)
        for key, child_value in value.items():
            child = node.properties.get(key) or node.values
            if child is not None:
                _default(child, child_value)
    elif isinstance(node, Arr) and isinstance(value, list):
        for item in value:
            _default(node.items, item)


def _check(node: Node, value: Any, path: str, optional: frozenset[str], problems: list[Problem]) -> None:
    """Step 4: the OpenAPI schema."""
    if not node.type_ok(value):
        hint = " (quote it in YAML)" if isinstance(node, Str) and isinstance(value, (bool, int, float)) else ""
        problems.append(Problem(path, f"{show(value)} is not valid; expected {node.describe()}{hint}", blocking=True))
        return
    for p in node.bounds(value):
        problems.append(p._replace(path=_under(path, p.path)))
    if isinstance(node, Obj):
        for key, child in node.properties.items():
            sub = join(path, key)
            if key in value:
                _check(child, value[key], sub, optional, problems)
            elif child.required and sub not in optional:
                problems.append(Problem(sub, f"required; {child.example or 'expected ' + child.describe()}", blocking=True))
        if node.values is not None:
            for key, child_value in value.items():
                _check(node.values, child_value, join(path, key), optional, problems)
    elif isinstance(node, Arr):
        for i, item in enumerate(value):
            _check(node.items, item, join(path, i), optional, problems)


def _rules(node: Node, value: Any, old: Any, path: str, problems: list[Problem],
           failed: set[tuple[str, str]] | None = None) -> None:
    """Step 5: the CEL rules, each on its node's value, children after parents.

    On an update the API server ratchets (CRD validation ratcheting, on by default since
    Kubernetes 1.30): a rule that does not use ``oldSelf`` is not enforced on a value that did
    not change, so an object stored before a rule existed can still be updated elsewhere. List
    items are compared with the old list's item at the same index.
    """
    unchanged = old is not MISSING and value == old
    for rule in node.rules:
        if rule.transition and old is MISSING:
            continue
        if unchanged and not rule.transition:
            continue
        for sub, message in rule.check(value, old):
            problems.append(Problem(_under(path, sub), message, policy=rule.policy))
            if failed is not None:
                failed.add((path, rule.cel()))
    if isinstance(node, Obj):
        for key, child_value in value.items():
            child = node.properties.get(key) or node.values
            if child is not None:
                old_child = old.get(key, MISSING) if isinstance(old, dict) else MISSING
                _rules(child, child_value, old_child, join(path, key), problems, failed)
    elif isinstance(node, Arr):
        for i, item in enumerate(value):
            old_item = old[i] if isinstance(old, list) and i < len(old) else MISSING
            _rules(node.items, item, old_item, join(path, i), problems, failed)


def failing_rules(node: Node, value: Any, path: str = "", *, old: Any = MISSING) -> set[tuple[str, str]]:
    """``(path, CEL text)`` of every rule whose Python check fails on ``value`` (already defaulted,
    free of blocking errors): what the API server's CEL evaluation must fail too."""
    failed: set[tuple[str, str]] = set()
    _rules(node, value, old, path, [], failed)
    return failed


def validate(node: Node, value: Any, path: str = "", *, old: Any = MISSING,
             optional: Sequence[str] = (), reset: Sequence[str] = ()) -> tuple[Any, list[Problem]]:
    """Checks ``value`` against ``node`` as the API server checks a create (or, with ``old``, an update).

    Args:
        node: the schema.
        value: the value (not changed: a copy is checked).
        path: the path of ``value`` in its object, for messages (``spec``).
        old: the stored value, for transition rules; MISSING on create.
        optional: paths of required fields to treat as optional (e.g. ``spec.image`` outside
            Kubernetes).
        reset: top-level fields the server drops from a create after decoding (``status``, when
            it is a subresource): checked for unknown fields only.

    Returns:
        ``(value, problems)``: the value as the server would store it (unknown fields dropped,
        nulls pruned, defaults filled in) and every problem found, in the server's order.
    """
    problems: list[Problem] = []
    value = as_sent(value, path, problems)
    _unknown_fields(node, value, path, problems)
    _default(node, value)
    if node.default is not MISSING and value is None:
        value = copy.deepcopy(node.default)
        _default(node, value)
    if isinstance(value, dict):
        for key in reset:
            value.pop(key, None)
    _check(node, value, path, frozenset(optional), problems)
    if not any(p.blocking for p in problems):
        _rules(node, value, old, path, problems)
    return value, problems


def walk(node: Node, path: str = "") -> Iterator[tuple[str, Node]]:
    """Every node with its schema path: ``.spec.mesh[].size``, ``.spec.template.metadata.labels{}``."""
    yield path, node
    if isinstance(node, Obj):
        for key, child in node.properties.items():
            yield from walk(child, f"{path}.{key}")
        if node.values is not None:
            yield from walk(node.values, f"{path}{{}}")
    elif isinstance(node, Arr):
        yield from walk(node.items, f"{path}[]")
