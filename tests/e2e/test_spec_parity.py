"""Parity: the Python validator (monarch_spmd.spec) and the real API server give the same verdict.

Hundreds of SPMDJob manifests are generated from a fixed seed: valid ones with random shapes and
optional fields, and mutations of them, one to three per manifest, over every field of the table
(wrong types, bounds and one past them, unknown fields, whitespace and non-ASCII in strings,
duplicate dimension names, products over 4096, bad argv, bad pod-template bits, floats where
integers go, nulls ...), half of them derived from the table itself (values at, below and above
every bound, enum values and their lowercase, other types, null, absent), so that a field added to
the table is covered without touching this file. Each goes to ``spec.check_manifest`` and, as a server-side dry-run create
with field validation Strict (what ``kubectl apply`` sends), to a real kube-apiserver with the
generated CRD installed. Every verdict must agree, every Python refusal must name a field, and
both verdicts must be common enough that the generator is not degenerate.

MONARCH_SPMD_PARITY_SEED and MONARCH_SPMD_PARITY_COUNT change the seed and the number of manifests;
the seed is printed on failure. A second test checks the YAML side: ``monarch-spmd validate`` reads
YAML scalars exactly as kubectl does.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from monarch_spmd import schema, spec, validate

pytestmark = pytest.mark.cluster

SEED = int(os.environ.get("MONARCH_SPMD_PARITY_SEED", "1130"))
COUNT = int(os.environ.get("MONARCH_SPMD_PARITY_COUNT", "700"))

Doc = dict[str, Any]
_DEL = object()


# --- valid manifests ------------------------------------------------------------------------------


def _dims(rng: random.Random) -> list[dict[str, Any]]:
    names = rng.sample(["hosts", "gpus", "a", "dp", "tp", "pp", "x-1", "zone9", "n" * 57], rng.randint(1, 4))
    sizes: list[int] = []
    budget = 4096
    for _ in names:
        size = rng.choice([1, 2, 3, 4, 8, 16, 64, budget]) if budget > 1 else 1
        size = max(1, min(size, budget))
        sizes.append(size)
        budget //= size
    return [{"name": n, "size": s} for n, s in zip(names, sizes)]


def valid_manifest(rng: random.Random) -> Doc:
    body: Doc = {
        "mesh": _dims(rng),
        "args": rng.choice([["-m", "train"], ["-m", "pkg.mod", "--lr", "0.1"], ["train.py"], ["/opt/x.py", "-v", ""]]),
        "image": rng.choice(["python:3.11-slim", "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "r.io/a/b@sha256:" + "f" * 64]),
    }
    optional: dict[str, Callable[[], Any]] = {
        "python": lambda: rng.choice(["python3", "/usr/bin/python3.11", "py"]),
        "masterPort": lambda: rng.choice([1, 29500, 65535]),
        "gpusPerProc": lambda: rng.choice([0, 1, 16]),
        "colocate": lambda: rng.choice([True, False]),
        "suspend": lambda: rng.choice([True, False]),
        "rendezvousTimeoutSeconds": lambda: rng.choice([1, 300, 86400]),
        "activeDeadlineSeconds": lambda: rng.choice([1, 3600, 2**62]),
        "ttlSecondsAfterFinished": lambda: rng.choice([0, 60]),
        "restartPolicy": lambda: {
            k: v for k, v in {
                "maxRestarts": rng.choice([0, 3, 100]),
                "permanentExitCodes": rng.choice([[], [1, 2], [255]]),
                "retryableExitCodes": rng.choice([[], [137, 143]]),
                "permanentReasons": rng.choice([[], ["OOMKilled", "Evicted"], ["OutOfnvidia.com/gpu"]]),
                "podReplacementPolicy": rng.choice(spec.POD_REPLACEMENT_POLICIES),
                "replacementTimeoutSeconds": rng.choice([1, 120, 86400]),
            }.items() if rng.random() < 0.5
        },
        "template": lambda: {
            "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x y"}},
            "spec": {
                "nodeSelector": {"gpu": "h100"},
                "containers": [
                    {"name": "trainer", "resources": {"limits": {"cpu": "1"}},
                     "env": [{"name": "A", "value": "1"}, {"name": "MONARCH_SPMD_ROLE_NAME", "value": "r"}]},
                    {"name": "side", "image": "busybox", "command": ["sh"], "env": [{"name": "MONARCH_SPMD_MESH"}]},
                ],
            },
        },
    }
    for key, make in optional.items():
        if rng.random() < 0.3:
            body[key] = make()
    return {"apiVersion": spec.API_VERSION, "kind": spec.KIND, "metadata": {"name": rng.choice(["job", "a", "a" * 50, "j-1"])},
            "spec": body}


# --- mutations: each changes one thing, valid or not -------------------------------------------


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        if isinstance(key, int):
            if not isinstance(doc, list) or not -len(doc) <= key < len(doc):
                return _DEL
        elif not isinstance(doc, dict) or key not in doc:
            return _DEL
        doc = doc[key]
    return doc


def _set(doc: Doc, path: tuple[Any, ...], value: Any) -> None:
    """Sets (or with _DEL deletes) ``path``, making the objects and lists on the way."""
    node: Any = doc
    for key, after in zip(path, path[1:]):
        kind = list if isinstance(after, int) else dict
        if isinstance(key, int):
            if not node:
                node.append(kind())
            key %= len(node)
        if not isinstance(node[key] if isinstance(key, int) else node.get(key), kind):
            node[key] = kind()
        node = node[key]
    last = path[-1]
    if isinstance(last, int):
        if not node and value is not _DEL:
            node.append(None)
        if node:
            if value is _DEL:
                del node[last % len(node)]
            else:
                node[last % len(node)] = value
    elif value is _DEL:
        node.pop(last, None)
    else:
        node[last] = value


INTS = [0, 1, -1, 2, 255, 256, 4096, 4097, 65535, 65536, 86400, 86401, 2**62, 2**63 - 1, 2**63, 10**30]
NOT_INTS = ["5", 5.5, 2.0, 1e21, 1e300, True, None, [1], {"a": 1}, -0.0]
STRINGS = ["", " ", "a b", "a\tb", "a\n", "\na", "ä", "python3", "x" * 57, "x" * 58, "\x7f", "a\u00a0b", "é" * 10, "-x", "A"]


def _field(path: tuple[Any, ...], values: list[Any]) -> Callable[[random.Random, Doc], None]:
    return lambda rng, doc: _set(doc, path, rng.choice(values))


def _append(path: tuple[Any, ...], item: Any) -> Callable[[random.Random, Doc], None]:
    def mutate(rng: random.Random, doc: Doc) -> None:
        current = _get(doc, path)
        _set(doc, path, (current if isinstance(current, list) else []) + [copy.deepcopy(item)])
    return mutate


def _mesh_product(rng: random.Random, doc: Doc) -> None:
    sizes = rng.choice([[64, 64], [64, 65], [16, 16, 16], [16, 16, 17], [4096], [2, 2, 2, 512], [2, 2, 2, 513], [4097, 1]])
    _set(doc, ("spec", "mesh"), [{"name": f"d{i}", "size": s} for i, s in enumerate(sizes)])


def _duplicate_dim(rng: random.Random, doc: Doc) -> None:
    mesh = _get(doc, ("spec", "mesh"))
    if isinstance(mesh, list) and mesh and isinstance(mesh[0], dict):
        mesh.append(copy.deepcopy(mesh[0]))


def _many(path: tuple[Any, ...], item: Any, counts: list[int]) -> Callable[[random.Random, Doc], None]:
    return lambda rng, doc: _set(doc, path, [copy.deepcopy(item) for _ in range(rng.choice(counts))])


def _containers(rng: random.Random, doc: Doc) -> None:
    trainer = rng.choice([{"name": "trainer"}, {}, {"name": None}, {"name": ""}, {"name": "side"}, {"name": "Side_1"},
                          {"name": "s" * 63}, {"name": "s" * 64}, {"name": "-side"}])
    extra = rng.choice([
        {"image": "x"}, {"command": ["sh"]}, {"args": ["-x"]}, {"image": None}, {"command": None},
        {"env": [{"name": "MONARCH_SPMD_MESH", "value": "a=1"}]}, {"env": [{"name": "MONARCH_SPMD_ROLE_NAME"}]},
        {"env": [{"name": "MONARCH_SPMD_LOCAL_RANK_SCOPE", "value": "pod"}, {"name": "B"}]},
        {"env": [{"name": "MONARCH_SPMD_"}]}, {"env": [{"value": "no name"}]}, {"env": [{"name": None}]},
        {"env": [None]}, {"env": "x"}, {"env": [{"name": 5}]}, {"command": [1]}, {"image": 5},
        {"resources": {"limits": {"cpu": 1}}}, {"unknownField": 1}, {},
        # the contract's variables and the pod's own, refused in the trainer only
        {"env": [{"name": "RANK", "value": "3"}]}, {"env": [{"name": "POD_IP"}, {"name": "A"}]},
        {"env": [{"name": "OMP_NUM_THREADS", "value": "2"}, {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING"}]},
        {"env": [{"name": "MASTER_PORT", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
        {"env": [{"name": "a" * 256}]}, {"env": [{"name": "a" * 257}]},
    ])
    containers = [{**trainer, **extra}]
    if rng.random() < 0.4:
        containers.append(rng.choice([{"name": "trainer"}, {}, {"name": "side2", "image": "y"}, {"name": "s3", "env": [{"name": "MONARCH_SPMD_COORDS"}]}]))
    _set(doc, ("spec", "template", "spec", "containers"), containers)


MUTATIONS: list[tuple[str, Callable[[random.Random, Doc], None]]] = [
    # metadata and the envelope
    ("name", _field(("metadata", "name"), ["A", "a" * 50, "a" * 51, "1a", "a-", "-a", "a.b", "a_b", "", None, 5, "ab", "a" * 63])),
    ("no-name", _field(("metadata", "name"), [_DEL])),
    ("generate-name", lambda rng, doc: (doc["metadata"].pop("name", None), doc["metadata"].__setitem__(
        "generateName", rng.choice(["ab-", "a", "A-", "1-", "a" * 45, "a" * 46, "a--"])))),
    ("labels", _field(("metadata", "labels"), [{"a": "b"}, {"a b": "x"}, {"a": "b c"}, {"a": 1}, {"a": None},
                                                  {"x.io/a": "b"}, {"X.io/a": "b"}, {"a": "b" * 64}, "x"])),
    ("annotations", _field(("metadata", "annotations"), [{"A/b": "x"}, {"a": "multi\nline"}, {"a b": "x"}, {"a": 1}])),
    ("metadata-unknown", _field(("metadata", "color"), ["red"])),
    ("metadata-more", lambda rng, doc: doc["metadata"].update(rng.choice([
        {"generateName": "a."}, {"generateName": "A-"}, {"generateName": "ab-"}, {"finalizers": ["a b"]},
        {"finalizers": ["foo", "x.io/y"]}, {"finalizers": "x"}, {"finalizers": [1]}, {"creationTimestamp": "garbage"},
        {"creationTimestamp": None}, {"creationTimestamp": "2020-01-01T00:00:00Z"}, {"creationTimestamp": "2020-13-01T00:00:00Z"},
        {"creationTimestamp": "2020-01-01T00:00:00.5+01:00"}, {"generation": "x"}, {"generation": 3}, {"resourceVersion": "5"},
        {"uid": 5}, {"namespace": None}, {"labels": {"": "x"}}, {"labels": {"a/b/c": "x"}}, {"labels": {"-a": "x"}},
        {"labels": {"a": "x" * 63}}, {"labels": {"a" * 64: "x"}}, {"labels": {"x" * 254 + "/a": "b"}}, {"labels": {"a": "ä"}},
        {"annotations": {"a": "x" * 262143}}, {"annotations": {"a": "x" * 262144}}, {"annotations": {"ä": "x"}},
        {"annotations": None}, {"labels": None}, {"ownerReferences": []}, {"deletionGracePeriodSeconds": 5.5},
    ]))),
    ("root-unknown", _field(("extra",), [1, None])),
    ("status", _field(("status",), [{"phase": "Running"}, {"phase": "Bogus"}, {"color": 1}, "x"])),
    ("spec-unknown", _field(("spec", "replicas"), [3, None])),
    ("spec-type", _field(("spec",), [None, "x", [], {}])),
    # mesh
    ("mesh", _field(("spec", "mesh"), [_DEL, None, [], "hosts=2", {}, [None], ["x"], [{}],
                                      [{"name": f"d{i}", "size": 1} for i in range(5)],
                                      [{"name": f"d{i}", "size": 1} for i in range(4)]])),
    ("mesh-size", lambda rng, doc: _set(doc, ("spec", "mesh", rng.randrange(4), "size"), rng.choice(INTS + NOT_INTS + [_DEL]))),
    ("mesh-name", lambda rng, doc: _set(doc, ("spec", "mesh", rng.randrange(4), "name"), rng.choice(STRINGS + ["Hosts", "gpu_s", "1a", "a-", "a.b", None, 5, _DEL]))),
    ("mesh-extra", lambda rng, doc: _set(doc, ("spec", "mesh", 0, "extra"), 1)),
    ("mesh-duplicate", _duplicate_dim),
    ("mesh-product", _mesh_product),
    # args
    ("args", _field(("spec", "args"), [_DEL, None, [], ["-m"], ["-m", ""], ["-m", "x"], ["-m", "-x"], ["--"], ["--lr"],
                                      [""], [" x.py"], ["x.py", 1], [1], [None], ["x.py", None], "x.py", ["-m", "a b"],
                                      ["-c", "print(1)"], ["x.py", ""], ["-", "x"], ["\t"]])),
    ("args-count", _many(("spec", "args"), "a", [4096, 4097])),
    # strings
    ("image", _field(("spec", "image"), STRINGS + [_DEL, None, 5, "a" * 4096, "a" * 4097, "img:tag@sha256:00"])),
    ("python", _field(("spec", "python"), STRINGS + [None, 3, "/usr/bin/python3", "a" * 1024, "a" * 1025, "py\x00"])),
    # integers and booleans
    ("masterPort", _field(("spec", "masterPort"), INTS + NOT_INTS + [29500.0])),
    ("gpusPerProc", _field(("spec", "gpusPerProc"), INTS + NOT_INTS + [16, 17, 1.0])),
    ("rendezvous", _field(("spec", "rendezvousTimeoutSeconds"), INTS + NOT_INTS)),
    ("deadline", _field(("spec", "activeDeadlineSeconds"), INTS + NOT_INTS)),
    ("ttl", _field(("spec", "ttlSecondsAfterFinished"), INTS + NOT_INTS)),
    ("colocate", _field(("spec", "colocate"), [True, False, None, "true", 1, 0, "yes"])),
    ("shmSize", _field(("spec", "shmSize"), ["0", "1", "1048575", "1048576", "1Mi", "1Ti", "1025Gi", "1099511627777",
                                            "0.0000001", "0.5Gi", "16Gi", "1e3", "2 Gi", "99999999999Ei", "", None, 2])),
    ("suspend", _field(("spec", "suspend"), [True, False, None, "false", 0])),
    # restart policy
    ("restartPolicy", _field(("spec", "restartPolicy"), [None, {}, "x", [], {"backoffLimit": 1}])),
    ("maxRestarts", _field(("spec", "restartPolicy", "maxRestarts"), INTS + NOT_INTS + [100, 101])),
    ("permanentExitCodes", _field(("spec", "restartPolicy", "permanentExitCodes"),
                                  [[0], [1], [255], [256], [2, 2], [], None, ["1"], [1.5], [2.0], "1", [None], [-1]])),
    ("retryableExitCodes", _field(("spec", "restartPolicy", "retryableExitCodes"),
                                  [[0], [1], [137], [256], [], None, [True], [1, 255]])),
    ("exit-code-overlap", lambda rng, doc: (_set(doc, ("spec", "restartPolicy", "permanentExitCodes"), [1, 2, 3]),
                                            _set(doc, ("spec", "restartPolicy", "retryableExitCodes"), rng.choice([[3], [4], [2, 9]])))),
    ("exit-code-count", _many(("spec", "restartPolicy", "permanentExitCodes"), 1, [256, 257])),
    ("permanentReasons", _field(("spec", "restartPolicy", "permanentReasons"),
                                [[""], ["OOMKilled"], [" OOMKilled"], ["OOM Killed"], ["OutOfnvidia.com/gpu"], ["a" * 128],
                                 ["a" * 129], [1], [None], ["Ö"], ["1Reason"], ["Evicted", "Evicted"], "OOMKilled"])),
    ("reason-count", _many(("spec", "restartPolicy", "permanentReasons"), "Evicted", [32, 33])),
    ("podReplacementPolicy", _field(("spec", "restartPolicy", "podReplacementPolicy"),
                                    ["Failed", "TerminatingOrFailed", "failed", "", 1, None, "Terminating"])),
    ("replacementTimeout", _field(("spec", "restartPolicy", "replacementTimeoutSeconds"), INTS + NOT_INTS)),
    ("restartPolicy-unknown", _field(("spec", "restartPolicy", "onFailure"), ["x"])),
    # pod template
    ("template", _field(("spec", "template"), [None, {}, "x", [], {"kind": "Pod"}, {"metadata": None}, {"spec": None},
                                              {"spec": "x"}, {"spec": {}}, {"metadata": {}}])),
    ("template-metadata", _field(("spec", "template", "metadata"),
                                 [{"name": "x"}, {"labels": {"a": 1}}, {"labels": {"a": None}}, {"labels": {"a": "b"}},
                                  {"annotations": {"x": "y"}}, {"annotations": "x"}, {"labels": {"a b": "c"}}, None])),
    ("pod-restartPolicy", _field(("spec", "template", "spec", "restartPolicy"), ["Always", "Never", "OnFailure", "", None, 1, "never"])),
    ("pod-free-form", _field(("spec", "template", "spec", "nodeSelector"), [{"a": "b"}, None, 5, "x"])),
    ("containers", _containers),
    ("containers-type", _field(("spec", "template", "spec", "containers"), [None, [], "x", [None], [{}], [[]], {}])),
    ("containers-count", _many(("spec", "template", "spec", "containers"), {"name": "side"}, [64, 65])),
    ("env-count", lambda rng, doc: _set(doc, ("spec", "template", "spec", "containers"),
                                        [{"name": "trainer", "env": [{"name": "A"}] * rng.choice([1024, 1025])}])),
]


# --- mutations derived from the table: every field, including the ones added later ------------

TABLE = [(path, node) for path, node in schema.walk(spec.ROOT) if path.startswith(".spec")]


def _sample(node: schema.Node) -> Any:
    """A value of the node's type, usually within its bounds."""
    if node.default is not schema.MISSING:
        return copy.deepcopy(node.default)
    if isinstance(node, schema.Int):
        return node.minimum if node.minimum is not None else 1
    if isinstance(node, schema.Str):
        return node.enum[0] if node.enum else "a"
    if isinstance(node, schema.Bool):
        return False
    if isinstance(node, schema.Arr):
        return [_sample(node.items)] * (node.min_items or 1)
    if isinstance(node, schema.Obj):
        return {k: _sample(c) for k, c in node.properties.items() if c.required}
    return None


def _values(node: schema.Node) -> list[Any]:
    """Values at and around every bound of the node, and of other types."""
    out: list[Any] = [_DEL, None, "x", 1, 1.5, True, [], {}]
    if isinstance(node, schema.Int):
        for bound in (node.minimum, node.maximum):
            if bound is not None:
                out += [bound - 1, bound, bound + 1, float(bound)]
        out += [0, -1, 2**63, 2**31]
    elif isinstance(node, schema.Str):
        for length in (node.min_length, node.max_length):
            if length is not None:
                out += ["a" * max(length - 1, 0), "a" * length, "a" * (length + 1)]
        out += list(node.enum or ()) + [e.lower() for e in node.enum or ()] + ["", " a", "a b", "a\tb", "ä", "A", "1"]
    elif isinstance(node, schema.Arr):
        item = _sample(node.items)
        for count in (node.min_items, node.max_items):
            if count is not None:
                out += [[item] * max(count - 1, 0), [item] * count, [item] * (count + 1)]
        out += [[item], [None], [item, item]]
    elif isinstance(node, schema.Obj):
        out += [_sample(node), {**_sample(node), "unknownField": 1}]
    return out


def _concrete(rng: random.Random, path: str) -> tuple[Any, ...]:
    """``.spec.mesh[].size`` -> ``("spec", "mesh", 1, "size")``; a map's ``{}`` -> a key."""
    keys: list[Any] = []
    for part in path.lstrip(".").split("."):
        name, brackets = part.split("[")[0].split("{")[0], part[len(part.split("[")[0].split("{")[0]):]
        keys.append(name)
        for mark in re.findall(r"\[\]|\{\}", brackets):
            keys.append(rng.randrange(3) if mark == "[]" else "k")
    return tuple(keys)


def _from_table(rng: random.Random, doc: Doc) -> None:
    path, node = rng.choice(TABLE)
    value = rng.choice(_values(node))
    _set(doc, _concrete(rng, path), value if value is _DEL else copy.deepcopy(value))


MUTATIONS += [("table", _from_table)] * (len(MUTATIONS) // 2)


def generate(seed: int, count: int) -> list[tuple[str, Doc]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        doc = valid_manifest(rng)
        applied = []
        for _ in range(rng.choices([0, 1, 2, 3], weights=[12, 60, 20, 8])[0]):
            name, mutate = rng.choice(MUTATIONS)
            mutate(rng, doc)
            applied.append(name)
        out.append((f"#{i} [{', '.join(applied) or 'valid'}]", doc))
    return out


def as_kubectl_sends(value: Any) -> Any:
    """The JSON kubectl writes (Go's encoder): a whole float below 1e21 has no fraction."""
    if isinstance(value, float) and math.isfinite(value) and value == int(value) and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: as_kubectl_sends(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_kubectl_sends(v) for v in value]
    return value


def server_verdict(api: client.CustomObjectsApi, namespace: str, doc: Doc) -> tuple[bool, str]:
    try:
        api.create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, as_kubectl_sends(doc),
                                            dry_run="All", field_validation="Strict")
        return True, ""
    except client.ApiException as e:
        if e.status in (400, 422):
            try:
                return False, json.loads(e.body).get("message", e.body)
            except ValueError:
                return False, str(e.body)
        raise


@pytest.fixture(scope="module")
def crd_installed(cluster):
    cluster.install_crds()
    return cluster


def test_python_and_the_api_server_agree_on_every_generated_manifest(crd_installed, namespace):
    api = client.CustomObjectsApi(crd_installed.api_client())
    cases = generate(SEED, COUNT)
    began = time.monotonic()
    accepted = rejected = 0
    mismatches, unnamed = [], []
    for label, doc in cases:
        _, errors = spec.check_manifest(copy.deepcopy(doc), require_image=True)
        ok, message = server_verdict(api, namespace, doc)
        accepted += ok
        rejected += not ok
        if ok != (not errors):
            mismatches.append(f"{label}: server {'accepted' if ok else 'refused: ' + message[:400]}; "
                              f"python {'accepted' if not errors else 'refused: ' + '; '.join(map(str, errors))[:400]}\n"
                              f"    {json.dumps(doc)[:600]}")
        if errors and not all(e.field and e.field.split(".")[0].split("[")[0] in ("apiVersion", "kind", "metadata", "spec", "status", "extra")
                              for e in errors):
            unnamed.append(f"{label}: {errors}")
    seconds = time.monotonic() - began
    print(f"\nparity: seed {SEED}, {len(cases)} manifests, {accepted} accepted, {rejected} refused, {seconds:.1f}s")
    assert not mismatches, (f"seed {SEED} (MONARCH_SPMD_PARITY_SEED): {len(mismatches)} of {len(cases)} verdicts differ:\n"
                            + "\n".join(mismatches[:25]))
    assert not unnamed, f"seed {SEED}: refusals that name no field:\n" + "\n".join(unnamed[:10])
    assert accepted >= len(cases) // 5 and rejected >= len(cases) // 5, (
        f"seed {SEED}: degenerate generator: {accepted} accepted, {rejected} refused of {len(cases)}")


# --- the YAML side: scalars read as kubectl reads them ------------------------------------------

SCALARS = ["1e3", "017", "0o17", "08", "0x1F", "1_000", "-0b101", "0b101", "+5", ".5", "1.", "y", "n", "yes", "No", "on",
           "OFF", "~", "null", "Null", "2024-01-01", "2024-01-01T10:00:00Z", "12:30", "1e21", "3.0", "-0.0",
           "9223372036854775807", "1.0e+3", "0.1", "1e-7", "True", "tRue", "0", "-", "-1", "+.5", "._5", "1__0",
           "0.", "-.5", "1e", "e1", "0x", "0b2", "'quoted 5'", '"7"', "Yes please", "1,2", "0o8", "+0x10", "~x"]


def test_validate_reads_yaml_scalars_as_kubectl_does(crd_installed, tmp_path: Path):
    lines = "\n".join(f"        - {s}" for s in SCALARS)
    text = (f"apiVersion: {spec.API_VERSION}\nkind: {spec.KIND}\nmetadata: {{name: yaml}}\nspec:\n"
            f"  mesh: [{{name: a, size: 1}}]\n  args: [x.py]\n  image: i\n  template:\n    spec:\n      probe:\n{lines}\n"
            f"      keys: {{1: a, true: b, 2.5: c, yes: d, 1e7: e, 0.0001: f, 1.0e-5: g, 3.14159265358979: h, 123456.7: i, -0.0: j}}\n")
    path = tmp_path / "scalars.yaml"
    path.write_text(text)
    result = crd_installed.kubectl("create", "--dry-run=client", "-o", "json", "-f", str(path))
    kubectl = json.loads(result.stdout)["spec"]["template"]["spec"]
    [ours] = validate.load_documents(text)
    ours = ours["spec"]["template"]["spec"]
    sent = as_kubectl_sends(ours)
    for scalar, theirs, mine in zip(SCALARS, kubectl["probe"], sent["probe"]):
        assert (type(theirs), theirs) == (type(mine), mine), f"YAML {scalar!r}: kubectl sends {theirs!r}, validate reads {mine!r}"
    assert sent["keys"] == kubectl["keys"]


# --- the pod-template rules, now the API server's: kubectl apply refuses them naming the field --

TEMPLATE_CASES = [
    ({"restartPolicy": "OnFailure"}, "spec.template.spec.restartPolicy", "pods run with Never"),
    ({"containers": [{"name": "trainer", "image": "other"}]}, "spec.template.spec.containers[0].image", "use spec.image"),
    ({"containers": [{"command": ["sh"]}]}, "spec.template.spec.containers[0].command", "use spec.python"),
    ({"containers": [{"name": "trainer", "args": ["x"]}]}, "spec.template.spec.containers[0].args", "use spec.args"),
    ({"containers": [{"name": "trainer", "env": [{"name": "MONARCH_SPMD_MESH", "value": "a=1"}]}]},
     "spec.template.spec.containers[0].env", "MONARCH_SPMD_*"),
    ({"containers": [{"name": "trainer"}, {"image": "x2"}]}, "spec.template.spec.containers", "at most one container"),
]


@pytest.mark.parametrize(("pod", "field", "message"), TEMPLATE_CASES, ids=[c[1].rsplit(".", 1)[-1] for c in TEMPLATE_CASES])
def test_kubectl_apply_refuses_a_bad_pod_template_naming_the_field(crd_installed, namespace, tmp_path, pod, field, message):
    doc = {"apiVersion": spec.API_VERSION, "kind": spec.KIND, "metadata": {"name": "tmpl"},
           "spec": {"mesh": [{"name": "a", "size": 1}], "args": ["x.py"], "image": "i", "template": {"spec": pod}}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(doc))
    result = crd_installed.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
    assert result.returncode != 0, result.stdout
    assert f"{field}: Invalid value" in result.stderr and message in result.stderr, result.stderr
    _, errors = spec.check_manifest(doc)
    assert errors and errors[0].field.startswith(field), errors
    # Without the offending part the same job is accepted.
    doc["spec"]["template"] = {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "trainer", "env": [{"name": "MONARCH_SPMD_ROLE_NAME", "value": "r"}]},
        {"name": "sidecar", "image": "busybox", "command": ["sh"], "env": [{"name": "MONARCH_SPMD_MESH", "value": "x"}]}]}}
    path.write_text(json.dumps(doc))
    result = crd_installed.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
    assert result.returncode == 0, result.stderr
    assert spec.check_manifest(doc)[1] == []
