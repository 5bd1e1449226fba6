"""Helpers shared by the Helm chart tests: picking objects out of rendered manifests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "monarch-spmd"
#: The test cluster's Kubernetes version; helm built from source assumes v1.20 without it.
KUBE_VERSION = "v1.34.4"


def by_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: Sequence[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def is_test_hook(obj: dict[str, Any]) -> bool:
    return (obj["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"


def rendered_test_job(objects: Sequence[dict[str, Any]], uid: str = "0a1b2c3d-0000") -> dict[str, Any]:
    """The SPMDJob the `helm test` pod creates, named as the pod names it for pod uid `uid`."""
    import json

    pod = one([o for o in objects if is_test_hook(o)], "Pod")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    job = json.loads(env["SPMD_TEST_JOB_MANIFEST"])
    job["metadata"]["name"] = f"{env['SPMD_TEST_JOB_PREFIX']}-{uid[:5]}"
    return job
