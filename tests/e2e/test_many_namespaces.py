"""End-to-end: an operator that watches 500 namespaces by name (the chart's watchNamespaces) starts,
takes its Lease and runs a job.

Every informer opens one watch per namespace and kind, each holding a connection for minutes:
1,500 here. Once they shared the one pool of 64 connections that lists, writes and the Lease
renewals need too, and an operator of 25 namespaces never became ready. Watches now have a pool
of their own, and the Lease a client of its own.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes import client

from devcluster.controlplane import stop_process_group
from tests.e2e.conftest import apply, job_manifest, wait_phase, wait_until

pytestmark = pytest.mark.cluster

NAMESPACES = 500


def test_an_operator_of_500_namespaces_takes_its_lease_and_runs_a_job(running_operator, namespace):
    cluster = running_operator
    cluster.stop_operator()  # the session's operator watches every namespace: this one runs alone
    core = client.CoreV1Api(cluster.api_client())
    tag = uuid.uuid4().hex[:6]
    names = [f"w{tag}-{i}" for i in range(NAMESPACES - 1)]

    def create(name: str) -> None:
        core.create_namespace({"metadata": {"name": name, "labels": {"monarch-spmd.dev/test": "1"}}})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, names))
    watched = [*names, namespace]
    lease = f"many-{tag}"
    began = time.monotonic()
    operator = cluster.start_replica(f"many-{tag}", "--lease-name", lease, lease_namespace=namespace,
                                     scope=tuple(f"--namespace={n}" for n in watched))
    try:
        leases = client.CoordinationV1Api(cluster.api_client())
        holder = wait_until(lambda: _holder(leases, namespace, lease), 120, "the Lease taken")
        leading = time.monotonic() - began
        assert holder == f"many-{tag}"
        apply(cluster, namespace, job_manifest("among-many", [("procs", 2)], ["-m", "tests.programs.say", "hello"]))
        job = wait_phase(cluster, namespace, "among-many", "Succeeded", timeout=180)
        done = time.monotonic() - began
        assert job["status"]["phase"] == "Succeeded" and operator.poll() is None
        print(f"\n{NAMESPACES} namespaces: Lease held {leading:.1f}s, a job Succeeded {done:.1f}s after the start")
    finally:
        stop_process_group(operator, 10)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: core.delete_namespace(n), names))


def _holder(api: client.CoordinationV1Api, namespace: str, name: str) -> str:
    try:
        return api.read_namespaced_lease(name, namespace).spec.holder_identity or ""
    except client.ApiException:
        return ""
