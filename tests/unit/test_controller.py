"""The controller (spmd_operator.controller) against an in-memory API: order of writes,
idempotence, ownership, refusals, errors and the job loop's view of its job.

The stand-in answers like the API server for what the controller uses (409 on a taken name,
404 on a missing object, uid preconditions on delete) and records every request, so a duplicate
POST is seen even when the server would answer it with 409.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import gc
import json
import logging
import time
import weakref

import pytest

from monarch_spmd.spec import parse_job_spec
from spmd_operator import builders, controller, creation, kube, lifecycle, memory, names

from .lifecycle.helpers import BASE, JOB, NOW, cond, merge

FILES = {"__init__.py": "", "contract.py": "", "names.py": "", "worker.py": "print()"}
#: The namespace's payload ConfigMap of FILES: its jobs share it.
PAYLOAD = names.payload_configmap_name(builders.payload_hash(FILES))


class FakeApi:
    """Objects by (collection path, name); every request recorded as (verb, path)."""

    def __init__(self, job, reject_pods=False):
        self.job = job
        self.objects = {}
        self.calls = []
        self.reject_pods = reject_pods
        self.fail = {}  # (verb, collection) -> list of errors to raise, first first
        self.namespace = {"metadata": {"name": JOB.namespace}}

    def _maybe_fail(self, verb, collection):
        """Raises the next scripted error of (verb, collection), if any."""
        errors = self.fail.get((verb, collection))
        if errors:
            raise errors.pop(0)

    concurrency = 8

    async def create(self, path, body, *, keep=True, owner=None):
        self.calls.append(("create", path, body["metadata"].get("name")))
        collection = path.rsplit("/", 1)[-1]
        self._maybe_fail("create", collection)
        if self.reject_pods and collection == "pods":
            raise kube.KubeError(422, 'Pod "x" is invalid: spec.containers[1].image: Required value')
        key = (path, body["metadata"]["name"])
        if key in self.objects:
            return None
        obj = copy.deepcopy(body)
        obj["metadata"].setdefault("uid", f"uid-{len(self.objects)}")
        self.objects[key] = obj
        return obj

    async def get(self, path, *, metadata=False):
        self.calls.append(("get", path, "metadata" if metadata else None))
        if path.endswith(f"/namespaces/{JOB.namespace}"):
            return self.namespace
        if path.endswith(f"/spmdjobs/{JOB.name}"):
            return json.loads(json.dumps(self.job))
        collection, _, name = path.rpartition("/")
        obj = copy.deepcopy(self.objects.get((collection, name)))
        if obj is not None and metadata:  # what the server sends for a PartialObjectMetadata
            return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
        return obj

    async def list(self, path, *, label_selector=None):
        self.calls.append(("list", path, None))
        self._maybe_fail("list", path.rsplit("/", 1)[-1])
        key, eq, value = (label_selector or "").partition("=")
        labels = lambda o: o["metadata"].get("labels") or {}  # noqa: E731
        items = [copy.deepcopy(o) for (p, _), o in self.objects.items()
                 if in_collection(p, path) and (not key or (labels(o).get(key) == value if eq else key in labels(o)))]
        return items, "1"

    async def pages(self, path, *, label_selector=None, limit=500, metadata=False):
        items, version = await self.list(path, label_selector=label_selector)
        yield items, version

    async def watch(self, path, *, resource_version, label_selector=None, timeout_seconds=270, metadata=False):
        """A watch that stays quiet (what the test does not script does not happen)."""
        await asyncio.Event().wait()
        yield "BOOKMARK", {}

    async def json_patch(self, path, ops, *, owner=None):
        """The operator's status patch: a test of metadata.uid, then the whole status (as the API
        server applies a JSON Patch: all or nothing)."""
        self.calls.append(("patch", path, None))
        self._maybe_fail("patch", path.rsplit("/", 1)[-1])
        assert path.endswith(f"/spmdjobs/{JOB.name}/status"), path
        for op in ops:
            if op["op"] == "test" and op["path"] == "/metadata/uid" and op["value"] != self.job["metadata"].get("uid"):
                raise kube.KubeError(422, "the server rejected our request due to an error in our request",
                                     reason="Invalid")
        for op in ops:
            if op["op"] == "add" and op["path"] == "/status":
                self.job["status"] = copy.deepcopy(op["value"])
        return json.loads(json.dumps(self.job))

    async def patch(self, path, patch, *, owner=None):
        self.calls.append(("patch", path, None))
        self._maybe_fail("patch", path.rsplit("/", 1)[-1])
        if path.endswith(f"/spmdjobs/{JOB.name}/status"):
            self.job["status"] = merge(self.job.get("status") or {}, patch["status"])
            return json.loads(json.dumps(self.job))
        collection, _, name = path.rpartition("/")
        if name == "status":  # a custom resource's status subresource
            collection, _, name = collection.rpartition("/")
        obj = self.objects[(collection, name)]
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        current = obj.setdefault("metadata", {}).get("resourceVersion", "1")
        if wanted is not None and wanted != current:
            raise kube.KubeError(409, "the object has been modified; please apply your changes to the latest version",
                                 reason="Conflict")
        meta = {k: v for k, v in (patch.get("metadata") or {}).items() if k != "resourceVersion"}
        obj.update(merge(obj, {**{k: v for k, v in patch.items() if k != "metadata"}, **({"metadata": meta} if meta else {})}))
        obj["metadata"]["resourceVersion"] = str(int(current) + 1)
        return copy.deepcopy(obj)

    async def delete(self, path, *, uid=None, propagation="Background", owner=None):
        self.calls.append(("delete", path, None))
        collection, _, name = path.rpartition("/")
        return self.objects.pop((collection, name), None) is not None

    def posted(self, collection):
        return [name for verb, path, name in self.calls if verb == "create" and path.endswith("/" + collection)]

    def events(self):
        return [(o["type"], o["reason"]) for (p, _), o in self.objects.items() if p.endswith("/events")]


def in_collection(stored, path):
    """A namespaced collection belongs to the cluster-wide path of the same resource too."""
    if stored == path:
        return True
    base, _, plural = path.rpartition("/")
    return "/namespaces/" not in path and stored.startswith(base + "/namespaces/") and stored.endswith("/" + plural)


def job_body(**spec_changes):
    spec = copy.deepcopy(BASE)
    spec.update(spec_changes)
    return {"apiVersion": "spmd.monarch.dev/v1alpha1", "kind": "SPMDJob",
            "metadata": {"name": JOB.name, "namespace": JOB.namespace, "uid": JOB.uid, "generation": 1,
                         "resourceVersion": "10"},
            "spec": spec}


def make(api, *, synced=True):
    c = controller.Controller(api, FILES)
    loop = controller.JobLoop(key=JOB.key, body=json.loads(json.dumps(api.job)))
    c.jobs[JOB.key] = loop
    if synced:
        for inf in c.view.informers:
            listed(inf)
    return c, loop


async def _lead_until_the_pods_are_posted(c, api):
    """The job's loop started by the leader, and run until its 4 pods are created (2 s at most)."""
    c.active = True
    c._start_loop(c.jobs[JOB.key])
    for _ in range(100):
        await asyncio.sleep(0.02)
        if len(api.posted("pods")) == 4:
            return


def listed(inf):
    """What an informer's first list does to its state (the stand-in API has no watch)."""
    inf._listed.update(inf.scopes)
    inf.ready.set()


def sync_informers(c, api):
    """What the watches would deliver: every stored pod, Service and ConfigMap."""
    for (path, _), obj in list(api.objects.items()):
        target = {"pods": c.view.pods, "services": c.view.services,
                  "configmaps": c.payloads.configmaps}.get(path.rsplit("/", 1)[-1])
        if target is not None:
            target._put(obj, set())


def run_pass(c, loop):
    return asyncio.run(c.reconcile_once(loop, now=NOW))


class SlowApi(FakeApi):
    """Every write takes 50 ms; ``spans`` records when each began and ended (loop time)."""

    def __init__(self, job):
        super().__init__(job)
        self.spans = []

    async def _slowly(self, verb, path, write):
        began = asyncio.get_running_loop().time()
        await asyncio.sleep(0.05)
        try:
            return await write()
        finally:
            self.spans.append((verb, path.rsplit("/", 1)[-1], began, asyncio.get_running_loop().time()))

    async def create(self, path, body, *, keep=True, owner=None):
        return await self._slowly("create", path, lambda: FakeApi.create(self, path, body, keep=keep, owner=owner))

    async def patch(self, path, patch, *, owner=None):
        return await self._slowly("patch", path, lambda: FakeApi.patch(self, path, patch, owner=owner))

    async def json_patch(self, path, ops, *, owner=None):
        return await self._slowly("patch", path, lambda: FakeApi.json_patch(self, path, ops, owner=owner))


def test_first_pass_writes_events_then_status_while_configmap_and_service_go_then_pods():
    api = SlowApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)
    order = [(verb, path.rsplit("/", 1)[-1]) for verb, path, _ in api.calls]
    assert sorted(order) == sorted([("create", "events"), ("patch", "status"), ("create", "configmaps"),
                                    ("create", "services")] + [("create", "pods")] * 4)
    span = {(verb, what): (began, ended) for verb, what, began, ended in api.spans}
    events, status = span[("create", "events")], span[("patch", "status")]
    children = [span[("create", "configmaps")], span[("create", "services")]]
    pods = [(b, e) for verb, what, b, e in api.spans if what == "pods"]
    assert events[1] <= status[0], "a transition's Event before its status: a cut-short pass repeats it"
    assert all(b < events[1] for b, _ in children), "the ConfigMap and Service go with the Events and status"
    assert min(b for b, _ in pods) >= max(status[1], *(e for _, e in children)), \
        "no pod before the status, and none without its Service and ConfigMap"
    assert loop.body["status"]["phase"] == "Pending", "the loop keeps the status its own patch returned"
    assert api.events() == [("Normal", "Created")]
    assert api.posted("services") == [names.service_name(JOB, 0)]


def test_a_second_pass_before_the_watches_catch_up_posts_nothing_twice():
    api = FakeApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)
    run_pass(c, loop)
    pods = api.posted("pods")
    assert sorted(pods) == sorted(names.pod_name(JOB, 0, r) for r in range(4)), "each pod POSTed exactly once"
    assert api.events() == [("Normal", "Created")]
    sync_informers(c, api)
    run_pass(c, loop)
    assert len(api.posted("pods")) == 4 and len(api.posted("services")) == 1 and len(api.posted("configmaps")) == 1


def test_pods_of_an_earlier_pass_are_recognised_as_ours():
    api = FakeApi(job_body())
    s = parse_job_spec(BASE, require_image=True)
    for r in range(4):  # created by an operator that crashed before the informer showed them
        pod = builders.build_pod(JOB, s, r, 0)
        api.objects[(kube.pods_url("ns"), pod["metadata"]["name"])] = pod
    c, loop = make(api)
    run_pass(c, loop)
    assert not api.events() or api.events() == [("Normal", "Created")], "no NameTaken warning for our own pods"
    assert loop.body["status"]["phase"] == "Pending"


def test_a_name_held_by_another_jobs_pod_is_reported_not_adopted():
    api = FakeApi(job_body())
    s = parse_job_spec(BASE, require_image=True)
    stranger = builders.build_pod(names.JobRef(JOB.name, JOB.namespace, "other-uid"), s, 0, 0)
    stranger["metadata"]["name"] = names.pod_name(JOB, 0, 0)  # improbable, but possible: a collision
    api.objects[(kube.pods_url("ns"), stranger["metadata"]["name"])] = stranger
    c, loop = make(api)
    run_pass(c, loop)
    assert ("Warning", "NameTaken") in api.events()
    sync_informers(c, api)
    counted = [p.name for p in c.view.pods.get(JOB.key, JOB.uid)]
    assert stranger["metadata"]["name"] not in counted, "a pod owned by another uid is never counted"
    assert c.view.pods.foreign(JOB.key, JOB.uid) == [stranger["metadata"]["name"]]


def test_a_refused_pod_fails_the_job_in_the_next_pass_with_one_patch_each():
    api = FakeApi(job_body(), reject_pods=True)
    c, loop = make(api)
    run_pass(c, loop)
    assert loop.rejection and "spec.containers[1].image" in loop.rejection.message
    run_pass(c, loop)
    st = api.job["status"]
    assert st["phase"] == "Failed"
    assert cond(st, "Failed")["reason"] == "InvalidSpec"
    assert "spec.containers[1].image" in cond(st, "Failed")["message"]
    assert api.events() == [("Normal", "Created"), ("Warning", "InvalidSpec")], "in the order things happened"
    assert [verb for verb, path, _ in api.calls if path.endswith("/status")] == ["patch", "patch"]


def test_an_invalid_spec_is_failed_and_nothing_is_created():
    api = FakeApi(job_body(mesh=[{"name": "hosts", "size": 0}]))
    c, loop = make(api)
    run_pass(c, loop)
    assert [(verb, path.rsplit("/", 1)[-1]) for verb, path, _ in api.calls] == [("create", "events"), ("patch", "status")]
    assert api.job["status"]["phase"] == "Failed"
    assert "spec.mesh[0].size" in api.job["status"]["failure"]["message"]


def test_a_404_from_writing_a_child_does_not_end_the_loop(monkeypatch):
    monkeypatch.setattr(controller, "ERROR_BACKOFF_SECONDS", (0.05,))
    monkeypatch.setattr(controller, "COALESCE_SECONDS", 0.0)
    api = FakeApi(job_body())
    api.fail[("create", "services")] = [kube.KubeError(404, "the server could not find the requested resource")]
    c, loop = make(api)

    async def scenario():
        c.active = True
        c._start_loop(loop)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if api.posted("services").count(names.service_name(JOB, 0)) >= 2 and len(api.posted("pods")) == 4:
                break
        alive = not loop.task.done()
        await c.deactivate()
        return alive

    assert asyncio.run(scenario()), "the loop outlives the 404 and retries"
    assert len(api.posted("pods")) == 4
    assert ("Warning", "ReconcileError") in api.events()


def test_every_failure_of_concurrent_writes_is_logged_and_the_first_raised(caplog):
    api = FakeApi(job_body())
    api.fail[("create", "pods")] = [kube.KubeError(500, f"boom {i}") for i in range(4)]
    c, loop = make(api)
    with caplog.at_level(logging.WARNING, logger="spmd_operator.errors"):
        with pytest.raises(kube.KubeError, match="boom 0"):
            run_pass(c, loop)
    logged = [r.getMessage() for r in caplog.records]
    assert sum("also failed" in m for m in logged) == 3
    assert all(any(f"boom {i}" in m for m in logged) for i in (1, 2, 3))


def test_a_job_whose_namespace_is_being_deleted_stops_quietly():
    api = FakeApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)
    sync_informers(c, api)
    for r in range(4):  # every pod runs; then the namespace goes and takes the pods with it
        c.view.pods._put({**api.objects[(kube.pods_url("ns"), names.pod_name(JOB, 0, r))],
                     "status": {"phase": "Running"}}, set())
    run_pass(c, loop)
    assert api.job["status"]["phase"] == "Running"
    before = len(api.calls)
    api.namespace = {"metadata": {"name": "ns", "deletionTimestamp": "2026-01-01T12:00:00Z"}}
    c.view.pods._drop({"metadata": {"namespace": "ns", "name": names.pod_name(JOB, 0, 1), "labels": {names.LABEL_JOB: JOB.name}}}, set())
    with pytest.raises(controller.JobGone):
        run_pass(c, loop)
    assert [verb for verb, _, _ in api.calls[before:]] == ["get"], "nothing written: no restart, no Warning"
    assert api.job["status"]["phase"] == "Running"


def configmap_writes(api):
    return [(verb, name) for verb, path, name in api.calls
            if (verb in ("create", "patch") and "/configmaps" in path)]


def test_the_pods_mount_the_namespaces_payload_configmap_which_has_no_owner():
    api = FakeApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)
    cm = api.objects[(kube.configmaps_url("ns"), PAYLOAD)]
    assert cm["data"] == FILES and cm["immutable"] is True
    assert "ownerReferences" not in cm["metadata"], "the namespace's jobs share it: none of them owns it"
    mounted = {v["configMap"]["name"] for (p, _), pod in api.objects.items() if p.endswith("/pods")
               for v in pod["spec"]["volumes"] if "configMap" in v}
    assert mounted == {PAYLOAD}


def test_a_configmap_created_moments_ago_is_not_posted_again():
    api = FakeApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)
    run_pass(c, loop)  # the informer has not shown the ConfigMap yet: the plan asks for it again
    run_pass(c, loop)
    assert configmap_writes(api) == [("create", PAYLOAD)], "one POST; never rewritten"


def test_jobs_asking_at_once_send_one_post_of_the_payload():
    """A thousand jobs submitted together: one 160 KB POST, which every job's pass awaits."""
    api = SlowApi(job_body())
    c, _ = make(api)

    async def scenario():
        await asyncio.gather(*(c.payloads.ensure("ns") for _ in range(20)))
        await c.payloads.ensure("ns")  # after: remembered until the informer shows it

    asyncio.run(scenario())
    assert configmap_writes(api) == [("create", PAYLOAD)]


def test_a_refused_payload_reaches_every_job_asking_and_is_tried_again():
    api = SlowApi(job_body())
    c, _ = make(api)
    quota = kube.KubeError(403, 'configmaps "x" is forbidden: exceeded quota: q, requested: count/configmaps=1',
                           reason="Forbidden")
    api.fail[("create", "configmaps")] = [quota]

    async def scenario():
        results = await asyncio.gather(*(c.payloads.ensure("ns") for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, controller.Refused) for r in results), results
        assert results[0].refusal.kind == "ConfigMap" and "exceeded quota" in results[0].refusal.message
        await c.payloads.ensure("ns")  # the quota raised: the next pass creates it

    asyncio.run(scenario())
    assert configmap_writes(api) == [("create", PAYLOAD)] * 2


@pytest.mark.parametrize("ours", [True, False])
def test_a_payload_name_taken_is_used_when_ours_and_named_when_not(ours):
    api = FakeApi(job_body())
    existing = builders.build_worker_configmap("ns", FILES)
    if not ours:
        existing["metadata"]["labels"] = {"app": "someone-else"}
    api.objects[(kube.configmaps_url("ns"), PAYLOAD)] = existing  # the informer has not shown it
    c, loop = make(api)
    if ours:
        run_pass(c, loop)
        assert ("get", f"{kube.configmaps_url('ns')}/{PAYLOAD}", "metadata") in api.calls, "read as metadata only"
        assert len(api.posted("pods")) == 4
    else:
        with pytest.raises(kube.KubeError, match=f"ConfigMap {PAYLOAD} exists and is not the operator's payload"):
            run_pass(c, loop)
        assert api.posted("pods") == [], "no pod mounts a stranger's ConfigMap"


def test_a_payload_deleted_wakes_the_namespaces_jobs_and_is_created_again():
    api = FakeApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)
    sync_informers(c, api)
    run_pass(c, loop)
    loop.wake.clear()
    cm = api.objects.pop((kube.configmaps_url("ns"), PAYLOAD))
    c.payloads.configmaps._drop(cm, changed := set())
    c.payloads.changed(changed)
    assert loop.wake.is_set(), "the job's next pass runs at once"
    assert c.payloads.configmaps.sizes() == (0, 0, 0), "a deleted payload leaves no tombstone (nobody asks for it)"
    run_pass(c, loop)
    assert configmap_writes(api) == [("create", PAYLOAD)] * 2


def test_an_upgrade_leaves_a_running_jobs_own_older_configmap_and_pods_alone():
    """A job started by an operator that gave each job its own ConfigMap (``<job>-<id>-worker``):
    the upgraded one creates the namespace's payload and touches nothing of the job's."""
    api = FakeApi(job_body())
    s = parse_job_spec(BASE, require_image=True)
    api.job["status"] = {"phase": "Running", "restarts": 0, "procs": 4, "mesh": "hosts=2,gpus=2",
                         "startTime": "2026-01-01T11:00:00Z", "masterAddr": names.master_addr(JOB, 0),
                         "running": 4, "succeeded": 0, "failed": 0,
                         "reason": "AllProcsRunning", "message": "", "observedGeneration": 1,
                         "conditions": [{**cond_("Created", "True", "PodsCreated"), "observedGeneration": 1},
                                        {**cond_("Running", "True", "AllProcsRunning"), "observedGeneration": 1}]}
    older = f"{JOB.name}-{names.job_id(JOB.uid)}-worker"
    for r in range(4):
        body = builders.build_pod(JOB, s, r, 0, payload=older)
        body["status"] = {"phase": "Running"}
        api.objects[(kube.pods_url("ns"), body["metadata"]["name"])] = body
    service = builders.build_service(JOB, s, 0)
    api.objects[(kube.services_url("ns"), service["metadata"]["name"])] = service
    api.objects[(kube.configmaps_url("ns"), older)] = {
        "metadata": {"name": older, "namespace": "ns", "labels": builders.job_labels(JOB),
                     "ownerReferences": [builders.owner_reference(JOB)]}, "data": {"worker.py": "older"}}
    c, loop = make(api)
    loop.body = json.loads(json.dumps(api.job))
    sync_informers(c, api)
    run_pass(c, loop)
    writes = [(verb, path.rsplit("/", 1)[-1], name) for verb, path, name in api.calls if verb != "get"]
    assert writes == [("create", "configmaps", PAYLOAD)], writes
    assert api.objects[(kube.configmaps_url("ns"), older)]["data"] == {"worker.py": "older"}


def sweep(c):
    async def scenario():
        c.active = True
        return await c.payloads.sweep()
    return asyncio.run(scenario())


def test_the_payload_is_deleted_once_the_namespace_had_no_unfinished_job_for_the_grace():
    api = FakeApi(job_body())
    c, loop = make(api)
    c.payloads.grace_seconds = 0.2
    run_pass(c, loop)
    sync_informers(c, api)
    path = f"{kube.configmaps_url('ns')}/{PAYLOAD}"
    assert sweep(c) == [], "the job is unfinished (Pending)"
    time.sleep(0.3)
    assert sweep(c) == [], "still unfinished after the grace"
    loop.body["status"] = {**loop.body["status"], "phase": "Succeeded"}
    assert sweep(c) == [], "finished only now: the grace starts"
    time.sleep(0.3)
    assert sweep(c) == [path]
    assert (kube.configmaps_url("ns"), PAYLOAD) not in api.objects


def test_a_payload_of_a_namespace_without_jobs_waits_the_grace_from_when_the_leader_first_saw_it():
    api = FakeApi(job_body())
    api.objects[(kube.configmaps_url("other"), PAYLOAD)] = builders.build_worker_configmap("other", FILES)
    old = builders.build_worker_configmap("ns", {"worker.py": "an older operator's"})
    api.objects[(kube.configmaps_url("ns"), old["metadata"]["name"])] = old
    c, loop = make(api)
    c.payloads.grace_seconds = 0.2
    run_pass(c, loop)
    sync_informers(c, api)
    assert sweep(c) == [], "a new term: the grace starts now"
    time.sleep(0.3)
    assert sweep(c) == [f"{kube.configmaps_url('other')}/{PAYLOAD}"], \
        "the job's namespace keeps both payloads (its pods may mount the older one); the other's goes"
    c.active = False
    assert asyncio.run(c.payloads.sweep()) == [], "a standby deletes nothing"


def test_pods_whose_creation_waited_its_turn_are_remembered_from_the_answer(monkeypatch):
    monkeypatch.setattr(creation, "CREATED_MEMORY_SECONDS", 0.2)
    api = FakeApi(job_body())
    create = api.create

    async def slow_pods(path, body, **kwargs):
        if path.endswith("/pods"):
            await asyncio.sleep(0.3)  # queued behind other jobs' writes for longer than the memory
        return await create(path, body, **kwargs)

    api.create = slow_pods
    c, loop = make(api)

    async def two_passes():
        await c.reconcile_once(loop, now=NOW)
        await c.reconcile_once(loop, now=NOW)  # the informer has not shown the pods yet

    asyncio.run(two_passes())
    assert len(api.posted("pods")) == 4, "no pod POSTed again (each would be a 409 and a GET)"
    assert not [call for call in api.calls if call[0] == "get" and "/pods/" in call[1]]


def test_the_loop_ignores_watch_versions_older_than_its_own_write():
    loop = controller.JobLoop(key=JOB.key, body={"metadata": {"resourceVersion": "9"}, "status": {}})
    loop.wrote({"metadata": {"resourceVersion": "abc"}, "status": {"phase": "Running"}})
    loop.accept({"metadata": {"resourceVersion": "zzz"}, "status": {"phase": "Pending"}}), "resourceVersions are opaque"
    assert loop.body["status"]["phase"] == "Running", "a version from before our write is ignored"
    loop.accept({"metadata": {"resourceVersion": "abd"}, "status": {"phase": "Running"}, "spec": {"suspend": True}})
    assert loop.body["spec"] == {"suspend": True}, "the watch caught up with our write"
    loop.accept({"metadata": {"resourceVersion": "abe"}, "status": {"phase": "Succeeded"}})
    assert loop.body["status"]["phase"] == "Succeeded", "after that, the watch is followed again"


def test_resync_reads_the_job_and_ends_the_loop_of_a_deleted_one():
    api = FakeApi(job_body())
    c, loop = make(api)
    asyncio.run(c.resync(loop))
    assert loop.body["metadata"]["uid"] == JOB.uid
    api.job["metadata"]["uid"] = "another"  # deleted, and created again under the same name
    with pytest.raises(controller.JobGone):
        asyncio.run(c.resync(loop))


def test_only_progress_tells_counts_from_transitions():
    running = {"conditions": [{"type": "Running", "status": "False", "reason": "WaitingForProcs", "message": "1/4"}]}
    assert controller.only_progress(running, {"running": 2, "message": "2/4 procs running", "conditions": [
        {"type": "Running", "status": "False", "reason": "WaitingForProcs", "message": "2/4"}]})
    assert not controller.only_progress(running, {"conditions": [
        {"type": "Running", "status": "False", "reason": "Unschedulable", "message": "0/5 nodes"}]})
    assert not controller.only_progress(running, {"phase": "Running"})
    assert not controller.only_progress(running, {"running": 4, "failure": None})
    # A finished job's last counts (its pods stopped after the transition) are not held back.
    assert not controller.only_progress({**running, "phase": "Failed"}, {"running": 0})


def test_progress_only_status_is_written_at_most_every_few_seconds_transitions_at_once():
    api = FakeApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)  # the first pass: Pending, written
    sync_informers(c, api)
    run_pass(c, loop)  # the pods exist, Pending: the first status said so already
    pods = [o for (p, _), o in api.objects.items() if p.endswith("/pods")]
    c.view.pods._put({**pods[0], "status": {"phase": "Running"}}, set())
    patches = lambda: [v for v, path, _ in api.calls if path.endswith("/status")]
    before = len(patches())
    delay = asyncio.run(c.reconcile_once(loop, now=NOW))
    assert len(patches()) == before, "1/4 running is progress: not written within PROGRESS_SECONDS"
    assert 0 < delay <= controller.PROGRESS_SECONDS
    for pod in pods:
        c.view.pods._put({**pod, "status": {"phase": "Running"}}, set())
    run_pass(c, loop)
    assert len(patches()) == before + 1 and api.job["status"]["phase"] == "Running", "a transition is written at once"


def test_turns_are_spaced_by_the_rate_first_asked_first_served_and_free_at_once_when_none_waits():
    turns = controller.Turns(4.0)
    assert turns.take(100.0) == 100.0
    assert [turns.take(100.0) for _ in range(3)] == [100.25, 100.5, 100.75]
    assert turns.take(100.1) == 101.0, "a later ask queues behind the ones given"
    assert turns.take(200.0) == 200.0, "none waiting: the turn is now"


def test_progress_waits_for_its_turn_among_every_jobs_progress_but_a_transition_does_not():
    """Hundreds of jobs starting at once: their running counts share PROGRESS_WRITES_PER_SECOND,
    each job in turn; the job's phase going Running is written at once, taking the counts along."""
    api = FakeApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)  # the first pass: Pending, written
    sync_informers(c, api)
    pods = [o for (p, _), o in api.objects.items() if p.endswith("/pods")]
    patches = lambda: [v for v, path, _ in api.calls if path.endswith("/status")]
    before = len(patches())

    async def progress_pass(running: int) -> float | None:
        for pod in pods[:running]:
            c.view.pods._put({**pod, "status": {"phase": "Running"}}, set())
        now = asyncio.get_running_loop().time()
        loop.status_written = now - controller.PROGRESS_SECONDS - 1  # this job's own wait is over
        c.progress_turns.next = now + 40 / controller.PROGRESS_WRITES_PER_SECOND  # 40 jobs' turns ahead
        return await c.reconcile_once(loop, now=NOW)

    delay = asyncio.run(progress_pass(1))
    assert len(patches()) == before, "1/4 running waits for its turn"
    assert delay == pytest.approx(40 / controller.PROGRESS_WRITES_PER_SECOND, abs=0.5)
    assert loop.progress_turn is not None

    async def at_its_turn() -> float | None:
        loop.progress_turn = asyncio.get_running_loop().time()
        return await c.reconcile_once(loop, now=NOW)

    asyncio.run(at_its_turn())
    assert len(patches()) == before + 1 and api.job["status"]["running"] == 1, "written at its turn"
    assert loop.progress_turn is None

    delay = asyncio.run(progress_pass(2))
    assert len(patches()) == before + 1 and delay > 1.0, "the next count waits for a new turn"
    asyncio.run(progress_pass(4))
    assert len(patches()) == before + 2, "every proc running is a transition: written at once"
    assert (api.job["status"]["phase"], api.job["status"]["running"]) == ("Running", 4)
    assert loop.progress_turn is None, "the transition took the waiting counts with it"


# --- item 1: never act on an unsynced view; holding a Kueue job needs evidence ------------------

KUEUE = {"provider": "Kueue", "queue": "team-a"}
WORKLOADS = kube.custom_url(*builders.KUEUE_WORKLOAD, "ns")


def running_kueue_job(api, *, workload=True, admitted=True):
    """A Kueue job admitted and Running: its status, its 4 Running pods and its Workload on the server."""
    s = parse_job_spec({**BASE, "scheduling": KUEUE}, require_image=True)
    api.job["status"] = {"phase": "Running", "restarts": 0, "procs": 4, "mesh": "hosts=2,gpus=2",
                         "startTime": "2026-01-01T11:00:00Z", "masterAddr": names.master_addr(JOB, 0),
                         "running": 4, "succeeded": 0, "failed": 0,
                         "conditions": [cond_("Created", "True", "PodsCreated"), cond_("Running", "True", "AllProcsRunning"),
                                        cond_("Suspended", "False", "Admitted")]}
    for r in range(4):
        body = builders.build_pod(JOB, s, r, 0)
        body["status"] = {"phase": "Running"}
        api.objects[(kube.pods_url("ns"), body["metadata"]["name"])] = body
    for kind in ("services", "configmaps"):
        body = (builders.build_service(JOB, s, 0) if kind == "services"
                else builders.build_worker_configmap("ns", FILES))
        api.objects[(kube._core_url("ns", kind, None), body["metadata"]["name"])] = body
    if workload:
        body = builders.build_workload(JOB, s)
        body["metadata"]["resourceVersion"] = "5"
        body["metadata"]["ownerReferences"] = [{"apiVersion": names.API_VERSION, "kind": names.KIND, "name": JOB.name,
                                                "uid": JOB.uid, "controller": True}]
        if admitted:
            body["status"] = {"conditions": [cond_("QuotaReserved", "True", "QuotaReserved"), cond_("Admitted", "True", "Admitted")],
                              "admission": {"podSetAssignments": [{"name": "procs", "flavors": {"cpu": "kwok"}}]}}
        api.objects[(WORKLOADS, body["metadata"]["name"])] = body


def cond_(type_, status, reason):
    return {"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": "2026-01-01T11:00:00Z"}


def deletions(api):
    return [path for verb, path, _ in api.calls if verb == "delete"]


def status_patches(api):
    return [path for verb, path, _ in api.calls if verb == "patch" and path.endswith("/status")]


def test_a_restarted_operator_touches_no_pod_of_an_admitted_kueue_job_before_the_workloads_are_listed():
    api = FakeApi(job_body(scheduling=KUEUE))
    running_kueue_job(api)
    c, loop = make(api)
    sync_informers(c, api)

    async def scenario():
        await c.reconcile_once(loop, now=NOW)  # the first pass after a start: the Workloads not listed yet
        assert deletions(api) == [] and status_patches(api) == [], "nothing decided on an empty store"
        await asyncio.sleep(0.05)  # the Workload informer lists
        await c.reconcile_once(loop, now=NOW)
        for inf in c.view.informers:
            await inf.stop()

    asyncio.run(scenario())
    assert deletions(api) == [], "the admitted job's pods were never touched"
    assert api.job["status"]["phase"] == "Running"
    assert not any(reason in ("WaitingForAdmission", "Suspended") for _, reason in api.events())


def test_pods_are_kept_when_the_job_has_no_workload_yet_and_the_workload_is_created():
    api = FakeApi(job_body(scheduling=KUEUE))
    running_kueue_job(api, workload=False)
    c, loop = make(api)
    sync_informers(c, api)

    async def scenario():
        await c.reconcile_once(loop, now=NOW)
        await asyncio.sleep(0.05)
        await c.reconcile_once(loop, now=NOW)
        for inf in c.view.informers:
            await inf.stop()

    asyncio.run(scenario())
    assert deletions(api) == [], "no Workload seen is no evidence against running pods"
    assert api.posted("workloads") == [names.workload_name(JOB)], "Kueue gets the Workload and decides"
    assert api.job["status"]["phase"] == "Running"


def test_a_workload_that_exists_and_is_not_admitted_holds_the_job():
    api = FakeApi(job_body(scheduling=KUEUE))
    running_kueue_job(api, admitted=False)
    c, loop = make(api)
    sync_informers(c, api)

    async def scenario():
        await c.reconcile_once(loop, now=NOW)
        await asyncio.sleep(0.05)
        await c.reconcile_once(loop, now=NOW)
        for inf in c.view.informers:
            await inf.stop()

    asyncio.run(scenario())
    assert len(deletions(api)) == 4 and api.job["status"]["phase"] == "Suspended", "positive evidence: held"


# --- item 4: an optional API that cannot be used blocks only the jobs that name it --------------


def test_a_forbidden_workload_api_blocks_only_its_job_and_says_why():
    api = FakeApi(job_body(scheduling=KUEUE))
    api.fail[("list", "workloads")] = [kube.KubeError(403, 'workloads.kueue.x-k8s.io is forbidden: User "op" cannot list')] * 50
    c, loop = make(api)

    async def scenario():
        await c.reconcile_once(loop, now=NOW)  # starts the Workload informer, whose list is refused
        await asyncio.sleep(0.05)
        await c.reconcile_once(loop, now=NOW)
        await c.reconcile_once(loop, now=NOW)
        for inf in c.view.informers:
            await inf.stop()

    asyncio.run(scenario())
    st = api.job["status"]
    assert st["phase"] == "Pending" and cond(st, "Created")["status"] == "False"
    assert cond(st, "Created")["reason"] == "SchedulingForbidden"
    assert "gangScheduling.kueue.enabled=true" in cond(st, "Created")["message"]
    assert "workloads.kueue.x-k8s.io" in cond(st, "Created")["message"]
    assert api.events() == [("Warning", "SchedulingForbidden")], "one Warning, not one per pass"
    assert api.posted("pods") == [] and api.posted("workloads") == []


def test_a_missing_podgroup_crd_blocks_only_its_job_and_says_why():
    api = FakeApi(job_body(scheduling={"provider": "Volcano"}))
    api.fail[("list", "podgroups")] = [kube.KubeError(404, "the server could not find the requested resource")] * 50
    c, loop = make(api)

    async def scenario():
        await c.reconcile_once(loop, now=NOW)
        await asyncio.sleep(0.05)
        await c.reconcile_once(loop, now=NOW)
        for inf in c.view.informers:
            await inf.stop()

    asyncio.run(scenario())
    st = api.job["status"]
    assert cond(st, "Created")["reason"] == "SchedulingAPIMissing"
    assert "podgroups.scheduling.volcano.sh" in cond(st, "Created")["message"]
    assert api.posted("pods") == [], "no pod that would wait forever for a gang scheduler"


# --- issue 23 item 1: a resync reads the caches -------------------------------------------------


def test_periodic_passes_read_the_caches_and_each_job_gets_itself_once_per_check_period():
    api = FakeApi(job_body())
    c, loop = make(api)
    c.resync_seconds, c.check_seconds = 0.02, 3600.0
    run_pass(c, loop)
    sync_informers(c, api)
    run_pass(c, loop)
    before = len(api.calls)

    async def scenario():
        c.active = True
        c._start_loop(loop)
        await asyncio.sleep(0.5)  # about 25 resync periods
        await c.deactivate()

    asyncio.run(scenario())
    calls = api.calls[before:]
    assert [v for v, _, _ in calls if v == "list"] == [], "no LIST from a job's resync"
    assert [(v, p.rsplit("/", 1)[-1]) for v, p, _ in calls] == [("get", JOB.name)], \
        "one GET of the job (its check on activation), nothing else"


def test_jobs_checked_together_check_again_spread_over_the_second_half_of_the_period():
    """1,000 jobs created together each GET themselves on their first pass: their next checks must
    not all fall at the same moment (a burst of 1,000 GETs ten minutes later)."""
    api = FakeApi(job_body())
    c, _ = make(api)
    c.check_seconds = 1000.0
    loops = [controller.JobLoop(key=JOB.key, body=json.loads(json.dumps(api.job))) for _ in range(200)]

    async def scenario():
        now = asyncio.get_running_loop().time()
        for loop in loops:
            await c.resync(loop)
        return now

    start = asyncio.run(scenario())
    due = sorted(loop.next_check - start for loop in loops)
    assert 500.0 <= due[0] and due[-1] <= 1001.0, due
    assert due[-1] - due[0] > 300.0, "spread over the half period, not at one moment"
    assert not any(loop.check_now for loop in loops)


def test_forgetting_jobs_hands_freed_memory_back_once_a_little_later(monkeypatch):
    trims = []
    real = memory.trim_memory
    monkeypatch.setattr(memory, "trim_memory", lambda: trims.append(asyncio.get_running_loop().time()) or True)
    monkeypatch.setattr(memory, "TRIM_DELAY_SECONDS", 0.05)
    api = FakeApi(job_body())
    c, loop = make(api)
    other = controller.JobLoop(key=("default", "other"), body=json.loads(json.dumps(api.job)))
    c.jobs[other.key] = other

    async def scenario():
        c.forget(("default", "never-known"))
        await asyncio.sleep(0.1)
        assert trims == [], "nothing went: nothing to hand back"
        c.forget(loop.key)
        c.forget(other.key)
        await asyncio.sleep(0.2)

    asyncio.run(scenario())
    assert len(trims) == 1, "two jobs forgotten together: one trim"
    assert real() is True, "glibc's malloc_trim is there on this platform"


def test_a_deleted_jobs_loop_is_freed_by_the_trim_not_kept_by_its_cycle(monkeypatch):
    """A cancelled loop is a reference cycle (task, CancelledError, traceback, frames): with the
    cycle collector's own runs off, as in an idle operator that allocates too little to start
    one, only the trim after the deletion frees it."""
    monkeypatch.setattr(memory, "TRIM_DELAY_SECONDS", 0.05)
    monkeypatch.setattr(controller, "COALESCE_SECONDS", 0.0)
    api = FakeApi(job_body())
    c = make(api)[0]
    seen: dict[str, object] = {}

    async def scenario():
        await _lead_until_the_pods_are_posted(c, api)
        seen["task"] = weakref.ref(c.jobs[JOB.key].task)
        c.forget(JOB.key)  # its deletion: the loop is cancelled and dropped
        await asyncio.sleep(0.01)
        seen["before"] = seen["task"]() is not None
        await asyncio.sleep(0.2)  # the trim's delay
        seen["after"] = seen["task"]() is not None

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        asyncio.run(scenario())
    finally:
        if enabled:
            gc.enable()
    assert seen["before"], "the cancelled loop is kept alive by its own cycle until something collects it"
    assert not seen["after"], "the trim collected it"


# --- item 8: conflict-safe writes to Kueue's Workload; Events of cut-short passes ---------------


def test_workload_conditions_never_overwrite_a_condition_kueue_wrote_in_between():
    api = FakeApi(job_body(scheduling=KUEUE))
    running_kueue_job(api)
    c, loop = make(api)
    key = (WORKLOADS, names.workload_name(JOB))
    real_get = api.get

    async def get_then_kueue_writes(path):
        body = await real_get(path)
        if path.endswith(names.workload_name(JOB)) and not api.objects[key].get("kueue_wrote"):
            api.objects[key]["kueue_wrote"] = True  # Kueue's own update lands between our GET and PATCH
            api.objects[key]["status"]["conditions"].append(cond_("PodsReady", "True", "PodsReady"))
            api.objects[key]["metadata"]["resourceVersion"] = "7"
        return body

    api.get = get_then_kueue_writes
    o = lifecycle.Observed(job=JOB, generation=1, spec=parse_job_spec({**BASE, "scheduling": KUEUE}, require_image=True),
                           status={"phase": "Succeeded"}, workload=lifecycle.WorkloadInfo(name=names.workload_name(JOB)),
                           now=NOW)
    asyncio.run(c.workloads.finish(o))
    types = [cnd["type"] for cnd in api.objects[key]["status"]["conditions"]]
    assert "PodsReady" in types, "Kueue's condition survived our update"
    assert "Finished" in types


def test_an_event_that_could_not_be_posted_is_posted_when_the_pass_is_repeated():
    api = FakeApi(job_body())
    api.fail[("create", "events")] = [kube.KubeError(0, "connection refused: the API server restarts")]
    c, loop = make(api)
    with pytest.raises(kube.KubeError):
        run_pass(c, loop)
    assert "status" not in api.job, "no transition is written without its Event"
    run_pass(c, loop)
    assert api.events() == [("Normal", "Created")]
    assert api.job["status"]["phase"] == "Pending"


def test_a_pass_cut_short_after_its_events_is_repeated_by_the_next_leader_without_a_duplicate():
    api = FakeApi(job_body())
    api.fail[("patch", "status")] = [kube.KubeError(0, "connection reset")]
    c, loop = make(api)
    with pytest.raises(kube.KubeError):
        run_pass(c, loop)
    assert api.events() == [("Normal", "Created")]
    successor, loop2 = make(api)  # another replica, remembering nothing, repeats the pass
    run_pass(successor, loop2)
    assert api.job["status"]["phase"] == "Pending"
    assert api.events() == [("Normal", "Created")], "the same transition, the same Event: no duplicate"


def test_repeated_events_are_aggregated_into_one_with_a_count():
    api = FakeApi(job_body())
    c, loop = make(api)
    warning = lifecycle.Event(lifecycle.EVENT_WARNING, "ReconcileError", "HTTP 500: etcd timed out")

    async def scenario():
        for _ in range(3):
            await c.events.record(loop.body, [warning])

    asyncio.run(scenario())
    stored = [o for (p, _), o in api.objects.items() if p.endswith("/events")]
    assert len(stored) == 1 and stored[0]["count"] == 3, stored


# --- issue 23 item 4: jobs take turns for the write slots ---------------------------------------


def test_the_write_limiter_takes_turns_between_jobs():
    order = []

    async def scenario():
        limiter = kube.FairLimiter(1)
        await limiter.acquire("holder")

        async def write(owner, i):
            await limiter.acquire(owner)
            order.append((owner, i))
            limiter.release(owner)

        big = [asyncio.create_task(write("big", i)) for i in range(100)]
        await asyncio.sleep(0)
        small = [asyncio.create_task(write("small", i)) for i in range(4)]
        await asyncio.sleep(0)
        limiter.release("holder")
        await asyncio.gather(*big, *small)

    asyncio.run(scenario())
    last_small = max(i for i, (owner, _) in enumerate(order) if owner == "small")
    assert last_small < 10, f"the small job's 4 writes waited behind {last_small} others"
    assert len(order) == 104


def test_a_job_added_under_the_leader_starts_without_reading_itself_back_and_a_listed_one_reads_itself():
    """Fairness (issue 23): a new job's first pass must not queue a GET of the object its watch
    event just carried. A job seen in a listing (a start, a re-list) or known from before a new
    term is read from the server first (a missed deletion, another leader's status)."""

    def first_requests(event_type, active):
        api = FakeApi(job_body())
        c, _ = make(api)
        del c.jobs[JOB.key]
        c.active = active

        async def scenario():
            c.observe_job(event_type, json.loads(json.dumps(api.job)))
            if not active:
                c.activate()
            loop = c.jobs[JOB.key]
            for _ in range(200):
                await asyncio.sleep(0.01)
                if api.posted("pods"):
                    break
            await c.deactivate()
            return loop

        loop = asyncio.run(scenario())
        return [(v, p.rsplit("/", 1)[-1]) for v, p, _ in api.calls][:2], loop

    calls, loop = first_requests("ADDED", active=True)
    assert calls == [("create", "events"), ("patch", "status")], calls
    assert loop.next_check > 0, "its periodic check is still scheduled"
    for event_type, active in ((None, True), ("MODIFIED", True), ("ADDED", False)):
        calls, _ = first_requests(event_type, active)
        assert calls[0] == ("get", JOB.name), (event_type, active, calls)
    c, loop = make(FakeApi(job_body()))
    loop.check_now = False
    c._relisted()  # an informer listed again: a deletion may have been missed meanwhile
    assert loop.check_now and loop.wake.is_set()


def test_a_refused_status_patch_fails_the_pass_before_any_pod_and_leaves_no_write_running():
    api = SlowApi(job_body())
    api.fail[("patch", "status")] = [kube.KubeError(500, "etcdserver: request timed out")]
    c, loop = make(api)

    async def scenario():
        with pytest.raises(kube.KubeError, match="request timed out"):
            await c.reconcile_once(loop, now=NOW)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()
                  and "informer" not in t.get_name()]
        return others

    left = asyncio.run(scenario())
    assert left == [], left
    assert api.posted("pods") == [], "no pod before the job's status says it is being created"
    run_pass(c, loop)  # the next pass finishes what this one began, once each
    assert sorted(api.posted("configmaps") + api.posted("services")) == sorted([PAYLOAD, names.service_name(JOB, 0)])
    assert len(api.posted("pods")) == 4


# --- a deleted job's children: deleted by the operator at once, unless orphaned ------------------


def deleted_job(c, api, *events):
    """Runs the first pass (the job's pods, Service and ConfigMap), lets the informers see them,
    then hands the controller (the leader) the job's watch events; returns the paths DELETEd."""
    loop = c.jobs[JOB.key]
    run_pass(c, loop)
    sync_informers(c, api)
    before = len(api.calls)

    async def scenario():
        c.active = True
        for event_type, meta in events:
            body = job_body()
            body["metadata"].update(meta)
            c.observe_job(event_type, body)
            assert len(c.collector._collections) <= api.concurrency, "a few deleters, not a task per child"
            await asyncio.sleep(0)
        await asyncio.gather(*c.collector._collections)

    asyncio.run(scenario())
    return sorted(path for verb, path, _ in api.calls[before:] if verb == "delete")


def children(api):
    """The job's children left (the namespace's payload ConfigMap is not one: it stays)."""
    return sorted(f"{p}/{n}" for (p, n) in api.objects if p.rsplit("/", 1)[-1] in ("pods", "services", "configmaps")
                  and n != PAYLOAD)


def test_a_deleted_jobs_children_are_deleted_by_the_operator_not_left_to_the_collectors_pace():
    api = FakeApi(job_body())
    c, _ = make(api)
    deleted = deleted_job(c, api, ("DELETED", {}))
    assert len([p for p in deleted if "/pods/" in p]) == 4, deleted
    assert any("/services/" in p for p in deleted) and not any("/configmaps/" in p for p in deleted), deleted
    assert children(api) == [], "every child of the deleted job is gone"
    assert (kube.configmaps_url("ns"), PAYLOAD) in api.objects, "the namespace's payload stays for its other jobs"
    assert JOB.key not in c.jobs


def test_the_children_are_deleted_by_no_more_deleters_than_the_clients_concurrency():
    api = FakeApi(job_body())
    api.concurrency = 2
    c, _ = make(api)
    assert len(deleted_job(c, api, ("DELETED", {}))) == 5
    assert children(api) == [] and not c.collector._doomed


def test_the_memory_is_handed_back_after_the_last_child_is_deleted_not_only_after_the_forget(monkeypatch):
    """The deletions go on after the job is forgotten (a thousand jobs: a minute); the trim that
    follows the forget ran while they did, so the last deleter asks for another."""
    trims = []
    monkeypatch.setattr(memory, "trim_memory", lambda: trims.append(len(api.calls)) or True)
    monkeypatch.setattr(memory, "TRIM_DELAY_SECONDS", 0.0)
    api = FakeApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)
    sync_informers(c, api)
    real_delete = api.delete

    async def slow_delete(path, **kw):
        await asyncio.sleep(0.01)
        return await real_delete(path, **kw)

    api.delete = slow_delete

    async def scenario():
        c.active = True
        c.observe_job("DELETED", job_body())
        await asyncio.gather(*c.collector._collections)
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert children(api) == []
    assert trims and trims[-1] == len(api.calls), "a trim after the last deletion"


def test_a_job_deleted_with_cascade_orphan_keeps_its_children():
    api = FakeApi(job_body())
    c, _ = make(api)
    deleting = {"deletionTimestamp": "2026-01-01T00:00:00Z"}
    deleted = deleted_job(c, api, ("MODIFIED", {**deleting, "finalizers": ["orphan"]}), ("DELETED", deleting))
    assert deleted == [], "kubectl delete --cascade=orphan: the children stay"
    assert len([p for p in children(api) if "/pods/" in p]) == 4
    assert c.collector._orphaning == set(), "forgotten once the job is gone"


def test_a_foreground_deletion_is_collected_once_and_another_finalizer_waits_for_the_deletion():
    api = FakeApi(job_body())
    c, _ = make(api)
    deleting = {"deletionTimestamp": "2026-01-01T00:00:00Z"}
    deleted = deleted_job(c, api, ("MODIFIED", {**deleting, "finalizers": ["foregroundDeletion"]}),
                          ("MODIFIED", {**deleting, "finalizers": ["foregroundDeletion"]}), ("DELETED", deleting))
    assert len(deleted) == len(set(deleted)) == 5, deleted  # 4 pods and the Service: once each
    assert c.collector._collected == set()

    api = FakeApi(job_body())
    c, _ = make(api)
    assert deleted_job(c, api, ("MODIFIED", {**deleting, "finalizers": ["example.com/archive-logs"]})) == [], \
        "held by someone else's finalizer: nothing is deleted before the job is"
    assert len(children(api)) == 5


def test_a_standby_replica_and_a_namesakes_children_are_left_alone():
    api = FakeApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)
    sync_informers(c, api)
    before = len(api.calls)

    async def standby():
        c.active = False
        c.observe_job("DELETED", job_body())
        await asyncio.sleep(0.05)

    asyncio.run(standby())
    assert [v for v, _, _ in api.calls[before:] if v == "delete"] == [], "a standby replica writes nothing"
    assert c.collector._collections == set()

    # A standby that saw the foreground marking, then leads when the job is gone: it collects.
    api = FakeApi(job_body())
    c, loop = make(api)
    run_pass(c, loop)
    sync_informers(c, api)
    marked = job_body()
    marked["metadata"].update({"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["foregroundDeletion"]})

    async def standby_then_leader():
        c.active = False
        c.observe_job("MODIFIED", marked)
        c.active = True
        c.observe_job("DELETED", job_body())
        await asyncio.gather(*c.collector._collections)

    asyncio.run(standby_then_leader())
    assert children(api) == [], "collected by the replica that leads at the deletion"

    api = FakeApi(job_body())
    c, _ = make(api)
    other = job_body()
    other["metadata"]["uid"] = "a-namesake"  # deleted, and created again under the same name
    assert deleted_job(c, api, ("ADDED", other["metadata"]), ("DELETED", other["metadata"])) == [], \
        "the children belong to the first job, not to the namesake deleted"


# --- memory: a new process once the jobs went and their memory stayed ---------------------------


def _recycle_after_forget(monkeypatch, *, doomed: bool) -> tuple[list[str], controller.Controller]:
    monkeypatch.setattr(memory, "TRIM_DELAY_SECONDS", 0.05)
    monkeypatch.setattr(controller, "COALESCE_SECONDS", 0.0)
    api = FakeApi(job_body())
    c = make(api)[0]
    c.trimmer.recycle = memory.RecyclePolicy(2.0, 0, start=1)  # any resident memory is far above a 1-byte start
    c.trimmer.recycle.jobs_seen(len(c.jobs))
    calls: list[str] = []
    c.trimmer.start_afresh = lambda: calls.append("active" if c.active else "stopped")

    async def scenario():
        await _lead_until_the_pods_are_posted(c, api)
        if doomed:
            c.collector._doomed.append((JOB.key, "/api/v1/namespaces/x/pods/y", None))
        c.forget(JOB.key)
        await asyncio.sleep(0.3)

    asyncio.run(scenario())
    return calls, c


def test_the_trim_after_the_last_job_went_starts_the_process_afresh_with_the_loops_stopped(monkeypatch):
    calls, c = _recycle_after_forget(monkeypatch, doomed=False)
    assert calls == ["stopped"], "deactivated first (as when the Lease is lost), then replaced, once"
    assert c.jobs == {}


def test_no_new_process_while_deleted_jobs_children_are_still_being_deleted(monkeypatch):
    calls, _ = _recycle_after_forget(monkeypatch, doomed=True)
    assert calls == []


def test_the_controller_never_starts_afresh_without_a_policy(monkeypatch):
    monkeypatch.setattr(memory, "TRIM_DELAY_SECONDS", 0.01)
    c = make(FakeApi(job_body()))[0]
    assert c.trimmer.recycle is None
    c.trimmer.start_afresh = lambda: pytest.fail("no policy: never")

    async def scenario():
        c.forget(JOB.key)
        await asyncio.sleep(0.1)

    asyncio.run(scenario())


def test_no_new_process_while_a_deleted_jobs_pods_are_still_held_and_one_once_the_last_went(monkeypatch):
    """Pods the API server still has (terminating, or owned and awaiting the garbage collector)
    would be listed again by a new process; an orphan (no owner) stays and does not count; the
    last pod's going is what brings the new process."""
    monkeypatch.setattr(memory, "TRIM_DELAY_SECONDS", 0.05)
    c = make(FakeApi(job_body()))[0]
    c.trimmer.recycle = memory.RecyclePolicy(2.0, 0, start=1)
    c.trimmer.recycle.jobs_seen(1)
    calls: list[int] = []
    c.trimmer.start_afresh = lambda: calls.append(1)
    gone = ("ns", "deleted-job")
    pod = lifecycle.pod_info({"metadata": {"name": "p0", "deletionTimestamp": "2026-12-04T00:00:00Z",
                                           "labels": {names.LABEL_JOB: "deleted-job"}}, "status": {}})
    orphan = lifecycle.pod_info({"metadata": {"name": "o0", "labels": {names.LABEL_JOB: "old"}}, "status": {}})

    async def scenario():
        c.view.pods.store[gone] = {"p0": ("uid-of-the-deleted-job", pod)}
        c.view.pods.store[("ns", "old")] = {"o0": (None, orphan)}
        c.forget(JOB.key)
        await asyncio.sleep(0.2)
        seen = list(calls)
        del c.view.pods.store[gone]  # what the informer does when the watch says the pod is gone
        c._wake_all({gone})
        await asyncio.sleep(0.2)
        return seen

    assert asyncio.run(scenario()) == [], "not while the deleted job's pod is held"
    assert calls == [1], "once its last pod went; the orphan does not hold it back"


# --- a loop that outlived its job: a namesake's status is not its to write ----------------------


def test_an_old_jobs_late_deletion_leaves_its_namesakes_loop_running():
    """kopf hands each uid's events to a worker of its own, so the deletion of a job deleted and
    created again can come after the namesake's creation: only the old uid's loop may stop."""
    api = FakeApi(job_body())
    c, loop = make(api)

    async def scenario():
        c._start_loop(loop)
        await asyncio.sleep(0.05)
        old = job_body()
        old["metadata"].update({"uid": "the-deleted-job", "deletionTimestamp": "2026-12-04T00:00:00Z"})
        c.observe_job("MODIFIED", old)
        c.observe_job("DELETED", old)
        await asyncio.sleep(0.05)
        held, cancelled = c.jobs.get(JOB.key), loop.task.cancelled() or loop.task.done()
        c.observe_job("DELETED", job_body())  # its own deletion does stop it
        await asyncio.sleep(0.05)
        return held, cancelled, c.jobs.get(JOB.key), loop.task.done()

    held, cancelled, after, done = asyncio.run(scenario())
    assert held is loop and not cancelled
    assert after is None and done


def test_a_forgotten_loop_whose_cancellation_was_lost_runs_no_pass():
    """Python 3.11's wait_for can return the wake-up instead of the cancellation when both land
    in one turn: the loop, no longer the job's, must stop by itself and write nothing."""
    api = FakeApi(job_body())
    c, loop = make(api)
    del c.jobs[JOB.key]  # forgotten: its job deleted, or replaced by a namesake's loop

    asyncio.run(asyncio.wait_for(c._run(loop), timeout=5))
    assert api.calls == []
    # A pass already under way when its loop was replaced does not write the status.
    with pytest.raises(controller.JobGone):
        run_pass(c, loop)
    assert [call for call in api.calls if call[0] == "patch"] == []


def test_a_status_patch_never_reaches_a_namesake():
    """The patch carries the uid it was computed for: the server refuses it for a namesake (a uid
    cannot change), so the namesake's status is untouched and the stale loop stops."""
    api = FakeApi(job_body())
    c, loop = make(api)
    api.job["metadata"]["uid"] = "a-namesake"  # deleted and created again since the loop read it
    with pytest.raises(controller.JobGone, match="namesake"):
        run_pass(c, loop)
    assert loop.uid == JOB.uid and loop.written is None
    assert not api.job.get("status"), "the namesake's status is not written"
    patches = [call for call in api.calls if call[0] == "patch"]
    assert len(patches) == 1


# --- network isolation: a NetworkPolicy per job, before its first pods ------------------------------


def test_with_isolation_the_jobs_network_policy_is_created_with_its_first_pods_and_never_without():
    api = SlowApi(job_body())
    c, loop = make(api)
    c.creator.isolation = ("monarch-spmd", {"app.kubernetes.io/name": "monarch-spmd"})
    run_pass(c, loop)
    policies = [(p, n) for verb, p, n in api.calls if verb == "create" and p.endswith("/networkpolicies")]
    assert policies == [("/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies", names.network_policy_name(JOB))]
    span = {(verb, what): (began, ended) for verb, what, began, ended in api.spans}
    first_pod = min(began for verb, what, began, _ in api.spans if what == "pods")
    assert span[("create", "networkpolicies")][1] <= first_pod, "no pod runs before its job is isolated"
    body = api.objects[("/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies", names.network_policy_name(JOB))]
    assert body["metadata"]["ownerReferences"][0]["uid"] == JOB.uid
    plain = FakeApi(job_body())
    c2, loop2 = make(plain)
    run_pass(c2, loop2)
    assert not [p for verb, p, _ in plain.calls if p.endswith("/networkpolicies")], "off unless asked for"


def test_a_network_policy_the_server_refuses_holds_the_pods_back_and_is_named():
    """RBAC without networkpolicies (rbac.create false, a Role of one's own): no pod of the job
    starts unisolated; the refusal is kept for the next pass to say, naming the object."""
    api = FakeApi(job_body())
    api.fail[("create", "networkpolicies")] = [kube.KubeError(
        403, 'networkpolicies.networking.k8s.io is forbidden: User "system:serviceaccount:ops:spmd" cannot create '
             'resource "networkpolicies" in API group "networking.k8s.io" in the namespace "ns"', reason="Forbidden")]
    c, loop = make(api)
    c.creator.isolation = ("ops", {})
    run_pass(c, loop)
    assert api.posted("pods") == [], "no pod runs before its job is isolated"
    assert loop.rejection is not None and loop.rejection.kind == "NetworkPolicy"
    assert loop.rejection.code == 403 and "networkpolicies" in loop.rejection.message
    run_pass(c, loop)  # the next pass says it, and holds creation for the back-off
    refusal = api.job["status"]["refusal"]
    assert refusal["kind"] == "NetworkPolicy" and refusal["code"] == 403, refusal
    assert api.posted("pods") == []
    # The rule was added: after the back-off (timed from the refusal's wall-clock time) the policy
    # is created first, then pods follow.
    asyncio.run(c.reconcile_once(loop, now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60)))
    assert api.objects[("/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies", names.network_policy_name(JOB))]
    assert api.posted("pods"), "creation goes on once the job is isolated"
