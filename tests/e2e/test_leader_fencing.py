"""End-to-end: two operator replicas, one leader; a deposed leader writes nothing once its
successor has written, and a failover is invisible to running jobs. Judged by the API server's own
audit log of writes (devcluster: ControlPlane.enable_audit), not by what the operators say.

Each replica has its own Lease identity, its own client certificate (the audit log's user name)
and its own User-Agent. Short election timings (4 s lease, 3 s renew deadline, 1 s retry) keep the
tests quick. Two ways a leader is deposed without knowing it:

* SIGSTOP past the lease (a frozen VM, a stop-the-world pause), then SIGCONT;
* its connection to the API server stalled (a paused TCP proxy, devcluster.StallableProxy),
  then flowing again.

Meanwhile the successor takes over, and a 64-proc job applied just before the leader was deposed
is disturbed (one pod deleted) so that the successor must write. The deposed replica, once it
runs (or reaches the server) again, must not write anything (Lease updates aside: those are
conditional on the resourceVersion, and are how it learns it lost) after the successor's first
write. The running Kueue, PodGroup and plain jobs keep their pods, phase and restart count.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
from kubernetes import client

from devcluster.controlplane import stop_process_group
from devcluster.localcluster import StallableProxy
from spmd_operator import names
from tests.e2e import survival
from tests.e2e.conftest import (apply, get_job, job_manifest, job_pods, job_ref, operator_args, pod_names,
                                wait_until)

pytestmark = pytest.mark.cluster
ELECTION = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1", "--resync-seconds", "10")
LEASE = "spmdjob-operator"
CHURN = 64


@pytest.fixture
def lease_namespace(cluster):
    name = f"lease-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def holder(c, namespace: str) -> str:
    try:
        return client.CoordinationV1Api(c.api_client()).read_namespaced_lease(LEASE, namespace).spec.holder_identity or ""
    except client.ApiException:
        return ""


def when(event: dict) -> dt.datetime:
    return dt.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))


def writes_by(c, user: str, since: dt.datetime) -> list[dict]:
    """The audit log's completed writes of ``user`` since ``since``, Lease updates left out."""
    return [e for e in c.audit_events()
            if e.get("stage") == "ResponseComplete" and e["user"]["username"] == user
            and (e.get("objectRef") or {}).get("resource") != "leases" and when(e) >= since]


def describe(e: dict) -> str:
    ref = e.get("objectRef") or {}
    return (f"{e['requestReceivedTimestamp']} {e['verb']} {ref.get('resource')}/{ref.get('subresource') or ''}"
            f"{ref.get('name') or ''} -> {e.get('responseStatus', {}).get('code')} ({e.get('userAgent')})")


class Replicas:
    """Operator replicas with distinct identities; with ``proxied``, fence-a (the first, which
    leads) reaches the API server through a StallableProxy."""

    def __init__(self, c, lease_namespace: str, *, proxied: bool = False) -> None:
        self.c, self.lease_namespace = c, lease_namespace
        self.proxy = StallableProxy(c.control_plane.api_port) if proxied else None
        self.procs = {}

    def start(self, name: str) -> None:
        port = self.proxy.port if self.proxy and name == "fence-a" else None
        self.procs[name] = self.c.start_replica(name, *ELECTION, kubeconfig=self.c.kubeconfig_for(name, port),
                                                lease_namespace=self.lease_namespace)

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                self.c.unpause(proc)
            except ProcessLookupError:
                pass
            stop_process_group(proc, 10)
        if self.proxy:
            self.proxy.close()


def depose_and_check(c, namespace: str, lease_namespace: str, replicas: Replicas, before: dict,
                     depose, restore) -> None:
    """Applies the churn job, deposes the leader mid-creation, lets the successor take over and
    restart the churn job's gang, restores the old leader, then reads the audit log."""
    old = wait_until(lambda: holder(c, lease_namespace), 60, "a leader")
    assert old == "fence-a", "fence-a starts first and must lead (the one that is deposed)"
    began = dt.datetime.now(dt.timezone.utc)
    apply(c, namespace, job_manifest("churn", [("procs", CHURN)], ["-m", "train"], kwok=True,
                                     restartPolicy={"maxRestarts": 5}))
    time.sleep(0.5)
    depose()
    new = wait_until(lambda: (h := holder(c, lease_namespace)) not in ("", old) and h, 30, "the successor leads")
    job = wait_until(lambda: (j := get_job(c, namespace, "churn")).get("status", {}).get("phase") == "Running" and j,
                     120, "the churn job Running under the successor")
    victim = names.pod_name(job_ref(job), 0, 3)
    c.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false", "--grace-period=0", "--force")
    wait_until(lambda: get_job(c, namespace, "churn")["status"].get("restarts") == 1, 60, "the successor restarts the gang")
    restore()
    time.sleep(8)  # the old leader runs (or reaches the server) again: time for anything it would still send
    theirs = writes_by(c, new, began)
    assert theirs, "the successor wrote"
    first = min(when(e) for e in theirs)
    late = [describe(e) for e in writes_by(c, old, first)]
    assert not late, f"the deposed leader wrote after its successor's first write ({first}):\n" + "\n".join(late)
    job = wait_until(lambda: (j := get_job(c, namespace, "churn"))["status"].get("phase") == "Running" and j, 120,
                     "the churn job Running again")
    live = sorted(p.metadata.name for p in job_pods(c, namespace, "churn") if not p.metadata.deletion_timestamp)
    assert live == pod_names(job, 1, CHURN), "exactly one gang, of the newest attempt"
    survival.watch_unchanged(c, namespace, before, seconds=1)


def run_case(c, kueue_queues, namespace, lease_namespace, *, proxied: bool, depose, restore) -> None:
    c.stop_operator()
    c.enable_audit()
    replicas = Replicas(c, lease_namespace, proxied=proxied)
    try:
        replicas.start("fence-a")
        wait_until(lambda: holder(c, lease_namespace) == "fence-a", 60, "fence-a leads")
        replicas.start("fence-b")  # only now, so that fence-a is the leader every time
        before = survival.start_jobs(c, namespace, kueue_queues.create(cpu="4"))
        depose_and_check(c, namespace, lease_namespace, replicas, before, lambda: depose(replicas),
                         lambda: restore(replicas))
    finally:
        replicas.stop()
        c.kubectl("delete", "spmdjob", "--all", "-n", namespace, "--wait=false", check=False)
        c.start_operator(*operator_args())


def test_a_leader_paused_past_its_lease_writes_nothing_after_its_successor(
        operator, kueue_queues, podgroup_crds, namespace, lease_namespace):
    run_case(operator, kueue_queues, namespace, lease_namespace, proxied=False,
             depose=lambda r: r.c.pause(r.procs["fence-a"]), restore=lambda r: r.c.unpause(r.procs["fence-a"]))


def test_a_leader_whose_connection_stalls_writes_nothing_after_its_successor(
        operator, kueue_queues, podgroup_crds, namespace, lease_namespace):
    run_case(operator, kueue_queues, namespace, lease_namespace, proxied=True,
             depose=lambda r: r.proxy.pause(), restore=lambda r: r.proxy.resume())
