"""End-to-end: rules on updates and across upgrades, against the real API server.

* Immutable where a Job's template is: a pod-shaping field (masterPort here) of a Pending or
  Running job is refused on update, naming the field; the same update passes once the job is
  suspended (the CRD's transition rules).
* Upgrades never fail admitted jobs: a job stored while the CRD lacked this version's newer rules
  (an older CRD is applied: the current one without them), running, and then breaking them, keeps
  its pods and phase when the current CRD is applied and the operator restarted; one Warning Event
  says so and ``status.specWarnings`` lists what it breaks; the API server keeps accepting the
  operator's status writes and the user's other updates (validation ratcheting), while a new job
  with the same spec is refused.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
import yaml
from kubernetes import client

from monarch_spmd import crd as crdmod
from monarch_spmd import schema
from monarch_spmd import spec as specmod
from tests.e2e.conftest import (
    GROUP,
    PLURAL,
    VERSION,
    apply,
    get_job,
    job_events,
    job_manifest,
    job_pods,
    operator_args,
    wait_job,
    wait_phase,
    wait_until,
)

pytestmark = pytest.mark.cluster


def patch(cluster, namespace, name, body, check=False):
    return cluster.kubectl("patch", "spmdjob", name, "-n", namespace, "--type", "merge", "-p", json.dumps(body),
                           check=check)


def test_a_pod_shaping_field_changes_only_while_the_job_is_suspended(running_operator, namespace):
    c = running_operator
    apply(c, namespace, job_manifest("frozen", [("procs", 2)], ["-m", "train"], kwok=True))
    wait_phase(c, namespace, "frozen", "Running", timeout=60)
    refused = patch(c, namespace, "frozen", {"spec": {"masterPort": 29501}})
    assert refused.returncode != 0, refused.stdout
    assert "spec.masterPort" in refused.stderr and "suspend" in refused.stderr, refused.stderr
    assert get_job(c, namespace, "frozen")["spec"]["masterPort"] == 29500
    # Fields that do not shape the pods change at any time.
    assert patch(c, namespace, "frozen", {"spec": {"activeDeadlineSeconds": 3600}}).returncode == 0

    assert patch(c, namespace, "frozen", {"spec": {"suspend": True}}).returncode == 0
    wait_phase(c, namespace, "frozen", "Suspended", timeout=60)
    changed = patch(c, namespace, "frozen", {"spec": {"masterPort": 29501}})
    assert changed.returncode == 0, changed.stderr
    assert patch(c, namespace, "frozen", {"spec": {"suspend": False}}).returncode == 0
    wait_phase(c, namespace, "frozen", "Running", timeout=60)
    ports = {pod.metadata.name: [e.value for e in pod.spec.containers[0].env if e.name == "MONARCH_SPMD_MASTER_PORT"]
             for pod in job_pods(c, namespace, "frozen") if not pod.metadata.deletion_timestamp}
    assert ports and all(v == ["29501"] for v in ports.values()), ports


def newer_rules() -> set[str]:
    """The CEL text of the rules this version added: the policies and the pod-shaping freeze."""
    return {r.cel() for _, node in schema.walk(specmod.ROOT) for r in node.rules
            if r.policy or isinstance(r, specmod.FrozenUnlessSuspended)}


def older_crd() -> dict[str, Any]:
    """The current CRD without this version's newer rules: what a cluster upgraded from the
    previous version still serves until `kubectl apply --server-side -f crds/` is run."""
    body = crdmod.crd()
    drop = newer_rules()
    assert drop, "no newer rule to take away: the test would prove nothing"

    def strip(node: Any) -> None:
        if isinstance(node, dict):
            rules = node.get("x-kubernetes-validations")
            if rules is not None:
                kept = [r for r in rules if r["rule"] not in drop]
                if kept:
                    node["x-kubernetes-validations"] = kept
                else:
                    del node["x-kubernetes-validations"]
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)

    strip(body)
    return body


def apply_crd(cluster, body: dict[str, Any]) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(body))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{PLURAL}.{GROUP}")


def accepted(cluster, namespace: str, doc: dict[str, Any]) -> tuple[bool, str]:
    api = client.CustomObjectsApi(cluster.api_client())
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc, dry_run="All", field_validation="Strict")
        return True, ""
    except client.ApiException as e:
        return False, json.loads(e.body).get("message", "")


#: What the newer rules refuse: a /dev/shm of size 0, the trainer setting RANK.
BREAKING = {"shmSize": "0", "template": {"spec": {"containers": [
    {"name": "trainer", "env": [{"name": "RANK", "value": "5"}]}]}}}


def test_a_job_admitted_before_newer_rules_keeps_running_across_the_crd_upgrade_and_an_operator_restart(
        running_operator, namespace):
    c = running_operator
    apply_crd(c, older_crd())
    try:
        manifest = job_manifest("legacy", [("procs", 2)], ["-m", "train"], kwok=True)
        apply(c, namespace, manifest)
        wait_phase(c, namespace, "legacy", "Running", timeout=60)
        # Under the older CRD the spec may change to what the newer rules refuse (the freeze and the
        # policies are both newer): the job, admitted and running, now breaks them.
        spec = copy.deepcopy(BREAKING)
        spec["template"]["spec"]["tolerations"] = manifest["spec"]["template"]["spec"]["tolerations"]
        spec["template"]["spec"]["nodeSelector"] = manifest["spec"]["template"]["spec"]["nodeSelector"]
        wait_until(lambda: patch(c, namespace, "legacy", {"spec": spec}).returncode == 0, 30,
                   "the older CRD's rules in force (the API server reloads a CRD's validation shortly after)")
        job = wait_job(c, namespace, "legacy", lambda j: (j.get("status") or {}).get("specWarnings"), 30,
                       "the running operator said what the job breaks")
        assert job["status"]["phase"] == "Running"
        uids = sorted(p.metadata.uid for p in job_pods(c, namespace, "legacy"))
        assert len(uids) == 2

        c.install_crds()  # the current CRD, as `kubectl apply --server-side -f crds/` after an upgrade
        fresh = copy.deepcopy(get_job(c, namespace, "legacy"))
        fresh = {"apiVersion": fresh["apiVersion"], "kind": fresh["kind"], "metadata": {"name": "newcomer"},
                 "spec": fresh["spec"]}
        wait_until(lambda: not accepted(c, namespace, fresh)[0], 30, "the current CRD's rules in force")
        ok, message = accepted(c, namespace, fresh)
        assert "spec.shmSize" in message and "RANK" in message, message

        c.stop_operator()
        c.start_operator(*operator_args())
        time.sleep(10)  # several passes of the new operator (the resync period is 10 s)
        job = get_job(c, namespace, "legacy")
        st = job["status"]
        assert (st["phase"], st["restarts"]) == ("Running", 0), st
        assert sorted(p.metadata.uid for p in job_pods(c, namespace, "legacy")) == uids, "the same pods"
        assert any("spec.shmSize" in w for w in st["specWarnings"]), st["specWarnings"]
        assert any("RANK is reserved" in w for w in st["specWarnings"]), st["specWarnings"]
        warned = [e for e in job_events(c, namespace, "legacy") if e.reason == "OutdatedSpec"]
        assert len(warned) == 1 and (warned[0].count or 1) == 1, [(e.message, e.count) for e in warned]
        assert "keeps running" in warned[0].message
        # Ratcheting: the user may still change what the newer rules allow.
        updated = patch(c, namespace, "legacy", {"spec": {"activeDeadlineSeconds": 7200}})
        assert updated.returncode == 0, updated.stderr
        assert not [e for e in job_events(c, namespace, "legacy") if e.reason in ("InvalidSpec", "ReconcileError")]
    finally:
        c.install_crds()
