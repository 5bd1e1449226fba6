"""End-to-end: a small job created while a large one is being created is not queued behind it.

The operator runs with a write concurrency of 2, so that creating a 512-proc job's pods (on kwok
nodes) takes a while; a 4-proc job applied a second later must be Running while the large job's
pods are still being created: the write slots go to the jobs in turn (round robin), not first
come, first served. Ordering, not timing: how long it takes is the many-jobs benchmark's business.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import apply, job_manifest, job_pods, operator_args, wait_phase, wait_until

pytestmark = pytest.mark.cluster
BIG = 512


def test_a_small_job_runs_while_a_large_one_is_still_being_created(operator, namespace):
    c = operator
    c.start_operator(*operator_args(), "--concurrency", "2")
    try:
        apply(c, namespace, job_manifest("large", [("procs", BIG)], ["-m", "train"], kwok=True))
        wait_until(lambda: len(job_pods(c, namespace, "large")) >= 8, 60, "the large job's creation under way")
        time.sleep(1)
        apply(c, namespace, job_manifest("small", [("procs", 4)], ["-m", "train"], kwok=True))
        wait_phase(c, namespace, "small", "Running", timeout=120)
        created = len(job_pods(c, namespace, "large"))
        print(f"the small job Running when {created} of the large job's {BIG} pods existed")
        assert created < BIG, "the small job waited for the whole large job"
    finally:
        c.kubectl("delete", "spmdjob", "--all", "-n", namespace, "--wait=false", check=False)
        c.start_operator(*operator_args())
