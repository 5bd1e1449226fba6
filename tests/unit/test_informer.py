"""The informer's resync (spmd_operator.informer.Informer.refresh) against a list that is a
snapshot: what the watch delivered while the list was read is never undone by it."""

from __future__ import annotations

import asyncio

from spmd_operator import informer, kube, names

UID = "job-uid"
KEY = ("ns", "big")


def pod(name: str, phase: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "labels": {names.LABEL_JOB: "big"},
                         "ownerReferences": [{"apiVersion": f"{names.GROUP}/v1", "kind": names.KIND,
                                              "controller": True, "uid": UID}]},
            "status": {"phase": phase}}


class SnapshotApi:
    """Serves a LIST in two pages of a snapshot; between the pages it runs ``between``, which
    stands for watch events arriving while the list is read."""

    def __init__(self, snapshot: list[dict], between) -> None:
        self.snapshot, self.between = snapshot, between

    async def pages(self, path, label_selector=None):
        half = len(self.snapshot) // 2
        yield self.snapshot[:half], "10"
        self.between()
        yield self.snapshot[half:], "10"


def make(snapshot: list[dict], between=lambda: None) -> informer.Informer:
    inf = informer.Informer(SnapshotApi(snapshot, between), kube.pods_url,  # type: ignore[arg-type]
                            lambda body: body["status"]["phase"], namespaces=None,
                            on_change=lambda keys: None, name="pods")
    return inf


def test_refresh_keeps_what_the_watch_changed_while_listing():
    async def go():
        # The snapshot was taken with a-0 Pending; the watch then saw it Running, saw a-1 deleted
        # and a-2 created, all while the pages were read.
        snapshot = [pod("a-0", "Pending"), pod("a-1", "Running"), pod("a-3", "Pending")]
        inf = make(snapshot)

        def watch_events():
            changed: set = set()
            inf._put(pod("a-0", "Running"), changed)
            inf._drop(pod("a-1", "Running"), changed)
            inf._put(pod("a-2", "Pending"), changed)

        inf.api.between = watch_events  # type: ignore[attr-defined]
        for body in (pod("a-0", "Pending"), pod("a-1", "Running")):
            inf._put(body, set())
        return sorted(await inf.refresh(KEY, UID)), inf.store[KEY]

    phases, store = asyncio.run(go())
    assert sorted(store) == ["a-0", "a-2", "a-3"], "a-1's deletion stands; a-2 kept; a-3 from the list"
    assert store["a-0"] == (UID, "Running"), "the snapshot's Pending must not undo the watch's Running"
    assert phases == ["Pending", "Pending", "Running"]


def test_refresh_drops_what_the_server_no_longer_has():
    async def go():
        inf = make([pod("a-0", "Running")])
        for body in (pod("a-0", "Running"), pod("ghost", "Running")):
            inf._put(body, set())
        await inf.refresh(KEY, UID)
        return inf.store[KEY]

    assert sorted(asyncio.run(go())) == ["a-0"], "a pod missing from the list (and untouched by the watch) is dropped"
