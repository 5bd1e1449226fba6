"""End-to-end: hot spares (spec.spares) under the real Kueue, on the process node with real agents
and gloo all_reduces (tests/programs/train_steps.py), and the real operator.

A hot spare is a pod that holds its resources like a member does, so a user expects Kueue to
count it: the operator's Workload has one pod set of the gang's pods and its spares
(docs/kueue.md; docs/restart-in-place.md, "Hot spares", the operator's part). Hence:

* a quota that holds exactly the gang and its spare admits the job, the members train and the
  spare is ready;
* a quota that holds the gang but not its spare admits nothing: no pod runs, and the job's status
  says, in the operator's words (lifecycle/suspend.py), that the spare is what does not fit;
* a member lost while admitted is taken over by the spare and a new spare made, all inside the
  one admission: the Workload is never evicted nor its quota given back, nothing is counted
  against maxRestarts 0.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes import watch as kwatch

from devcluster import kueue as kueue_objects
from devcluster.localcluster import PROCESS_NODE
from spmd_operator import names
from tests.e2e.conftest import PROCESS_FLAVOR, apply, job_events, job_pods, job_ref
from tests.e2e.test_combinations import (AGAIN, START, beside_spares, gang_trains, manifest, restarting_events,
                                         uncounted)
from tests.e2e.test_combinations import follow  # noqa: F401 - a fixture of the tests below

pytestmark = pytest.mark.cluster
#: One pod's requests (each pod of the job, spare included): the quotas below are multiples of it.
POD_CPU, POD_MEMORY = "100m", "64Mi"
GROUP, VERSION = kueue_objects.API_GROUP, kueue_objects.API_VERSION


def spared_job(name: str, queue: str) -> dict[str, Any]:
    """Two pods training for ever (an all_reduce every 0.1 s), one hot spare, maxRestarts 0, on a
    Kueue queue; every pod requests POD_CPU and POD_MEMORY."""
    m = manifest(name, 2, spares=1)
    m["spec"]["scheduling"] = {"provider": "Kueue", "queue": queue}
    m["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": POD_CPU,
                                                                               "memory": POD_MEMORY}}
    return m


# --- the Workload, as Kueue and the operator leave it ---------------------------------------------


def workload(c, namespace: str, job: dict[str, Any]) -> dict[str, Any]:
    return client.CustomObjectsApi(c.api_client()).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "workloads", names.workload_name(job_ref(job)))


def conditions(wl: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x.get("type"): x for x in (wl.get("status") or {}).get("conditions") or []}


def admitted_at(wl: dict[str, Any]) -> dt.datetime | None:
    cond = conditions(wl).get("Admitted") or {}
    if cond.get("status") != "True":
        return None
    return dt.datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00"))


def state(wl: dict[str, Any]) -> dict[str, Any]:
    """What a Workload says about its admission, in one record."""
    conds = conditions(wl)
    admission = (wl.get("status") or {}).get("admission") or {}
    assigned = (admission.get("podSetAssignments") or [{}])[0]
    return {"uid": wl["metadata"]["uid"], "resourceVersion": wl["metadata"].get("resourceVersion"),
            "count": wl["spec"]["podSets"][0]["count"],
            **{t: (conds.get(t) or {}).get("status") for t in ("QuotaReserved", "Admitted", "Evicted", "Requeued",
                                                                "Finished")},
            "clusterQueue": admission.get("clusterQueue"), "assigned": assigned.get("count"),
            "usage": assigned.get("resourceUsage")}


def held(s: dict[str, Any], pods: int = 3) -> bool:
    """The Workload is admitted for ``pods`` pods and its quota reserved: nothing evicted, nothing
    given back."""
    return (s["QuotaReserved"] == "True" and s["Admitted"] == "True" and s["Evicted"] != "True"
            and s["Finished"] != "True" and s["clusterQueue"] is not None and s["count"] == pods
            and s["assigned"] == pods)


class WorkloadLog:
    """Every version of the namespace's Workloads, as a Kubernetes watch delivers them (a change
    that lasts a fraction of a second is seen too), plus any the test polls itself."""

    def __init__(self, c, namespace: str) -> None:
        self.c, self.namespace = c, namespace
        self.states: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listed = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"workloads-{namespace}", daemon=True)
        self._thread.start()
        assert self._listed.wait(30), "the watch of Workloads never listed"

    def record(self, wl: dict[str, Any]) -> dict[str, Any]:
        s = state(wl)
        with self._lock:
            if not self.states or self.states[-1]["resourceVersion"] != s["resourceVersion"]:
                self.states.append(s)
        return s

    def _follow(self) -> None:
        api = client.CustomObjectsApi(self.c.api_client())
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = api.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "workloads")
                    for wl in listed["items"]:
                        self.record(wl)
                    version = listed["metadata"]["resourceVersion"]
                    self._listed.set()
                w = kwatch.Watch()
                try:
                    for event in w.stream(api.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                                          "workloads", resource_version=version, timeout_seconds=5):
                        obj = event["object"]
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] == "DELETED":
                            self.deleted.append(obj["metadata"]["name"])
                        self.record(obj)
                        if self._stop.is_set():
                            break
                finally:
                    w.stop()
            except Exception:  # noqa: BLE001 - the watch expired (410) or the namespace went: list again
                version = None
                self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def not_held(self) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.states if not held(s)]


def cluster_queue(c, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(c.api_client()).get_cluster_custom_object(GROUP, VERSION, "clusterqueues", name)


def reserved_cpu(cq: dict[str, Any]) -> str | None:
    """The CPU the ClusterQueue has reserved for admitted Workloads (status.flavorsReservation)."""
    for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
        for resource in flavor.get("resources") or []:
            if resource.get("name") == "cpu":
                return resource.get("total")
    return None


def spare_ready(j: dict[str, Any]) -> int:
    return int(((j.get("status") or {}).get("spares") or {}).get("ready") or 0)


# --- 1. a quota that holds the gang and its spare ----------------------------------------------------


def test_a_quota_for_the_gang_and_its_spare_admits_both_and_the_spare_becomes_ready(running_operator,
                                                                                   process_queue, namespace,
                                                                                   follow):
    """2 pods and spares 1, each pod 100m CPU, on a queue whose quota is 300m: the Workload counts
    3 pods (the spare's requests included), Kueue admits it, the two members train and the spare
    is ready (status.spares.ready 1); every pod was created once admitted, on the admitted flavor."""
    c, name = running_operator, "fits"
    queue = process_queue("300m", "spares")
    applied = time.monotonic()
    apply(c, namespace, spared_job(name, queue))
    w = follow(name)
    trained = w.until(lambda j: spare_ready(j) == 1 and gang_trains(c, namespace, name, j, 2), START,
                      "both members training and the spare ready")
    ready = time.monotonic() - applied
    wl = workload(c, namespace, w.job)
    s = state(wl)
    assert s["count"] == 3, f"the Workload's pod set counts {s['count']} pods, not the 2 members and 1 spare"
    requests = wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["cpu"] == POD_CPU, requests
    assert held(s), f"the Workload is not admitted for 3 pods: {s}"
    assert s["clusterQueue"] == queue and s["usage"]["cpu"] == "300m", s
    since = admitted_at(wl)
    ref = job_ref(w.job)
    spare0 = names.spare_pod_name(ref, 0, 0)
    pods = {p.metadata.name: p for p in job_pods(c, namespace, name)}
    assert set(pods) == {*trained.values(), spare0}, f"pods {sorted(pods)}: the 2 members and spare 0"
    spare = pods[spare0]
    assert (spare.metadata.labels or {}).get(names.LABEL_SPARE) is not None, spare.metadata.labels
    assert spare.status.phase == "Running" and spare.spec.node_name == PROCESS_NODE, (spare.status.phase,
                                                                                       spare.spec.node_name)
    assert all(p.metadata.creation_timestamp >= since.replace(microsecond=0) for p in pods.values()), \
        f"a pod created before Kueue admitted the job at {since}"
    assert all(p.spec.node_selector.get("kubernetes.io/hostname") == PROCESS_NODE for p in pods.values())
    status = w.status
    assert (status["phase"], status.get("restarts", 0)) == ("Running", 0), status
    cq = cluster_queue(c, queue)
    assert reserved_cpu(cq) == "300m", cq.get("status")
    print(f"\nadmitted with its spare: 2 members training and the spare ready {ready:.1f}s after apply; "
          f"Workload {s}")


# --- 2. a quota that holds the gang but not its spare -------------------------------------------------


def test_a_quota_for_the_gang_but_not_its_spare_admits_nothing_and_says_the_spare_does_not_fit(
        running_operator, process_queue, namespace, follow, kueue_cluster):
    """The same job on a queue whose quota is 200m (2 pods, not 3): Kueue admits nothing, no pod is
    created (watched for 15 s), and the job's status (phase Suspended, reason WaitingForAdmission,
    the Suspended condition and status.message) counts 3 pods, 2 of the gang and 1 hot spare, and
    says the spare is what does not fit, then Kueue's own message. Raising the quota to 300m, as
    the message says, admits the job with its 3 pods."""
    c, name = running_operator, "short"
    queue = process_queue("200m", "spares")
    applied = time.monotonic()
    apply(c, namespace, spared_job(name, queue))
    w = follow(name)
    job = w.until(lambda j: "insufficient quota" in (j.get("status") or {}).get("message", "") and j,
                  90, "Kueue's reason in the job's status")
    said = time.monotonic() - applied
    status = job["status"]
    assert (status["phase"], status["reason"]) == ("Suspended", "WaitingForAdmission"), status
    want = (f"waiting for Kueue to admit all 3 pods (2 of the gang and 1 hot spare) on queue {queue}; the quota "
            f"of cpu in flavor {PROCESS_FLAVOR} holds the gang's 2 pods but not its hot spare: lower spec.spares or "
            "raise the quota: ")
    message = status["message"]
    assert message.startswith(want), f"status.message:\n  {message}\nwanted it to begin:\n  {want}"
    kueue_said = message[len(want):]
    assert "insufficient quota for cpu in flavor " + PROCESS_FLAVOR in kueue_said, kueue_said
    assert "current podset request (300m) > maximum capacity (200m)" in kueue_said, kueue_said
    suspended = next(x for x in status["conditions"] if x["type"] == "Suspended")
    assert (suspended["status"], suspended["reason"], suspended["message"]) == ("True", "WaitingForAdmission",
                                                                               message), suspended
    s = state(workload(c, namespace, job))
    assert s["count"] == 3 and s["QuotaReserved"] != "True" and s["Admitted"] != "True" and not s["clusterQueue"], s
    w.hold(15, lambda j: j["status"]["phase"] == "Suspended" and not job_pods(c, namespace, name),
           "Suspended with no pod")
    assert not w.created, f"pods created though Kueue admitted nothing: {sorted(i['name'] for i in w.created.values())}"
    events = [(e.reason, e.message) for e in job_events(c, namespace, name)]
    # One Event on entering the wait (written before Kueue had said why: the status carries that).
    assert any(r == "WaitingForAdmission" and m.startswith(
        f"waiting for Kueue to admit all 3 pods (2 of the gang and 1 hot spare) on queue {queue}") for r, m in events), events
    print(f"\nwaiting, the spare named as what does not fit, {said:.1f}s after apply:\n  {message}")

    # The user raises the quota as told: the job is admitted, with its spare.
    client.CustomObjectsApi(kueue_cluster.api_client()).patch_cluster_custom_object(
        GROUP, VERSION, "clusterqueues", queue, kueue_objects.cluster_queue(queue, PROCESS_FLAVOR, {"cpu": "300m",
                                                                                            "memory": "4Gi"}))
    raised = time.monotonic()
    w.until(lambda j: j["status"]["phase"] != "Suspended" and len(w.created) >= 3, 90,
            "admitted and its 3 pods created once the quota was raised")
    s = state(workload(c, namespace, w.job))
    assert held(s), s
    ref = job_ref(w.job)
    assert {i["name"] for i in w.created.values()} == {names.pod_name(ref, 0, 0), names.pod_name(ref, 0, 1),
                                                       names.spare_pod_name(ref, 0, 0)}, w.created
    print(f"quota raised to 300m: admitted and 3 pods created {time.monotonic() - raised:.1f}s later")


# --- 3. a member lost while admitted -------------------------------------------------------------------


class SurplusSpare(AssertionError):
    """More hot spare pods waiting than spec.spares: pods the job holds beyond what its Workload
    counts, so beyond what Kueue admitted."""


# Two passes may race a pod informer that lags (under load): the pass after the one that created
# spare s1 does not see it yet. Spares on their way count (lifecycle.Observed.creating), and any
# beyond spec.spares are deleted, newest first (lifecycle/spares.py): else the job would hold a pod
# more than its Workload, so more than Kueue admitted.


def test_a_member_deleted_under_kueue_is_taken_over_by_the_spare_within_the_one_admission(
        running_operator, process_queue, namespace, follow):
    """Admitted as in the first test (quota 300m for 2 members and 1 spare), maxRestarts 0: member
    1's pod is deleted while the ranks all_reduce. The spare takes its place (one restart, a
    disruption: restarts - disruptions stays 0), every rank trains again, no pod is created alone
    for member 1, and a new spare is created and becomes ready. All the while (a watch of every
    version, and a poll every quarter second) the Workload stays admitted for 3 pods, the same
    Workload with the same admission: never evicted, never requeued, its quota never given back,
    and the ClusterQueue keeps 300m reserved for it."""
    c, name = running_operator, "takeover"
    queue = process_queue("300m", "spares")
    apply(c, namespace, spared_job(name, queue))
    w = follow(name)
    w.until(lambda j: spare_ready(j) == 1 and gang_trains(c, namespace, name, j, 2), START,
            "both members training and the spare ready")
    wl = workload(c, namespace, w.job)
    first = state(wl)
    assert held(first), first
    since = admitted_at(wl)
    log = WorkloadLog(c, namespace)
    polled: list[dict[str, Any]] = []

    def admitted(j: dict[str, Any]) -> bool:
        """Polled with the job: the Workload is still the one admitted for 3 pods, since then."""
        now = workload(c, namespace, j)
        s = log.record(now)
        polled.append(s)
        assert held(s) and s["uid"] == first["uid"] and admitted_at(now) == since, \
            f"the Workload is no longer admitted as it was: {s} (admitted at {admitted_at(now)}, was {since})"
        assert reserved_cpu(cluster_queue(c, queue)) == "300m", cluster_queue(c, queue).get("status")
        return True

    running = len(w.phases) - 1  # w.phases[running] is this Running: the job was Suspended until admitted
    ref = job_ref(w.job)
    lost, spare0, spare1 = names.pod_name(ref, 0, 1), names.spare_pod_name(ref, 0, 0), names.spare_pod_name(ref, 0, 1)
    try:
        deleted = time.monotonic()
        c.kubectl("delete", "pod", lost, "-n", namespace, "--wait=false")
        trained = w.until(lambda j: admitted(j) and j["status"].get("restarts", 0) >= 1
                          and gang_trains(c, namespace, name, j, 2), AGAIN, "every rank training again after the takeover")
        again = time.monotonic() - deleted
        status = w.status
        assert (status["restarts"], status["disruptions"], status.get("gangRestart"), status["spares"]["used"]) == \
            (1, 1, 0, 1), status
        assert trained[1] == spare0, f"member 1 is held by {trained[1]}, not the spare {spare0}"
        assert status["failure"]["pod"] == lost and status["failure"]["disruption"], status["failure"]
        assert f"hot spare pod {spare0} took its place" in status["failure"]["message"], status["failure"]
        assert restarting_events(c, namespace, name), "one Restarting Event"
        w.until(lambda j: admitted(j) and spare_ready(j) >= 1 and spare1 in w.pods
                and gang_trains(c, namespace, name, j, 2), 90, "a new spare ready, the gang training")
        renewed = time.monotonic() - deleted

        def waiting_spares() -> list[str]:
            """The spare pods waiting (not adopted as a member's, not terminating)."""
            return sorted(p.metadata.name for p in job_pods(c, namespace, name)
                          if names.LABEL_SPARE in (p.metadata.labels or {}) and not p.metadata.deletion_timestamp
                          and names.LABEL_RANK not in (p.metadata.labels or {}))

        try:
            w.until(lambda j: admitted(j) and spare_ready(j) == 1 and waiting_spares() == [spare1], 20,
                    "exactly one spare waiting (spec.spares 1), and it the new one")
        except AssertionError as err:
            if "not reached" in str(err) and len(waiting_spares()) > 1:
                raise SurplusSpare(f"{len(waiting_spares())} spares waiting for spec.spares 1, beside a Workload "
                                   f"admitted for 3 pods: {waiting_spares()}; status.spares "
                                   f"{w.status.get('spares')}\n{err}") from None
            raise
        # The lost pod gone, the job holds what Kueue admitted: 2 members and 1 spare.
        w.until(lambda j: admitted(j) and lost not in {p.metadata.name for p in job_pods(c, namespace, name)}, 30,
                "the lost pod gone")
        alive = {p.metadata.name: p for p in job_pods(c, namespace, name) if not p.metadata.deletion_timestamp}
        assert set(alive) == {names.pod_name(ref, 0, 0), spare0, spare1}, sorted(alive)
        assert alive[spare1].status.phase == "Running" and alive[spare1].spec.node_name == PROCESS_NODE
        assert alive[spare1].metadata.creation_timestamp >= since.replace(microsecond=0)
    finally:
        log.stop()
    uncounted(w.status)
    after = w.phases[running:]
    assert "Failed" not in after and "Suspended" not in after, f"phases since admitted and Running: {after}"
    bad = log.not_held()
    assert not bad, f"the Workload was not admitted for 3 pods at some point: {bad}"
    assert {s["uid"] for s in log.states} == {first["uid"]} and not log.deleted, \
        f"the Workload was replaced: {log.states} deleted {log.deleted}"
    beside_spares(w, ref, [1])
    print(f"\nmember 1 deleted under Kueue: every rank training again {again:.1f}s after the delete, a new spare "
          f"ready {renewed:.1f}s after it; the Workload admitted throughout ({len(log.states)} versions watched, "
          f"{len(polled)} polls)")
