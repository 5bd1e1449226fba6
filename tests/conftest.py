"""Session fixtures for tests that need the real test cluster (devcluster/).

A fixture runs only for tests that ask for it: unit tests start no cluster. The first test that
asks for `cluster` starts, for the whole session, a control plane, one process node
(`proc-node-0`, pods run as local processes) and four kwok nodes (simulated, tainted: pods need
`devcluster.KWOK_TOLERATION`). The binaries are built on first use on a machine (minutes,
once; before the first test runs, so no test timeout covers it), then reused from
~/.cache/monarch-spmd.

Fixtures:
    cluster: a devcluster.LocalCluster, started. What tests use of it:
        kubeconfig (Path), env (dict for subprocess: KUBECONFIG, the built kubectl/helm first on
        PATH), bin_dir, state_dir, logs_dir, kubectl(*args, input=None, check=True, timeout=60)
        -> CompletedProcess, api_client() -> kubernetes ApiClient, pod_log(namespace, pod,
        container=None) -> str, start_operator(*args) / stop_operator() (the SPMDJob operator as
        a subprocess, log in <state_dir>/operator.log), start_seconds.
    namespace: a fresh namespace (random name) whose default ServiceAccount exists; deleted
        after the test.

Mark such tests `@pytest.mark.cluster`. MONARCH_SPMD_KEEP_CLUSTER=1 keeps the state folder
(logs of every component and pod) after the session; its path is printed either way.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from devcluster import LocalCluster
from devcluster.binaries import ensure_binaries


BIN_DIR = pytest.StashKey[Path]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the cluster's binaries before any test runs, outside every test's timeout.

    Only when a collected test needs the cluster; the first build on a machine takes minutes.
    """
    if any("cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            reporter.write_line("test cluster: checking binaries (the first build on a machine "
                                "takes minutes)")
        session.config.stash[BIN_DIR] = ensure_binaries()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state_dir = tmp_path_factory.mktemp("cluster")
    bin_dir = request.config.stash.get(BIN_DIR, None) or ensure_binaries()
    with LocalCluster(state_dir, kwok_nodes=4, bin_dir=bin_dir) as running:
        print(f"\ntest cluster up in {running.start_seconds:.1f}s; state in {state_dir}",
              file=sys.stderr)
        yield running
    if not os.environ.get("MONARCH_SPMD_KEEP_CLUSTER"):
        shutil.rmtree(state_dir / "etcd", ignore_errors=True)  # the bulk; logs stay with pytest


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespace({"metadata": {"name": name, "labels": {"monarch-spmd.dev/test": "1"}}})
    deadline = time.monotonic() + 30
    while True:  # pods are refused until the service-account controller made `default`
        try:
            core.read_namespaced_service_account("default", name)
            break
        except client.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    yield name
    core.delete_namespace(name)
