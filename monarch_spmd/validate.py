"""``monarch-spmd validate``: checks SPMDJob manifests offline, as the API server checks ``kubectl apply``.

Where it sits: the command layer, beside :mod:`monarch_spmd.runner`; it reads YAML (PyYAML, the
``cli`` extra) and checks each SPMDJob with :func:`check_manifest`: the table the CRD is generated
from (:func:`monarch_spmd.spec.check_manifest`) and, under ``spec.template``, Kubernetes' own
PodTemplateSpec schema, which the CRD carries too (:mod:`monarch_spmd.podtemplate`), so a field
misspelled there (``resoures:``) is an error naming its path, as ``kubectl apply`` is refused for
it. Usage::

    monarch-spmd validate -f job.yaml [more.yaml ...]     # also plain paths, and - for stdin
    monarch-spmd validate -f manifests/ [-R]              # every .yaml, .yml, .json in the folder

Every error is printed as ``FILE: doc N (NAME): FIELD: MESSAGE``; a file without errors as
``FILE: N SPMDJob(s) valid``, after a ``FILE: doc N (NAME): note: FIELD: MESSAGE`` line for what is
valid but likely not meant (:func:`notes`: a GPU job whose pods tolerate no GPU taint). Exit code 0
when every SPMDJob is valid (notes or not), 1 when one is not (or a file named holds none), 2 on a
usage error (an unknown option, a missing file or a folder without manifests, YAML that does not
parse). Documents of other kinds are skipped; a ``kind: List`` is checked item by item. A folder
is read as ``kubectl apply -f DIR`` reads it: its files ending in ``.yaml``, ``.yml`` or ``.json``
(in name order; ``-R`` also those of its subfolders), where a file without an SPMDJob is skipped
with a note rather than an error (a folder mixes kinds).

A verdict of "valid" means: ``kubectl apply`` of the document is accepted by an API server with
the CRD of this version installed, and the operator runs it, up to what only creating a pod can
show (see :mod:`monarch_spmd.spec`). To match kubectl exactly, YAML is read the way kubectl reads
it (:func:`load_documents`), not the way PyYAML does by default: ``1e3`` is a number, ``y`` and
``n`` are booleans, ``2024-01-01`` and ``12:30`` are strings, ``017`` is octal and ``0o17`` is 15.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import yaml

from . import podtemplate, policy, schema, spec
from .torchrun import GPU_TOLERATION

USAGE: Final = "usage: monarch-spmd validate [-R] [-f FILE|DIR|-] ... [FILE|DIR ...]"
#: The files of a folder that are manifests (kubectl's FileExtensions).
MANIFEST_EXTENSIONS: Final = (".yaml", ".yml", ".json")

# --- kubectl's YAML: go-yaml v2's scalar resolution, then sigs.k8s.io/yaml's JSON conversion --

_PLAIN_TAG: Final = "tag:monarch-spmd,2025:plain"
_BOOLS: Final = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
}
_NULLS: Final = ("", "~", "null", "Null", "NULL")
_SPECIAL_FLOATS: Final = (".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF",
                          "-.inf", "-.Inf", "-.INF")
_YAML_FLOAT: Final = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_DOT_FLOAT: Final = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")
_GO_INT: Final = re.compile(r"([-+]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")


def _go_int(text: str) -> int | None:
    """strconv.ParseInt(text, 0, 64), else ParseUint(text, 0, 64); None when neither parses."""
    m = _GO_INT.fullmatch(text)
    if not m:
        return None
    sign, digits = m.groups()
    if digits[:2] in ("0x", "0X", "0o", "0O", "0b", "0B"):
        value = int(digits[2:], {"x": 16, "o": 8, "b": 2}[digits[1].lower()])
    elif len(digits) > 1 and digits[0] == "0":
        value = int(digits[1:], 8)
    else:
        value = int(digits)
    value = -value if sign == "-" else value
    if -(2**63) <= value < 2**63 or (not sign and value < 2**64):
        return value
    return None


def resolve_plain(text: str) -> Any:
    """What kubectl makes of an unquoted YAML scalar (go-yaml v2's ``resolve``)."""
    first = text[:1]
    if text and first not in "yYnNtTfFoO~+-.0123456789":
        return text
    if text in _NULLS:
        return None
    if text in _BOOLS:
        return _BOOLS[text]
    if text in _SPECIAL_FLOATS:
        return float(text.lstrip("+").replace(".", "", 1))
    if first == ".":
        return float(text) if _DOT_FLOAT.fullmatch(text) else text
    if first in "+-0123456789":
        # A timestamp (YYYY-MM-DD...) stays a string for kubectl; it matches nothing below.
        plain = text.replace("_", "")
        value = _go_int(plain)
        if value is not None:
            return value
        if _YAML_FLOAT.fullmatch(plain):
            number = float(plain)
            if number not in (float("inf"), float("-inf")):  # ParseFloat's range error
                return number
    return text


class KubectlLoader(yaml.SafeLoader):
    """A PyYAML loader that reads scalars as kubectl does (YAML 1.1 the go-yaml v2 way)."""

    yaml_implicit_resolvers: dict[Any, Any] = {}


def _construct_mapping(loader: KubectlLoader, node: yaml.MappingNode, deep: bool = False) -> dict[str, Any]:
    # Keys become JSON strings as they are read, so that 1 and true stay two keys as for kubectl.
    loader.flatten_mapping(node)
    return {_json_key(loader.construct_object(k, deep=deep)): loader.construct_object(v, deep=deep)
            for k, v in node.value}


KubectlLoader.construct_mapping = _construct_mapping  # type: ignore[assignment,method-assign]
KubectlLoader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])
KubectlLoader.add_implicit_resolver(_PLAIN_TAG, re.compile(r".*", re.DOTALL), None)
KubectlLoader.add_constructor(_PLAIN_TAG, lambda loader, node: resolve_plain(loader.construct_scalar(node)))


def _float32_digits(number: float) -> str:
    """The shortest decimal that reads back as the same float32 (Go's FormatFloat bitSize 32)."""
    single = struct.unpack("f", struct.pack("f", number))[0]
    for precision in range(1, 10):
        text = f"{single:.{precision}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == single:
            return text
    return repr(single)


def _go_float_key(number: float) -> str:
    """strconv.FormatFloat(number, 'g', -1, 32), as sigs.k8s.io/yaml writes a float key."""
    if not math.isfinite(number):
        return ".nan" if number != number else ".inf" if number > 0 else "-.inf"
    sign, digits, exponent = Decimal(_float32_digits(number)).normalize().as_tuple()
    text = "".join(map(str, digits)).lstrip("0") or "0"
    if text == "0":
        return "-0" if sign else "0"
    point = len(text) + int(exponent)  # where the decimal point goes in text
    neg = "-" if sign else ""
    e = point - 1
    if e < -4 or e >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{neg}{mantissa}e{'-' if e < 0 else '+'}{abs(e):02d}"
    if point <= 0:
        return f"{neg}0.{'0' * -point}{text}"
    if point >= len(text):
        return f"{neg}{text}{'0' * (point - len(text))}"
    return f"{neg}{text[:point]}.{text[point:]}"


def _json_key(key: Any) -> str:
    """sigs.k8s.io/yaml's string for a mapping key: kubectl sends every key as a string."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        return _go_float_key(key)
    raise yaml.constructor.ConstructorError(None, None, f"a mapping key {key!r} cannot become JSON (kubectl refuses it too)")


def _to_json(value: Any) -> Any:
    """sigs.k8s.io/yaml's conversion to JSON: infinities and NaN cannot be sent."""
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        raise ValueError(f"{value!r} cannot become JSON (kubectl refuses it too)")
    return value


def load_documents(text: str) -> list[Any]:
    """The documents of a YAML stream as kubectl reads them (empty documents dropped).

    Raises:
        yaml.YAMLError: the text is not YAML.
        ValueError: a document cannot be turned into JSON (a null key, an infinite number).
    """
    return [_to_json(doc) for doc in yaml.load_all(text, Loader=KubectlLoader) if doc is not None]


# --- notes: valid, but likely not meant ------------------------------------------------------------

def gpu_request(job_spec: Any) -> str | None:
    """The field that makes the pods of a (checked, defaulted) spec request ``nvidia.com/gpu``, or None."""
    if not isinstance(job_spec, dict):
        return None
    gpus = job_spec.get("gpusPerProc")
    if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0:
        return f"spec.gpusPerProc {gpus}"
    pod = (job_spec.get("template") or {}).get("spec") or {}
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(pod.get(kind) or []):
            resources = container.get("resources") or {}
            for part in ("limits", "requests"):
                value = (resources.get(part) or {}).get(policy.GPU_RESOURCE)
                if value is not None and str(value).strip() not in ("", "0"):
                    return f"spec.template.spec.{kind}[{i}].resources.{part}[{policy.GPU_RESOURCE}]"
    return None


def tolerates_gpu_taint(tolerations: Any) -> bool:
    """A toleration of the list names the key ``nvidia.com/gpu``, or tolerates every taint (Exists
    without a key)."""
    for t in tolerations if isinstance(tolerations, list) else []:
        if not isinstance(t, dict):
            continue
        if t.get("key") == policy.GPU_RESOURCE or (not t.get("key") and t.get("operator") == "Exists"):
            return True
    return False


def notes(value: Any) -> list[tuple[str, str]]:
    """``(field, message)`` for what a valid SPMDJob says that is likely not meant; nothing refuses it.

    A GPU job (its pods request ``nvidia.com/gpu``) whose template tolerates no GPU taint: GPU nodes
    are commonly tainted ``nvidia.com/gpu:NoSchedule`` (the NVIDIA device plugin's convention, and
    the clouds' GPU node pools), where such pods stay Pending (Unschedulable). The toleration
    suggested is the one ``monarch-spmd manifest`` writes (:data:`monarch_spmd.torchrun.GPU_TOLERATION`).
    A note, not an error: a cluster whose GPU nodes carry no taint runs them.
    """
    job_spec = value.get("spec") if isinstance(value, dict) else None
    asking = gpu_request(job_spec)
    if asking is None:
        return []
    pod = ((job_spec or {}).get("template") or {}).get("spec") or {}
    if tolerates_gpu_taint(pod.get("tolerations")):
        return []
    kueue = ((job_spec or {}).get("scheduling") or {}).get("provider") == spec.SCHEDULING_KUEUE
    flavor = (" (or give it to the Kueue ResourceFlavor that admits the job: its tolerations join the pods')"
              if kueue else "")
    toleration = "{" + ", ".join(f"{k}: {v}" for k, v in GPU_TOLERATION.items()) + "}"
    return [("spec.template.spec.tolerations", (
        f"the pods request {policy.GPU_RESOURCE} ({asking}) but tolerate no GPU taint: on GPU nodes tainted "
        f"{policy.GPU_RESOURCE}:NoSchedule (the NVIDIA device plugin's convention) they stay Pending "
        f"(Unschedulable); add the toleration {toleration}{flavor}, or ignore this where GPU nodes carry no "
        "such taint"))]


# --- the command ---------------------------------------------------------------------------------


@dataclass
class _Outcome:
    errors: int = 0
    usage: int = 0
    jobs: int = 0
    stored: dict[str, Any] = field(default_factory=dict)  # --old: name -> the job as stored


def _jobs(docs: list[Any]) -> Iterator[tuple[str, Any]]:
    """(label, document) of every SPMDJob-looking document, List items included."""
    for n, doc in enumerate(docs, 1):
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            for m, item in enumerate(doc["items"], 1):
                if _is_job(item):
                    yield f"doc {n} item {m}", item
        elif _is_job(doc):
            yield f"doc {n}", doc


def _is_job(doc: Any) -> bool:
    """An SPMDJob, or a document that meant to be one (its group or kind is ours)."""
    if not isinstance(doc, dict):
        return True
    api = doc.get("apiVersion")
    return doc.get("kind") == spec.KIND or (isinstance(api, str) and api.split("/")[0] == spec.GROUP)


def _name(doc: Any) -> str:
    metadata = doc.get("metadata") if isinstance(doc, dict) else None
    if isinstance(metadata, dict):
        if isinstance(metadata.get("name"), str) and metadata["name"]:
            return metadata["name"]
        if isinstance(metadata.get("generateName"), str) and metadata["generateName"]:
            return metadata["generateName"] + "*"
    return "no name"


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def check_file(path: str, out: _Outcome, *, in_folder: bool = False) -> None:
    """Checks one file (``-`` is standard input); ``in_folder``: found in a folder, where a file
    without an SPMDJob is skipped with a note instead of being an error."""
    shown = "<stdin>" if path == "-" else path
    try:
        docs = load_documents(_read(path))
    except OSError as e:
        print(f"{shown}: cannot read: {e.strerror or e}", file=sys.stderr)
        out.usage += 1
        return
    except (yaml.YAMLError, ValueError, UnicodeDecodeError) as e:
        print(f"{shown}: not valid YAML: {' '.join(str(e).split())}", file=sys.stderr)
        out.usage += 1
        return
    jobs = list(_jobs(docs))
    if not jobs:
        kinds = sorted({str(d.get("kind")) for d in docs if isinstance(d, dict)})
        found = f" (found: {', '.join(kinds)})" if kinds else ""
        if in_folder:
            print(f"{shown}: no {spec.KIND} document{found}; skipped")
            return
        print(f"{shown}: no {spec.KIND} document{found}")
        out.errors += 1
        return
    out.jobs += len(jobs)
    bad = 0
    for label, doc in jobs:
        old = out.stored.get(_name(doc), spec.MISSING)  # --old: an update of the stored object
        value, errors = check_manifest(doc, old=old)
        errors = errors or spec.pod_problems(value["spec"])  # what the job's every pod would be refused for
        for error in errors:
            print(f"{shown}: {label} ({_name(doc)}): {error}")
        for where, message in [] if errors else notes(value):
            print(f"{shown}: {label} ({_name(doc)}): note: {where}: {message}")
        bad += bool(errors)
    out.errors += bad
    if not bad:
        print(f"{shown}: {len(jobs)} {spec.KIND}(s) valid")


@functools.cache
def _root() -> schema.Obj:
    """The SPMDJob schema as the CRD has it: the table, with Kubernetes' PodTemplateSpec under spec.template."""
    return podtemplate.with_template(spec.ROOT)


def check_manifest(doc: Any, *, old: Any = spec.MISSING) -> tuple[Any, list[spec.SpecError]]:
    """:func:`monarch_spmd.spec.check_manifest` with every field of ``spec.template`` checked as the
    CRD checks it (Kubernetes' PodTemplateSpec, :mod:`monarch_spmd.podtemplate`): an unknown field
    (``spec.template.spec.containers[0].resoures``) or a value of the wrong type there is an error
    naming its path, as ``kubectl apply`` is refused for it."""
    value, errors = spec.check_manifest(doc, require_image=True, old=old)
    if not isinstance(value, dict) or value is doc:
        return value, errors  # not an SPMDJob: apiVersion or kind
    if isinstance(old, dict):
        old, _ = schema.validate(_root(), old, "")  # as the server stored it: defaulted
    value, problems = schema.validate(_root(), doc, "", old=old, reset=("status",))
    return value, [spec.SpecError(p.path, p.message, policy=p.policy) for p in problems]


def folder_files(folder: str, recursive: bool = False) -> list[str]:
    """The manifests of a folder, as ``kubectl apply -f DIR [-R]`` finds them: files ending in
    :data:`MANIFEST_EXTENSIONS`, in name order (with ``recursive``, subfolders' too, depth first)."""
    found: list[str] = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.is_dir():
            if recursive:
                found.extend(folder_files(entry.path, True))
        elif entry.name.endswith(MANIFEST_EXTENSIONS):
            found.append(entry.path)
    return found


def check_path(path: str, out: _Outcome, recursive: bool) -> None:
    """Checks a file, or every manifest of a folder."""
    if path == "-" or not os.path.isdir(path):
        check_file(path, out)
        return
    try:
        files = folder_files(path, recursive)
    except OSError as e:
        print(f"{path}: cannot read: {e.strerror or e}", file=sys.stderr)
        out.usage += 1
        return
    before = out.jobs
    for file in files:
        check_file(file, out, in_folder=True)
    if not files:
        deeper = "" if recursive else " (-R looks in its subfolders too)"
        print(f"{path}: no {', '.join(MANIFEST_EXTENSIONS)} file in this folder{deeper}", file=sys.stderr)
        out.usage += 1
    elif out.jobs == before:
        print(f"{path}: no {spec.KIND} document in the folder's {len(files)} manifest file(s)")
        out.errors += 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``monarch-spmd validate``."""
    parser = argparse.ArgumentParser(
        prog="monarch-spmd validate",
        usage=USAGE[len("usage: "):],
        description="Check SPMDJob manifests offline, exactly as the API server checks kubectl apply (field "
        "validation Strict: unknown fields, types, defaults, bounds, patterns and the CRD's CEL rules). Each "
        "error names the file, the document and the field. Exit code 0: every SPMDJob is valid; 1: one is "
        "not (or a file named holds none); 2: a file or folder cannot be read, or YAML that does not parse.",
    )
    parser.add_argument("-f", "--filename", dest="files", action="append", default=[], metavar="FILE|DIR|-",
                        help="a manifest, a folder of manifests (.yaml, .yml, .json) or - for standard input; repeatable")
    parser.add_argument("-R", "--recursive", action="store_true", help="also the manifests of a folder's subfolders")
    parser.add_argument("paths", nargs="*", metavar="FILE|DIR", help="more manifests or folders (as with -f)")
    parser.add_argument("--old", metavar="FILE", help="the jobs as stored (kubectl get spmdjob NAME -o yaml): check "
                        "the manifests as updates of them, by name (the fields that shape the pods change only while "
                        "the job is suspended)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``monarch-spmd validate``; returns the exit code."""
    parser = build_parser()
    opts = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    paths = [*opts.files, *opts.paths]
    if not paths:
        parser.error("no file given: -f FILE, a folder or - for standard input")
    out = _Outcome()
    if opts.old:
        try:
            out.stored = {_name(doc): doc for _, doc in _jobs(load_documents(_read(opts.old)))}
        except (OSError, yaml.YAMLError, ValueError, UnicodeDecodeError) as e:
            print(f"{opts.old}: cannot read the stored jobs: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
    for path in paths:
        check_path(path, out, opts.recursive)
    return 2 if out.usage else 1 if out.errors else 0


if __name__ == "__main__":
    sys.exit(main())
