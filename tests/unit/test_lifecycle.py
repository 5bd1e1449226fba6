"""Unit tests of the SPMDJob lifecycle (pure) and of the controller that carries out its plans.

The controller runs against an in-memory stand-in for the API server, so the order of writes,
idempotence on 409/404 and the handling of a pod the server rejects are checked without one.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json

import pytest

from monarch_spmd.spec import SpecError, parse_job_spec
from spmd_operator import builders, handlers, kube, lifecycle
from spmd_operator.lifecycle import PodInfo, reconcile

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
T0 = "2026-01-01T11:00:00Z"
BASE = {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 2}], "args": ["train.py"], "image": "img"}


def spec(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return parse_job_spec(raw, require_image=True)


def pod(rank, phase="Running", restart=0, **kw):
    return PodInfo(name=f"hello-r{restart}-{rank}", rank=rank, restart=restart, phase=phase, node=f"node-{rank}", **kw)


def gang(phase="Running", restart=0, n=4):
    return [pod(r, phase, restart) for r in range(n)]


def status(phase, restarts=0, **kw):
    out = {"phase": phase, "restarts": restarts, "startTime": T0, "mesh": "hosts=2,gpus=2", "procs": 4,
           "masterAddr": "hello-master.ns.svc"}
    if phase == "Running":
        out["conditions"] = lifecycle.set_condition([], "Running", "True", "AllProcsRunning", "all 4 procs are running", NOW)
    out.update(kw)
    return out


def run(s=None, st=None, pods=(), now=NOW, generation=1):
    return reconcile(name="hello", namespace="ns", generation=generation, spec=s or spec(), status=st, pods=pods, now=now)


def apply(st, plan):
    """The status after the plan's merge patch."""
    return merge(st or {}, plan.status)


def merge(a, patch):
    out = dict(a)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def cond(st, type_):
    return next((c for c in st.get("conditions", []) if c["type"] == type_), None)


# --- pod summaries ------------------------------------------------------------------------------


def pod_body(phase="Running", terminated=None, waiting=None, reason=None, deleting=False, labels=None):
    state = {"terminated": terminated} if terminated else {"waiting": waiting} if waiting else {"running": {}}
    body = {
        "metadata": {"name": "hello-r1-2", "labels": labels if labels is not None else {
            "spmd.monarch.dev/job": "hello", "spmd.monarch.dev/rank": "2", "spmd.monarch.dev/restart": "1"}},
        "spec": {"nodeName": "n7"},
        "status": {"phase": phase, "containerStatuses": [
            {"name": "sidecar", "ready": True, "state": {"running": {}}},
            {"name": "trainer", "ready": phase == "Running", "state": state},
        ]},
    }
    if reason:
        body["status"]["reason"] = reason
        body["status"]["message"] = "The node was low on resource: memory."
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return body


def test_pod_info_of_a_running_pod():
    assert lifecycle.pod_info(pod_body()) == PodInfo(name="hello-r1-2", rank=2, restart=1, phase="Running", node="n7", ready=True)


def test_pod_info_of_a_failed_pod_keeps_exit_code_reason_and_log_tail():
    info = lifecycle.pod_info(pod_body("Failed", terminated={"exitCode": 3, "reason": "Error", "message": "Traceback\nValueError: x", "finishedAt": T0}))
    assert (info.phase, info.exit_code, info.reason, info.message, info.finished_at) == ("Failed", 3, "Error", "Traceback\nValueError: x", T0)


def test_pod_info_of_an_evicted_pod_uses_the_pod_reason():
    info = lifecycle.pod_info(pod_body("Failed", reason="Evicted"))
    assert (info.exit_code, info.reason, info.message) == (None, "Evicted", "The node was low on resource: memory.")


def test_pod_info_of_a_waiting_pod_and_a_deleted_pod():
    info = lifecycle.pod_info(pod_body("Pending", waiting={"reason": "ImagePullBackOff"}))
    assert (info.phase, info.reason, info.ready) == ("Pending", "ImagePullBackOff", False)
    assert lifecycle.pod_info(pod_body(deleting=True)).deleting


def test_pod_info_ignores_pods_without_our_labels():
    assert lifecycle.pod_info(pod_body(labels={"spmd.monarch.dev/job": "hello"})) is None
    assert lifecycle.pod_info(pod_body(labels={"spmd.monarch.dev/rank": "x", "spmd.monarch.dev/restart": "0"})) is None


@pytest.mark.parametrize(
    ("policy", "code", "reason", "permanent"),
    [
        ({}, 1, "Error", False),
        ({}, 137, "OOMKilled", False),
        ({}, 64, "Error", True),
        ({}, 75, "Error", False),
        ({}, None, "Evicted", False),
        ({}, None, "InvalidImageName", True),
        ({"permanentExitCodes": [2]}, 2, "Error", True),
        ({"permanentExitCodes": [75]}, 75, "Error", True),
        ({"retryableExitCodes": [137]}, 137, "Error", False),
        ({"retryableExitCodes": [137]}, 1, "Error", True),
        ({"retryableExitCodes": [137]}, 75, "Error", False),
        ({"retryableExitCodes": [64]}, 64, "Error", False),
        ({"retryableExitCodes": [137]}, None, "PodDeleted", False),
        ({"permanentReasons": ["OOMKilled"]}, 137, "OOMKilled", True),
        ({"permanentReasons": ["Evicted"]}, None, "Evicted", True),
    ],
)
def test_failure_classification(policy, code, reason, permanent):
    assert lifecycle.is_permanent(spec(restartPolicy=policy), code, reason) is permanent


# --- the state machine ------------------------------------------------------------------------


def test_first_pass_creates_every_pod_and_goes_pending():
    plan = run(st=None)
    assert plan.create == (0, 1, 2, 3)
    assert plan.restart == 0
    assert plan.delete == ()
    st = apply(None, plan)
    assert st["phase"] == "Pending"
    assert (st["mesh"], st["procs"], st["restarts"]) == ("hosts=2,gpus=2", 4, 0)
    assert st["masterAddr"] == "hello-master.ns.svc"
    assert st["startTime"] == "2026-01-01T12:00:00Z"
    assert st["observedGeneration"] == 1
    assert cond(st, "Created")["status"] == "True"
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Created")]


def test_first_pass_again_with_pods_present_creates_nothing():
    st = apply(None, run(st=None))
    plan = run(st=st, pods=gang("Pending"))
    assert plan.create == ()
    assert plan.delete == ()
    assert plan.events == ()


def test_missing_pods_of_a_starting_gang_are_created_again():
    st = apply(None, run(st=None))
    plan = run(st=st, pods=gang("Pending")[:2])
    assert plan.create == (2, 3)


def test_running_only_when_every_proc_runs():
    st = status("Pending")
    plan = run(st=st, pods=gang("Running")[:3] + [pod(3, "Pending", reason="ContainerCreating")])
    new = apply(st, plan)
    assert new["phase"] == "Pending"
    assert new["running"] == 3
    running = cond(new, "Running")
    assert running["status"] == "False"
    assert "3/4 procs running" in running["message"]
    assert "rank 3 ContainerCreating" in running["message"]
    plan = run(st=new, pods=gang("Running"))
    new = apply(new, plan)
    assert new["phase"] == "Running"
    assert cond(new, "Running")["status"] == "True"
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Running")]


def test_running_and_the_same_pass_again_is_a_no_op():
    st = status("Running", running=4, succeeded=0, failed=0, observedGeneration=1)
    plan = run(st=st, pods=gang("Running"))
    assert plan.status == {}
    assert (plan.create, plan.delete, plan.events) == ((), (), ())


def test_all_ranks_exit_zero_is_success():
    st = status("Running")
    plan = run(st=st, pods=gang("Succeeded"))
    new = apply(st, plan)
    assert new["phase"] == "Succeeded"
    assert new["completionTime"] == "2026-01-01T12:00:00Z"
    assert new["succeeded"] == 4
    assert cond(new, "Succeeded")["status"] == "True"
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Succeeded")]
    assert plan.delete == ()


def test_some_ranks_done_others_running_stays_running():
    st = status("Running")
    plan = run(st=st, pods=gang("Succeeded")[:2] + gang("Running")[2:])
    assert apply(st, plan)["phase"] == "Running"
    assert plan.create == ()


def test_retryable_failure_replaces_the_whole_gang():
    st = status("Running")
    pods = gang("Running")
    pods[2] = pod(2, "Failed", exit_code=1, reason="Error", message="line1\nRuntimeError: boom", finished_at="2026-01-01T11:59:00Z")
    pods[0] = pod(0, "Failed", exit_code=1, reason="Error", message="connection reset", finished_at="2026-01-01T11:59:30Z")
    plan = run(st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Restarting"
    assert new["restarts"] == 1
    assert set(plan.delete) == {p.name for p in pods}, "every old pod goes, failed ones included"
    assert plan.create == (0, 1, 2, 3)
    assert plan.restart == 1
    failure = new["failure"]
    assert failure == {"rank": 2, "pod": "hello-r0-2", "node": "node-2", "exitCode": 1, "reason": "Error",
                       "message": "line1\nRuntimeError: boom", "restart": 0, "permanent": False,
                       "time": "2026-01-01T12:00:00Z"}
    assert cond(new, "Restarting")["status"] == "True"
    assert cond(new, "Running")["status"] == "False"
    [event] = plan.events
    assert (event.type, event.reason) == ("Warning", "Restarting")
    assert "rank 2" in event.message and "RuntimeError: boom" in event.message


def test_restarting_gang_comes_up_as_the_new_attempt():
    st = status("Restarting", restarts=1)
    old = gang("Running", restart=0)
    old = [PodInfo(**{**p.__dict__, "deleting": True}) for p in old]
    plan = run(st=st, pods=old + gang("Pending", restart=1))
    assert plan.create == ()
    assert plan.delete == (), "old pods already being deleted are left alone"
    assert apply(st, plan)["phase"] == "Restarting"
    plan = run(st=st, pods=gang("Running", restart=1))
    new = apply(st, plan)
    assert new["phase"] == "Running"
    assert cond(new, "Restarting") is None or cond(new, "Restarting")["status"] == "False"


def test_stale_pods_of_an_older_attempt_are_deleted():
    st = status("Restarting", restarts=1)
    plan = run(st=st, pods=gang("Running", restart=0) + gang("Pending", restart=1))
    assert set(plan.delete) == {f"hello-r0-{r}" for r in range(4)}
    assert plan.create == ()


def test_permanent_exit_code_fails_at_once():
    st = status("Running")
    pods = gang("Running")
    pods[1] = pod(1, "Failed", exit_code=64, reason="Error", message="bad input: MONARCH_SPMD_MESH")
    plan = run(st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Failed"
    assert new["restarts"] == 0
    assert plan.create == ()
    assert set(plan.delete) == {"hello-r0-0", "hello-r0-2", "hello-r0-3"}, "the rest of the gang is stopped"
    assert new["failure"]["exitCode"] == 64
    assert new["failure"]["permanent"] is True
    failed = cond(new, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "PermanentFailure")
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "PermanentFailure")]


def test_permanent_failure_wins_over_an_earlier_retryable_one():
    st = status("Running")
    pods = gang("Running")
    pods[0] = pod(0, "Failed", exit_code=1, reason="Error", finished_at="2026-01-01T11:00:00Z")
    pods[3] = pod(3, "Failed", exit_code=137, reason="OOMKilled", finished_at="2026-01-01T11:00:05Z")
    new = apply(st, run(s=spec(restartPolicy={"permanentReasons": ["OOMKilled"]}), st=st, pods=pods))
    assert new["phase"] == "Failed"
    assert (new["failure"]["rank"], new["failure"]["reason"]) == (3, "OOMKilled")


def test_restart_limit_fails_with_the_root_cause():
    st = status("Running", restarts=2)
    pods = gang("Running", restart=2)
    pods[3] = pod(3, "Failed", restart=2, exit_code=1, reason="Error", message="\n".join(f"line {i}" for i in range(100)))
    plan = run(s=spec(restartPolicy={"maxRestarts": 2}), st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Failed"
    assert new["restarts"] == 2
    assert plan.create == ()
    assert cond(new, "Failed")["reason"] == "RestartLimitExceeded"
    failure = new["failure"]
    assert (failure["rank"], failure["pod"], failure["node"], failure["exitCode"], failure["restart"]) == (3, "hello-r2-3", "node-3", 1, 2)
    assert failure["message"].splitlines() == [f"line {i}" for i in range(80, 100)], "the last lines only"


def test_max_restarts_zero_fails_on_the_first_failure():
    st = status("Running")
    pods = gang("Running")
    pods[0] = pod(0, "Failed", exit_code=1, reason="Error")
    assert apply(st, run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=pods))["phase"] == "Failed"


@pytest.mark.parametrize("how", ["deleting", "missing", "evicted"])
def test_pod_lost_under_a_running_job_restarts_the_gang(how):
    st = status("Running")
    pods = gang("Running")
    if how == "deleting":
        pods[1] = PodInfo(**{**pods[1].__dict__, "deleting": True})
        reason = "PodDeleted"
    elif how == "missing":
        del pods[1]
        reason = "PodMissing"
    else:
        pods[1] = pod(1, "Failed", reason="Evicted", message="The node was low on resource: memory.")
        reason = "Evicted"
    plan = run(st=st, pods=pods)
    new = apply(st, plan)
    assert new["phase"] == "Restarting"
    assert new["restarts"] == 1
    assert plan.create == (0, 1, 2, 3)
    assert (new["failure"]["rank"], new["failure"]["reason"]) == (1, reason)
    assert new["failure"]["pod"] == "hello-r0-1", "a vanished pod is still named"
    assert "exitCode" not in new["failure"]


def test_failure_patch_clears_fields_of_the_previous_failure():
    st = status("Running", restarts=1, failure={"rank": 0, "pod": "hello-r0-0", "exitCode": 1, "reason": "Error", "restart": 0})
    pods = gang("Running", restart=1)
    del pods[2]
    plan = run(st=st, pods=pods)
    assert plan.status["failure"]["exitCode"] is None, "a merge patch must remove the old exit code"
    assert "exitCode" not in apply(st, plan)["failure"]


def test_image_that_can_never_be_pulled_fails_permanently():
    st = status("Pending")
    pods = gang("Pending")
    pods[0] = pod(0, "Pending", reason="InvalidImageName", message="couldn't parse image reference")
    new = apply(st, run(st=st, pods=pods))
    assert new["phase"] == "Failed"
    assert new["failure"]["reason"] == "InvalidImageName"


def test_a_deleted_pod_while_pending_is_a_failure_but_a_missing_one_is_recreated():
    st = status("Pending")
    pods = gang("Pending")
    pods[0] = PodInfo(**{**pods[0].__dict__, "deleting": True})
    assert apply(st, run(st=st, pods=pods))["phase"] == "Restarting"
    plan = run(st=st, pods=gang("Pending")[1:])
    assert plan.create == (0,)
    assert apply(st, plan)["phase"] == "Pending"


def test_suspend_deletes_the_pods_and_resume_recreates_them():
    st = status("Running", restarts=1)
    plan = run(s=spec(suspend=True), st=st, pods=gang("Running", restart=1))
    new = apply(st, plan)
    assert new["phase"] == "Suspended"
    assert "startTime" not in new
    assert set(plan.delete) == {f"hello-r1-{r}" for r in range(4)}
    assert cond(new, "Suspended")["status"] == "True"
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Suspended")]
    # Suspended again: nothing new.
    again = run(s=spec(suspend=True), st=new, pods=[])
    assert (again.create, again.delete, again.events) == ((), (), ())
    # Resumed while old pods still terminate: wait.
    terminating = [PodInfo(**{**p.__dict__, "deleting": True}) for p in gang("Running", restart=1)]
    waiting = run(st=new, pods=terminating)
    assert waiting.create == ()
    assert apply(new, waiting)["phase"] == "Suspended"
    assert cond(apply(new, waiting), "Suspended")["reason"] == "Resuming"
    # Resumed with the old pods gone: the same attempt again, the deadline clock restarted.
    resumed = run(st=new, pods=[])
    after = apply(new, resumed)
    assert after["phase"] == "Pending"
    assert after["restarts"] == 1
    assert after["startTime"] == "2026-01-01T12:00:00Z"
    assert resumed.create == (0, 1, 2, 3)
    assert resumed.restart == 1
    assert cond(after, "Suspended")["status"] == "False"
    assert [(e.type, e.reason) for e in resumed.events] == [("Normal", "Resumed")]


def test_created_suspended_creates_nothing():
    plan = run(s=spec(suspend=True), st=None)
    assert plan.create == ()
    assert apply(None, plan)["phase"] == "Suspended"


def test_active_deadline_fails_the_job_and_stops_its_pods():
    st = status("Running")  # started 11:00, now 12:00
    plan = run(s=spec(activeDeadlineSeconds=3600), st=st, pods=gang("Running"))
    new = apply(st, plan)
    assert new["phase"] == "Failed"
    assert cond(new, "Failed")["reason"] == "DeadlineExceeded"
    assert new["failure"]["reason"] == "DeadlineExceeded"
    assert len(plan.delete) == 4
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "DeadlineExceeded")]


def test_active_deadline_not_yet_reached_asks_to_be_woken():
    plan = run(s=spec(activeDeadlineSeconds=3700), st=status("Running"), pods=gang("Running"))
    assert plan.requeue_after == pytest.approx(100)
    assert plan.status.get("phase") is None


def test_ttl_after_finished_deletes_the_job():
    st = status("Succeeded", completionTime="2026-01-01T11:59:00Z")
    waiting = run(s=spec(ttlSecondsAfterFinished=120), st=st, pods=gang("Succeeded"))
    assert not waiting.delete_job
    assert waiting.requeue_after == pytest.approx(60)
    expired = run(s=spec(ttlSecondsAfterFinished=60), st=st, pods=gang("Succeeded"))
    assert expired.delete_job
    kept = run(st=st, pods=gang("Succeeded"))
    assert not kept.delete_job and kept.requeue_after is None


def test_finished_job_stops_remaining_pods_and_keeps_finished_ones():
    st = status("Failed")
    pods = [pod(0, "Failed", exit_code=1), pod(1, "Succeeded"), pod(2, "Running"), pod(3, "Pending")]
    plan = run(st=st, pods=pods)
    assert set(plan.delete) == {"hello-r0-2", "hello-r0-3"}
    assert plan.create == ()
    assert plan.events == ()


def test_invalid_spec_fails_without_creating_anything():
    error = SpecError("spec.template.spec.restartPolicy", "'Always' is not allowed")
    plan = run(s=error, st=None)
    new = apply(None, plan)
    assert new["phase"] == "Failed"
    failed = cond(new, "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.template.spec.restartPolicy" in failed["message"]
    assert new["failure"]["reason"] == "InvalidSpec"
    assert plan.create == ()
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "InvalidSpec")]
    again = run(s=error, st=new)
    assert (again.status, again.events, again.create) == ({}, (), ())


def test_observed_generation_follows_the_spec():
    st = status("Running", observedGeneration=1)
    assert run(st=st, pods=gang("Running"), generation=2).status["observedGeneration"] == 2


def test_condition_transition_time_moves_only_on_a_status_change():
    later = NOW + dt.timedelta(minutes=5)
    conds = lifecycle.set_condition([], "Running", "False", "WaitingForProcs", "1/4", NOW)
    conds = lifecycle.set_condition(conds, "Running", "False", "WaitingForProcs", "3/4", later)
    assert conds[0]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert conds[0]["message"] == "3/4"
    conds = lifecycle.set_condition(conds, "Running", "True", "AllProcsRunning", "4/4", later)
    assert conds[0]["lastTransitionTime"] == "2026-01-01T12:05:00Z"


def test_merge_patch():
    assert lifecycle.merge_patch({"a": 1, "b": {"x": 1, "y": 2}}, {"a": 1, "b": {"x": 1}}) == {"b": {"y": None}}
    assert lifecycle.merge_patch({"a": 1}, {"a": 1}) == {}
    assert lifecycle.merge_patch({"a": 1}, {}) == {"a": None}
    assert lifecycle.merge_patch({}, {"c": [1]}) == {"c": [1]}


# --- the controller (handlers) against an in-memory API ---------------------------------------


class FakeApi:
    """Stands in for kube.Kube: keeps objects by URL, answers 409/404 like the API server."""

    def __init__(self, job, reject_pods=False):
        self.job = job
        self.objects = {}
        self.calls = []
        self.reject_pods = reject_pods

    async def create(self, url, body):
        key = f"{url}/{body['metadata']['name']}"
        self.calls.append(("create", key))
        if self.reject_pods and url.endswith("/pods"):
            raise kube.KubeError(422, 'Pod "x" is invalid: spec.containers[1].image: Required value')
        if key in self.objects:
            return False
        self.objects[key] = body
        return True

    async def patch(self, url, patch):
        self.calls.append(("patch", url))
        if url.endswith("/status"):
            self.job["status"] = merge(self.job.get("status") or {}, patch["status"])
            rv = int(self.job["metadata"]["resourceVersion"]) + 1
            self.job["metadata"]["resourceVersion"] = str(rv)
            return json.loads(json.dumps(self.job))
        return {}

    async def delete(self, url, propagation="Background"):
        self.calls.append(("delete", url))
        return self.objects.pop(url, None) is not None


def job_body():
    return {"apiVersion": "spmd.monarch.dev/v1alpha1", "kind": "SPMDJob",
            "metadata": {"name": "hello", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "10"},
            "spec": copy.deepcopy(BASE)}


@pytest.fixture
def posted(monkeypatch):
    events = []
    monkeypatch.setattr(handlers.kopf, "event", lambda body, type, reason, message: events.append((type, reason)))
    return events


def controller(api):
    c = handlers.Controller(api, {"__init__.py": "", "contract.py": "", "worker.py": ""})
    c.pods = {}
    return c


def test_controller_writes_status_first_then_creates_configmap_service_and_pods(posted):
    api = FakeApi(job_body())
    c = controller(api)
    loop = handlers.JobLoop(key=("ns", "hello"), body=json.loads(json.dumps(api.job)))
    asyncio.run(c.reconcile_once(loop, now=NOW))
    kinds = [(verb, url.split("/")[-2] if verb == "create" else url.split("/")[-1]) for verb, url in api.calls]
    assert kinds[0] == ("patch", "status")
    assert kinds[1:] == [("create", "configmaps"), ("create", "services")] + [("create", "pods")] * 4
    assert loop.body["status"]["phase"] == "Pending", "the loop keeps the status its own patch returned"
    assert posted == [("Normal", "Created")]


def test_controller_second_pass_before_the_index_catches_up_posts_nothing_twice(posted):
    api = FakeApi(job_body())
    c = controller(api)
    loop = handlers.JobLoop(key=("ns", "hello"), body=json.loads(json.dumps(api.job)))
    asyncio.run(c.reconcile_once(loop, now=NOW))
    api.calls.clear()
    asyncio.run(c.reconcile_once(loop, now=NOW))
    assert not [call for call in api.calls if call[0] == "create"], "pods it just created are not POSTed again"
    assert posted == [("Normal", "Created")]


def test_controller_treats_existing_pods_as_created(posted):
    api = FakeApi(job_body())
    job = builders.JobRef("hello", "ns", "u1")
    s = spec()
    for r in range(4):  # e.g. created by an operator that crashed before it wrote the status
        pod_obj = builders.build_pod(job, s, r, 0)
        api.objects[f"{kube.pods_url('ns')}/{pod_obj['metadata']['name']}"] = pod_obj
    c = controller(api)
    loop = handlers.JobLoop(key=("ns", "hello"), body=json.loads(json.dumps(api.job)))
    asyncio.run(c.reconcile_once(loop, now=NOW))
    assert len([k for k in api.objects if "/pods/" in k]) == 4
    assert loop.body["status"]["phase"] == "Pending"


def test_controller_fails_the_job_when_the_server_rejects_the_pod_template(posted):
    api = FakeApi(job_body(), reject_pods=True)
    c = controller(api)
    loop = handlers.JobLoop(key=("ns", "hello"), body=json.loads(json.dumps(api.job)))
    asyncio.run(c.reconcile_once(loop, now=NOW))
    st = api.job["status"]
    assert st["phase"] == "Failed"
    assert cond(st, "Failed")["reason"] == "InvalidSpec"
    assert "spec.containers[1].image" in cond(st, "Failed")["message"]
    assert posted == [("Normal", "Created"), ("Warning", "InvalidSpec")]


def test_controller_marks_an_invalid_spec_failed_and_creates_nothing(posted):
    body = job_body()
    body["spec"]["template"] = {"spec": {"restartPolicy": "Always"}}
    api = FakeApi(body)
    c = controller(api)
    loop = handlers.JobLoop(key=("ns", "hello"), body=json.loads(json.dumps(api.job)))
    asyncio.run(c.reconcile_once(loop, now=NOW))
    assert [verb for verb, _ in api.calls] == ["patch"]
    assert api.job["status"]["phase"] == "Failed"
    assert "spec.template.spec.restartPolicy" in api.job["status"]["failure"]["message"]


def test_job_loop_ignores_an_older_version_of_the_job():
    loop = handlers.JobLoop(key=("ns", "hello"), body={"metadata": {"resourceVersion": "20"}, "status": {"phase": "Running"}})
    loop.accept({"metadata": {"resourceVersion": "19"}, "status": {"phase": "Pending"}})
    assert loop.body["status"]["phase"] == "Running"
    loop.accept({"metadata": {"resourceVersion": "21"}, "status": {"phase": "Succeeded"}})
    assert loop.body["status"]["phase"] == "Succeeded"
