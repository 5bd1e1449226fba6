"""Operating the chart on the real test cluster: what its RBAC lets the operator do, asked of the
API server's own RBAC authorizer, and `helm upgrade` while a job runs.

The upgrade test installs the chart (one replica, watching the test's namespace), starts a
long-running SPMDJob whose pods land on kwok nodes (simulated: they run until deleted), then
`helm upgrade`s to two replicas with a new pod annotation, so the Deployment rolls: the new pods
start beside the old leader, the old pod gets SIGTERM and hands its Lease back, a new pod takes
it. The job must not notice: same pods (uids), no restart, still Running, no Warning. Then the
new leader must still act on it: one pod deleted gives exactly one gang restart.

On the process node the operator pods are `python -m spmd_operator` from this checkout, each in
its own network namespace, so every replica serves /metrics on port 9090 of its own pod IP.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
import urllib.request
import uuid
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes import watch as kube_watch

from devcluster import KWOK_TOLERATION
from helm_support import (CHART, CRD_RULE, GANG_CLUSTER_RULES, GANG_RULES, LEASE_RULE, NAMESPACE_GET_RULE,
                          NAMESPACED_RULES, NAMESPACES_RULE, KUBE_VERSION, by_kind, helm_cmd, wait_for_lease_holder)

pytestmark = pytest.mark.cluster

JOB_LABEL = "spmd.monarch.dev/job"
OPERATOR_PODS = "app.kubernetes.io/component=operator,app.kubernetes.io/instance=spmd"
LEASE = "spmd-monarch-spmd"
#: Every verb RBAC knows for a resource; the operator must get exactly the ones its rules list.
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


# --- RBAC, asked of the real authorizer ----------------------------------------------------------


def allowed(cluster, user: str, namespace: str | None, verb: str, group: str, resource: str) -> bool:
    """SubjectAccessReview: may the ServiceAccount `user` do this? (the API server's RBAC decides)"""
    plural, _, sub = resource.partition("/")
    sa_namespace = user.split(":")[2]
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=["system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(
            namespace=namespace, verb=verb, group=group, resource=plural, subresource=sub or None)))
    answer = client.AuthorizationV1Api(cluster.api_client()).create_subject_access_review(review)
    return bool(answer.status.allowed)


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(verb, group, resource) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


@pytest.fixture
def applied_rbac(cluster, namespace):
    """Applies the RBAC objects the chart renders for `values` under a release name of its own
    (ClusterRoles are cluster-wide); deletes the cluster-scoped ones afterwards."""
    created: list[dict[str, Any]] = []

    def apply(*values: str) -> str:
        release = f"rbac-{uuid.uuid4().hex[:6]}"
        result = helm_cmd(cluster, "template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION,
                          "--set", "tests.enabled=false", *values)
        assert result.returncode == 0, result.stderr
        objects = [d for d in yaml.safe_load_all(result.stdout) if d]
        rbac = [o for o in objects if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
        created.extend(by_kind(rbac, "ClusterRole") + by_kind(rbac, "ClusterRoleBinding"))
        (account,) = by_kind(rbac, "ServiceAccount")
        return f"system:serviceaccount:{namespace}:{account['metadata']['name']}"

    yield apply
    for obj in created:
        cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found", check=False)


@pytest.mark.parametrize("gang", [False, True], ids=["plain", "gang-schedulers"])
def test_the_authorizer_grants_the_operator_exactly_its_rules_cluster_wide(cluster, namespace, applied_rbac, gang):
    values = [a for n in GANG_RULES for a in ("--set", f"gangScheduling.{n}.enabled=true")] if gang else []
    user = applied_rbac(*values)
    everywhere = grants([*NAMESPACED_RULES, CRD_RULE, NAMESPACE_GET_RULE,
                         *([r for n in GANG_RULES for r in (*GANG_RULES[n], *GANG_CLUSTER_RULES[n])] if gang else [])])
    resources = {(g, r) for _, g, r in everywhere} | {(g, r) for rules in GANG_RULES.values() for _, g, r in grants(rules)}
    resources |= {("", "secrets"), ("", "nodes"), ("spmd.monarch.dev", "spmdjobs/finalizers"), ("events.k8s.io", "events"),
                  ("coordination.k8s.io", "leases"), ("rbac.authorization.k8s.io", "roles")}
    wrong = []
    for group, resource in sorted(resources):
        for verb in VERBS:
            # "default" stands for any namespace a job may run in (the Lease is not granted there).
            want = (verb, group, resource) in everywhere
            if allowed(cluster, user, "default", verb, group, resource) != want:
                wrong.append(f"{verb} {resource}.{group or 'core'} in default: expected {'allowed' if want else 'denied'}")
    for verb in VERBS:  # the Lease: in the release namespace only, and only what the election does
        want = (verb, "coordination.k8s.io", "leases") in grants([LEASE_RULE])
        if allowed(cluster, user, namespace, verb, "coordination.k8s.io", "leases") != want:
            wrong.append(f"{verb} leases in the release namespace: expected {'allowed' if want else 'denied'}")
    assert not wrong, "\n".join(wrong)
    assert not allowed(cluster, user, None, "list", "", "namespaces")  # kopf needs it only per namespace


def test_the_authorizer_confines_a_namespaced_operator(cluster, namespace, applied_rbac):
    user = applied_rbac("--set", f"watchNamespaces={{{namespace}}}", "--set", "gangScheduling.kueue.enabled=true")
    namespaced = grants([*NAMESPACED_RULES, *GANG_RULES["kueue"]])
    wrong = []
    for verb, group, resource in sorted(namespaced):
        if not allowed(cluster, user, namespace, verb, group, resource):
            wrong.append(f"{verb} {resource} in {namespace}: expected allowed")
        if allowed(cluster, user, "default", verb, group, resource):
            wrong.append(f"{verb} {resource} in default (not watched): expected denied")
    for verb, group, resource in sorted(grants([CRD_RULE, NAMESPACE_GET_RULE, NAMESPACES_RULE, *GANG_CLUSTER_RULES["kueue"]])):
        if not allowed(cluster, user, None, verb, group, resource):
            wrong.append(f"{verb} {resource} (cluster-scoped): expected allowed")
    for verb in ("get", "create", "update"):
        if not allowed(cluster, user, namespace, verb, "coordination.k8s.io", "leases"):
            wrong.append(f"{verb} leases in the release namespace: expected allowed")
        if allowed(cluster, user, "kube-system", verb, "coordination.k8s.io", "leases"):
            wrong.append(f"{verb} leases in kube-system: expected denied")
    if allowed(cluster, user, namespace, "delete", "coordination.k8s.io", "leases"):
        wrong.append("delete leases: expected denied")
    assert not wrong, "\n".join(wrong)


# --- helm upgrade while a job runs ---------------------------------------------------------------


def operator_pods(cluster, namespace: str) -> list[dict[str, Any]]:
    got = cluster.kubectl("get", "pods", "-n", namespace, "-l", OPERATOR_PODS, "-o", "json")
    return json.loads(got.stdout)["items"]


def lease(cluster, namespace: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "lease", LEASE, "-n", namespace, "-o", "json").stdout)


def job(cluster, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "spmdjob", name, "-n", namespace, "-o", "json").stdout)


def job_pods(cluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """Pod name -> pod, of the job, not counting pods already being deleted."""
    got = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", f"{JOB_LABEL}={name}", "-o", "json").stdout)
    return {p["metadata"]["name"]: p for p in got["items"] if not p["metadata"].get("deletionTimestamp")}


def job_events(cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    got = cluster.kubectl("get", "events", "-n", namespace, "-o", "json",
                          f"--field-selector=involvedObject.kind=SPMDJob,involvedObject.name={name}")
    return json.loads(got.stdout)["items"]


def warnings(cluster, namespace: str, name: str) -> list[str]:
    """Warning Events about the job or its pods."""
    got = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json", "--field-selector=type=Warning").stdout)
    return [f"{e['involvedObject']['kind']}/{e['involvedObject']['name']}: {e['reason']}: {e.get('message')}"
            for e in got["items"] if e["involvedObject"]["name"].startswith(name)]


def metrics(pod: dict[str, Any], timeout: float = 60) -> dict[str, float]:
    """The pod's /metrics as {'name{labels}': value} (its own IP: a pod of the process node);
    waits for a replica still starting up to serve them."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{pod['status']['podIP']}:9090/metrics", timeout=10) as response:
                text = response.read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    samples = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$", line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not reached in {timeout}s: {what}")


def parse_time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


class LeaseWatch:
    """Watches the Lease in a thread and keeps every change of holder: (seconds since the epoch it
    was seen, holder, renewTime, acquireTime).

    A watch, not polling: the API server sends every update, so a release followed at once by a
    standby's acquisition (the holder empty for less than one poll) is still in the record.
    """

    def __init__(self, cluster, namespace: str) -> None:
        self.api = client.CoordinationV1Api(cluster.api_client())
        self.namespace = namespace
        self.changes: list[tuple[float, str, dt.datetime | None, dt.datetime | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._version = ""
        self.error: BaseException | None = None

    def __enter__(self) -> "LeaseWatch":
        lease = self.api.read_namespaced_lease(LEASE, self.namespace)
        self._record(lease)
        self._version = lease.metadata.resource_version
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if exc_type is not None:
            return  # the body's own failure is the one to report
        assert self.error is None, f"the Lease watch failed: {self.error!r}"
        self._record(self.api.read_namespaced_lease(LEASE, self.namespace))  # what the caller saw last too

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # Short server-side timeouts, resumed from the last version seen: no update is missed
                # between two streams, and the thread notices the stop within about a second.
                try:
                    for event in kube_watch.Watch().stream(self.api.list_namespaced_lease, self.namespace,
                                                           field_selector=f"metadata.name={LEASE}",
                                                           resource_version=self._version, timeout_seconds=1,
                                                           allow_watch_bookmarks=True):
                        lease = event["object"]
                        self._version = lease.metadata.resource_version
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self._record(lease)
                except client.ApiException as e:
                    if e.status != 410:
                        raise
                    # Our version fell out of the server's watch window (other Leases, e.g. the
                    # nodes', churn it): read the Lease again and watch on from there.
                    lease = self.api.read_namespaced_lease(LEASE, self.namespace)
                    self._record(lease)
                    self._version = lease.metadata.resource_version
        except BaseException as e:  # noqa: BLE001 - reported by __exit__
            self.error = e

    def _record(self, lease: Any) -> None:
        spec = lease.spec
        holder = spec.holder_identity or ""
        if not self.changes or self.changes[-1][1] != holder:
            self.changes.append((time.time(), holder, spec.renew_time, spec.acquire_time))

    def handover_seconds(self, old: str, new: str) -> float:
        """From the old leader's release (its last renewTime, holder emptied) to the new one's acquireTime."""
        released = [renew for _, holder, renew, _ in self.changes if holder == ""]
        acquired = [acquire for _, holder, _, acquire in self.changes if holder == new]
        assert released and acquired, f"no release by {old} then acquisition by {new}: {self.changes}"
        return (acquired[0] - released[0]).total_seconds()


def long_job(name: str, procs: int) -> dict[str, Any]:
    """A job whose pods go to the kwok nodes, where they run until deleted."""
    return {
        "apiVersion": "spmd.monarch.dev/v1alpha1", "kind": "SPMDJob", "metadata": {"name": name},
        "spec": {"mesh": [{"name": "procs", "size": procs}], "args": ["-m", "train"], "image": "python:3.11-slim",
                 "restartPolicy": {"maxRestarts": 3},
                 "template": {"spec": {"tolerations": [KWOK_TOLERATION], "nodeSelector": {"type": "kwok"}}}},
    }


@pytest.fixture
def chart_operator(cluster, namespace, crd):
    """The chart installed in `namespace`, watching it, with the session's own operator (if any)
    stopped meanwhile so that one operator handles each job; uninstalled afterwards."""
    had_operator = getattr(cluster, "operator_process", None) is not None
    if had_operator:
        cluster.stop_operator()
    try:
        yield namespace
    finally:
        result = helm_cmd(cluster, "uninstall", "spmd", "-n", namespace, "--wait", "--timeout", "60s")
        if had_operator:
            cluster.start_operator()
        assert result.returncode == 0 or "not found" in result.stderr, result.stderr


def test_helm_upgrade_while_a_job_runs(cluster, chart_operator):
    namespace = chart_operator
    install = helm_cmd(cluster, "install", "spmd", str(CHART), "-n", namespace, "--set", f"watchNamespaces={{{namespace}}}",
                       "--set", "tests.enabled=false", "--wait", "--timeout", "120s")
    assert install.returncode == 0, install.stdout + install.stderr
    (old,) = operator_pods(cluster, namespace)
    old_name = old["metadata"]["name"]
    before_lease = wait_for_lease_holder(cluster, namespace, LEASE)
    assert before_lease["spec"]["holderIdentity"] == old_name

    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(long_job("long", 4)))
    wait_until(lambda: (job(cluster, namespace, "long").get("status") or {}).get("phase") == "Running", 120,
               "the job Running under the installed operator")
    uids = {n: p["metadata"]["uid"] for n, p in job_pods(cluster, namespace, "long").items()}
    assert len(uids) == 4
    events_before = {e["metadata"]["uid"] for e in job_events(cluster, namespace, "long")}
    assert not warnings(cluster, namespace, "long")

    # Upgrade: two replicas and a new pod annotation, so the Deployment rolls; then the CRD, as documented.
    upgraded_at = time.time()
    with LeaseWatch(cluster, namespace) as watch:
        upgrade = helm_cmd(cluster, "upgrade", "spmd", str(CHART), "-n", namespace, "--reuse-values",
                           "--set", "replicaCount=2", "--set-string", "podAnnotations.rollout=upgrade-test",
                           "--wait", "--timeout", "120s")
        assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
        assert "2 replicas: the one holding the Lease" in upgrade.stdout  # NOTES
        cluster.kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
        new = wait_until(lambda: (lambda pods: pods if len(pods) == 2 and old_name not in {p["metadata"]["name"] for p in pods}
                                  and all(p["status"].get("phase") == "Running" for p in pods) else None)(
                                      operator_pods(cluster, namespace)), 120, "two new operator pods, the old one gone")
        after_lease = wait_for_lease_holder(cluster, namespace, LEASE, other_than=old_name)
    for pod in new:
        assert pod["metadata"]["annotations"]["rollout"] == "upgrade-test"
    leader = after_lease["spec"]["holderIdentity"]
    assert leader in {p["metadata"]["name"] for p in new}
    # One hand-over: the old leader released the Lease on SIGTERM and a new pod took it at its next try.
    assert [h for _, h, _, _ in watch.changes] == [old_name, "", leader], watch.changes
    assert after_lease["spec"]["leaseTransitions"] == before_lease["spec"].get("leaseTransitions", 0) + 1
    handover = watch.handover_seconds(old_name, leader)
    # The holder went through "" (above): the Lease was released, not waited out (10 s). How long
    # the hand-over took is printed, not bounded: a loaded machine stretches it.
    print(f"hand-over of the Lease: {handover:.1f} s")
    takeover = parse_time(after_lease["spec"]["acquireTime"]).timestamp() - upgraded_at
    pdb = json.loads(cluster.kubectl("get", "pdb", "spmd-monarch-spmd", "-n", namespace, "-o", "json").stdout)
    assert pdb["spec"]["minAvailable"] == 1
    wait_until(lambda: (json.loads(cluster.kubectl("get", "pdb", "spmd-monarch-spmd", "-n", namespace, "-o", "json").stdout)
                        .get("status") or {}).get("disruptionsAllowed") == 1, 60, "the PDB allows one disruption")

    # The new leader has reconciled the job (its passes are counted) and changed nothing.
    by_name = {p["metadata"]["name"]: p for p in new}
    leader_metrics = wait_until(
        lambda: (lambda m: m if m.get("spmdjob_reconcile_duration_seconds_count", 0) > 0 else None)(metrics(by_name[leader])),
        60, "a reconcile pass by the new leader")
    (standby,) = [p for n, p in by_name.items() if n != leader]
    standby_metrics = metrics(standby)
    assert leader_metrics["spmdjob_leader"] == 1 and standby_metrics["spmdjob_leader"] == 0
    assert leader_metrics[f'spmdjob_jobs{{namespace="{namespace}",phase="Running"}}'] == 1
    assert leader_metrics.get("spmdjob_pods_created_total", 0) == 0
    assert standby_metrics.get("spmdjob_pods_created_total", 0) == 0
    assert standby_metrics.get("spmdjob_reconcile_duration_seconds_count", 0) == 0
    time.sleep(3)  # a little longer for anything the takeover might have set off
    after = job(cluster, namespace, "long")
    assert after["status"]["phase"] == "Running" and after["status"]["restarts"] == 0, after["status"]
    assert {n: p["metadata"]["uid"] for n, p in job_pods(cluster, namespace, "long").items()} == uids
    assert not warnings(cluster, namespace, "long")
    new_events = [e for e in job_events(cluster, namespace, "long") if e["metadata"]["uid"] not in events_before]
    assert not new_events, [(e["reason"], e["message"]) for e in new_events]
    # The metrics Service has both replicas behind it.
    slices = json.loads(cluster.kubectl("get", "endpointslices", "-n", namespace, "-o", "json",
                                        "-l", "kubernetes.io/service-name=spmd-monarch-spmd-metrics").stdout)["items"]
    assert sorted(e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or []) == sorted(by_name)
    assert {p["name"]: p["port"] for s in slices for p in s.get("ports") or []} == {"metrics": 9090}

    # The new leader still acts on the job: one pod deleted, exactly one gang restart.
    victim = sorted(uids)[0]
    cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
    restarted = wait_until(
        lambda: (lambda j: j if (j.get("status") or {}).get("restarts") == 1 and j["status"].get("phase") == "Running" else None)(
            job(cluster, namespace, "long")), 120, "one gang restart, Running again")
    time.sleep(3)
    settled = job(cluster, namespace, "long")
    assert settled["status"]["restarts"] == 1 and settled["status"]["phase"] == "Running", settled["status"]
    pods = job_pods(cluster, namespace, "long")
    assert len(pods) == 4 and not set(uids) & set(pods), sorted(pods)
    assert {p["metadata"]["labels"]["spmd.monarch.dev/restart"] for p in pods.values()} == {"1"}
    restarting = [e for e in job_events(cluster, namespace, "long") if e["reason"] == "Restarting"]
    assert len(restarting) == 1, [(e["reason"], e["message"]) for e in restarting]
    assert restarting[0]["reportingInstance"] == leader
    counted = metrics(by_name[leader])
    assert sum(v for k, v in counted.items() if k.startswith("spmdjob_gang_restarts_total{")) == 1, counted
    print(f"\nhelm upgrade observed: leader {old_name} -> {leader}, hand-over {handover:.1f}s after the release, "
          f"Lease taken {takeover:.1f}s after `helm upgrade` began; pods {sorted(uids)} unchanged, restarts 0, "
          f"no Warning, no Event; after deleting {victim}: restarts {restarted['status']['restarts']}, "
          f"one Restarting Event from {leader}")
