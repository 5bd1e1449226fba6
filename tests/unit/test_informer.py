"""The informer (spmd_operator.informer.Informer) against a scripted API: when its view may be
trusted (synced), what a re-list does, what a forbidden or missing API leaves for the jobs that
need it, and that nothing of a deleted job is kept.

The stand-in serves LISTs from a list of scripted answers and watches from a queue of scripted
events, so each step of the informer's life is driven by the test.
"""

from __future__ import annotations

import asyncio

import pytest

from spmd_operator import informer, kube, names

UID = "job-uid"
KEY = ("ns", "big")


def pod(name: str, phase: str = "Running", job: str = "big") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "labels": {names.LABEL_JOB: job}, "resourceVersion": "11",
                         "ownerReferences": [{"apiVersion": f"{names.GROUP}/v1", "kind": names.KIND,
                                              "controller": True, "uid": UID}]},
            "status": {"phase": phase}}


class ScriptedApi:
    """LIST answers come from ``lists`` (a list of items, or an exception), one per LIST; a watch
    yields what the test puts into ``events`` (None ends the stream, as the server's timeout does)."""

    def __init__(self, *lists) -> None:
        self.lists = list(lists)
        self.listed = 0
        self.watches = 0
        self.events: asyncio.Queue = asyncio.Queue()
        self.metadata: list[tuple[str, bool]] = []  # (list or watch, metadata only?)

    async def pages(self, path, label_selector=None, metadata=False):
        self.listed += 1
        self.metadata.append(("list", metadata))
        answer = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        if isinstance(answer, Exception):
            raise answer
        yield answer, "10"

    async def watch(self, path, *, resource_version, label_selector=None, metadata=False):
        self.watches += 1
        self.metadata.append(("watch", metadata))
        while True:
            event = await self.events.get()
            if event is None:
                return
            if isinstance(event, Exception):
                raise event
            yield event


def make(api, **kwargs) -> informer.Informer:
    return informer.Informer(api, kube.pods_url, lambda body: body["status"]["phase"],  # type: ignore[arg-type]
                             namespaces=None, on_change=lambda keys: None, name="pods", **kwargs)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_not_synced_until_listed_and_not_again_from_a_broken_watch_until_listed_again():
    async def go():
        api = ScriptedApi([pod("a-0"), pod("ghost")], [pod("a-0")])
        synced_calls = []
        inf = make(api, on_synced=lambda: synced_calls.append(inf.synced))
        assert not inf.synced, "an informer that has not listed knows nothing: not 'nothing exists'"
        inf.start()
        await settle()
        assert inf.synced and sorted(p for p in inf.store[KEY]) == ["a-0", "ghost"]
        # The server says the watch's version is too old (e.g. it restarted): it lists again.
        api.lists.insert(0, [pod("a-0")])
        api.events.put_nowait(("ERROR", {"code": 410}))
        await settle()
        assert inf.synced, "re-listed straight away"
        assert sorted(inf.store[KEY]) == ["a-0"], "a re-list replaces the store: no ghost stays"
        assert synced_calls == [True, True]
        await inf.stop()

    asyncio.run(go())


def test_a_watch_the_server_closes_is_opened_again_without_a_list():
    async def go():
        api = ScriptedApi([pod("a-0")])
        inf = make(api)
        inf.start()
        await settle()
        for _ in range(3):  # three server-side watch timeouts
            api.events.put_nowait(None)
            await settle()
        assert (api.listed, api.watches) == (1, 4), "a resumed watch costs no LIST"
        assert inf.synced
        api.events.put_nowait(("MODIFIED", pod("a-0", "Failed")))
        await settle()
        assert inf.get(KEY, UID) == ["Failed"]
        await inf.stop()

    asyncio.run(go())


@pytest.mark.parametrize("metadata", [False, True])
def test_an_informer_of_metadata_lists_and_watches_metadata_only(metadata):
    async def go():
        api = ScriptedApi([pod("a-0")])
        inf = make(api, metadata=metadata)
        inf.start()
        await settle()
        api.events.put_nowait(None)  # the server ends the watch: it is opened again the same way
        await settle()
        await inf.stop()
        return api.metadata

    assert asyncio.run(go()) == [("list", metadata), ("watch", metadata), ("watch", metadata)]


def test_a_broken_watch_makes_it_unsynced_until_the_next_list(monkeypatch):
    monkeypatch.setattr(informer, "BACKOFF_SECONDS", (0.2,))

    async def go():
        api = ScriptedApi([pod("a-0")])
        inf = make(api)
        inf.start()
        await settle()
        api.events.put_nowait(ValueError("not JSON"))
        await settle()
        assert not inf.synced, "between the break and the next list the view is not trusted"
        await asyncio.sleep(0.3)
        await settle()
        assert inf.synced and api.listed == 2
        await inf.stop()

    asyncio.run(go())


@pytest.mark.parametrize("status", [403, 404])
def test_a_forbidden_or_missing_api_is_reported_and_retried_slowly(monkeypatch, status):
    monkeypatch.setattr(informer, "ABSENT_BACKOFF_SECONDS", (0.05,))

    async def go():
        api = ScriptedApi(kube.KubeError(status, "no"), kube.KubeError(status, "no"), [pod("a-0")])
        inf = make(api)
        inf.start()
        await settle()
        assert not inf.synced and inf.failure is not None and inf.failure.status == status
        for _ in range(50):
            await asyncio.sleep(0.02)
            if inf.synced:
                break
        assert inf.synced and inf.failure is None, "once allowed (or installed), it lists and is used"
        await inf.stop()

    asyncio.run(go())


def test_tombstones_are_kept_only_for_known_jobs_and_forgotten_with_them():
    async def go():
        known = {KEY}
        api = ScriptedApi([pod("a-0"), pod("b-0", job="other")])
        inf = make(api, keep=lambda key: key in known)
        inf.start()
        await settle()
        api.events.put_nowait(("DELETED", pod("a-0", "Failed")))
        api.events.put_nowait(("DELETED", pod("b-0", job="other")))
        await settle()
        assert inf.gone(KEY, UID) == ["Failed"], "a known job learns why its pod went"
        assert ("ns", "other") not in inf.tombstones and ("ns", "other") not in inf.store
        inf.forget(KEY)
        assert inf.sizes() == (0, 0, 0), "nothing of a deleted job is left"
        await inf.stop()

    asyncio.run(go())
