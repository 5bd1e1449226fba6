"""End-to-end: combinations of faults on the process node, with real agents, real processes doing
gloo all_reduces and the real operator (docs/restart-in-place.md, "Invariants" and "Hot spares").

Each test provokes what a cluster does to a training job (a pod deleted while the ranks
all_reduce, a drain of several pods, the same pod lost again and again, the operator killed
right after a hot spare took a place, a spare that crashes on every start, an elastic gang
losing members below its minimum) on a job with ``maxRestarts: 0``, and asserts what a user sees:
the job never fails (Invariant 2), ``status.restarts - status.disruptions`` stays 0 (Invariant 1),
the job is Running again with every rank training in the new round (Invariant 5: the ranks' logs
show the round's TORCHELASTIC_RESTART_COUNT and a checked all_reduce sum), the status agrees with
the ranks (Invariant 6), and the pods created stay few (Invariant 7).

The training program is tests/programs/train_steps.py: every step an all_reduce of ``step + 1``
whose sum each rank checks (it exits 1 on a wrong one), then ``train_steps rank R step S restart
N sum X``. The jobs here run it for far longer than the tests, which delete them at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes import watch as kwatch

from spmd_operator import names
from tests.e2e.conftest import (RESYNC_SECONDS, apply, get_job, job_events, job_manifest, job_pods, job_ref,
                                operator_args, wait_until)

pytestmark = pytest.mark.cluster
PROGRAM = ["-m", "tests.programs.train_steps"]
#: Training that outlasts every test: an all_reduce every ~0.1 s.
FOREVER = ["--steps", "1000000", "--step-seconds", "0.1"]
#: What a line of a pod of several procs (PerHost) begins with: its rank.
PREFIX = r"(?:\[rank \d+\] )?"
#: Bounds of a loaded 2-core machine: pods import torch on every round.
START = 180
AGAIN = 150


def manifest(name: str, pods: int, *, procs: int | None = None, spares: int = 0, min_size: int | None = None,
             **restart_policy: Any) -> dict[str, Any]:
    """``pods`` pods training for ever: one proc each (mesh ``procs``), or with ``procs`` given a
    PerHost mesh ``[nodes=pods, procs]`` (``min_size``: mesh[0].minSize, an elastic job)."""
    restart_policy.setdefault("maxRestarts", 0)
    if procs is None:
        m = job_manifest(name, [("procs", pods)], [*PROGRAM, *FOREVER], restartPolicy=restart_policy)
    else:
        m = job_manifest(name, [("nodes", pods), ("procs", procs)], [*PROGRAM, *FOREVER], podLayout="PerHost",
                         restartPolicy=restart_policy)
    if min_size is not None:
        m["spec"]["mesh"][0]["minSize"] = min_size
    if spares:
        m["spec"]["spares"] = spares
    m["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 5
    return m


class Watch:
    """Follows a job: polls it, remembering every phase and size its status had, and watches its
    pods (a Kubernetes watch, so a pod that lives a fraction of a second is seen too). A job that
    fails fails the test at once (maxRestarts 0 and only disruptions: Invariant 2), with its status,
    Events, pods and logs."""

    def __init__(self, c, namespace: str, name: str) -> None:
        self.c, self.namespace, self.name = c, namespace, name
        self.phases: list[str] = []
        self.sizes: list[int] = []
        self.pods: dict[str, dict[str, Any]] = {}  # name -> the newest pod of that name seen
        self.created: dict[str, dict[str, Any]] = {}  # uid -> every pod ever seen: name, created, seen
        self.job: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"pods-{name}", daemon=True)
        self._thread.start()

    def _see(self, pod: client.V1Pod) -> None:
        info = self.created.setdefault(pod.metadata.uid, {"name": pod.metadata.name, "seen": time.monotonic(),
                                                          "created": pod.metadata.creation_timestamp})
        info.update(labels=dict(pod.metadata.labels or {}), phase=pod.status.phase)
        self.pods[pod.metadata.name] = info

    def _follow(self) -> None:
        core = client.CoreV1Api(self.c.api_client())
        version = None
        while not self._stop.is_set():
            w = kwatch.Watch()
            try:
                kwargs = {"resource_version": version} if version else {}
                for event in w.stream(core.list_namespaced_pod, self.namespace, timeout_seconds=5,
                                      label_selector=f"{names.LABEL_JOB}={self.name}", **kwargs):
                    self._see(event["object"])
                    version = event["object"].metadata.resource_version
                    if self._stop.is_set():
                        break
            except Exception:  # noqa: BLE001 - a watch expired (410) or the namespace went: list again
                version = None
                time.sleep(0.2)
            finally:
                w.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def status(self) -> dict[str, Any]:
        return self.job.get("status") or {}

    def poll(self) -> dict[str, Any]:
        self.job = get_job(self.c, self.namespace, self.name)
        phase = self.status.get("phase")
        if phase and (not self.phases or self.phases[-1] != phase):
            self.phases.append(phase)
        size = (self.status.get("size") or {}).get("pods")
        if size is not None and (not self.sizes or self.sizes[-1] != size):
            self.sizes.append(size)
        for pod in job_pods(self.c, self.namespace, self.name):
            self._see(pod)
        if phase == "Failed":
            raise AssertionError(f"job {self.name} failed (maxRestarts 0, only disruptions):\n{self.describe()}")
        return self.job

    def until(self, check: Callable[[dict[str, Any]], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = check(self.poll())
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"job {self.name}: {what} not reached in {timeout}s\n{self.describe()}")
            time.sleep(0.25)

    def hold(self, seconds: float, check: Callable[[dict[str, Any]], Any], what: str) -> None:
        """``check`` stays true for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not check(self.poll()):
                raise AssertionError(f"job {self.name}: {what} no longer holds\n{self.describe()}")
            time.sleep(0.25)

    def describe(self) -> str:
        events = [(e.type, e.reason, e.message) for e in job_events(self.c, self.namespace, self.name)]
        pods = self.c.kubectl("get", "pods", "-n", self.namespace, "-o", "wide", "--show-labels",
                              check=False).stdout
        logs = ""
        for pod in job_pods(self.c, self.namespace, self.name):
            logs += f"--- {pod.metadata.name}\n{self.c.pod_log(self.namespace, pod.metadata.name, 'trainer')[-1500:]}\n"
        said = [line for line in operator_log(self.c).splitlines() if f"{self.namespace}/{self.name}" in line]
        return (f"phases seen: {self.phases}\npods seen: {sorted(self.pods)}\nstatus: {json.dumps(self.status, indent=1)}\n"
                f"events: {json.dumps(events, indent=1)}\npods:\n{pods}\nlogs:\n{logs[-8000:]}\n"
                f"the operator's log of the job:\n" + "\n".join(said[-40:]))


def operator_log(c) -> str:
    path = c.state_dir / "operator.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture
def follow(running_operator, namespace):
    """follow(name) -> a :class:`Watch` of job ``name`` in the test's namespace, stopped after the test."""
    made: list[Watch] = []

    def make(name: str) -> Watch:
        made.append(Watch(running_operator, namespace, name))
        return made[-1]

    yield make
    for w in made:
        w.stop()


class PodBesideSpare(AssertionError):
    """A pod was created alone for a member whose place a hot spare took (docs/restart-in-place.md,
    the operator's part of "Hot spares": "No pod is created alone for the lost one")."""


class SpareNameReused(AssertionError):
    """A new spare pod got a name (index) already used in its attempt (names.spare_pod_name: "A
    spare index is never used twice in an attempt: a name never in use")."""


def beside_spares(w: Watch, ref: names.JobRef, held: list[int]) -> None:
    """No pod was ever created alone (``<job>-<id>-r0-<index>-<n>``) for a member a spare holds."""
    alone = sorted(i["name"] for i in w.created.values()
                   if any(i["name"].startswith(names.pod_name(ref, 0, m) + "-") for m in held))
    if alone:
        raise PodBesideSpare(f"pods created alone for members {held}, whose places spares took: {alone}\n"
                             f"{w.describe()}")


def members(c, namespace: str, name: str) -> dict[int, str]:
    """member index -> the name of the pod that holds it now (not terminating; a spare that took a
    place is relabelled with the member's rank)."""
    out: dict[int, str] = {}
    for pod in job_pods(c, namespace, name):
        labels = pod.metadata.labels or {}
        if pod.metadata.deletion_timestamp or names.LABEL_RANK not in labels or pod.status.phase in ("Failed",
                                                                                                      "Succeeded"):
            continue
        procs = int(labels.get(names.LABEL_PROCS) or 1)
        out[int(labels[names.LABEL_RANK]) // procs] = pod.metadata.name
    return out


def trains(c, namespace: str, pod: str, restart: int) -> bool:
    """The pod's ranks all_reduced in round ``restart`` (TORCHELASTIC_RESTART_COUNT) and got the sum."""
    return re.search(rf"^{PREFIX}train_steps rank \d+ step \d+ restart {restart} sum \d+", c.pod_log(namespace, pod, "trainer"),
                     re.M) is not None


def worlds(log: str) -> dict[int, int]:
    """restart -> WORLD_SIZE of each round a pod's first rank started in."""
    return {int(r): int(w) for r, w in re.findall(rf"^{PREFIX}train_steps rank \d+ pid \d+ restart (\d+) world (\d+)", log, re.M)}


def gang_trains(c, namespace: str, name: str, job: dict[str, Any], count: int | None = None) -> dict[int, str] | None:
    """The member pods, once the job is Running and every one (``count`` of them, or the elastic
    round's members, or every pod) trains in the round ``status.restarts`` says."""
    status = job.get("status") or {}
    if status.get("phase") != "Running":
        return None
    restart = int(status.get("restarts") or 0)
    now = members(c, namespace, name)
    want = (status.get("size") or {}).get("members")
    if want is None:
        want = range(count if count is not None else len(now))
    if not all(m in now for m in want):
        return None
    held = {m: now[m] for m in want}
    return held if all(trains(c, namespace, pod, restart) for pod in held.values()) else None


def uncounted(status: dict[str, Any]) -> None:
    """Invariant 1: every restart so far was a disruption (nothing counted against maxRestarts 0)."""
    assert int(status.get("restarts") or 0) == int(status.get("disruptions") or 0), status


def restarting_events(c, namespace: str, name: str) -> list[str]:
    events = [e for e in job_events(c, namespace, name) if e.reason == "Restarting"]
    for e in events:
        assert "a disruption, not counted against maxRestarts" in e.message, e.message
    return [e.message for e in events]


def evict(c, namespace: str, *pods: str) -> None:
    """What `kubectl drain` does to each pod: the Eviction API, one request after the other."""
    core = client.CoreV1Api(c.api_client())
    for pod in pods:
        core.create_namespaced_pod_eviction(pod, namespace, {"apiVersion": "policy/v1", "kind": "Eviction",
                                                             "metadata": {"name": pod, "namespace": namespace}})


# --- 1. a pod deleted under a job with a hot spare ---------------------------------------------


def test_a_pod_deleted_while_the_ranks_all_reduce_is_taken_over_by_a_spare_and_never_counted(running_operator,
                                                                                            namespace, follow):
    """spares 1, maxRestarts 0, three pods all_reducing every 0.1 s: pod 2 deleted (the API delete).
    The spare takes its place: one restart, a disruption (restarts - disruptions stays 0), the job
    Running again with every rank training in restart 1, no pod created alone for rank 2, and a
    new spare ready again."""
    c, name = running_operator, "spared"
    apply(c, namespace, manifest(name, 3, spares=1))
    w = follow(name)
    w.until(lambda j: (j.get("status", {}).get("spares") or {}).get("ready") == 1
                  and gang_trains(c, namespace, name, j, 3), START, "training with a ready spare")
    ref = job_ref(w.job)
    lost, spare0, spare1 = names.pod_name(ref, 0, 2), names.spare_pod_name(ref, 0, 0), names.spare_pod_name(ref, 0, 1)
    deleted = time.monotonic()
    c.kubectl("delete", "pod", lost, "-n", namespace, "--wait=false")
    held = w.until(lambda j: j["status"].get("restarts", 0) >= 1 and gang_trains(c, namespace, name, j, 3), AGAIN,
                   "every rank training again after the takeover")
    again = time.monotonic() - deleted
    status = w.status
    assert (status["restarts"], status["disruptions"], status.get("gangRestart"), status["spares"]["used"]) == \
        (1, 1, 0, 1), status
    failure = status["failure"]
    # A takeover is the coordinator's word (the member's agent left, its place given): MemberLost.
    assert (failure["pod"], failure["rank"], failure["reason"], failure["disruption"]) == \
        (lost, 2, "MemberLost", True), failure
    assert f"hot spare pod {spare0} took its place" in failure["message"], failure
    assert held[2] == spare0, f"rank 2 is held by {held[2]}, not the spare {spare0}"
    assert restarting_events(c, namespace, name), "one Restarting Event"
    w.until(lambda j: (j["status"].get("spares") or {}).get("ready") == 1 and spare1 in w.pods, 90,
            "a new spare ready")
    uncounted(w.status)
    assert "Failed" not in w.phases, w.phases
    print(f"\npod deleted, spare took over: every rank training again {again:.1f}s after the delete")
    beside_spares(w, ref, [2])


# --- 2. an elastic job --------------------------------------------------------------------------

#: An init container that holds a pod created in a lost pod's place (its replacement label) until
#: the file named by its first rank exists in the folder given: a replacement that takes a while to
#: come (a node being repaired, a slow scheduler), released by the test when it has seen what it
#: must see first. The gang's first pods and the spares pass at once.
HOLD = ("import os, sys, time\n"
        "while os.environ.get('REPLACEMENT') and not os.path.exists(os.path.join(sys.argv[1], os.environ['RANK'])):\n"
        "    time.sleep(0.2)\n")


def hold_replacements(m: dict[str, Any], folder) -> dict[str, Any]:
    label = lambda key: {"fieldRef": {"fieldPath": f"metadata.labels['{key}']"}}  # noqa: E731
    m["spec"]["template"]["spec"]["initContainers"] = [{
        "name": "hold", "image": "python:3.11-slim", "command": ["python3", "-c", HOLD, str(folder)],
        "env": [{"name": "REPLACEMENT", "valueFrom": label(names.LABEL_REPLACEMENT)},
                {"name": "RANK", "valueFrom": label(names.LABEL_RANK)}]}]
    return m


def test_an_elastic_job_with_max_restarts_0_shrinks_when_a_pod_is_deleted_grows_back_and_never_fails(
        running_operator, namespace, follow, tmp_path):
    """mesh nodes 3 (minSize 2) x procs 2, PerHost, maxRestarts 0, elasticWaitSeconds 3: pod 2 is
    deleted while the gang trains, and its replacement held back. The gang shrinks (pods 0 and 1
    train at WORLD_SIZE 4), then grows back once the replacement is let go (WORLD_SIZE 6, a
    Resizing Event); the job never fails and no restart is counted."""
    c, name = running_operator, "elastic"
    apply(c, namespace, hold_replacements(manifest(name, 3, procs=2, min_size=2, elasticWaitSeconds=3), tmp_path))
    w = follow(name)
    w.until(lambda j: gang_trains(c, namespace, name, j), START, "the gang training at full size")
    ref = job_ref(w.job)
    zero, lost = names.pod_name(ref, 0, 0), names.pod_name(ref, 0, 2)
    assert worlds(c.pod_log(namespace, zero, "trainer")) == {0: 6}
    deleted = time.monotonic()
    c.kubectl("delete", "pod", lost, "-n", namespace, "--wait=false")
    held = w.until(lambda j: j["status"].get("restarts", 0) >= 1 and gang_trains(c, namespace, name, j), AGAIN,
                   "training again after the loss")
    shrunk = time.monotonic() - deleted
    status = w.status
    assert (status["size"], sorted(held)) == ({"pods": 2, "procs": 4, "members": [0, 1]}, [0, 1]), status
    assert worlds(c.pod_log(namespace, zero, "trainer"))[status["restarts"]] == 4
    uncounted(status)
    assert (status["failure"]["pod"], status["failure"]["reason"]) == (lost, "PodDeleted"), status["failure"]
    (tmp_path / "4").touch()  # pod 2's first rank: its replacement may start
    grown_from = time.monotonic()
    w.until(lambda j: (j["status"].get("size") or {}).get("pods") == 3 and gang_trains(c, namespace, name, j), AGAIN,
            "training at full size again")
    grown = time.monotonic() - grown_from
    status = w.status
    uncounted(status)
    assert status.get("gangRestart") == 0 and status["restarts"] >= 2, status
    rounds = worlds(c.pod_log(namespace, zero, "trainer"))
    assert rounds[status["restarts"]] == 6 and all(size in (4, 6) for size in rounds.values()), rounds
    assert "Resizing" in [e.reason for e in job_events(c, namespace, name)]
    restarting_events(c, namespace, name)
    print(f"\nelastic job, pod deleted: training at 2 pods {shrunk:.1f}s after the delete, at 3 pods again {grown:.1f}s "
          f"after the replacement was let go; rounds' world sizes {rounds}; restarts {status['restarts']}, "
          f"disruptions {status['disruptions']}")


# --- 3. a drain of two pods at once -------------------------------------------------------------

# The coordinator may take two evictions in two rounds (member 1 taken over in round 0, member 2
# in round 1) and an operator's pass then sees round 2 at once: member 1's takeover, two rounds
# old, still holds its place (inplace._of_spare; the simulation's regression "a pod is created
# alone for a member a spare took two rounds before").


def test_two_pods_evicted_at_once_under_two_spares_are_both_taken_over_in_place(running_operator, namespace, follow):
    """spares 2, maxRestarts 0, three pods: pods 1 and 2 evicted in one go (the Eviction API, as a
    drain does). Each spare takes one place: the same gang, every restart a disruption, every rank
    training again, two new spares ready, and no pod ever created alone for either rank."""
    c, name = running_operator, "drained"
    apply(c, namespace, manifest(name, 3, spares=2))
    w = follow(name)
    w.until(lambda j: (j.get("status", {}).get("spares") or {}).get("ready") == 2
            and gang_trains(c, namespace, name, j, 3), START, "training with two ready spares")
    ref = job_ref(w.job)
    victims = [names.pod_name(ref, 0, 1), names.pod_name(ref, 0, 2)]
    spares = {names.spare_pod_name(ref, 0, 0), names.spare_pod_name(ref, 0, 1)}
    drained = time.monotonic()
    evict(c, namespace, *victims)
    held = w.until(lambda j: j["status"].get("restarts", 0) >= 1 and (j["status"].get("spares") or {}).get("used") == 2
                   and gang_trains(c, namespace, name, j, 3), AGAIN, "every rank training again with both spares")
    again = time.monotonic() - drained
    status = w.status
    uncounted(status)
    assert status["restarts"] in (1, 2) and status.get("gangRestart") == 0, status
    assert {held[1], held[2]} == spares, f"ranks 1 and 2 held by {held}, not by the spares {spares}"
    failure = status["failure"]
    assert failure["pod"] in victims and failure["reason"] == "MemberLost" and failure["disruption"], failure
    assert "took its place" in failure["message"], failure
    new = {names.spare_pod_name(ref, 0, 2), names.spare_pod_name(ref, 0, 3)}
    w.until(lambda j: (j["status"].get("spares") or {}).get("ready") == 2 and new <= set(w.pods), 90,
            "two new spares ready")
    uncounted(w.status)
    print(f"\ntwo pods evicted at once: every rank training again {again:.1f}s after the drain "
          f"(restarts {status['restarts']}, disruptions {status['disruptions']})")
    beside_spares(w, ref, [1, 2])


def test_two_pods_evicted_one_round_apart_while_the_operator_is_stalled_get_no_pod_beside_their_spares(
        running_operator, namespace, follow):
    """spares 2, maxRestarts 0, three pods; the operator stalled (SIGSTOP: a busy or starved
    operator): pod 1 evicted, spare 0 takes its place and every rank trains in restart 1; pod 2
    evicted, spare 1 takes its place and every rank trains in restart 2. The operator, running
    again, records both disruptions, adopts both spares, makes two new ones, and creates no pod
    alone for rank 1 or 2."""
    c, name = running_operator, "stalled"
    apply(c, namespace, manifest(name, 3, spares=2))
    w = follow(name)
    w.until(lambda j: (j.get("status", {}).get("spares") or {}).get("ready") == 2
            and gang_trains(c, namespace, name, j, 3), START, "training with two ready spares")
    ref = job_ref(w.job)
    zero, spare0, spare1 = names.pod_name(ref, 0, 0), names.spare_pod_name(ref, 0, 0), names.spare_pod_name(ref, 0, 1)
    c.pause(c.operator_process)
    try:
        evict(c, namespace, names.pod_name(ref, 0, 1))
        wait_until(lambda: trains(c, namespace, zero, 1) and trains(c, namespace, spare0, 1), AGAIN,
                   "restart 1 training with spare 0, the operator stalled")
        evict(c, namespace, names.pod_name(ref, 0, 2))
        wait_until(lambda: all(trains(c, namespace, pod, 2) for pod in (zero, spare0, spare1)), AGAIN,
                   "restart 2 training with both spares, the operator stalled")
    finally:
        c.unpause(c.operator_process)
    resumed = time.monotonic()
    held = w.until(lambda j: j["status"].get("restarts") == 2 and (j["status"].get("spares") or {}).get("used") == 2
                   and gang_trains(c, namespace, name, j, 3), AGAIN, "both restarts recorded, the gang Running")
    assert (held[1], held[2]) == (spare0, spare1), held
    new = {names.spare_pod_name(ref, 0, 2), names.spare_pod_name(ref, 0, 3)}
    w.until(lambda j: (j["status"].get("spares") or {}).get("ready") == 2 and new <= set(w.pods), 90,
            "two new spares ready")
    status = w.status
    uncounted(status)
    assert (status["restarts"], status.get("gangRestart")) == (2, 0), status
    print(f"\noperator stalled through two takeovers: status agreed {time.monotonic() - resumed:.1f}s after it resumed")
    beside_spares(w, ref, [1, 2])


# --- 4. the same place lost three times -----------------------------------------------------------


def test_the_pod_of_one_member_deleted_three_times_in_a_row_trains_again_each_time(running_operator, namespace, follow):
    """No spare, maxRestarts 0, two pods: the pod that holds member 1 is deleted, and again each
    time the job is Running again with the replacement training, three times. Each loss is a
    disruption replaced alone in place (the same rank 0 pod, no RepeatedFailure recreation), and
    the ranks train in restarts 1, 2, 3. The seconds from each delete to Running and to training
    are printed."""
    c, name = running_operator, "thrice"
    apply(c, namespace, manifest(name, 2))
    w = follow(name)
    w.until(lambda j: gang_trains(c, namespace, name, j, 2), START, "training")
    ref = job_ref(w.job)
    zero = names.pod_name(ref, 0, 0)
    timings = []
    for k in (1, 2, 3):
        victim = members(c, namespace, name)[1]
        deleted = time.monotonic()
        c.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
        w.until(lambda j: j["status"].get("restarts", 0) >= k and j["status"]["phase"] == "Running", AGAIN,
                f"Running again after delete {k}")
        running = time.monotonic() - deleted
        held = w.until(lambda j: gang_trains(c, namespace, name, j, 2), AGAIN, f"training again after delete {k}")
        training = time.monotonic() - deleted
        timings.append((running, training))
        status = w.status
        assert (status["restarts"], status.get("gangRestart")) == (k, 0), status
        uncounted(status)
        assert (status["failure"]["pod"], status["failure"]["reason"]) == (victim, "PodDeleted"), status["failure"]
        assert held[0] == zero and held[1] == names.pod_name(ref, 0, 1, k), held
    assert sorted(worlds(c.pod_log(namespace, zero, "trainer"))) == [0, 1, 2, 3], "rank 0 restarted in place thrice"
    assert len(restarting_events(c, namespace, name)) == 3
    for k, (running, training) in enumerate(timings, 1):
        print(f"\ndelete {k}: Running again {running:.1f}s, training again {training:.1f}s after the delete", end="")
    print()


# --- 5. the operator killed right after a takeover -------------------------------------------------


def test_the_operator_killed_within_a_second_of_a_takeover_agrees_with_the_gang_when_it_is_back(running_operator,
                                                                                              namespace, follow):
    """spares 1, maxRestarts 0, two pods: pod 1 is deleted and the operator SIGKILLed as soon as the
    spare says it takes the place (well within a second). The gang trains on with the spare, no
    operator there; once the operator is started again its status agrees with the gang (restarts 1,
    disruptions 1, spares used 1 and ready 1 once a new spare is made), the spare's pod is rank 1's,
    and no pod is ever created for rank 1 beside it (over two resync periods)."""
    c, name = running_operator, "takeover"
    apply(c, namespace, manifest(name, 2, spares=1))
    w = follow(name)
    w.until(lambda j: (j.get("status", {}).get("spares") or {}).get("ready") == 1
                  and gang_trains(c, namespace, name, j, 2), START, "training with a ready spare")
    ref = job_ref(w.job)
    lost, spare0, spare1 = names.pod_name(ref, 0, 1), names.spare_pod_name(ref, 0, 0), names.spare_pod_name(ref, 0, 1)
    c.kubectl("delete", "pod", lost, "-n", namespace, "--wait=false")
    deadline = time.monotonic() + 60
    while "takes the place of member 1" not in c.pod_log(namespace, spare0, "trainer"):  # the log is a file here
        assert time.monotonic() < deadline, "no takeover in 60 s"
        time.sleep(0.02)
    took = time.monotonic()
    os.killpg(c.operator_process.pid, signal.SIGKILL)
    killed = time.monotonic() - took
    c.operator_process.wait(timeout=30)
    c.operator_process = None
    assert killed < 1.0, f"the operator was killed {killed:.2f}s after the takeover"
    at_kill = get_job(c, namespace, name)["status"]
    print(f"\nstatus as the operator left it: restarts {at_kill.get('restarts')}, disruptions "
          f"{at_kill.get('disruptions')}, spares {at_kill.get('spares')}, phase {at_kill.get('phase')}")
    try:
        wait_until(lambda: trains(c, namespace, spare0, 1) and trains(c, namespace, names.pod_name(ref, 0, 0), 1), AGAIN,
                   "both ranks training in restart 1 without the operator")
    finally:
        c.start_operator(*operator_args())
    back = time.monotonic()
    w.until(lambda j: (s := j["status"]).get("restarts") == 1 and s.get("disruptions") == 1
            and (s.get("spares") or {}).get("used") == 1 and (s.get("spares") or {}).get("ready") == 1
            and spare1 in w.pods and gang_trains(c, namespace, name, j, 2), 90,
            "the status agreeing with the gang, a new spare ready")
    agreed = time.monotonic() - back
    status = w.status
    assert (status.get("gangRestart"), status["failure"]["pod"], status["failure"]["disruption"]) == (0, lost, True), \
        status
    assert members(c, namespace, name)[1] == spare0
    w.hold(2 * RESYNC_SECONDS, lambda j: (j["status"]["restarts"], j["status"]["disruptions"], j["status"]["phase"])
           == (1, 1, "Running"), "restarts 1, disruptions 1, Running")
    beside_spares(w, ref, [1])
    assert trains(c, namespace, spare0, 1) and not re.search(r"restart 2", c.pod_log(namespace, spare0, "trainer"))
    print(f"\noperator killed {killed:.2f}s after the takeover; status agreed {agreed:.1f}s after it started again")


# --- 6. a spare that crashes on every start ----------------------------------------------------------

#: The template's init container: it fails in a hot spare's pod (the downward API gives it the pod's
#: spare label, set only on spares) and passes in the gang's pods: a spare that crashes on every start.
CRASH_SPARE = "import os, sys\nsys.exit(3 if os.environ.get('SPARE') else 0)\n"


def test_a_spare_that_crashes_on_every_start_backs_off_and_is_cleaned_up(running_operator, namespace, follow):
    """spares 1, maxRestarts 0, two pods; every spare pod fails (its init container exits 3). The
    gang trains on, never restarted; status.spares.crashed and retryTime appear, and crashed counts
    the spare pods that failed; every crashed spare pod is deleted; over 60 s from the first spare
    only a few are created (the back-off: 10, 20, 40 s), never one a second; each has a name of
    its own."""
    c, name = running_operator, "crashing"
    m = manifest(name, 2, spares=1)
    m["spec"]["template"]["spec"]["initContainers"] = [{
        "name": "crash", "image": "python:3.11-slim", "command": ["python3", "-c", CRASH_SPARE],
        "env": [{"name": "SPARE", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{names.LABEL_SPARE}']"}}}]}]
    apply(c, namespace, m)
    w = follow(name)
    w.until(lambda j: gang_trains(c, namespace, name, j, 2), START, "the gang training")
    ref = job_ref(w.job)
    prefix = names.spare_pod_name(ref, 0, 0)[:-1]

    def spares() -> list[dict[str, Any]]:
        """Every spare pod ever created (one per uid), oldest first."""
        return sorted((i for i in list(w.created.values()) if i["name"].startswith(prefix)), key=lambda i: i["seen"])

    w.until(lambda j: spares(), 60, "the first spare pod")
    began = spares()[0]["seen"]
    crashed = w.until(lambda j: (j["status"].get("spares") or {}).get("crashed") and j["status"]["spares"]
                      .get("retryTime") and j["status"]["spares"], 60, "status.spares.crashed and retryTime")
    print(f"\nstatus.spares after the first crash, {time.monotonic() - began:.1f}s: {crashed}")
    w.hold(began + 60 - time.monotonic(), lambda j: j["status"]["phase"] == "Running"
           and j["status"].get("restarts", 0) == 0, "the gang Running, no restart")
    made = [i for i in spares() if i["seen"] <= began + 60]
    gaps = [round((b["created"] - a["created"]).total_seconds()) for a, b in zip(made, made[1:])]
    print(f"spare pods created in 60 s: {len(made)} ({[i['name'][len(prefix) - 1:] for i in made]}), seconds "
          f"between them {gaps}; status.spares {w.status.get('spares')}")
    assert 2 <= len(made) <= 5, f"{len(made)} spare pods in 60 s: the back-off is 10, 20, 40 s"
    assert all(g >= 8 for g in gaps), f"spares created {gaps} s apart: the back-off is 10, 20, 40 s"
    w.until(lambda j: int((j["status"].get("spares") or {}).get("crashed") or 0)
            == sum(1 for i in spares() if i["phase"] == "Failed"), 15, "status.spares.crashed counting the failed spares")
    w.until(lambda j: not [p for p in job_pods(c, namespace, name) if p.metadata.name.startswith(prefix)
                           and p.status.phase == "Failed"], 15, "every crashed spare pod deleted")
    assert gang_trains(c, namespace, name, w.poll(), 2) and w.status["restarts"] == 0
    named = [i["name"] for i in spares()]
    if len(set(named)) != len(named):
        raise SpareNameReused(f"spare pods created in turn: {named}")


# --- 7. an elastic gang below its minimum --------------------------------------------------------------


def test_an_elastic_gang_that_loses_members_below_its_minimum_waits_for_new_pods_and_trains_again(
        running_operator, namespace, follow, tmp_path):
    """mesh nodes 3 (minSize 2) x procs 1, PerHost, maxRestarts 0, elasticWaitSeconds 3: pods 1 and
    2 are deleted at once, leaving pod 0 below the minimum, and the pods created in their places are
    held back. No round runs below the minimum and the job does not fail while it waits (longer
    than the elastic wait); pod 1's replacement let go, the gang trains at 2 pods; pod 2's let go,
    it grows back to 3. Nothing is counted."""
    c, name = running_operator, "below"
    apply(c, namespace, hold_replacements(manifest(name, 3, procs=1, min_size=2, elasticWaitSeconds=3), tmp_path))
    w = follow(name)
    w.until(lambda j: gang_trains(c, namespace, name, j), START, "the gang training at full size")
    ref = job_ref(w.job)
    zero = names.pod_name(ref, 0, 0)
    c.kubectl("delete", "pod", names.pod_name(ref, 0, 1), names.pod_name(ref, 0, 2), "-n", namespace, "--wait=false")
    replacements = {names.pod_name(ref, 0, 1, 1), names.pod_name(ref, 0, 2, 1)}
    w.until(lambda j: replacements <= set(w.pods) and j["status"]["phase"] == "Restarting", 60,
            "both pods created again, the job Restarting")
    w.hold(10, lambda j: j["status"]["phase"] == "Restarting" and sorted(worlds(c.pod_log(namespace, zero, "trainer")))
           == [0], "waiting below the minimum, no round started")
    (tmp_path / "1").touch()  # pod 1's replacement may start
    released = time.monotonic()
    held = w.until(lambda j: j["status"].get("restarts", 0) >= 1 and gang_trains(c, namespace, name, j), AGAIN,
                   "training again at the minimum")
    again = time.monotonic() - released
    status = w.status
    uncounted(status)
    assert (status.get("gangRestart"), sorted(held), status["size"]["pods"]) == (0, [0, 1], 2), status
    assert held[0] == zero
    (tmp_path / "2").touch()
    released = time.monotonic()
    w.until(lambda j: (j["status"].get("size") or {}).get("pods") == 3 and gang_trains(c, namespace, name, j), AGAIN,
            "training at full size again")
    full = time.monotonic() - released
    status = w.status
    uncounted(status)
    rounds = worlds(c.pod_log(namespace, zero, "trainer"))
    assert all(size >= 2 for size in rounds.values()) and rounds[status["restarts"]] == 3, \
        f"a round ran below minSize: {rounds}"
    print(f"\nelastic gang below its minimum: waited 10 s below it; training at 2 pods {again:.1f}s after pod 1's "
          f"replacement was let go, at 3 pods {full:.1f}s after pod 2's; rounds' world sizes {rounds}; restarts "
          f"{status['restarts']}, disruptions {status['disruptions']}")
