"""The operator's metadata-only reads against the real API server.

The Service and ConfigMap informers, and the GET of a child whose name was taken, ask for
PartialObjectMetadata: a job's ConfigMap carries the worker payload (about 160 KB), which 1,000
jobs would otherwise send through the watch and the 409 path again and again. These tests check
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
            "metadata": {"name": name, "labels": {names.LABEL_JOB: "meta-job", names.LABEL_RESTART: "0"},
                         # No owner: the garbage collector deletes what an absent SPMDJob owns.
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
            async for page, version in api.pages(collection, label_selector=names.LABEL_JOB, metadata=True):
                items.extend(page)
            seen["list"] = items
            seen["get"] = await api.get(f"{collection}/meta-a", metadata=True)
            seen["get_missing"] = await api.get(f"{collection}/meta-none", metadata=True)

            async def first_event() -> tuple[str, dict[str, Any]]:
                async for kind, body in api.watch(collection, resource_version=version,
                                                  label_selector=names.LABEL_JOB, metadata=True):
                    if kind != "BOOKMARK" and body.get("metadata", {}).get("name") == "meta-b":
                        return kind, body
                raise AssertionError("the watch ended without an event")

            watching = asyncio.create_task(first_event())
            await asyncio.sleep(0.5)
            await api.create(collection, configmap("meta-b", "hash-2"), keep=False)
            seen["watch"] = await asyncio.wait_for(watching, 30)

            # The informer the operator runs for ConfigMaps, summarizing with lifecycle.child_info.
            inf = informer.Informer(api, kube.configmaps_url, lifecycle.child_info, namespaces=[namespace],
                                    on_change=lambda keys: None, name="configmaps", metadata=True)
            inf.start()
            await asyncio.wait_for(inf.ready.wait(), 30)
            key = (namespace, "meta-job")
            seen["informer"] = sorted((name, c.payload_hash, c.restart, owner)
                                      for name, (owner, c) in inf.store.get(key, {}).items())
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
    assert seen["get"]["metadata"]["labels"][names.LABEL_JOB] == "meta-job"
    assert seen["get_missing"] is None
    kind, body = seen["watch"]
    assert kind == "ADDED" and body["metadata"]["name"] == "meta-b"
    assert body["metadata"]["annotations"][names.PAYLOAD_HASH_ANNOTATION] == "hash-2" and "data" not in body
    assert seen["informer"] == [("meta-a", "hash-1", 0, None), ("meta-b", "hash-2", 0, None)]
    assert seen["deleted"], "the informer saw the deletion through its metadata watch"
