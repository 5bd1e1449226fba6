"""The operator's metrics (spmd_operator.metrics): what a pass's status patch counts."""

from __future__ import annotations

import datetime as dt

import pytest
from prometheus_client import generate_latest

from spmd_operator import leader
from spmd_operator.metrics import Metrics

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
CREATED = "2026-01-01T11:59:00Z"


def sample(m: Metrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_a_jobs_life_is_counted_once_per_transition():
    m = Metrics(lambda: [{"metadata": {"namespace": "a"}, "status": {"phase": "Running"}},
                         {"metadata": {"namespace": "a"}, "status": {}}])
    m.transition({}, {"phase": "Pending", "restarts": 0}, CREATED, NOW)
    m.transition({"phase": "Pending"}, {"phase": "Running"}, CREATED, NOW)
    m.transition({"phase": "Running", "restarts": 0}, {"phase": "Restarting", "restarts": 1,
                                                        "failure": {"disruption": True}}, CREATED, NOW)
    m.transition({"phase": "Restarting", "restarts": 1}, {"phase": "Running"}, CREATED, NOW)
    m.transition({"phase": "Running", "restarts": 1}, {"phase": "Failed", "conditions": [
        {"type": "Failed", "status": "True", "reason": "RestartLimitExceeded"}]}, CREATED, NOW)
    assert sample(m, "spmdjob_jobs_created_total") == 1
    assert sample(m, "spmdjob_time_to_running_seconds_count") == 1, "only the first start"
    assert sample(m, "spmdjob_time_to_running_seconds_sum") == 60
    assert sample(m, "spmdjob_gang_restarts_total", cause="disruption") == 1
    assert sample(m, "spmdjob_jobs_failed_total", reason="RestartLimitExceeded") == 1
    assert sample(m, "spmdjob_time_to_completion_seconds_count", result="failed") == 1
    assert sample(m, "spmdjob_jobs", namespace="a", phase="Running") == 1
    assert sample(m, "spmdjob_jobs", namespace="a", phase="New") == 1
    text = generate_latest(m.registry).decode()
    assert "spmdjob_api_requests_total" in text or "spmdjob_api_requests" in text


def test_a_short_job_that_succeeds_before_it_was_seen_running_has_a_start_time():
    m = Metrics()
    m.transition({"phase": "Pending", "conditions": [{"type": "Running", "status": "False"}]},
                 {"phase": "Succeeded"}, CREATED, NOW)
    assert sample(m, "spmdjob_time_to_running_seconds_count") == 1
    assert sample(m, "spmdjob_jobs_succeeded_total") == 1


def test_leader_timings_must_nest():
    leader.Timings(10, 7, 2)
    with pytest.raises(ValueError, match="lease duration"):
        leader.Timings(5, 7, 2)
    with pytest.raises(ValueError, match="retry period"):
        leader.Timings(10, 7, 0)


def test_the_job_gauges_are_computed_on_the_event_loop_not_the_scraping_thread():
    import asyncio
    import threading

    seen = []
    jobs = [{"metadata": {"namespace": "a"}, "status": {"phase": "Running"}}]

    def read_jobs():
        seen.append(threading.get_ident())
        return jobs

    m = Metrics(read_jobs, lambda: {"pods": (1, 4, 2)})
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        m.bind(loop)
        assert sample(m, "spmdjob_jobs", namespace="a", phase="Running") == 1
        assert sample(m, "spmdjob_cache_entries", informer="pods", kind="tombstones") == 2
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    assert seen and set(seen) == {thread.ident}, "the controller's dicts are read only by the loop that changes them"
