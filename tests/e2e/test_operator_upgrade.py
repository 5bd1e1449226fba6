"""End-to-end: `helm upgrade` of the chart under running jobs is invisible to them.

The chart (the real helm binary) installs the operator in the test's namespace, watching it, with
Kueue and Volcano granted; its pods run on the process node as ``python -m spmd_operator`` from
this checkout (see tests/helm/test_helm_upgrade.py). A Kueue job (real Kueue), a PodGroup job and a
plain job run (tests/e2e/survival.py); the upgrade rolls the Deployment (a new pod annotation):
the old pod gets SIGTERM and hands its Lease over, a new pod starts, lists, and takes over. Every
job keeps its pods (uids), phase and restart count, and gets no new Event.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e import survival
from tests.e2e.conftest import operator_args, wait_until
from tests.helm.helm_support import CHART, helm_cmd, wait_for_lease_holder

pytestmark = pytest.mark.cluster
OPERATOR_PODS = "app.kubernetes.io/component=operator,app.kubernetes.io/instance=spmd"
LEASE = "spmd-monarch-spmd"


def operator_pods(c, namespace: str) -> list[dict]:
    return json.loads(c.kubectl("get", "pods", "-n", namespace, "-l", OPERATOR_PODS, "-o", "json").stdout)["items"]


@pytest.fixture
def chart_namespace(running_operator, namespace):
    """The test's namespace, where the chart's operator will run; the session's operator is
    stopped meanwhile (one operator per job), and started again afterwards."""
    c = running_operator
    c.stop_operator()
    try:
        yield namespace
    finally:
        helm_cmd(c, "uninstall", "spmd", "-n", namespace, "--wait", "--timeout", "60s")
        c.start_operator(*operator_args())


def test_helm_upgrade_is_invisible_to_running_jobs(running_operator, kueue_queues, podgroup_crds, chart_namespace):
    c, namespace = running_operator, chart_namespace
    install = helm_cmd(c, "install", "spmd", str(CHART), "-n", namespace, "--set", f"watchNamespaces={{{namespace}}}",
                       "--set", "gangScheduling.kueue.enabled=true", "--set", "gangScheduling.volcano.enabled=true",
                       "--set", "tests.enabled=false", "--wait", "--timeout", "120s")
    assert install.returncode == 0, install.stdout + install.stderr
    (old,) = operator_pods(c, namespace)
    wait_for_lease_holder(c, namespace, LEASE)
    before = survival.start_jobs(c, namespace, kueue_queues.create(cpu="4"))
    seen = survival.reasons(c, namespace)

    upgrade = helm_cmd(c, "upgrade", "spmd", str(CHART), "-n", namespace, "--reuse-values",
                       "--set-string", "podAnnotations.rollout=upgrade", "--wait", "--timeout", "120s")
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
    lease = wait_for_lease_holder(c, namespace, LEASE, other_than=old["metadata"]["name"], timeout=90)
    new = lease["spec"]["holderIdentity"]
    wait_until(lambda: new in {p["metadata"]["name"] for p in operator_pods(c, namespace)}, 30, "the new leader's pod")
    survival.watch_unchanged(c, namespace, before, seconds=20)
    after = survival.reasons(c, namespace)
    for name in survival.JOBS:
        assert after[name][:len(seen[name])] == seen[name] and after[name][len(seen[name]):] == [], \
            f"{name}: new Events {after[name][len(seen[name]):]}"
