"""Helpers for the tests that disturb the operator itself (killed, upgraded, failed over, paused)
under running jobs: three jobs of the kinds an operator restart can hurt, and what a user would
compare before and after (each job's phase, restart count and its pods' uids).

The jobs' pods go to kwok nodes (simulated: they run until deleted):

* ``queued``: admitted by the real Kueue (spec.scheduling.provider Kueue) on a test queue;
* ``grouped``: a Volcano PodGroup per attempt (the CRD from tests/data/crds), its pods scheduled
  by the default scheduler (no Volcano scheduler runs here), so it reaches Running;
* ``plain``: no scheduling provider.
"""

from __future__ import annotations

import time
from typing import Any

from tests.e2e.conftest import apply, get_job, job_events, job_manifest, job_pods, wait_phase

JOBS = ("queued", "grouped", "plain")
PROCS = 2


def manifests(queue: str) -> dict[str, dict[str, Any]]:
    """The three jobs, by name, for a Kueue LocalQueue ``queue``."""
    queued = job_manifest("queued", [("procs", PROCS)], ["-m", "train"], kwok=True,
                          scheduling={"provider": "Kueue", "queue": queue})
    for container in queued["spec"]["template"]["spec"].setdefault("containers", [{"name": "trainer"}]):
        container["resources"] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    grouped = job_manifest("grouped", [("procs", PROCS)], ["-m", "train"], kwok=True,
                           scheduling={"provider": "Volcano", "schedulerName": "default-scheduler"})
    plain = job_manifest("plain", [("procs", PROCS)], ["-m", "train"], kwok=True)
    return {"queued": queued, "grouped": grouped, "plain": plain}


def start_jobs(c, namespace: str, queue: str, timeout: float = 120) -> dict[str, tuple[str, int, dict[str, str]]]:
    """Applies the three jobs, waits until each runs; returns :func:`snapshot`."""
    for manifest in manifests(queue).values():
        apply(c, namespace, manifest)
    for name in JOBS:
        wait_phase(c, namespace, name, "Running", timeout=timeout)
    return snapshot(c, namespace)


def snapshot(c, namespace: str) -> dict[str, tuple[str, int, dict[str, str]]]:
    """Job name -> (phase, restarts, {pod name: uid}) of the pods not being deleted."""
    out = {}
    for name in JOBS:
        status = get_job(c, namespace, name).get("status") or {}
        pods = {p.metadata.name: p.metadata.uid for p in job_pods(c, namespace, name) if not p.metadata.deletion_timestamp}
        out[name] = (status.get("phase"), int(status.get("restarts") or 0), pods)
    return out


def reasons(c, namespace: str) -> dict[str, list[str]]:
    """The Events' reasons of each job, oldest first."""
    return {name: [e.reason for e in job_events(c, namespace, name)] for name in JOBS}


def watch_unchanged(c, namespace: str, before: dict[str, Any], seconds: float) -> None:
    """Fails as soon as any job's phase, restart count or pods differ from ``before`` within
    ``seconds`` (polled), naming what changed."""
    deadline = time.monotonic() + seconds
    while True:
        now = snapshot(c, namespace)
        assert now == before, f"a job was disturbed:\nbefore {before}\nafter  {now}"
        if time.monotonic() > deadline:
            return
        time.sleep(1.0)
