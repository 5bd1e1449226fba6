"""End-to-end: the operator never trusts a stale view, never touches another job's pods, and
repairs what users delete, on the real control plane.

Each test provokes what an SRE would: the API server killed and restarted under a running job
(pods and jobs deleted or created around the outage), a job re-created under the name of one
whose pods are still terminating or were orphaned, the master Service and the payload ConfigMap
deleted by hand, a gang restart whose old pods take their time to stop, a node that disappears,
a spec changed under a running job, and a namespace deleted with a job in it. Every one of them
must converge within one resync period of the operator (RESYNC_SECONDS here).
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from kubernetes import client

from devcluster import KWOK_TOLERATION
from devcluster.kwoknodes import fake_node
from spmd_operator import builders, names
from tests.e2e.conftest import (RESYNC_SECONDS, apply, get_job, job_events, job_manifest, job_pods,
                                job_ref, operator_args, pod_names, wait_job, wait_phase, wait_until)

pytestmark = pytest.mark.cluster
RESTART = "spmd.monarch.dev/restart"
SLEEP = ["-m", "tests.programs.fail_once", "--rank", "99", "--sleep", "600"]
#: A pass follows within seconds; a stale view is corrected by the next resync at the latest.
CONVERGE = RESYNC_SECONDS + 20
#: Bound on kube-controller-manager's garbage collection after an API server restart.
GC_AFTER_OUTAGE = 120


def running_pods(c, namespace, name, restart=None):
    return [p for p in job_pods(c, namespace, name)
            if not p.metadata.deletion_timestamp and (restart is None or p.metadata.labels[RESTART] == str(restart))]


# --- a stale view ------------------------------------------------------------------------------


def test_pod_deleted_right_after_an_api_server_restart_is_noticed(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("ghost", [("procs", 16)], ["-m", "train"], kwok=True,
                                     restartPolicy={"maxRestarts": 3}))
    job = wait_phase(c, namespace, "ghost", "Running", timeout=120)
    victim = names.pod_name(job_ref(job), 0, 5)
    outage = c.restart_apiserver(down_seconds=2)
    # At once, before the operator's watches are back: its view still holds the pod.
    c.kubectl("delete", "pod", victim, "-n", namespace, "--grace-period=0", "--force", "--wait=false")
    job = wait_job(c, namespace, "ghost", lambda j: j["status"].get("restarts") == 1, timeout=CONVERGE,
                   what="a gang restart for the pod deleted after the outage")
    assert job["status"]["failure"]["pod"] == victim, job["status"]["failure"]
    job = wait_phase(c, namespace, "ghost", "Running", timeout=120)
    assert sorted(p.metadata.name for p in running_pods(c, namespace, "ghost")) == pod_names(job, 1, 16)
    print(f"API server outage {outage:.1f}s; converged")


def test_pod_deleted_a_little_after_the_restart_is_noticed_too(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("ghost2", [("procs", 8)], ["-m", "train"], kwok=True))
    job = wait_phase(c, namespace, "ghost2", "Running", timeout=120)
    c.restart_apiserver()
    time.sleep(3)
    victim = names.pod_name(job_ref(job), 0, 2)
    c.kubectl("delete", "pod", victim, "-n", namespace, "--grace-period=0", "--force", "--wait=false")
    job = wait_job(c, namespace, "ghost2", lambda j: j["status"].get("restarts") == 1, timeout=CONVERGE,
                   what="a gang restart")
    assert job["status"]["failure"]["pod"] == victim


def test_job_deleted_and_job_created_around_an_outage(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("doomed", [("procs", 4)], ["-m", "train"], kwok=True))
    wait_phase(c, namespace, "doomed", "Running", timeout=120)
    c.restart_apiserver(down_seconds=2)
    c.kubectl("delete", "spmdjob", "doomed", "-n", namespace, "--wait=false")
    apply(c, namespace, job_manifest("newborn", [("procs", 4)], ["-m", "train"], kwok=True))
    # The operator acts on the new job within the resync period; the scheduler, back from the
    # outage on its own back-off, binds the pods when it can.
    wait_until(lambda: len(job_pods(c, namespace, "newborn")) == 4, CONVERGE, "the new job's pods created")
    wait_phase(c, namespace, "newborn", "Running", timeout=120)
    # The deleted job's pods go (garbage collection) and nothing recreates them. The garbage
    # collector of kube-controller-manager, not the operator, deletes them, and after an API server
    # restart it cannot map SPMDJob owners ("unable to get REST mapping") until its periodic
    # re-discovery: that can take longer than the operator's resync, hence its own bound.
    began = time.monotonic()
    wait_until(lambda: not job_pods(c, namespace, "doomed"), GC_AFTER_OUTAGE, "the deleted job's pods gone")
    print(f"the deleted job's pods collected {time.monotonic() - began:.1f}s after the new job ran")
    time.sleep(RESYNC_SECONDS + 2)
    assert not job_pods(c, namespace, "doomed"), "a loop of the deleted job created pods again"


# --- another job's pods ------------------------------------------------------------------------


def test_a_new_job_ignores_the_terminating_pods_of_a_deleted_namesake(running_operator, namespace):
    c = running_operator
    old = job_manifest("reuse", [("procs", 2)], ["-m", "tests.programs.slow_stop", "--stop-seconds", "15"])
    old["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    apply(c, namespace, old)
    first = wait_phase(c, namespace, "reuse", "Running", timeout=120)
    c.kubectl("delete", "spmdjob", "reuse", "-n", namespace, "--wait=false")
    wait_until(lambda: all(p.metadata.deletion_timestamp for p in job_pods(c, namespace, "reuse")), 60,
               "the old pods terminating (checkpointing for 15 s)")
    new = job_manifest("reuse", [("procs", 2)], ["-m", "tests.programs.fail_once", "--rank", "99"],
                       restartPolicy={"maxRestarts": 0})
    apply(c, namespace, new)
    job = wait_phase(c, namespace, "reuse", "Succeeded", timeout=120)
    assert job["metadata"]["uid"] != first["metadata"]["uid"]
    assert job["status"]["restarts"] == 0 and "failure" not in job["status"], job["status"]
    mine = [p for p in job_pods(c, namespace, "reuse") if (p.metadata.labels or {}).get("spmd.monarch.dev/job-uid") == job["metadata"]["uid"]]
    assert sorted(p.metadata.name for p in mine) == pod_names(job, 0, 2)


def test_orphans_of_a_deleted_namesake_are_neither_adopted_nor_deleted(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("orphans", [("procs", 4)], ["-m", "train"], kwok=True))
    first = wait_phase(c, namespace, "orphans", "Running", timeout=120)
    c.kubectl("delete", "spmdjob", "orphans", "-n", namespace, "--cascade=orphan", "--wait=true", timeout=120)
    old_pods = sorted(p.metadata.name for p in job_pods(c, namespace, "orphans"))
    assert old_pods == pod_names(first, 0, 4)
    second = job_manifest("orphans", [("procs", 4)], ["-m", "train"], kwok=True)
    second["spec"]["image"] = "example.com/another-image:2"
    apply(c, namespace, second)
    job = wait_phase(c, namespace, "orphans", "Running", timeout=120)
    assert job["status"]["running"] == 4
    mine = running_pods(c, namespace, "orphans", restart=0)
    by_uid = {}
    for p in mine:
        by_uid.setdefault(p.metadata.labels.get("spmd.monarch.dev/job-uid"), []).append(p)
    own = by_uid[job["metadata"]["uid"]]
    assert sorted(p.metadata.name for p in own) == pod_names(job, 0, 4)
    assert {p.spec.containers[0].image for p in own} == {"example.com/another-image:2"}
    c.kubectl("delete", "spmdjob", "orphans", "-n", namespace, "--wait=true", timeout=120)
    wait_until(lambda: sorted(p.metadata.name for p in job_pods(c, namespace, "orphans")) == old_pods, 120,
               "the new job's pods garbage-collected, the orphans left alone")


# --- repairs ------------------------------------------------------------------------------------


def test_a_deleted_service_and_configmap_are_created_again(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("repair", [("procs", 2)], ["-m", "train"], kwok=True))
    job = wait_phase(c, namespace, "repair", "Running", timeout=120)
    core = client.CoreV1Api(c.api_client())
    ref = job_ref(job)
    service, configmap = names.service_name(ref, 0), builders.installed_payload_configmap()
    old_svc = core.read_namespaced_service(service, namespace).metadata.uid
    old_cm = core.read_namespaced_config_map(configmap, namespace).metadata.uid
    began = time.monotonic()
    c.kubectl("delete", "service", service, "-n", namespace)
    c.kubectl("delete", "configmap", configmap, "-n", namespace)

    def recreated():
        try:
            return (core.read_namespaced_service(service, namespace).metadata.uid != old_svc
                    and core.read_namespaced_config_map(configmap, namespace).metadata.uid != old_cm)
        except client.ApiException:
            return False

    wait_until(recreated, 30, "the Service and the namespace's payload ConfigMap created again")
    print(f"repaired in {time.monotonic() - began:.1f}s")
    job = get_job(c, namespace, "repair")
    assert (job["status"]["phase"], job["status"]["restarts"]) == ("Running", 0), "a repair is not a restart"


# --- restart ordering ---------------------------------------------------------------------------


def _overlap_during_restart(c, namespace, name, policy):
    manifest = job_manifest(name, [("procs", 2)],
                            ["-m", "tests.programs.slow_stop", "--stop-seconds", "6", "--run-seconds", "4"],
                            restartPolicy={"maxRestarts": 1, "podReplacementPolicy": policy, "mode": "RecreatePods"})
    manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    apply(c, namespace, manifest)
    job = wait_phase(c, namespace, name, "Running", timeout=120)
    victim = names.pod_name(job_ref(job), 0, 1)
    seen_both = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            # Pods whose processes may still run: a pod object that has reached Succeeded or
            # Failed can outlive its processes for a moment, which is what the policy allows.
            pods = [p for p in job_pods(c, namespace, name) if p.status.phase not in ("Succeeded", "Failed")]
            attempts = {p.metadata.labels[RESTART] for p in pods}
            if {"0", "1"} <= attempts:
                seen_both.append(time.monotonic())
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    began = time.monotonic()
    c.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
    wait_job(c, namespace, name, lambda j: j["status"].get("restarts") == 1 and j["status"].get("phase") == "Running",
             timeout=120, what="attempt 1 running")
    took = time.monotonic() - began
    stop.set()
    thread.join(5)
    return seen_both, took


def test_the_next_attempt_waits_for_the_old_pods_to_stop(running_operator, namespace):
    c = running_operator
    overlap, took = _overlap_during_restart(c, namespace, "inorder", "Failed")
    assert overlap == [], "pods of two attempts were live at once"
    reasons = [e.reason for e in job_events(c, namespace, "inorder")]
    assert "Restarting" in reasons and "ReplacementTimeout" not in reasons
    print(f"restart with podReplacementPolicy Failed: Running again after {took:.1f}s")


def test_terminating_or_failed_replaces_at_once(running_operator, namespace):
    c = running_operator
    overlap, took = _overlap_during_restart(c, namespace, "atonce", "TerminatingOrFailed")
    assert overlap, "with TerminatingOrFailed the new attempt starts while the old pods still stop"
    print(f"restart with podReplacementPolicy TerminatingOrFailed: Running again after {took:.1f}s")


# --- status quality ----------------------------------------------------------------------------


def test_node_loss_is_a_disruption_with_the_pod_gcs_reason(running_operator, namespace):
    c = running_operator
    core = client.CoreV1Api(c.api_client())
    node = f"kwok-lost-{uuid.uuid4().hex[:6]}"
    core.create_node(fake_node(node, cpu="64", memory="64Gi", pods=100, gpus=0))
    wait_until(lambda: any(x.type == "Ready" and x.status == "True"
                           for x in core.read_node(node).status.conditions or []), 60, "the extra node Ready")
    manifest = job_manifest("nodeloss", [("procs", 2)], ["-m", "train"], kwok=True,
                            restartPolicy={"maxRestarts": 0})
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    manifest["spec"]["template"]["spec"]["tolerations"] = [KWOK_TOLERATION]
    apply(c, namespace, manifest)
    wait_phase(c, namespace, "nodeloss", "Running", timeout=120)
    core.delete_node(node)
    # The pod GC removes pods of a node that is gone (after its 40 s quarantine).
    job = wait_job(c, namespace, "nodeloss", lambda j: j["status"].get("disruptions") == 1, timeout=150,
                   what="a disruption restart")
    failure = job["status"]["failure"]
    assert failure["reason"] == "DeletionByPodGC" and "node no longer exists" in failure["message"], failure
    assert failure["disruption"] is True
    assert job["status"]["phase"] != "Failed", "maxRestarts 0, but a disruption does not count"


def test_conditions_follow_the_generation_of_the_spec(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("gen", [("procs", 2)], ["-m", "train"], kwok=True))
    wait_phase(c, namespace, "gen", "Running", timeout=120)
    c.kubectl("patch", "spmdjob", "gen", "-n", namespace, "--type=merge", "-p", '{"spec":{"activeDeadlineSeconds":86400}}')
    job = wait_job(c, namespace, "gen", lambda j: j["status"].get("observedGeneration") == j["metadata"]["generation"] == 2,
                   timeout=30, what="observedGeneration 2")
    assert {cond["observedGeneration"] for cond in job["status"]["conditions"]} == {2}, job["status"]["conditions"]


def test_deleting_the_namespace_stops_the_job_quietly(running_operator, cluster):
    c = running_operator
    core = client.CoreV1Api(c.api_client())
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": namespace}})
    wait_until(lambda: core.list_namespaced_service_account(namespace).items, 30, "default service account")
    apply(c, namespace, job_manifest("bystander", [("procs", 4)], ["-m", "train"], kwok=True))
    wait_phase(c, namespace, "bystander", "Running", timeout=120)
    log_before = len((c.state_dir / "operator.log").read_text())
    seen = set()
    core.delete_namespace(namespace)

    def gone():
        try:
            for e in core.list_namespaced_event(namespace).items:
                if e.involved_object.kind == "SPMDJob":
                    seen.add((e.type, e.reason))
            core.read_namespace(namespace)
            return False
        except client.ApiException as err:
            return err.status == 404

    wait_until(gone, 120, "the namespace gone")
    assert not {r for t, r in seen if t == "Warning"}, seen
    new_log = [line for line in (c.state_dir / "operator.log").read_text()[log_before:].splitlines() if namespace in line]
    text = "\n".join(new_log)
    assert "403" not in text and "Forbidden" not in text and "reconcile failed" not in text, text[-3000:]


# --- the master's name across a restart ---------------------------------------------------------


def test_a_new_attempt_never_reaches_an_old_attempts_rank_zero(running_operator, namespace):
    """RecreatePods: a new gang gets a new master Service name (in place the pods and the name stay)."""
    c = running_operator
    apply(c, namespace, job_manifest("reroute", [("procs", 3)], ["-m", "tests.programs.master_probe", "--sleep", "20"],
                                     restartPolicy={"maxRestarts": 1, "mode": "RecreatePods"}))

    def first_master_ip():
        return next((p.status.pod_ip for p in job_pods(c, namespace, "reroute")
                     if p.metadata.labels[RESTART] == "0" and p.metadata.labels["spmd.monarch.dev/rank"] == "0"
                     and p.status.pod_ip), None)

    old_master_ip = wait_until(first_master_ip, 120, "attempt 0's rank 0 running")
    job = wait_phase(c, namespace, "reroute", "Succeeded", timeout=240)
    ref = job_ref(job)
    seen = {}
    for pod in job_pods(c, namespace, "reroute"):
        for line in c.pod_log(namespace, pod.metadata.name).splitlines():
            if line.startswith("MASTER "):
                record = json.loads(line[len("MASTER "):])
                seen[(record["restart"], record["rank"])] = record
    second = {r: v for (a, r), v in seen.items() if a == 1}
    assert set(second) == {0, 1, 2}, seen
    for rank, record in second.items():
        assert record["MASTER_ADDR"] == names.master_addr(ref, 1) != names.master_addr(ref, 0)
        assert record["master_ip"] == second[0]["POD_IP"] != old_master_ip, record
    core = client.CoreV1Api(c.api_client())
    services = [s.metadata.name for s in core.list_namespaced_service(namespace).items]
    assert names.service_name(ref, 0) not in services, "the old attempt's name no longer resolves"


def test_an_evicted_pod_restarts_the_gang_without_using_up_max_restarts(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("evicted", [("procs", 4)], ["-m", "train"], kwok=True,
                                     restartPolicy={"maxRestarts": 0}))
    job = wait_phase(c, namespace, "evicted", "Running", timeout=120)
    victim = names.pod_name(job_ref(job), 0, 2)
    core = client.CoreV1Api(c.api_client())
    # What `kubectl drain` does: the Eviction API (it marks the pod DisruptionTarget, then deletes it).
    core.create_namespaced_pod_eviction(victim, namespace, {"apiVersion": "policy/v1", "kind": "Eviction",
                                                            "metadata": {"name": victim, "namespace": namespace}})
    job = wait_job(c, namespace, "evicted", lambda j: j["status"].get("disruptions") == 1, timeout=CONVERGE,
                   what="a disruption restart")
    failure = job["status"]["failure"]
    assert (failure["pod"], failure["reason"], failure["disruption"]) == (victim, "EvictionByEvictionAPI", True), failure
    job = wait_phase(c, namespace, "evicted", "Running", timeout=120)
    assert job["status"]["restarts"] == 1, "maxRestarts 0, and yet the gang came back: a disruption is no failure"


# --- an optional API the chart did not grant blocks only the jobs that name it -------------------


def chart_default_kubeconfig(c, namespace: str) -> tuple[object, list[dict]]:
    """Applies the RBAC the chart renders with its default values (helm template, the real helm
    binary) and returns a kubeconfig logging in as its ServiceAccount (a token), with the objects."""
    import yaml

    from tests.helm.helm_support import CHART, KUBE_VERSION, helm_cmd

    release = f"iso-{uuid.uuid4().hex[:6]}"
    rendered = helm_cmd(c, "template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION,
                        "--set", "tests.enabled=false")
    assert rendered.returncode == 0, rendered.stderr
    rbac = [o for o in yaml.safe_load_all(rendered.stdout)
            if o and o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    c.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(rbac))
    (account,) = [o["metadata"]["name"] for o in rbac if o["kind"] == "ServiceAccount"]
    token = c.kubectl("create", "token", account, "-n", namespace, "--duration", "1h").stdout.strip()
    admin = json.loads(c.kubeconfig.read_text())
    admin["users"] = [{"name": "admin", "user": {"token": token}}]
    path = c.state_dir / f"kubeconfig-{release}"
    path.write_text(json.dumps(admin))
    return path, rbac


def test_a_forbidden_scheduling_api_blocks_only_its_job_while_other_jobs_timers_fire(operator, namespace):
    from devcluster.controlplane import stop_process_group

    c = operator
    c.stop_operator()
    kubeconfig, rbac = chart_default_kubeconfig(c, namespace)
    proc = c.start_replica("chart-rbac", "--resync-seconds", str(RESYNC_SECONDS), kubeconfig=kubeconfig,
                           lease_namespace=namespace)
    try:
        apply(c, namespace, job_manifest("kq", [("procs", 2)], ["-m", "train"], kwok=True,
                                         scheduling={"provider": "Kueue", "queue": "nowhere"}))
        # A deadline past two resync periods: a resync that fails for every job never reaches it.
        apply(c, namespace, job_manifest("timer", [("procs", 2)], ["-m", "train"], kwok=True,
                                         activeDeadlineSeconds=2 * RESYNC_SECONDS + 5))
        job = wait_job(c, namespace, "kq", lambda j: any(
            cnd.get("reason") == "SchedulingForbidden" for cnd in (j.get("status") or {}).get("conditions") or []),
            timeout=60, what="the Kueue job says why it waits")
        created = next(cnd for cnd in job["status"]["conditions"] if cnd["type"] == "Created")
        assert created["status"] == "False" and "gangScheduling.kueue.enabled=true" in created["message"], created
        assert "workloads.kueue.x-k8s.io" in created["message"]
        timer = wait_phase(c, namespace, "timer", "Failed", timeout=2 * RESYNC_SECONDS + 5 + CONVERGE)
        assert timer["status"]["failure"]["reason"] == "DeadlineExceeded"
        assert job_pods(c, namespace, "kq") == [], "no pod of the blocked job"
        warnings = [(e.reason, e.count) for e in job_events(c, namespace, "kq") if e.type == "Warning"]
        assert warnings == [("SchedulingForbidden", 1)], warnings
        assert not [e for e in job_events(c, namespace, "timer") if e.reason == "ReconcileError"]
    finally:
        stop_process_group(proc, 10)
        for obj in rbac:
            if obj["kind"].startswith("Cluster"):
                c.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found", check=False)
        c.start_operator(*operator_args())


# --- bounded memory: nothing of a deleted job stays ----------------------------------------------


def cache_entries(port: int) -> dict[str, float]:
    """spmdjob_cache_entries by "informer/kind", read from the operator's /metrics."""
    import re
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:  # still starting
        return {}
    out = {}
    for match in re.finditer(r'^spmdjob_cache_entries\{informer="([^"]+)",kind="([^"]+)"\} (\S+)$', text, re.M):
        out[f"{match.group(1)}/{match.group(2)}"] = float(match.group(3))
    return out


def test_200_jobs_created_and_deleted_leave_the_caches_at_their_baseline(running_operator, namespace):
    c = running_operator
    args = c.operator_process.args
    port = int(args[args.index("--metrics-port") + 1])
    baseline = wait_until(lambda: cache_entries(port), 60, "the operator's metrics")
    jobs = [job_manifest(f"m{i}", [("procs", 1)], ["-m", "train"], kwok=True) for i in range(200)]
    c.kubectl("apply", "-n", namespace, "-f", "-", timeout=180,
              input="\n---\n".join(json.dumps(j) for j in jobs))
    # (Jobs of earlier tests may still be going away meanwhile: the baseline only shrinks.)
    peak = wait_until(lambda: (m := cache_entries(port)).get("pods/objects", 0) >= 200 and m, 300,
                      "every job's pod in the pod informer")
    assert peak["controller/jobs"] >= 200
    c.kubectl("delete", "spmdjob", "--all", "-n", namespace, "--wait=false", timeout=120)

    # The namespace's payload ConfigMap is no job's child: the operator keeps it for its grace
    # after the last job (--payload-grace-seconds, 300 s by default), so it may be the one entry
    # more in the ConfigMap informer (one group, one object). Deleted, it leaves nothing behind.
    payload = {"configmaps/jobs": 1, "configmaps/objects": 1}
    grown: dict[str, tuple[float, float]] = {}

    def settled(allowed: dict[str, int]):
        now = cache_entries(port)
        grown.clear()
        grown.update({k: (baseline.get(k, 0), v) for k, v in now.items() if v > baseline.get(k, 0) + allowed.get(k, 0)})
        return now if now and not grown else None

    try:
        after = wait_until(lambda: settled(payload), GC_AFTER_OUTAGE + 60,
                           "every store, tombstone and job entry back at the baseline, but the payload's")
        c.kubectl("delete", "configmap", "-n", namespace, "-l", names.LABEL_PAYLOAD, timeout=60)
        final = wait_until(lambda: settled({}), 60, "the payload ConfigMap's entry gone too")
    except AssertionError as e:
        raise AssertionError(f"{e}; grown (baseline, now): {grown}") from None
    print(f"cache entries: baseline {baseline}, peak {peak}, after the jobs {after}, after the payload {final}")
