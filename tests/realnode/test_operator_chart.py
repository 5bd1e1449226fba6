"""The Helm chart on real nodes: the operator image in a container, its probes, its hardening.

`installed_chart` ran `helm install --wait` with the locally built operator image
(pullPolicy IfNotPresent) and tolerations/nodeSelector for the real nodes; the operator then
talks to the API server from its pod with its ServiceAccount token, as on any cluster.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.realnode.conftest import (OPERATOR_IMAGE, OPERATOR_NAMESPACE, RELEASE, VERSION, helm,
                                     operator_pod)

pytestmark = pytest.mark.cluster

# What the operator container sees of itself, read inside it with `kubectl exec`.
SELF_CHECK = r"""
import errno, json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
def can_write(path):
    try:
        with open(os.path.join(path, ".probe"), "w") as f:
            f.write("x")
        os.unlink(os.path.join(path, ".probe"))
        return "ok"
    except OSError as err:
        return errno.errorcode[err.errno]
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
                  "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
                  "root": can_write("/"), "usr": can_write("/usr"), "tmp": can_write("/tmp")}))
"""


def test_operator_runs_on_a_real_node_and_its_probes_pass(real_cluster, installed_chart):
    pod = operator_pod(real_cluster)
    assert pod.spec.node_name.startswith("real-node-"), pod.spec.node_name
    [status] = pod.status.container_statuses
    assert status.image.endswith(f"{OPERATOR_IMAGE}:{VERSION}"), status.image
    assert status.ready and status.state.running, status
    assert status.restart_count == 0, "the liveness probe restarted the operator"
    ready = {c.type: c.status for c in pod.status.conditions}
    assert ready["Ready"] == "True" and ready["ContainersReady"] == "True", ready
    # The endpoint the kubelet probes answers over the pod network (the host routes to pods).
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8080/healthz", timeout=10) as resp:
        assert resp.status == 200


def test_operator_container_is_non_root_read_only_and_without_capabilities(real_cluster,
                                                                          installed_chart):
    pod = operator_pod(real_cluster)
    result = real_cluster.kubectl("exec", "-n", OPERATOR_NAMESPACE, pod.metadata.name,
                                  "-c", "operator", "--", "python", "-c", SELF_CHECK)
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert (seen["uid"], seen["gid"]) == (65532, 65532), seen
    assert int(seen["cap_eff"], 16) == 0 and int(seen["cap_bnd"], 16) == 0, seen  # drop: [ALL]
    assert seen["no_new_privs"] == "1", seen  # allowPrivilegeEscalation: false
    assert seen["seccomp"] == "2", seen  # RuntimeDefault: a seccomp filter is on
    assert seen["root"] == "EROFS" and seen["usr"] == "EROFS", seen  # readOnlyRootFilesystem
    assert seen["tmp"] == "ok", seen  # the chart's emptyDir
    # The kubelet reports the same: no restart, and the spec the API server kept.
    sc = pod.spec.containers[0].security_context
    assert sc.read_only_root_filesystem and sc.run_as_non_root
    assert sc.capabilities.drop == ["ALL"]


def test_helm_test_passes_on_real_nodes(real_cluster, installed_chart):
    result = helm(real_cluster, "test", RELEASE, "-n", OPERATOR_NAMESPACE, "--logs",
                  "--timeout", "8m")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "Succeeded" in out and "passed (job deleted)" in out, out
