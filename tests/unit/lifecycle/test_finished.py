"""Finished jobs and ttlSecondsAfterFinished (lifecycle.finished)."""

from __future__ import annotations

import pytest

from .helpers import gang, pod, pod_name, run, service, spec, status


def test_ttl_after_finished_deletes_the_job():
    st = status("Succeeded", completionTime="2026-01-01T11:59:00Z")
    waiting = run(s=spec(ttlSecondsAfterFinished=120), st=st, pods=gang("Succeeded"))
    assert not waiting.delete_job
    assert waiting.requeue_after == pytest.approx(60)
    expired = run(s=spec(ttlSecondsAfterFinished=60), st=st, pods=gang("Succeeded"))
    assert expired.delete_job
    kept = run(st=st, pods=gang("Succeeded"))
    assert not kept.delete_job and kept.requeue_after is None


def test_finished_job_stops_remaining_pods_keeps_finished_ones_and_drops_its_services():
    st = status("Failed")
    pods = [pod(0, "Failed", exit_code=1), pod(1, "Succeeded"), pod(2, "Running"), pod(3, "Pending")]
    plan = run(st=st, pods=pods, services=[service(0)])
    assert set(plan.delete_pods) == {pod_name(2), pod_name(3)}
    assert plan.delete_services == (service(0).name,)
    assert (plan.create, plan.service, plan.events) == ((), None, ())
