"""End-to-end: every refusal of a job's children by the API server is visible, named and acted on.

The real API server's own admission refuses the children: a ResourceQuota (``pods: 1`` under a
2-proc job; ``services: 0``, which refuses the master Service), Pod Security admission (a namespace labelled ``pod-security.kubernetes.io/enforce:
restricted``; kube-apiserver 1.34 enables the PodSecurity plugin by default, and its refusal here
is the proof), and pod validation (a template quantity no pod may have). What a user sees is
checked: ``status.reason``/``message`` (``kubectl get -o wide``), ``monarch-spmd status``, Warning
Events (one per distinct refusal, however many retries), and what the operator does: retries with
back-off, releases an incomplete gang after lifecycle.refusal.RELEASE_SECONDS without using up a
restart, runs once the quota allows, fails an invalid template naming the SPMDJob's field and
drops its Service. The examples and the chart's test job pass ``restricted``.
The CRD carries Kubernetes' PodTemplateSpec: a misspelled field anywhere under ``spec.template``
is refused at ``kubectl apply`` naming it (as ``monarch-spmd validate`` refuses it offline), and
the operator creates pods with field validation Strict, so that what the CRD takes and the Pod
API does not fails the job (InvalidSpec) naming the SPMDJob's field, never a pod without it.
A container that cannot start is timed from when it was first seen, kept across an operator restart.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import subprocess
import sys
import time

import pytest
import yaml
from kubernetes import client

from devcluster.localcluster import REPO_ROOT
from monarch_spmd import spec as specmod
from monarch_spmd import validate
from spmd_operator import builders, errors, kube, names
from spmd_operator.lifecycle import refusal
from tests.e2e.conftest import (
    apply,
    get_job,
    job_events,
    job_manifest,
    job_pods,
    job_ref,
    operator_args,
    wait_job,
    wait_phase,
    wait_until,
)
from tests.unit.test_pod_template import MISSPELLINGS

pytestmark = pytest.mark.cluster


def status_of(job):
    return job.get("status") or {}


def warnings(cluster, namespace, name, reason):
    return [e for e in job_events(cluster, namespace, name) if e.type == "Warning" and e.reason == reason]


def set_quota(cluster, namespace, pods):
    core = client.CoreV1Api(cluster.api_client())
    body = {"metadata": {"name": "q1"}, "spec": {"hard": {"pods": str(pods)}}}
    try:
        core.replace_namespaced_resource_quota("q1", namespace, {**body, "metadata": {
            **body["metadata"], "resourceVersion": core.read_namespaced_resource_quota("q1", namespace).metadata.resource_version}})
    except client.ApiException as e:
        if e.status != 404:
            raise
        core.create_namespaced_resource_quota(namespace, body)
    # Quota admission refuses everything until the quota controller has written status.hard.
    wait_until(lambda: (core.read_namespaced_resource_quota("q1", namespace).status.hard or {}).get("pods") == str(pods),
               30, "the ResourceQuota's status written by kube-controller-manager")


def test_a_quota_refusal_is_named_announced_once_retried_and_an_incomplete_gang_released(running_operator, namespace):
    c = running_operator
    set_quota(c, namespace, 1)
    began = time.monotonic()
    apply(c, namespace, job_manifest("quota", [("procs", 2)], ["-m", "train"], kwok=True))
    job = wait_job(c, namespace, "quota", lambda j: status_of(j).get("reason") == "QuotaExceeded", 30,
                   "status.reason QuotaExceeded")
    print(f"QuotaExceeded in status {time.monotonic() - began:.1f}s after the apply")
    st = status_of(job)
    assert st["phase"] == "Pending"
    # The two pods are created at once: either may be the one the quota refuses.
    refused = [f"pod {names.pod_name(job_ref(job), 0, r)} (rank {r}) refused by ResourceQuota q1 of namespace "
               f"{namespace}: pods: requested 1, used 1, limited 1" for r in (0, 1)]
    assert any(text in st["message"] for text in refused), st["message"]
    assert "1/2 pods created" in st["message"]
    assert (st["refusal"]["reason"], st["refusal"]["kind"], st["refusal"]["code"]) == ("QuotaExceeded", "Pod", 403)
    wide = c.kubectl("get", "spmdjob", "quota", "-n", namespace, "-o", "wide").stdout
    assert "QuotaExceeded" in wide and "ResourceQuota q1" in wide, wide
    shown = subprocess.run([sys.executable, "-m", "monarch_spmd.cli", "status", "-n", namespace, "--kubeconfig",
                            str(c.kubeconfig)], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert "QuotaExceeded" in shown.stdout, shown.stdout + shown.stderr

    # Retried with back-off, announced once: the Event is not repeated (nor counted up) per retry.
    job = wait_job(c, namespace, "quota", lambda j: int(status_of(j).get("refusal", {}).get("retries") or 0) >= 3, 40,
                   "three refusals in a row")
    [event] = warnings(c, namespace, "quota", "QuotaExceeded")
    assert (event.count or 1) == 1 and "ResourceQuota q1" in event.message, event

    # Held for RELEASE_SECONDS without the whole gang: the created pod goes, no restart is used.
    job = wait_job(c, namespace, "quota", lambda j: int(status_of(j).get("refusal", {}).get("releases") or 0) >= 1,
                   refusal.RELEASE_SECONDS + 30, "the incomplete gang released")
    wait_until(lambda: not [p for p in job_pods(c, namespace, "quota") if not p.metadata.deletion_timestamp], 30,
               "the released pod gone")
    st = status_of(get_job(c, namespace, "quota"))
    assert (st["phase"], st["restarts"]) == ("Pending", 0), st
    assert "released the incomplete gang 1 time(s)" in st["message"], st["message"]
    assert warnings(c, namespace, "quota", "GangReleased")

    # The quota allows the gang now: the next try creates it whole.
    set_quota(c, namespace, 2)
    job = wait_phase(c, namespace, "quota", "Running", timeout=refusal.RELEASE_WAIT_SECONDS[0] + 40)
    assert "refusal" not in status_of(job)
    assert status_of(job)["restarts"] == 0
    created = next(x for x in status_of(job)["conditions"] if x["type"] == "Created")
    assert created["status"] == "True", created


def test_a_refused_service_is_named_and_holds_the_pods_back(running_operator, namespace):
    c = running_operator
    core = client.CoreV1Api(c.api_client())
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "no-services"}, "spec": {"hard": {"services": "0"}}})
    wait_until(lambda: (core.read_namespaced_resource_quota("no-services", namespace).status.hard or {}).get("services") == "0",
               30, "the ResourceQuota's status written by kube-controller-manager")
    apply(c, namespace, job_manifest("nosvc", [("procs", 2)], ["-m", "train"], kwok=True))
    job = wait_job(c, namespace, "nosvc", lambda j: status_of(j).get("reason") == "QuotaExceeded", 30,
                   "status.reason QuotaExceeded")
    st = status_of(job)
    service = names.service_name(job_ref(job), 0)
    assert f"Service {service} refused by ResourceQuota no-services of namespace {namespace}: services: requested 1" \
        in st["message"], st["message"]
    assert st["refusal"]["kind"] == "Service"
    assert job_pods(c, namespace, "nosvc") == [], "no pod goes without its master Service"
    core.delete_namespaced_resource_quota("no-services", namespace)
    job = wait_phase(c, namespace, "nosvc", "Running", timeout=60)
    assert "refusal" not in status_of(job)


RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}


def label(cluster, namespace, labels):
    client.CoreV1Api(cluster.api_client()).patch_namespace(namespace, {"metadata": {"labels": labels}})


def test_pod_security_refusal_names_the_level_and_the_fields_and_a_compliant_job_runs(running_operator, namespace):
    c = running_operator
    label(c, namespace, RESTRICTED)
    apply(c, namespace, job_manifest("open", [("procs", 2)], ["-m", "train"], kwok=True))
    job = wait_job(c, namespace, "open", lambda j: status_of(j).get("reason") == "PodSecurity", 30,
                   "status.reason PodSecurity")
    message = status_of(job)["message"]
    assert '"restricted:latest"' in message and f"namespace {namespace}" in message, message
    assert "0/2 pods created" in message
    # The kwok manifest has no trainer container in its template: the message says where to add it.
    assert "spec.template.spec.containers[] (add a container named trainer) must set securityContext" in message
    assert "allowPrivilegeEscalation=false" in message and "seccompProfile" in message
    [event] = warnings(c, namespace, "open", "PodSecurity")
    assert "restricted" in event.message
    assert job_pods(c, namespace, "open") == []
    assert status_of(job)["phase"] == "Pending"

    # docs/pod-security.md's securityContext: the same job passes.
    compliant = job_manifest("closed", [("procs", 2)], ["-m", "train"], kwok=True)
    compliant["spec"]["template"]["spec"].update(RESTRICTED_POD)
    compliant["spec"]["template"]["spec"]["containers"] = [{"name": "trainer", "securityContext": RESTRICTED_CONTAINER}]
    apply(c, namespace, compliant)
    job = wait_phase(c, namespace, "closed", "Running", timeout=60)
    assert "refusal" not in status_of(job)


#: What docs/pod-security.md asks of a job in a `restricted` namespace.
RESTRICTED_POD = {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                      "seccompProfile": {"type": "RuntimeDefault"}}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _example_jobs():
    for path in sorted((REPO_ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == specmod.KIND:
                yield path.name, doc


def _chart_test_job(cluster) -> dict:
    """The SPMDJob the chart's `helm test` pod creates, as `helm template` renders it."""
    rendered = subprocess.run([str(cluster.bin_dir / "helm"), "template", "t", str(REPO_ROOT / "helm" / "monarch-spmd"), "--show-only",
                               "templates/tests/spmdjob-test.yaml"], capture_output=True, text=True, check=True,
                              env=cluster.env, timeout=60).stdout
    for doc in yaml.safe_load_all(rendered):
        if doc and doc.get("kind") == "Pod":
            env = {e["name"]: e.get("value") for e in doc["spec"]["containers"][0]["env"]}
            job = json.loads(env["SPMD_TEST_JOB_MANIFEST"])
            job["metadata"]["name"] = "chart-test"
            return job
    raise AssertionError("the chart's test pod was not rendered")


def test_the_examples_and_the_charts_test_job_pass_pod_security_restricted(operator, namespace):
    """Every pod the operator would build from them is admitted by a `restricted` namespace."""
    c = operator
    label(c, namespace, RESTRICTED)
    core = client.CoreV1Api(c.api_client())
    jobs = [*_example_jobs(), ("helm test", _chart_test_job(c))]
    assert len(jobs) >= 7
    # The GPU example names the priority class a cluster would define for training.
    priorities = {doc["spec"].get("template", {}).get("spec", {}).get("priorityClassName") for _, doc in jobs} - {None}
    scheduling = client.SchedulingV1Api(c.api_client())
    made = []
    for name in priorities:
        try:
            scheduling.create_priority_class({"metadata": {"name": name}, "value": 1000})
            made.append(name)
        except client.ApiException as e:
            if e.status != 409:
                raise
    refused = []
    try:
        for where, doc in jobs:
            parsed = specmod.load_manifest(doc, require_image=True)
            ref = names.JobRef(parsed.name, namespace, "0123456789abcdef-0000-4000-8000-000000000000")
            pod = builders.build_pod(ref, parsed.spec, 0, 0)
            try:
                core.create_namespaced_pod(namespace, pod, dry_run="All")
            except client.ApiException as e:
                refused.append(f"{where} ({parsed.name}): {json.loads(e.body).get('message')}")
    finally:
        for name in made:
            scheduling.delete_priority_class(name)
    assert not refused, "\n".join(refused)
    # The control: the same pods without the examples' security contexts are refused.
    bare = specmod.load_manifest(jobs[0][1], require_image=True).spec
    bare = dataclasses.replace(bare, template={})
    with pytest.raises(client.ApiException) as info:
        core.create_namespaced_pod(namespace, builders.build_pod(
            names.JobRef("bare", namespace, "0123456789abcdef-0000-4000-8000-000000000000"), bare, 0, 0), dry_run="All")
    assert "violates PodSecurity" in info.value.body


def test_an_invalid_template_fails_naming_the_jobs_field_and_drops_its_service(running_operator, namespace):
    c = running_operator
    manifest = job_manifest("bad", [("procs", 2)], ["-m", "train"], kwok=True)
    manifest["spec"]["template"]["spec"]["containers"] = [
        {"name": "side", "image": "busybox"},
        {"name": "trainer", "resources": {"limits": {"memory": "-1"}}}]
    apply(c, namespace, manifest)
    job = wait_phase(c, namespace, "bad", "Failed", timeout=60)
    st = status_of(job)
    assert st["reason"] == "InvalidSpec"
    assert 'spec.template.spec.containers[1].resources.limits.memory: Invalid value: "-1"' in st["failure"]["message"], \
        st["failure"]["message"]
    ref = job_ref(job)
    core = client.CoreV1Api(c.api_client())

    def service():
        return names.service_name(ref, 0) in [s.metadata.name for s in core.list_namespaced_service(namespace).items]

    wait_until(lambda: not service(), 30, "the failed job's Service deleted")
    assert job_pods(c, namespace, "bad") == [] or all(p.metadata.deletion_timestamp for p in job_pods(c, namespace, "bad"))


def test_a_start_failure_is_timed_from_when_it_was_seen_and_survives_an_operator_restart(running_operator, namespace):
    """The kubelet's part is played by a status patch: the pod is unschedulable, so no kubelet owns it."""
    c = running_operator
    manifest = job_manifest("pull", [("procs", 2)], ["-m", "train"], kwok=True)
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {"type": "no-such-node"}
    apply(c, namespace, manifest)
    job = wait_job(c, namespace, "pull", lambda j: status_of(j).get("reason") == "Unschedulable", 60, "Unschedulable")
    pod0 = names.pod_name(job_ref(job), 0, 0)
    core = client.CoreV1Api(c.api_client())
    core.patch_namespaced_pod_status(pod0, namespace, {"status": {"containerStatuses": [{
        "name": names.CONTAINER_NAME, "image": "python:3.11-slim", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ErrImagePull", "message": "registry unavailable: 503"}}}]}})
    job = wait_job(c, namespace, "pull", lambda j: pod0 in (status_of(j).get("startFailures") or {}), 30,
                   "status.startFailures records the pod")
    since = status_of(job)["startFailures"][pod0]["since"]
    assert status_of(job)["phase"] == "Pending", "a pull error does not fail the job at once"
    c.stop_operator()
    time.sleep(2)
    c.start_operator(*operator_args())
    time.sleep(8)  # a few passes of the new operator
    job = get_job(c, namespace, "pull")
    assert status_of(job)["startFailures"][pod0]["since"] == since, "the operator restart did not reset the clock"
    assert status_of(job)["phase"] == "Pending"
    # The problem clears (the container waits for another reason): it is forgotten.
    core.patch_namespaced_pod_status(pod0, namespace, {"status": {"containerStatuses": [{
        "name": names.CONTAINER_NAME, "image": "python:3.11-slim", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ContainerCreating"}}}]}})
    wait_job(c, namespace, "pull", lambda j: not status_of(j).get("startFailures"), 30, "startFailures cleared")


# --- the typed pod template: nothing under spec.template is dropped without a word ----------------


def test_a_misspelled_template_field_is_refused_at_apply_naming_it(operator, namespace):
    """The same ten misspellings `monarch-spmd validate` refuses (tests/unit/test_pod_template.py)."""
    c = operator
    for name, doc, path in MISSPELLINGS:
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = f"typo-{name}"
        result = apply(c, namespace, doc, check=False)
        assert result.returncode != 0, f"{name}: kubectl apply took {path}"
        assert f'unknown field "{path}"' in result.stderr, result.stderr
        _, offline = validate.check_manifest(doc)
        assert [e.field for e in offline] == [path], offline
        print(f"{name}: offline: {offline[0]}\n    server: {result.stderr.strip().splitlines()[-1]}")
    assert c.kubectl("get", "spmdjobs", "-n", namespace, "-o", "name").stdout.strip() == ""


def test_the_examples_and_the_charts_test_job_still_apply(operator, namespace):
    c = operator
    jobs = [*_example_jobs(), ("helm test", _chart_test_job(c))]
    for where, doc in jobs:
        doc["metadata"].pop("namespace", None)  # the chart's is the release's
        result = c.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False)
        assert result.returncode == 0, f"{where}: {result.stderr}"


def test_pods_are_created_strictly_and_a_field_the_pod_api_does_not_know_is_named_in_the_jobs_terms(
        operator, namespace, monkeypatch):
    """A field the CRD takes and the Pod API does not (on a cluster older than the CRD's schema) is
    refused at the pod's create, as a strict create refuses any unknown field of the pod it builds."""
    c = operator
    monkeypatch.setenv("KUBECONFIG", str(c.kubeconfig))
    parsed = specmod.load_manifest(job_manifest("strict", [("procs", 1)], ["-m", "train"], kwok=True), require_image=True)
    parsed = dataclasses.replace(parsed.spec, template={"spec": {**parsed.spec.template["spec"], "containers": [
        {"name": "side", "image": "busybox"}, {"name": "trainer"}]}})
    ref = names.JobRef("strict", namespace, "0123456789abcdef-0000-4000-8000-000000000000")
    pod = builders.build_pod(ref, parsed, 0, 0)
    trainer = [i for i, ctr in enumerate(pod["spec"]["containers"]) if ctr["name"] == "trainer"][0]
    pod["spec"]["containers"][trainer]["resoures"] = {"limits": {"cpu": "1"}}

    async def create() -> BaseException:
        api = kube.Kube(kube.login())
        try:
            with pytest.raises(kube.KubeError) as info:
                await api.create(kube.pods_url(namespace), pod, keep=False)
            return info.value
        finally:
            await api.close()

    error = asyncio.run(create())
    assert isinstance(error, kube.KubeError) and error.status == 400, error
    assert f"spec.containers[{trainer}].resoures: unknown field" in error.message, error.message
    verdict = refusal.classify(errors.refusal_of(error, pod, 0), parsed, ref, 0)
    assert verdict.reason == "InvalidSpec" and verdict.permanent
    assert "spec.template.spec.containers[1].resoures: unknown field" in verdict.message, verdict.message
    assert not [p for p in client.CoreV1Api(c.api_client()).list_namespaced_pod(namespace).items]


def test_a_template_the_crd_takes_and_the_pod_api_refuses_fails_the_job_naming_the_field(running_operator, namespace):
    c = running_operator
    manifest = job_manifest("refused", [("procs", 2)], ["-m", "train"], kwok=True)
    manifest["spec"]["template"]["spec"]["containers"] = [{"name": "side", "image": "busybox", "resources": {
        "requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}]
    _, offline = validate.check_manifest(manifest)
    assert offline == []  # the schema's types hold; only the Pod API relates a request to its limit
    apply(c, namespace, manifest)
    job = wait_phase(c, namespace, "refused", "Failed", timeout=60)
    st = status_of(job)
    assert st["reason"] == "InvalidSpec"
    assert 'spec.template.spec.containers[0].resources.requests: Invalid value: "2"' in st["failure"]["message"], \
        st["failure"]["message"]
    wait_until(lambda: not [p for p in job_pods(c, namespace, "refused") if not p.metadata.deletion_timestamp], 30,
               "no pod of the refused job left")
