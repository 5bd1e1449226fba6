"""Helpers shared by the Helm chart tests: picking objects out of rendered manifests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def by_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: Sequence[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def is_test_hook(obj: dict[str, Any]) -> bool:
    return (obj["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"
