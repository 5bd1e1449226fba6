"""The operator's metadata-only reads against the real API server.

The Service and ConfigMap informers, and the GET of a child whose name was taken, ask for
PartialObjectMetadata: a namespace's payload ConfigMap carries the worker (about 160 KB), which
the watch and the 409 path would otherwise send again and again. These tests check
the server answers each such read with the metadata the lifecycle reads (labels, owner,
annotations, deletion) and without the data.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from devcluster import LocalCluster
from spmd_operator import informer, kube, lifecycle, names

PAYLOAD = {"worker.py": "x" * 200_000}


def configmap(name: str, payload_hash: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {names.LABEL_PAYLOAD: payload_hash},
                         "annotations": {names.PAYLOAD_HASH_ANNOTATION: payload_hash}},
            "data": PAYLOAD}


def test_lists_watches_and_gets_of_metadata_carry_no_payload(cluster: LocalCluster, namespace: str,
                                                               monkeypatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))

    async def go() -> dict[str, Any]:
        api = kube.Kube(kube.login())
        try:
            collection = kube.configmaps_url(namespace)
            assert await api.create(collection, configmap("meta-a", "hash-1"), keep=False)
            seen: dict[str, Any] = {}
            items, version = [], ""
            async for page, version in api.pages(collection, label_selector=names.LABEL_PAYLOAD, metadata=True):
                items.extend(page)
            seen["list"] = items
            seen["get"] = await api.get(f"{collection}/meta-a", metadata=True)
            seen["get_missing"] = await api.get(f"{collection}/meta-none", metadata=True)

            async def first_event() -> tuple[str, dict[str, Any]]:
                async for kind, body in api.watch(collection, resource_version=version,
                                                  label_selector=names.LABEL_PAYLOAD, metadata=True):
                    if kind != "BOOKMARK" and body.get("metadata", {}).get("name") == "meta-b":
                        return kind, body
                raise AssertionError("the watch ended without an event")

            watching = asyncio.create_task(first_event())
            await asyncio.sleep(0.5)
            await api.create(collection, configmap("meta-b", "hash-2"), keep=False)
            seen["watch"] = await asyncio.wait_for(watching, 30)

            # The informer the operator runs for ConfigMaps, summarizing with lifecycle.child_info.
            inf = informer.Informer(api, kube.configmaps_url, lifecycle.child_info, namespaces=[namespace],
                                    on_change=lambda keys: None, name="configmaps", metadata=True,
                                    label=names.LABEL_PAYLOAD)
            inf.start()
            await asyncio.wait_for(inf.ready.wait(), 30)
            key = (namespace, "hash-1")
            seen["informer"] = sorted((k, name, c.payload_hash, owner)
                                      for k, held in inf.store.items() for name, (owner, c) in held.items())
            await api.delete(f"{collection}/meta-a")
            for _ in range(300):
                if inf.deleted_at(key, "meta-a") is not None:
                    break
                await asyncio.sleep(0.1)
            seen["deleted"] = inf.deleted_at(key, "meta-a") is not None
            await inf.stop()
            return seen
        finally:
            await api.close()

    seen = asyncio.run(go())
    (item,) = seen["list"]
    assert item["metadata"]["annotations"][names.PAYLOAD_HASH_ANNOTATION] == "hash-1"
    assert "data" not in item and len(json.dumps(item)) < 5_000, "the list sent the payload"
    assert seen["get"]["kind"] == "PartialObjectMetadata" and "data" not in seen["get"]
    assert seen["get"]["metadata"]["labels"][names.LABEL_PAYLOAD] == "hash-1"
    assert seen["get_missing"] is None
    kind, body = seen["watch"]
    assert kind == "ADDED" and body["metadata"]["name"] == "meta-b"
    assert body["metadata"]["annotations"][names.PAYLOAD_HASH_ANNOTATION] == "hash-2" and "data" not in body
    assert seen["informer"] == [((namespace, "hash-1"), "meta-a", "hash-1", None),
                                ((namespace, "hash-2"), "meta-b", "hash-2", None)], "grouped by the payload's hash"
    assert seen["deleted"], "the informer saw the deletion through its metadata watch"
