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
    kueue_cluster: `cluster` with Kueue running on it (devcluster/kueue.py, started once per
        session; log in <state_dir>/kueue/kueue.log) and the ResourceFlavor KWOK_FLAVOR standing
        for the kwok nodes (their label `type=kwok` and their taint).
    kueue_queues: makes queues for one test: `kueue_queues.create(cpu="8", gpus=4)` creates a
        ClusterQueue with that quota on KWOK_FLAVOR and a LocalQueue in `namespace` pointing at
        it, and returns the LocalQueue's name (a Workload's spec.queueName); deleted after.
    podgroup_crds: `cluster` with the PodGroup CRDs of Volcano and coscheduling installed
        (tests/data/crds, vendored from those projects).

    real_cluster: a second LocalCluster, started on first use, with REAL_NODES real kubelet
        nodes (devcluster/realnode.py: containerd, runc, CNI, CoreDNS; pods run the images they
        name, built by scripts/build-images.sh) and no kwok nodes. Real nodes are tainted: pods
        need devcluster.realnode.REAL_TOLERATION (and nodeSelector type=real to stay off the
        process node). Its own API server, so an operator installed there (tests/realnode/)
        never meets the one tests/e2e runs.

Mark such tests `@pytest.mark.cluster`. MONARCH_SPMD_KEEP_CLUSTER=1 keeps the state folder
(logs of every component and pod) after the session; its path is printed either way.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from devcluster import KWOK_TAINT, LocalCluster
from devcluster import kueue as kueue_objects
from devcluster.binaries import ensure_binaries
from devcluster.kueue import ensure_kueue
from devcluster.realnode import ensure_images, ensure_realnode_binaries


#: tests/gpu needs CUDA GPUs: collected only where MONARCH_SPMD_GPU_TESTS=1 says there are some
#: (it is never skipped: on a machine without GPUs it is not part of the suite at all).
collect_ignore = [] if os.environ.get("MONARCH_SPMD_GPU_TESTS") == "1" else ["gpu"]

BIN_DIR = pytest.StashKey[Path]()
REAL_NODES = 2


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes tests start, however the suite itself was started.

    A shell without job control starts a background command (`... &`, nohup) with SIGINT
    ignored, and an ignored signal stays ignored through fork and exec: every Python the tests
    start would then ignore the SIGINT a test sends it (a worker's wait, `status -w`), and those
    tests would time out. Python's own handler here is reset to the default in every child.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


#: scripts/test.sh runs the suite on two xdist workers (``--dist loadgroup``); a group's tests run
#: on one worker, in order. The real nodes' cluster is one group (two real clusters at once would
#: be two more kubelets, containerds and CoreDNS on two cores); each module that uses `cluster`
#: is a group of its own (its module fixtures made once), so those modules spread over both
#: workers and each worker starts its own `cluster` the first time it needs one (clusters take
#: free ports, bridge slots and state folders of their own, so they never meet). Every other test
#: goes to whichever worker is free.
REAL_GROUP = "real-cluster"


def cluster_group(fixturenames: object, module: str) -> str | None:
    """The xdist group of a test of ``module`` that uses ``fixturenames``, or None."""
    names = set(fixturenames or ())  # type: ignore[call-overload]
    if "real_cluster" in names:
        return REAL_GROUP
    if "cluster" in names:
        return f"cluster:{module}"
    return None


#: The order the suite runs in: the longest groups first (the real nodes' cluster, the benchmarks'
#: smoke runs, the end-to-end modules), the short process tests last, so the two workers end
#: together instead of one waiting for a long group handed out at the end. Within a folder the
#: order is pytest's.
FIRST = ("realnode", "bench", "e2e", "scheduling", "helm", "harness", "lib", "kind", "unit")
#: Process tests of several minutes each, handed out before every folder: one of them handed out
#: last would leave the other worker idle for its length.
EARLY = ("tests/lib/test_hang_blame.py::test_the_rank_that_hangs_the_gang",)


def run_order(nodeid: str) -> int:
    """Where a test's folder comes in FIRST (a folder not named there goes last; EARLY first)."""
    if nodeid.startswith(EARLY):
        return -1
    parts = nodeid.split("/")
    folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return FIRST.index(folder) if folder in FIRST else len(FIRST)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Puts the longest groups first and marks each test that uses a session cluster with its
    xdist group (before xdist reads it)."""
    items.sort(key=lambda item: run_order(item.nodeid))  # stable: pytest's order within a folder
    for item in items:
        group = cluster_group(getattr(item, "fixturenames", ()), item.nodeid.split("::", 1)[0])
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


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
    if any("real_cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            reporter.write_line("real nodes: checking kubelet, CoreDNS and the images (the first "
                                "build on a machine takes minutes)")
        session.config.stash[BIN_DIR] = ensure_binaries()
        ensure_realnode_binaries()
        ensure_images()
    if any("kueue_cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        ensure_kueue()  # built once per machine, outside every test's timeout too


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


# --- Kueue and gang-scheduler CRDs (tests/scheduling, and the operator's tests of them) --------

KWOK_FLAVOR = "kwok"
PODGROUP_CRDS = Path(__file__).parent / "data" / "crds"


@pytest.fixture(scope="session")
def kueue_cluster(cluster: LocalCluster) -> Iterator[LocalCluster]:
    cluster.start_kueue()
    api = client.CustomObjectsApi(cluster.api_client())
    flavor = kueue_objects.resource_flavor(KWOK_FLAVOR, node_labels={"type": "kwok"},
                                           node_taints=[KWOK_TAINT])
    try:
        api.create_cluster_custom_object(kueue_objects.API_GROUP, kueue_objects.API_VERSION,
                                         "resourceflavors", flavor)
    except client.ApiException as err:
        if err.status != 409:  # made by an earlier start of Kueue on this cluster
            raise
    yield cluster
    cluster.stop_kueue()


class KueueQueues:
    """Creates ClusterQueues and LocalQueues for one test and deletes them after it."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        self.api = client.CustomObjectsApi(cluster.api_client())
        self.namespace = namespace
        self.cluster_queues: list[str] = []

    def create(self, *, cpu: str | int = "8", gpus: int = 0, memory: str = "64Gi",
               name: str | None = None, preemption: dict | None = None) -> str:
        """A ClusterQueue with this quota (cpu, nvidia.com/gpu, memory) on KWOK_FLAVOR and a
        LocalQueue in the test's namespace pointing at it; returns the LocalQueue's name.
        `preemption` is the ClusterQueue's spec.preemption (default: never preempt)."""
        name = name or f"q-{uuid.uuid4().hex[:8]}"
        group, version = kueue_objects.API_GROUP, kueue_objects.API_VERSION
        quota = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus}
        self.api.create_cluster_custom_object(
            group, version, "clusterqueues",
            kueue_objects.cluster_queue(name, KWOK_FLAVOR, quota, preemption=preemption))
        self.cluster_queues.append(name)
        self.api.create_namespaced_custom_object(
            group, version, self.namespace, "localqueues",
            kueue_objects.local_queue(self.namespace, name, name))
        return name

    def delete_all(self) -> None:
        # Kueue keeps a ClusterQueue (finalizer) until its workloads are gone with the namespace.
        for name in self.cluster_queues:
            try:
                self.api.delete_cluster_custom_object(kueue_objects.API_GROUP,
                                                      kueue_objects.API_VERSION,
                                                      "clusterqueues", name)
            except client.ApiException as err:
                if err.status != 404:
                    raise
        self.cluster_queues = []


@pytest.fixture
def kueue_queues(kueue_cluster: LocalCluster, namespace: str) -> Iterator[KueueQueues]:
    queues = KueueQueues(kueue_cluster, namespace)
    yield queues
    queues.delete_all()


@pytest.fixture(scope="session")
def podgroup_crds(cluster: LocalCluster) -> LocalCluster:
    cluster.kubectl("apply", "--server-side", "-f", str(PODGROUP_CRDS))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f",
                    str(PODGROUP_CRDS))
    return cluster


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state_dir = tmp_path_factory.mktemp("real-cluster")
    bin_dir = request.config.stash.get(BIN_DIR, None) or ensure_binaries()
    with LocalCluster(state_dir, kwok_nodes=0, real_nodes=REAL_NODES, bin_dir=bin_dir) as running:
        print(f"\ncluster with {REAL_NODES} real nodes up in {running.start_seconds:.1f}s; "
              f"state in {state_dir}", file=sys.stderr)
        yield running
    if not os.environ.get("MONARCH_SPMD_KEEP_CLUSTER"):
        shutil.rmtree(state_dir / "etcd", ignore_errors=True)
