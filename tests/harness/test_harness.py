"""Tests of the test cluster itself (devcluster/): what a user of kubectl would see.

They run against the session's real cluster (the `cluster` fixture of tests/conftest.py): nodes
Ready, pods on the process node running real processes with the downward API, ConfigMap volumes,
their own IPs, cluster names of headless services, service-account access to the API server,
exit codes and termination messages, restarts and init containers, SIGTERM on deletion, garbage
collection by the controller-manager, and kwok pods Running without processes. One test starts a
second cluster to time a warm start and to check that stopping it leaves no process, network
namespace or bridge behind.

    python3 -m pytest tests/harness -q -p no:cacheprovider
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from devcluster import KWOK_TOLERATION, PROCESS_NODE, LocalCluster
from devcluster.localcluster import REPO_ROOT, option_value, with_fresh_ports
from devcluster.podnetwork import Bridge

pytestmark = pytest.mark.cluster


# --- helpers -----------------------------------------------------------------------------------


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    """Poll `check` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def apply(cluster: LocalCluster, namespace: str, *objects: dict[str, Any]) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(items))


def get(cluster: LocalCluster, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def python_pod(name: str, code: str, **spec: Any) -> dict[str, Any]:
    """A pod on the process node whose one container runs `python3 -c code`."""
    container = {"name": "main", "image": "python:3.11", "command": ["python3", "-u", "-c", code]}
    container.update(spec.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **spec.pop("meta", {})},
            "spec": {"restartPolicy": "Never", "containers": [container], **spec}}


def wait_phase(cluster: LocalCluster, namespace: str, name: str, *phases: str,
               timeout: float = 60) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        pod = get(cluster, namespace, "pod", name)
        return pod if pod and pod.get("status", {}).get("phase") in phases else None

    return wait_for(f"pod {name} to be {'/'.join(phases)}", reached, timeout)


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["status"]["containerStatuses"][0]["state"]["terminated"]


# --- nodes -------------------------------------------------------------------------------------


def test_process_node_and_kwok_nodes_are_ready(cluster: LocalCluster) -> None:
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    ready = {n["metadata"]["name"]: any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in n["status"]["conditions"]) for n in nodes}
    assert ready == {PROCESS_NODE: True, **{f"kwok-node-{i}": True for i in range(4)}}
    table = cluster.kubectl("get", "nodes").stdout
    assert any(line.split()[:2] == [PROCESS_NODE, "Ready"] for line in table.splitlines())
    process_node = next(n for n in nodes if n["metadata"]["name"] == PROCESS_NODE)
    assert process_node["status"]["capacity"]["nvidia.com/gpu"] == "0"
    assert not process_node["spec"].get("taints")
    kwok_node = next(n for n in nodes if n["metadata"]["name"] == "kwok-node-0")
    assert [t["key"] for t in kwok_node["spec"]["taints"]] == ["kwok.x-k8s.io/node"]


# --- pods on the process node --------------------------------------------------------------------


def test_pod_runs_with_downward_env_and_configmap_volume(cluster: LocalCluster,
                                                         namespace: str) -> None:
    script = "\n".join([
        "import os, socket",
        "print('name', os.environ['POD_NAME'], 'ns', os.environ['POD_NAMESPACE'])",
        "print('ip', os.environ['POD_IP'], 'node', os.environ['NODE_NAME'])",
        "print('greeting', os.environ['GREETING'])",
        "print('hostname', socket.gethostname())",
        "print('file', open('/opt/monarch-spmd/harness/data.txt').read())",
    ])
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "code"},
                  "data": {"main.py": script, "data.txt": "from the configmap"}}

    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    pod = python_pod("hello", "", container={
        "command": ["python3", "/opt/monarch-spmd/harness/main.py"],
        "env": [{"name": "POD_NAME", **field("metadata.name")},
                {"name": "POD_NAMESPACE", **field("metadata.namespace")},
                {"name": "POD_IP", **field("status.podIP")},
                {"name": "NODE_NAME", **field("spec.nodeName")},
                {"name": "GREETING", "value": "hi $(POD_NAME)"}],
        "volumeMounts": [{"name": "code", "mountPath": "/opt/monarch-spmd/harness",
                          "readOnly": True}]},
        volumes=[{"name": "code", "configMap": {"name": "code"}}])
    apply(cluster, namespace, config_map, pod)

    done = wait_phase(cluster, namespace, "hello", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded", cluster.pod_log(namespace, "hello")
    assert terminated(done)["exitCode"] == 0
    assert terminated(done)["reason"] == "Completed"
    assert done["spec"]["nodeName"] == PROCESS_NODE
    ip = done["status"]["podIP"]
    expected = [f"name hello ns {namespace}", f"ip {ip} node {PROCESS_NODE}",
                "greeting hi hello", "hostname hello", "file from the configmap"]
    assert cluster.pod_log(namespace, "hello").splitlines() == expected
    assert cluster.kubectl("logs", "-n", namespace, "hello").stdout.splitlines() == expected


def test_failing_command_gives_failed_with_exit_code_and_message(cluster: LocalCluster,
                                                                 namespace: str) -> None:
    code = "import sys; print('step 1 ok'); sys.exit('rank 3: CUDA error: out of memory') "
    apply(cluster, namespace, python_pod("boom", code))
    pod = wait_phase(cluster, namespace, "boom", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Failed"
    state = terminated(pod)
    assert state["exitCode"] == 1
    assert state["reason"] == "Error"
    assert state["message"].strip() == "rank 3: CUDA error: out of memory"
    columns = cluster.kubectl("get", "pod", "boom", "-n", namespace).stdout.splitlines()[1]
    assert columns.split()[2] == "Error"


def test_two_pods_get_distinct_ips_and_talk_over_tcp(cluster: LocalCluster,
                                                      namespace: str) -> None:
    server = "\n".join([
        "import socket",
        "s = socket.create_server(('0.0.0.0', 7000))",
        "conn, peer = s.accept()",
        "conn.sendall(b'pong from ' + socket.gethostname().encode())",
        "print('served', peer[0])",
    ])
    apply(cluster, namespace, python_pod("server", server))
    server_ip = wait_for("the server's IP", lambda: (get(cluster, namespace, "pod", "server")
                                                     or {}).get("status", {}).get("podIP"))
    client_code = "\n".join([
        "import os, socket, time",
        "for _ in range(100):",
        "    try:",
        "        conn = socket.create_connection((os.environ['SERVER'], 7000), timeout=2)",
        "        break",
        "    except OSError:",
        "        time.sleep(0.1)",
        "print(conn.recv(100).decode())",
    ])
    apply(cluster, namespace, python_pod("client", client_code, container={
        "env": [{"name": "SERVER", "value": server_ip}]}))

    client_pod = wait_phase(cluster, namespace, "client", "Succeeded", "Failed")
    server_pod = wait_phase(cluster, namespace, "server", "Succeeded", "Failed")
    assert client_pod["status"]["phase"] == "Succeeded", cluster.pod_log(namespace, "client")
    client_ip = client_pod["status"]["podIP"]
    assert client_ip != server_ip
    assert cluster.pod_log(namespace, "client").strip() == "pong from server"
    assert cluster.pod_log(namespace, "server").strip() == f"served {client_ip}"
    assert server_pod["status"]["phase"] == "Succeeded"


def test_headless_service_resolves_to_the_selected_pod(cluster: LocalCluster,
                                                       namespace: str) -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "job-master"},
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                        "selector": {"role": "master"},
                        "ports": [{"name": "master", "port": 29500}]}}
    target = python_pod("rank0", "import time; time.sleep(120)",
                        meta={"labels": {"role": "master"}})
    resolver_code = "\n".join([
        "import socket, sys, time",
        f"names = ['job-master', 'job-master.{namespace}', 'job-master.{namespace}.svc',",
        f"         'job-master.{namespace}.svc.cluster.local']",
        "for _ in range(300):",
        "    try:",
        "        print(*[socket.gethostbyname(n) for n in names]); sys.exit(0)",
        "    except socket.gaierror:",
        "        time.sleep(0.1)",
        "sys.exit('job-master never resolved')",
    ])
    # The resolver starts before the Service has an endpoint: names must appear while it runs.
    apply(cluster, namespace, python_pod("resolver", resolver_code), service, target)

    rank0 = wait_phase(cluster, namespace, "rank0", "Running")
    resolver = wait_phase(cluster, namespace, "resolver", "Succeeded", "Failed")
    assert resolver["status"]["phase"] == "Succeeded", cluster.pod_log(namespace, "resolver")
    assert cluster.pod_log(namespace, "resolver").split() == [rank0["status"]["podIP"]] * 4


def test_pod_reaches_the_api_server_with_its_service_account(cluster: LocalCluster,
                                                             namespace: str) -> None:
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "default-view"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "view"},
               "subjects": [{"kind": "ServiceAccount", "name": "default",
                             "namespace": namespace}]}
    code = "\n".join([
        "import os",
        "from kubernetes import client, config",
        "config.load_incluster_config()",
        "me = client.CoreV1Api().read_namespaced_pod(os.environ['HOSTNAME'],",
        "    open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read())",
        "print(me.metadata.name, me.status.phase, me.spec.node_name)",
    ])
    apply(cluster, namespace, binding, python_pod("in-cluster", code))
    pod = wait_phase(cluster, namespace, "in-cluster", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded", cluster.pod_log(namespace, "in-cluster")
    assert cluster.pod_log(namespace, "in-cluster").split() == [
        "in-cluster", "Running", PROCESS_NODE]


def test_deleting_a_running_pod_sends_sigterm_then_removes_it(cluster: LocalCluster,
                                                              namespace: str) -> None:
    code = "\n".join([
        "import signal, sys, time",
        "def bye(*_):",
        "    print('got SIGTERM, cleaning up', flush=True)",
        "    sys.exit(0)",
        "signal.signal(signal.SIGTERM, bye)",
        "print('ready', flush=True)",
        "time.sleep(300)",
    ])
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
               "print('ready', flush=True); time.sleep(300)"
    apply(cluster, namespace, python_pod("polite", code),
          python_pod("stubborn", stubborn, terminationGracePeriodSeconds=2))
    pids = []
    for name in ("polite", "stubborn"):
        pod = wait_phase(cluster, namespace, name, "Running")
        pids.append(int(pod["status"]["containerStatuses"][0]["containerID"].split("//")[1]))
        wait_for(f"{name} to print ready", lambda n=name: "ready" in cluster.pod_log(namespace, n))

    began = time.monotonic()
    cluster.kubectl("delete", "pod", "polite", "stubborn", "-n", namespace, "--wait=true")
    assert time.monotonic() - began < 20
    assert cluster.pod_log(namespace, "polite").splitlines() == ["ready",
                                                                 "got SIGTERM, cleaning up"]
    assert get(cluster, namespace, "pod", "polite") is None
    assert get(cluster, namespace, "pod", "stubborn") is None
    for pid in pids:  # the processes are gone, the one ignoring SIGTERM included
        wait_for(f"process {pid} to exit", lambda p=pid: not Path(f"/proc/{p}").exists(), 10)


def test_owned_children_are_garbage_collected_with_their_owner(cluster: LocalCluster,
                                                               namespace: str) -> None:
    apply(cluster, namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                               "metadata": {"name": "owner"}, "data": {}})
    owner = get(cluster, namespace, "configmap", "owner")
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    child_pod = python_pod("child", "import time; time.sleep(300)",
                           meta={"ownerReferences": [ref]})
    child_config = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "child-config", "ownerReferences": [ref]}}
    apply(cluster, namespace, child_pod, child_config)
    wait_phase(cluster, namespace, "child", "Running")

    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for("the owned ConfigMap to go",
             lambda: get(cluster, namespace, "configmap", "child-config") is None, 60)
    wait_for("the owned pod to go", lambda: get(cluster, namespace, "pod", "child") is None, 60)


# --- kwok ----------------------------------------------------------------------------------------


def test_kwok_pod_runs_without_a_process_and_untolerated_pods_stay_off_kwok(
        cluster: LocalCluster, namespace: str) -> None:
    fake = python_pod("simulated", "raise SystemExit('must never run')",
                      tolerations=[KWOK_TOLERATION], nodeSelector={"type": "kwok"})
    apply(cluster, namespace, fake,
          *[python_pod(f"real-{i}", "print('real')") for i in range(3)])
    pod = wait_phase(cluster, namespace, "simulated", "Running")
    assert pod["spec"]["nodeName"].startswith("kwok-node-")
    assert pod["status"]["podIP"]
    assert cluster.pod_log(namespace, "simulated") == ""
    for i in range(3):
        real = wait_phase(cluster, namespace, f"real-{i}", "Succeeded", "Failed")
        assert real["spec"]["nodeName"] == PROCESS_NODE


# --- a second cluster: start time, and a stop that leaves nothing behind -------------------------


def test_second_cluster_starts_warm_and_stops_without_leftovers(cluster: LocalCluster) -> None:
    with tempfile.TemporaryDirectory(prefix="second-cluster-") as state:
        other = LocalCluster(Path(state), kwok_nodes=1, bin_dir=cluster.bin_dir)
        with other:
            plane = other.control_plane
            print(f"\nwarm start: control plane {plane.start_seconds:.1f}s, "
                  f"whole cluster {other.start_seconds:.1f}s", file=sys.stderr)
            bridge, api_port = other.bridge.name, plane.api_port
            assert bridge != cluster.bridge.name
            pids = [p.pid for p in plane.processes.values()] + [other.kwok.process.pid]
            other.kubectl("run", "sleeper", "--image=none", "--restart=Never", "--command",
                          "--", "python3", "-c", "import time; time.sleep(300)")
            pod = wait_phase(other, "default", "sleeper", "Running")
            pids.append(int(pod["status"]["containerStatuses"][0]["containerID"].split("//")[1]))
            netns = [line.split()[0] for line in subprocess.run(
                ["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
                if line.startswith(other.bridge.netns_prefix)]
            assert len(netns) == 1
        assert plane.start_seconds < 60
    left = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    assert left == [], "processes outlived stop()"
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f" {bridge}:" not in links
    assert netns[0] not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                          text=True).stdout
    with socket.socket() as probe:  # nothing listens on the API server's port any more
        assert probe.connect_ex(("127.0.0.1", api_port)) != 0


def test_tools_on_path_are_the_built_ones(cluster: LocalCluster) -> None:
    path = cluster.env["PATH"].split(os.pathsep)
    assert path[0] == str(cluster.bin_dir)
    version = cluster.kubectl("version", "-o", "json")
    info = json.loads(version.stdout)
    assert info["serverVersion"]["gitVersion"] == info["clientVersion"]["gitVersion"]


def test_init_container_then_restart_on_failure_sharing_an_empty_dir(cluster: LocalCluster,
                                                                     namespace: str) -> None:
    # The init container leaves a file; the main container fails on its first run only.
    main = "\n".join([
        "import os, sys",
        "print(open('/scratch/from-init').read(), flush=True)",
        "if not os.path.exists('/scratch/second-run'):",
        "    open('/scratch/second-run', 'w').close()",
        "    sys.exit(7)",
        "print('second run ok')",
    ])
    pod = python_pod("retry", main, restartPolicy="OnFailure",
                     container={"volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]},
                     initContainers=[{
                         "name": "prepare", "image": "busybox",
                         "command": ["python3", "-c",
                                     "open('/scratch/from-init', 'w').write('prepared')"],
                         "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
                     volumes=[{"name": "scratch", "emptyDir": {}}])
    apply(cluster, namespace, pod)
    done = wait_phase(cluster, namespace, "retry", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded", cluster.pod_log(namespace, "retry", "main")
    status = done["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 7
    assert done["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert cluster.pod_log(namespace, "retry", "main").splitlines() == [
        "prepared", "prepared", "second run ok"]


def test_volume_over_a_parent_of_the_checkout_keeps_the_project_importable(
        cluster: LocalCluster, namespace: str) -> None:
    # The Helm chart mounts an emptyDir at /tmp; CI may clone the repository under /tmp. The
    # pod must see the emptyDir there and still run the project from the host.
    parent = str(REPO_ROOT.parent)
    code = ("import os, spmd_operator, monarch_spmd; "
            f"open({parent!r} + '/scratch-marker', 'w').write('x'); "
            f"print('imported; parent is the volume:', os.listdir({parent!r}))")
    apply(cluster, namespace, python_pod(
        "hidden", code, container={"volumeMounts": [{"name": "scratch", "mountPath": parent}]},
        volumes=[{"name": "scratch", "emptyDir": {}}]))
    pod = wait_phase(cluster, namespace, "hidden", "Succeeded", "Failed")
    log = cluster.pod_log(namespace, "hidden")
    assert pod["status"]["phase"] == "Succeeded", log
    assert "imported" in log and "scratch-marker" in log, log
    assert not (REPO_ROOT.parent / "scratch-marker").exists()  # written to the volume, not the host


# --- the pod network itself ---------------------------------------------------------------------


def test_a_pod_keeps_reaching_the_gateway_while_other_pods_come_and_go() -> None:
    """A Linux bridge whose address was never set takes the lowest address of its ports: a pod
    added with a lower one, then removed, would leave the other pods' cached gateway address
    naming a port that is gone, and their packets to the API proxy dropped for up to a minute
    (an operator's Lease release after SIGTERM was lost that way). The gateway's address is set
    once and never changes; a pod reaches a server on the gateway through every change."""
    bridge = Bridge.create()
    server = socket.create_server((bridge.gateway, 0))
    port = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"pong")

    threading.Thread(target=serve, daemon=True).start()
    probe = (f"import socket; s = socket.create_connection(({bridge.gateway!r}, {port}), timeout=3); "
             "print(s.recv(4).decode())")

    def reaches(netns: str) -> bool:
        run = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", probe],
                             capture_output=True, text=True, timeout=30)
        return run.returncode == 0 and run.stdout.strip() == "pong"

    def gateway_mac() -> str:
        return Path(f"/sys/class/net/{bridge.name}/address").read_text().strip()

    try:
        first = f"{bridge.netns_prefix}00000000aaaa"
        bridge.add_pod(first)
        mac = gateway_mac()
        assert reaches(first)
        for i in range(3):
            other = f"{bridge.netns_prefix}{i:012d}"
            bridge.add_pod(other)
            # The lowest unicast address there is: an unset bridge address would become this one.
            subprocess.run(["ip", "link", "set", bridge.veth_name(other), "address", f"02:00:00:00:00:0{i + 1}"],
                           check=True)
            assert gateway_mac() == mac
            assert reaches(first) and reaches(other)
            bridge.remove_pod(other, None)
            assert gateway_mac() == mac
            assert reaches(first), f"the first pod lost the gateway after pod {i} left"
    finally:
        server.close()
        bridge.destroy()


def test_an_operator_whose_health_port_is_taken_is_started_again_on_other_ports(cluster: LocalCluster) -> None:
    """A port chosen free may be taken before the operator binds it (CI saw it once: the
    operator exited at start-up with EADDRINUSE and the next test found no operator). The
    cluster starts it again on other ports and returns once it answers on its liveness URL."""
    had_operator = cluster.operator_process is not None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"http://127.0.0.1:{taken.getsockname()[1]}/healthz"
        try:
            proc = cluster.start_operator("--liveness", busy)
            assert proc.poll() is None, "the operator runs"
            url = option_value(tuple(proc.args), "--liveness")
            assert url and url != busy
            with urllib.request.urlopen(url, timeout=5) as answer:
                assert answer.status == 200
            assert "address already in use" in (cluster.state_dir / "operator.log").read_text()
        finally:
            cluster.stop_operator()
            if had_operator:
                cluster.start_operator()


def test_fresh_ports_replace_only_the_health_and_metrics_ports() -> None:
    args = ("--liveness", "http://127.0.0.1:1/healthz", "--resync-seconds", "5", "--metrics-port=2", "--no-leader-election")
    fresh = with_fresh_ports(args)
    assert fresh[2:4] == ("--resync-seconds", "5") and fresh[5] == "--no-leader-election"
    assert option_value(fresh, "--liveness").startswith("http://127.0.0.1:") and option_value(fresh, "--liveness") != args[1]
    assert option_value(fresh, "--metrics-port") not in ("2", None)
    assert option_value(args, "--metrics-port") == "2" and option_value(args, "--namespace") is None


def test_a_process_the_suite_starts_turns_ctrl_c_into_a_keyboard_interrupt():
    """However the suite was started (a background job of a shell without job control starts
    with SIGINT ignored, and so would every process it starts), the tests that send SIGINT must
    reach a Python that handles it (tests/conftest.py::pytest_configure)."""
    out = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT)"
                          " is signal.default_int_handler)"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stdout + out.stderr
    assert signal.getsignal(signal.SIGINT) != signal.SIG_IGN
