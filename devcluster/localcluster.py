"""The whole test cluster as one object: control plane, process nodes, kwok nodes, operator.

Top of the test cluster (devcluster/): used by the session fixture in tests/conftest.py and by
`python -m devcluster up`. Order of start: pod bridge (its gateway goes into the API server's
certificate), control plane, process node agent, kwok nodes, and the operator if asked for; stop
runs the other way round and leaves no process, network namespace or bridge behind.

    with LocalCluster(Path("/tmp/c"), kwok_nodes=4) as cluster:
        cluster.kubectl("get", "nodes")
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

from kubernetes import client, config

from devcluster.binaries import ensure_binaries
from devcluster.controlplane import ControlPlane, die_with_parent, free_port, stop_process_group
from devcluster.kueue import Kueue, ensure_kueue
from devcluster.kwoknodes import KwokNodes
from devcluster.nodeagent import NodeAgent
from devcluster.podnetwork import Bridge
from devcluster.realnode import RealNodes, ensure_images, ensure_realnode_binaries

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
PROCESS_NODE: Final = "proc-node-0"


#: Starts of the operator before start_operator() gives up on one that exits while starting.
OPERATOR_START_TRIES: Final = 3
#: How long start_operator() waits for the operator's liveness endpoint to answer.
OPERATOR_START_SECONDS: Final = 60.0


def option_value(args: tuple[str, ...], name: str) -> str | None:
    """The value of ``name`` in ``args`` (``--name value`` or ``--name=value``), or None."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def with_fresh_ports(args: tuple[str, ...]) -> tuple[str, ...]:
    """``args`` with new free ports for ``--liveness`` (127.0.0.1) and ``--metrics-port``."""
    fresh = {"--liveness": lambda: f"http://127.0.0.1:{free_port()}/healthz", "--metrics-port": lambda: str(free_port())}
    out: list[str] = []
    replace_next = None
    for arg in args:
        if replace_next is not None:
            out.append(replace_next())
            replace_next = None
            continue
        name = arg.split("=", 1)[0]
        if name in fresh and "=" in arg:
            out.append(f"{name}={fresh[name]()}")
        else:
            out.append(arg)
            replace_next = fresh.get(arg)
    return tuple(out)


def wait_started(proc: subprocess.Popen, liveness: str | None, timeout: float = OPERATOR_START_SECONDS) -> bool:
    """False if ``proc`` exits before its liveness URL answers 200; True once it answers (or,
    still alive, after ``timeout``, or at once without a URL to ask)."""
    if not liveness:
        return proc.poll() is None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(liveness, timeout=1) as answer:
                if answer.status == 200:
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    return proc.poll() is None


class LocalCluster:
    """A real control plane with process nodes and kwok nodes, on this machine.

    Args:
        state_dir: a folder of its own for everything the cluster writes (logs included).
        kwok_nodes: how many simulated kwok nodes (0: none, and kwok is not started).
        process_nodes: names of the nodes whose pods run as local processes.
        gpus: `nvidia.com/gpu` capacity of each process node.
        operator: also run the SPMDJob operator (`python -m spmd_operator --all-namespaces`).
        bin_dir: the binaries' folder (default: binaries.ensure_binaries(), building once).
        real_nodes: how many real kubelet nodes (realnode.py: containers, CoreDNS; 0: none).
        kueue: also run Kueue's controller-manager (kueue.py; built once per machine).

    Attributes:
        kubeconfig: admin kubeconfig for kubectl, helm and the Python client.
        env: environment for subprocesses: KUBECONFIG set, the built binaries first on PATH.
        bin_dir, state_dir, control_plane, agent, kwok, operator_process, kueue.
        logs_dir: container logs, <logs_dir>/<namespace>/<pod>/<container>.log.
        start_seconds: how long start() took.
    """

    def __init__(self, state_dir: Path, *, kwok_nodes: int = 4,
                 process_nodes: tuple[str, ...] = (PROCESS_NODE,), gpus: int = 0,
                 operator: bool = False, bin_dir: Path | None = None,
                 real_nodes: int = 0, kueue: bool = False) -> None:
        self.state_dir = Path(state_dir)
        self.kwok_count, self.process_nodes, self.gpus = kwok_nodes, process_nodes, gpus
        self.with_operator = operator
        self.bin_dir = Path(bin_dir) if bin_dir else None
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.logs_dir = self.state_dir / "logs"
        self.env: dict[str, str] = {}
        self.bridge: Bridge | None = None
        self.control_plane: ControlPlane | None = None
        self.agent: NodeAgent | None = None
        self.kwok: KwokNodes | None = None
        self.operator_process: subprocess.Popen | None = None
        self.start_seconds = 0.0
        self.real_count = real_nodes
        self.real: RealNodes | None = None
        self.with_kueue = kueue
        self.kueue: Kueue | None = None

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        began = time.monotonic()
        self.bin_dir = self.bin_dir or ensure_binaries()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.bridge = Bridge.create()
            (self.state_dir / "bridge").write_text(self.bridge.name)
            self.control_plane = ControlPlane(self.bin_dir, self.state_dir,
                                              extra_ips=[self.bridge.gateway])
            self.control_plane.start()
            self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                        "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
            certs = self.control_plane.certs
            self.agent = NodeAgent(self.kubeconfig, self.bridge, self.state_dir,
                                   self.control_plane.api_port, node_names=self.process_nodes,
                                   gpus=self.gpus, tls=(certs.serving_crt, certs.serving_key))
            self.agent.start()
            if self.kwok_count:
                self.kwok = KwokNodes(self.bin_dir, self.kubeconfig, self.state_dir,
                                      self.kwok_count)
                self.kwok.start()
            if self.real_count:
                self.real = RealNodes(self.bin_dir, ensure_realnode_binaries(), self.kubeconfig,
                                      certs.ca_crt, self.control_plane.api_port, self.state_dir,
                                      self.real_count, ensure_images())
                self.real.start()
            self.wait_for_nodes()
            if self.with_kueue:
                self.start_kueue()
            if self.with_operator:
                self.start_operator()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop everything started, newest first; safe to call more than once."""
        self.stop_operator()
        self.stop_kueue()
        if self.real:
            self.real.stop()
            self.real = None
        if self.agent:
            self.agent.stop()
            self.agent = None
        if self.kwok:
            self.kwok.stop()
            self.kwok = None
        if self.control_plane:
            self.control_plane.stop()
            self.control_plane = None
        if self.bridge:
            self.bridge.destroy()
            self.bridge = None

    def restart_apiserver(self, *, down_seconds: float = 0.0, etcd: bool = False) -> float:
        """Kills the API server (and etcd with ``etcd``) and starts it again; returns the outage.

        What an operator meets when its API server restarts or is upgraded: its watches break,
        and resuming them from an old resourceVersion ends in 410 Gone and a re-list.
        """
        assert self.control_plane is not None, "the cluster is not running"
        names = ("etcd", "kube-apiserver") if etcd else ("kube-apiserver",)
        return self.control_plane.restart(*names, down_seconds=down_seconds)

    # --- the operator (hook for end-to-end tests; they may stop and restart it) ---------------

    def install_crds(self) -> None:
        """Apply the project's CRDs (crds/) and wait until the API server serves them."""
        self.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
        deadline = time.monotonic() + 60
        while True:
            # A CRD just created has no status.conditions for a moment, and kubectl wait gives up
            # on it at once ("accessor error") instead of waiting: ask again until it has them.
            result = self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f",
                                  str(REPO_ROOT / "crds"), check=False)
            if result.returncode == 0:
                return
            if "accessor error" not in result.stderr or time.monotonic() > deadline:
                raise AssertionError(f"kubectl wait for the CRDs failed ({result.returncode}):\n"
                                     f"{result.stdout}{result.stderr}")
            time.sleep(0.2)

    def start_operator(self, *args: str, install_crds: bool = True,
                       kubeconfig: Path | None = None) -> subprocess.Popen:
        """Run `python -m spmd_operator --all-namespaces *args`, logging to operator.log, and wait
        until its liveness endpoint answers (it has started: informers listed, loops running).

        The CRDs are applied first unless `install_crds` is False. Calling it again restarts
        the operator (stop_operator() first: SIGTERM, SIGKILL after a grace period). Unless
        `args` say otherwise, its health and metrics ports are free ones (several clusters may
        share the machine) and it runs alone, without leader election. An operator that exits
        while starting (its health or metrics port was taken between the choice and its bind)
        is started again on other ports, up to OPERATOR_START_TRIES times; one that is alive but
        not answering after OPERATOR_START_SECONDS is left to the caller. ``kubeconfig`` (default:
        the admin one) may point it at a :class:`StallableProxy`.
        """
        self.stop_operator()
        if install_crds:
            self.install_crds()
        if not any(a.startswith("--liveness") for a in args):
            args = (*args, "--liveness", f"http://127.0.0.1:{free_port()}/healthz")
        if not any(a.startswith("--metrics-port") for a in args):
            args = (*args, "--metrics-port", str(free_port()))
        if not any(a.endswith("leader-election") for a in args):
            args = (*args, "--no-leader-election")
        env = {**self.env, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO_ROOT / "operator"), str(REPO_ROOT),
                          self.env.get("PYTHONPATH", "")]))}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        for attempt in range(OPERATOR_START_TRIES):
            if attempt:
                args = with_fresh_ports(args)
            with open(self.state_dir / "operator.log", "ab") as log:
                self.operator_process = subprocess.Popen(
                    [sys.executable, "-m", "spmd_operator", "--all-namespaces", *args],
                    env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
            if wait_started(self.operator_process, option_value(args, "--liveness")):
                break
            print(f"the operator exited while starting (code {self.operator_process.returncode}; see "
                  f"{self.state_dir / 'operator.log'}); starting it again on other ports", file=sys.stderr)
        return self.operator_process

    def stop_operator(self, grace: float = 10.0) -> None:
        if self.operator_process is not None:
            stop_process_group(self.operator_process, grace)
            self.operator_process = None

    def start_replica(self, identity: str, *args: str, kubeconfig: Path | None = None,
                      lease_namespace: str = "default",
                      scope: tuple[str, ...] = ("--all-namespaces",)) -> subprocess.Popen:
        """One more operator process with leader election on, known to the Lease (and to the
        audit log, by its User-Agent ``spmdjob-operator/<identity>``) as ``identity``; ``scope``:
        the namespaces it watches (``--namespace=NS`` flags, or every namespace).

        Its log goes to operator-<identity>.log; ``kubeconfig`` (default: the admin one) may point
        it at a :class:`StallableProxy`. The caller stops it (:func:`stop_process_group`).
        """
        env = {**self.env, "POD_NAME": identity, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO_ROOT / "operator"), str(REPO_ROOT), self.env.get("PYTHONPATH", "")]))}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        if not any(a.startswith("--liveness") for a in args):
            args = (*args, "--liveness", f"http://127.0.0.1:{free_port()}/healthz")
        if not any(a.startswith("--metrics-port") for a in args):
            args = (*args, "--metrics-port", str(free_port()))
        with open(self.state_dir / f"operator-{identity}.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "spmd_operator", *scope, "--leader-election",
                 "--leader-election-namespace", lease_namespace, *args],
                env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent)

    @staticmethod
    def pause(proc: subprocess.Popen) -> None:
        """SIGSTOP to the process group: it stops where it is, as a frozen node or VM would."""
        os.killpg(proc.pid, signal.SIGSTOP)

    @staticmethod
    def unpause(proc: subprocess.Popen) -> None:
        """SIGCONT: it goes on from where it stopped, believing no time passed."""
        os.killpg(proc.pid, signal.SIGCONT)

    def kubeconfig_for(self, user: str, port: int | None = None) -> Path:
        """A kubeconfig of its own for client ``user`` (a client certificate with that user name,
        group system:masters), optionally through https://127.0.0.1:<port> (a proxy)."""
        assert self.control_plane is not None and self.control_plane.certs is not None
        crt, key = self.control_plane.certs.client(user)
        config = json.loads(self.kubeconfig.read_text())
        for entry in config["users"]:
            entry["user"] = {"client-certificate": str(crt), "client-key": str(key)}
        if port is not None:
            for entry in config["clusters"]:
                entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
        path = self.state_dir / f"kubeconfig-{user}"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def enable_audit(self) -> Path:
        """The API server's audit log of writes, on from now (one API server restart the first time)."""
        assert self.control_plane is not None, "the cluster is not running"
        return self.control_plane.enable_audit()

    def audit_events(self) -> list[dict[str, Any]]:
        assert self.control_plane is not None, "the cluster is not running"
        return self.control_plane.audit_events()

    # --- Kueue (kueue.py): quota admission of whole workloads ---------------------------------

    def start_kueue(self, **options: Any) -> Kueue:
        """Run Kueue against this cluster (CRDs, webhooks on kueue.x-k8s.io objects, manager).

        Log in <state_dir>/kueue/kueue.log. `options` go to kueue.Kueue (webhooks, frameworks).
        Calling it again restarts Kueue.
        """
        assert self.control_plane is not None and self.control_plane.certs is not None
        self.stop_kueue()
        self.kueue = Kueue(ensure_kueue(), self.bin_dir, self.kubeconfig,
                           self.control_plane.certs, self.state_dir / "kueue", **options)
        self.kueue.start()
        return self.kueue

    def stop_kueue(self) -> None:
        if self.kueue is not None:
            self.kueue.stop()
            self.kueue = None

    # --- helpers for tests ---------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess:
        """Run the built kubectl against this cluster; stdout and stderr are captured text."""
        result = subprocess.run([str(self.bin_dir / "kubectl"), *args], env=self.env,
                                input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    def api_client(self) -> client.ApiClient:
        """A new Python client for this cluster."""
        return config.new_client_from_config(str(self.kubeconfig))

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """What a process-node pod's container wrote (stdout and stderr), '' if nothing yet.

        `container` may be left out when the pod has one container. `kubectl logs` gives the
        same text.
        """
        folder = self.logs_dir / namespace / pod
        if container is None:
            files = sorted(folder.glob("*.log"))
            if len(files) > 1:
                raise ValueError(f"pod {namespace}/{pod} has several containers: name one")
            return files[0].read_text(errors="replace") if files else ""
        path = folder / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for_nodes(self, timeout: float = 60.0) -> None:
        """Wait until every process and kwok node is Ready."""
        names = list(self.process_nodes) + (self.kwok.names if self.kwok else [])
        names += self.real.names if self.real else []
        core = client.CoreV1Api(self.api_client())
        deadline = time.monotonic() + timeout
        while True:
            ready = {n.metadata.name for n in core.list_node().items
                     if any(c.type == "Ready" and c.status == "True"
                            for c in n.status.conditions or [])}
            if ready >= set(names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not Ready: {sorted(set(names) - ready)}")
            time.sleep(0.2)

    def describe(self) -> dict[str, Any]:
        return {"kubeconfig": str(self.kubeconfig), "state_dir": str(self.state_dir),
                "bin_dir": str(self.bin_dir), "bridge": self.bridge.name if self.bridge else None,
                "start_seconds": round(self.start_seconds, 2),
                **(self.real.describe() if self.real else {}),
                **(self.kueue.describe() if self.kueue else {})}


class StallableProxy:
    """A TCP proxy on 127.0.0.1 in front of the API server that a test can stall.

    ``pause()`` stops moving bytes in both directions: requests and answers in flight stay where
    they are, as on a network path that went silent. ``resume()`` closes every connection that was
    stalled (their clients gave up on them: each request has a timeout) and forwards again; new
    connections work at once. Connections made while paused are held until the resume, then closed.

    ``slow(seconds)`` makes a slow path instead: every chunk a client sends waits that long before
    it goes on (answers are not delayed), so a client that sends one request at a time sends at
    most one per ``seconds``.
    """

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._delay = 0.0
        self._lock = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket]] = []
        threading.Thread(target=self._accept, daemon=True, name="stallable-proxy").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._conns.append((conn, upstream))
            for a, b, sent in ((conn, upstream, True), (upstream, conn, False)):
                threading.Thread(target=self._pipe, args=(a, b, sent), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, sent: bool) -> None:
        try:
            while data := src.recv(65536):
                if sent and self._delay:
                    time.sleep(self._delay)
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def pause(self) -> None:
        self._flowing.clear()

    def slow(self, seconds: float) -> None:
        """Delays each chunk a client sends by ``seconds`` from now on (0: no delay)."""
        self._delay = seconds

    def resume(self) -> None:
        with self._lock:
            stalled, self._conns = self._conns, []
        for pair in stalled:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass
        self._flowing.set()

    def close(self) -> None:
        self._server.close()
        self.resume()
