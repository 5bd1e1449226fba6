"""A test node agent: a Node whose pods run as real local processes.

Part of the test cluster (devcluster/), above controlplane.py. It stands in for a kubelet and a
container runtime in tests, nothing more. Each ProcessNode:

- registers a Node (Ready; capacity cpu, memory, pods and `nvidia.com/gpu`) and heartbeats it
  (node Lease plus the Ready condition);
- watches the pods bound to it (spec.nodeName) and runs each in its own network namespace with
  its own IP on a Linux bridge (podnetwork.Bridge). The image is ignored: the container's
  command runs on this machine, `python`/`python3` meaning the interpreter of the agent;
- materialises configMap, secret, emptyDir, hostPath, downwardAPI and projected volumes (the
  service-account token and ca.crt included) into a per-pod folder that podexec.py bind-mounts at
  each mountPath inside the pod's private mount namespace;
- builds the env (values, $(VAR) references, fieldRef, configMapKeyRef, secretKeyRef, envFrom)
  plus KUBERNETES_SERVICE_HOST/PORT, which point at a TCP proxy (ApiProxy) on the bridge gateway
  that forwards to the loopback API server;
- writes pod status back (Running with podIP and Ready, then Succeeded or Failed with the exit
  code, reason and, on failure, the last lines of stderr as the termination message);
- honours deletion: SIGTERM to the container's main process, SIGKILL to its process group after
  the grace period, then the pod is removed (delete with grace 0).

The pod network (bridge, network namespaces, API proxy, the hosts files that stand in for
cluster DNS) lives in podnetwork.py.

Container logs (stdout and stderr, interleaved) go to <state_dir>/logs/<ns>/<pod>/<container>.log
and a small HTTPS endpoint per node serves them to the API server, so `kubectl logs` works.
"""

from __future__ import annotations

import base64
import collections
import datetime
import json
import logging
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from kubernetes import client
from kubernetes.client.rest import ApiException

from devcluster.controlplane import die_with_parent
from devcluster.podnetwork import ApiProxy, Bridge, ClusterDNS, watch_forever

log = logging.getLogger("nodeagent")

PODEXEC: Final = Path(__file__).with_name("podexec.py")
#: Host folders every pod runs from (the image is ignored): the repository, whose packages are
#: installed in editable mode, and the interpreter. A pod volume mounted over a parent of one of
#: them (an emptyDir at /tmp while the checkout lives under /tmp) must not hide it.
HOST_PATHS_PODS_NEED: Final = sorted({str(Path(__file__).resolve().parents[1]),
                                      os.path.realpath(sys.prefix),
                                      os.path.realpath(sys.base_prefix)})
HEARTBEAT_SECONDS: Final = 10
RESTART_BACKOFF_SECONDS: Final = 1.0
MESSAGE_BYTES: Final = 2048  # what kubelet keeps of the log for a termination message


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Container:
    """One running (or finished) container of a pod: its process, state and log."""

    def __init__(self, spec: client.V1Container, log_path: Path) -> None:
        self.spec = spec
        self.name = spec.name
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=80)
        self._reader: threading.Thread | None = None

    def start(self, argv: list[str]) -> None:
        with open(self.log_path, "ab") as out:
            # Started (and restarted) by the pod's own thread, which outlives the process.
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.PIPE, start_new_session=True,
                                         preexec_fn=die_with_parent)
        self.stderr_tail.clear()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        self.state = {"running": {"startedAt": now()}}

    def _read_stderr(self) -> None:
        assert self.proc and self.proc.stderr
        with open(self.log_path, "ab", buffering=0) as out:
            for line in self.proc.stderr:
                out.write(line)
                self.stderr_tail.append(line.decode(errors="replace"))

    def poll(self) -> int | None:
        """The exit code once the process is gone (128+N for signal N), else None."""
        if self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        return 128 - code if code < 0 else code

    def signal(self, sig: int, group: bool = False) -> None:
        if self.proc is not None and (group or self.proc.poll() is None):
            try:
                os.killpg(self.proc.pid, sig) if group else self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def finish(self, code: int) -> None:
        """Record the exit: like a container runtime, nothing of the container outlives it."""
        self.signal(signal.SIGKILL, group=True)
        if self._reader:
            self._reader.join(timeout=5)
        started = self.state.get("running", {}).get("startedAt", now())
        not_started = code == 127 and any(line.startswith("podexec: ") for line in self.stderr_tail)
        reason = "Completed" if code == 0 else ("StartError" if not_started else "Error")
        terminated = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now()}
        if code != 0:
            message = "".join(self.stderr_tail)
            if len(message.encode()) > MESSAGE_BYTES:  # keep whole lines of the last bytes
                cut = message.encode()[-MESSAGE_BYTES:].decode(errors="replace")
                message = cut.split("\n", 1)[-1]
            terminated["message"] = message
        self.state = {"terminated": terminated}

    def status(self, ready: bool) -> dict[str, Any]:
        state = {"waiting": None, "running": None, "terminated": None, **self.state}
        status = {"name": self.name, "image": self.spec.image or "", "imageID": "",
                  "containerID": f"process://{self.proc.pid}" if self.proc else None,
                  "ready": ready and "running" in self.state, "started": "running" in self.state,
                  "restartCount": self.restarts, "state": state}
        if self.last_state:
            status["lastState"] = self.last_state
        return status


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, `$$` is a literal `$`."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def condition(kind: str, ok: bool, reason: str | None = None) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason,
            "lastProbeTime": None, "lastTransitionTime": now()}


class PodRuntime:
    """Runs one pod on a ProcessNode: sandbox, volumes, env, containers, status, deletion."""

    def __init__(self, node: ProcessNode, pod: client.V1Pod) -> None:
        self.node, self.pod = node, pod
        self.ns, self.name, self.uid = pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
        self.dir = node.state_dir / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.log_dir = node.logs_dir / self.ns / self.name
        self.netns = f"{node.bridge.netns_prefix}{self.uid.replace('-', '')[:12]}"
        self.host_network = bool(pod.spec.host_network)
        self.ip: str | None = None
        self.init_containers: list[Container] = []
        self.containers: list[Container] = []
        self.deleting = threading.Event()
        self.kill_at = float("inf")
        self.force_deleted = False
        self._conditions: dict[str, dict[str, Any]] = {}
        self.thread = threading.Thread(target=self.run, daemon=True, name=f"pod-{self.name}")

    def request_stop(self, grace: float, force_deleted: bool = False) -> None:
        self.kill_at = min(self.kill_at, time.monotonic() + grace)
        self.force_deleted |= force_deleted
        self.deleting.set()

    # --- the pod's life ---------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception as err:
            log.exception("pod %s/%s", self.ns, self.name)
            self.patch_status({"phase": "Failed", "reason": "NodeAgentError", "message": str(err)})
        finally:
            for c in self.init_containers + self.containers:
                c.signal(signal.SIGKILL, group=True)
            if not self.host_network:
                self.node.dns.unregister(self.netns)
                self.node.bridge.remove_pod(self.netns, self.ip)
            if self.deleting.is_set() and not self.force_deleted:
                self.node.finalize(self.ns, self.name, self.uid)

    def _run(self) -> None:
        spec = self.pod.spec
        shutil.rmtree(self.log_dir, ignore_errors=True)
        self.log_dir.mkdir(parents=True)
        (self.dir / "work").mkdir(parents=True, exist_ok=True)
        self.patch_status({"startTime": now(), "hostIP": self.node.bridge.gateway})
        if self.host_network:
            self.ip = self.node.bridge.gateway
        else:
            self.ip = self.node.bridge.add_pod(self.netns)
            self.node.dns.register(self.netns, self.own_hosts_lines())
        while True:  # like kubelet, wait for missing ConfigMaps/Secrets rather than fail
            try:
                volumes = self.prepare_volumes()
                break
            except Exception as err:
                self.patch_status({"message": f"volumes not ready: {err}"})
                if self.deleting.wait(1):
                    return
        self.init_containers = [Container(c, self.log_dir / f"{c.name}.log")
                                for c in spec.init_containers or []]
        self.containers = [Container(c, self.log_dir / f"{c.name}.log") for c in spec.containers]
        for c in self.containers:
            self.node.logs[(self.ns, self.name, c.name)] = c
        for c in self.init_containers:
            if not self.supervise([c], volumes):
                return
        self.supervise(self.containers, volumes)

    def supervise(self, containers: list[Container], volumes: dict[str, Path]) -> bool:
        """Run `containers` until they are done (or the pod is deleted); True if all exited 0."""
        policy = self.pod.spec.restart_policy or "Always"
        is_init = containers[0] in self.init_containers
        restart_at: dict[str, float] = {}
        for c in containers:
            c.start(self.launch_argv(c, volumes))
        self.report()
        terminating = False
        while True:
            changed = False
            for c in containers:
                code = c.poll()
                if code is not None and "running" in c.state:
                    c.finish(code)
                    changed = True
                    again = policy == "Always" and not is_init or (policy != "Never" and code != 0)
                    if again and not self.deleting.is_set():
                        restart_at[c.name] = time.monotonic() + RESTART_BACKOFF_SECONDS
                if c.name in restart_at and time.monotonic() >= restart_at[c.name]:
                    del restart_at[c.name]
                    c.last_state, c.restarts = c.state, c.restarts + 1
                    c.start(self.launch_argv(c, volumes))
                    changed = True
            if self.deleting.is_set():
                restart_at.clear()
                if not terminating:
                    terminating = True
                    for c in containers:
                        c.signal(signal.SIGTERM)
                if time.monotonic() >= self.kill_at:
                    for c in containers:
                        c.signal(signal.SIGKILL, group=True)
            done = not restart_at and all("terminated" in c.state for c in containers)
            ok = done and all(c.state["terminated"]["exitCode"] == 0 for c in containers)
            if done and (not is_init or not ok or self.deleting.is_set()):
                self.report(final=True)
                return ok
            if done:
                return True
            if changed:
                self.report()
            time.sleep(0.1)

    # --- what the container sees --------------------------------------------------------------

    def own_hosts_lines(self) -> str:
        spec = self.pod.spec
        hostname = spec.hostname or self.name[:63]
        names = [hostname]
        if spec.subdomain:
            fqdn = f"{hostname}.{spec.subdomain}.{self.ns}.svc"
            names = [f"{fqdn}.cluster.local", fqdn, hostname]
        return f"{self.ip}\t{' '.join(names)}\n"

    def launch_argv(self, c: Container, volumes: dict[str, Path]) -> list[str]:
        env = self.build_env(c.spec)
        argv = [expand(a, env) for a in (c.spec.command or []) + (c.spec.args or [])]
        if not argv:
            argv = ["/bin/sh", "-c", "echo 'the process node cannot run an image entrypoint: "
                                     "give the container a command' >&2; exit 127"]
        if re.fullmatch(r"python[0-9.]*", os.path.basename(argv[0])):
            argv[0] = sys.executable
        mounts = []
        for m in c.spec.volume_mounts or []:
            source = volumes[m.name] / (m.sub_path or "")
            if not source.exists():  # a subPath not there yet is a new folder, as in kubelet
                source.mkdir(parents=True)
            mounts.append({"source": str(source), "target": m.mount_path,
                           "readOnly": bool(m.read_only)})
        spec_file = self.dir / f"{c.name}.json"
        spec_file.write_text(json.dumps({
            "hostname": (self.pod.spec.hostname or self.name)[:63], "mounts": mounts, "env": env,
            "cwd": c.spec.working_dir or str(self.dir / "work"), "argv": argv,
            "keep": HOST_PATHS_PODS_NEED}))
        helper = [sys.executable, str(PODEXEC), str(spec_file)]
        return helper if self.host_network else ["ip", "netns", "exec", self.netns, *helper]

    def build_env(self, c: client.V1Container) -> dict[str, str]:
        gw, port = self.node.bridge.gateway, str(self.node.api_port)
        env = {**self.node.base_env, "HOSTNAME": (self.pod.spec.hostname or self.name)[:63],
               "KUBERNETES_SERVICE_HOST": gw, "KUBERNETES_SERVICE_PORT": port,
               "KUBERNETES_SERVICE_PORT_HTTPS": port, "KUBERNETES_PORT": f"tcp://{gw}:{port}"}
        for src in c.env_from or []:
            ref = src.config_map_ref or src.secret_ref
            kind = "configmap" if src.config_map_ref else "secret"
            for key, value in self.read_map(kind, ref.name, ref.optional).items():
                env[(src.prefix or "") + key] = value.decode()
        for e in c.env or []:
            env[e.name] = expand(e.value or "", env) if e.value_from is None else \
                self.value_from(e.value_from, c)
        return env

    def value_from(self, src: client.V1EnvVarSource, c: client.V1Container) -> str:
        if src.field_ref:
            return self.field(src.field_ref.field_path)
        if src.config_map_key_ref or src.secret_key_ref:
            ref = src.config_map_key_ref or src.secret_key_ref
            data = self.read_map("configmap" if src.config_map_key_ref else "secret",
                                 ref.name, ref.optional)
            return data.get(ref.key, b"").decode()
        if src.resource_field_ref:  # the raw quantity; divisors are not applied
            res = c.resources or client.V1ResourceRequirements()
            kind, _, resource = src.resource_field_ref.resource.partition(".")
            return str(((res.limits if kind == "limits" else res.requests) or {}).get(resource, ""))
        return ""

    def field(self, path: str) -> str:
        """A downward-API field of this pod."""
        meta = self.pod.metadata
        match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if match:
            return (getattr(meta, match.group(1)) or {}).get(match.group(2), "")
        return {
            "metadata.name": self.name, "metadata.namespace": self.ns, "metadata.uid": self.uid,
            "spec.nodeName": self.node.name, "spec.serviceAccountName":
                self.pod.spec.service_account_name or "default",
            "status.podIP": self.ip or "", "status.podIPs": self.ip or "",
            "status.hostIP": self.node.bridge.gateway, "status.hostIPs": self.node.bridge.gateway,
        }.get(path, "")

    def read_map(self, kind: str, name: str, optional: bool | None) -> dict[str, bytes]:
        """The data of a ConfigMap or Secret as bytes ({} if optional and missing)."""
        try:
            if kind == "configmap":
                cm = self.node.core.read_namespaced_config_map(name, self.ns)
                data = {k: v.encode() for k, v in (cm.data or {}).items()}
                data.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
                return data
            secret = self.node.core.read_namespaced_secret(name, self.ns)
            return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
        except ApiException as err:
            if err.status == 404 and optional:
                return {}
            raise RuntimeError(f"{kind} {self.ns}/{name}: {err.reason}") from None

    def prepare_volumes(self) -> dict[str, Path]:
        """Materialise each volume into a folder; return volume name -> folder."""
        folders: dict[str, Path] = {}
        for v in self.pod.spec.volumes or []:
            if v.host_path:
                folders[v.name] = Path(v.host_path.path)
                if v.host_path.type == "DirectoryOrCreate":
                    folders[v.name].mkdir(parents=True, exist_ok=True)
                continue
            folder = folders[v.name] = self.dir / "volumes" / v.name
            folder.mkdir(parents=True, exist_ok=True)
            if v.config_map:
                data = self.read_map("configmap", v.config_map.name, v.config_map.optional)
                self.write_items(folder, data, v.config_map.items, v.config_map.default_mode)
            elif v.secret:
                data = self.read_map("secret", v.secret.secret_name, v.secret.optional)
                self.write_items(folder, data, v.secret.items, v.secret.default_mode)
            elif v.downward_api:
                self.write_fields(folder, v.downward_api.items, v.downward_api.default_mode)
            elif v.projected:
                for s in v.projected.sources or []:
                    mode = v.projected.default_mode
                    if s.service_account_token:
                        token = self.service_account_token(s.service_account_token)
                        self.write_items(folder, {"t": token}, [client.V1KeyToPath(
                            key="t", path=s.service_account_token.path)], mode)
                    elif s.config_map:
                        data = self.read_map("configmap", s.config_map.name, s.config_map.optional)
                        self.write_items(folder, data, s.config_map.items, mode)
                    elif s.secret:
                        data = self.read_map("secret", s.secret.name, s.secret.optional)
                        self.write_items(folder, data, s.secret.items, mode)
                    elif s.downward_api:
                        self.write_fields(folder, s.downward_api.items, mode)
            elif not v.empty_dir:
                log.warning("pod %s/%s: volume %s: unsupported type, left empty",
                            self.ns, self.name, v.name)
        return folders

    @staticmethod
    def write_items(folder: Path, data: dict[str, bytes], items: list | None,
                    default_mode: int | None) -> None:
        chosen = [(i.key, i.path, i.mode) for i in items] if items else \
            [(k, k, None) for k in data]
        for key, rel, mode in chosen:
            if key in data:
                path = folder / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data[key])
                path.chmod((mode or default_mode or 0o644) & 0o777)

    def write_fields(self, folder: Path, items: list | None, default_mode: int | None) -> None:
        data = {i.path: self.field(i.field_ref.field_path).encode()
                for i in items or [] if i.field_ref}
        self.write_items(folder, data, None, default_mode)

    def service_account_token(self, src: client.V1ServiceAccountTokenProjection) -> bytes:
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[src.audience] if src.audience else [],
            expiration_seconds=src.expiration_seconds or 3600,
            bound_object_ref=client.V1BoundObjectReference(
                kind="Pod", api_version="v1", name=self.name, uid=self.uid)))
        sa = self.pod.spec.service_account_name or "default"
        answer = self.node.core.create_namespaced_service_account_token(sa, self.ns, request)
        return answer.status.token.encode()

    # --- status -----------------------------------------------------------------------------

    def cond(self, kind: str, ok: bool, reason: str | None = None) -> dict[str, Any]:
        """A pod condition whose lastTransitionTime only moves when its status does."""
        old = self._conditions.get(kind)
        new = condition(kind, ok, reason)
        if old and old["status"] == new["status"]:
            new["lastTransitionTime"] = old["lastTransitionTime"]
        self._conditions[kind] = new
        return new

    def report(self, final: bool = False) -> None:
        """Write the pod's status as a kubelet would, from the containers' states."""
        initialized = all("terminated" in c.state and c.state["terminated"]["exitCode"] == 0
                          for c in self.init_containers)
        running = initialized and not self.deleting.is_set() and bool(self.containers) and \
            all("running" in c.state for c in self.containers)
        phase = "Running" if initialized else "Pending"
        if final:
            every = self.init_containers + self.containers if not initialized else self.containers
            failed = any("terminated" in c.state and c.state["terminated"]["exitCode"] != 0
                         for c in every)
            phase = "Failed" if failed else "Succeeded"
        ready_reason = "PodCompleted" if final else (None if running else "ContainersNotReady")
        self.patch_status({
            "phase": phase, "message": None,
            "hostIP": self.node.bridge.gateway, "hostIPs": [{"ip": self.node.bridge.gateway}],
            "podIP": self.ip, "podIPs": [{"ip": self.ip}],
            "conditions": [self.cond("PodReadyToStartContainers", not final),
                           self.cond("Initialized", initialized),
                           self.cond("ContainersReady", running, ready_reason),
                           self.cond("Ready", running, ready_reason)],
            "initContainerStatuses": [c.status(False) for c in self.init_containers
                                      if c.proc is not None],
            "containerStatuses": [c.status(running) for c in self.containers],
        })

    def patch_status(self, status: dict[str, Any]) -> None:
        try:
            self.node.core.patch_namespaced_pod_status(self.name, self.ns, {"status": status})
        except ApiException as err:
            if err.status != 404:
                log.warning("pod %s/%s: status: %s", self.ns, self.name, err.reason)


class ProcessNode:
    """One Node whose pods run as local processes (see the module docstring).

    Args:
        api: a client for the cluster (admin credentials).
        name: the Node's name.
        bridge, dns: the shared pod network and hosts-file keeper.
        state_dir: where pod folders (volumes, specs) and logs go.
        api_port: the API server's port on 127.0.0.1 (pods reach it through the gateway).
        cpu, memory, pods, gpus: the Node's capacity (gpus is `nvidia.com/gpu`).
        labels: extra Node labels.
        base_env: env every container starts from (default: PATH, HOME, LANG, PYTHONPATH).
        tls: (certificate, key) files for the log endpoint `kubectl logs` reaches.
    """

    def __init__(self, api: client.ApiClient, name: str, bridge: Bridge, dns: ClusterDNS,
                 state_dir: Path, api_port: int, *, cpu: str = "16", memory: str = "64Gi",
                 pods: int = 110, gpus: int = 0, labels: dict[str, str] | None = None,
                 base_env: dict[str, str] | None = None,
                 tls: tuple[Path, Path] | None = None) -> None:
        self.api, self.name, self.bridge, self.dns = api, name, bridge, dns
        self.core = client.CoreV1Api(api)
        self.state_dir = Path(state_dir)
        self.logs_dir = self.state_dir / "logs"
        self.api_port = api_port
        self.capacity = {"cpu": cpu, "memory": memory, "pods": str(pods),
                         "nvidia.com/gpu": str(gpus)}
        self.labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "monarch-spmd.dev/process-node": "true",
                       **(labels or {})}
        self.base_env = base_env if base_env is not None else {
            k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH") if k in os.environ}
        self.tls = tls
        self.runtimes: dict[str, PodRuntime] = {}
        self.logs: dict[tuple[str, str, str], Container] = {}
        self.stop_event = threading.Event()
        self.log_server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        log_port = self._serve_logs() if self.tls else 0
        self._register(log_port)
        threading.Thread(target=self._heartbeat, daemon=True, name=f"{self.name}-beat").start()
        threading.Thread(
            target=watch_forever, daemon=True, name=f"{self.name}-pods",
            args=(self.stop_event, self.core.list_pod_for_all_namespaces, self._on_pod),
            kwargs={"field_selector": f"spec.nodeName={self.name}"},
        ).start()

    def stop(self, delete_node: bool = True) -> None:
        """Kill every pod process, remove the pods' network namespaces (and the Node)."""
        self.stop_event.set()
        for rt in list(self.runtimes.values()):
            rt.request_stop(0, force_deleted=True)
        for rt in list(self.runtimes.values()):
            rt.thread.join(timeout=15)
        if self.log_server:
            self.log_server.shutdown()
            self.log_server.server_close()
        if delete_node:
            try:
                self.core.delete_node(self.name)
            except Exception:  # the API server may already be gone
                pass

    def _register(self, log_port: int) -> None:
        try:
            self.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": self.name, "labels": self.labels}})
        except ApiException as err:
            if err.status != 409:
                raise
        self.core.patch_node_status(self.name, {"status": {
            "capacity": self.capacity, "allocatable": self.capacity,
            "addresses": [{"type": "InternalIP", "address": self.bridge.gateway},
                          {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": log_port}},
            "nodeInfo": {"kubeletVersion": "v1.34.4-process-node", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "process://",
                         "kernelVersion": os.uname().release, "osImage": "test process node",
                         "machineID": "", "systemUUID": "", "bootID": "",
                         "kubeProxyVersion": ""},
            "conditions": self._conditions()}})

    def _conditions(self) -> list[dict[str, Any]]:
        beat = now()
        ok = {"type": "Ready", "status": "True", "reason": "KubeletReady",
              "message": "process node is ready", "lastHeartbeatTime": beat}
        quiet = [{"type": t, "status": "False", "reason": f"KubeletHasNo{t}",
                  "lastHeartbeatTime": beat}
                 for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
        return [ok, *quiet]

    def _heartbeat(self) -> None:
        leases = client.CoordinationV1Api(self.api)
        while not self.stop_event.is_set():
            renew = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            lease = {"metadata": {"name": self.name}, "spec": {
                "holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": renew}}
            try:
                try:
                    leases.create_namespaced_lease("kube-node-lease", lease)
                except ApiException as err:
                    if err.status != 409:
                        raise
                    leases.patch_namespaced_lease(self.name, "kube-node-lease", lease)
                self.core.patch_node_status(
                    self.name, {"status": {"conditions": self._conditions()}})
            except Exception as err:
                log.warning("node %s: heartbeat: %s", self.name, err)
            self.stop_event.wait(HEARTBEAT_SECONDS)

    def _on_pod(self, kind: str, obj: Any) -> None:
        if kind == "SYNC":
            present = {p.metadata.uid for p in obj}
            for uid, rt in list(self.runtimes.items()):
                if uid not in present:  # deleted while we were not watching
                    rt.request_stop(0, force_deleted=True)
                    del self.runtimes[uid]
            for pod in obj:
                self._on_pod("ADDED", pod)
            return
        uid = obj.metadata.uid
        rt = self.runtimes.get(uid)
        if kind == "DELETED":
            if rt:
                rt.request_stop(0, force_deleted=True)
                self.runtimes.pop(uid, None)
            return
        alive = rt is not None and rt.thread.is_alive()
        if obj.metadata.deletion_timestamp:
            if alive:
                grace = obj.metadata.deletion_grace_period_seconds
                rt.request_stop(30 if grace is None else grace)
            elif rt is None or not rt.deleting.is_set():
                self.finalize(obj.metadata.namespace, obj.metadata.name, uid)
            return
        if rt is None and obj.status.phase not in ("Succeeded", "Failed"):
            rt = self.runtimes[uid] = PodRuntime(self, obj)
            rt.thread.start()

    def finalize(self, namespace: str, name: str, uid: str) -> None:
        """Remove a pod whose processes are gone: what kubelet does after a graceful delete."""
        try:
            self.core.delete_namespaced_pod(name, namespace, body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)))
        except ApiException as err:
            if err.status not in (404, 409):
                log.warning("pod %s/%s: delete: %s", namespace, name, err.reason)

    # --- `kubectl logs` -----------------------------------------------------------------------

    def _serve_logs(self) -> int:
        node = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # /containerLogs/<ns>/<pod>/<container>?follow=&tailLines=
                url = urllib.parse.urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404)
                    return
                query = dict(urllib.parse.parse_qsl(url.query))
                _, ns, pod, container = parts
                path = node.logs_dir / ns / pod / f"{container}.log"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                data = path.read_bytes() if path.exists() else b""
                tail = int(query.get("tailLines", -1))
                if tail >= 0:
                    data = b"".join(data.splitlines(keepends=True)[-tail:]) if tail else b""
                self.wfile.write(data)
                offset = path.stat().st_size if path.exists() else 0
                running = node.logs.get((ns, pod, container))
                follow = query.get("follow") == "true"
                while follow and running and "terminated" not in running.state:
                    time.sleep(0.2)
                    with open(path, "rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                    offset += len(chunk)
                    self.wfile.write(chunk)
                    self.wfile.flush()

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer((self.bridge.gateway, 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*map(str, self.tls))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name=f"{self.name}-logs").start()
        self.log_server = server
        return server.server_address[1]


class NodeAgent:
    """Process nodes on one pod bridge, with the API proxy and the hosts-file keeper.

    Args:
        kubeconfig: admin kubeconfig of the cluster.
        bridge: the pod network (Bridge.create(); the API server's certificate must name its
            gateway).
        state_dir: where pod folders and logs go.
        api_port: the API server's port on 127.0.0.1.
        node_names: one ProcessNode per name.
        node_options: keyword arguments for every ProcessNode (cpu, memory, gpus, tls, ...).
    """

    def __init__(self, kubeconfig: Path, bridge: Bridge, state_dir: Path, api_port: int,
                 node_names: tuple[str, ...] = ("proc-node-0",), **node_options: Any) -> None:
        from kubernetes import config

        self.api = config.new_client_from_config(str(kubeconfig))
        self.bridge, self.state_dir, self.api_port = bridge, Path(state_dir), api_port
        self.node_names, self.node_options = node_names, node_options
        self.stop_event = threading.Event()
        self.nodes: list[ProcessNode] = []
        self.proxy: ApiProxy | None = None

    def start(self) -> None:
        self.proxy = ApiProxy(self.bridge.gateway, self.api_port)
        self.dns = ClusterDNS(self.api, self.stop_event)
        for name in self.node_names:
            node = ProcessNode(self.api, name, self.bridge, self.dns, self.state_dir,
                               self.api_port, **self.node_options)
            node.start()
            self.nodes.append(node)

    def stop(self) -> None:
        self.stop_event.set()
        for node in self.nodes:
            node.stop()
        if self.proxy:
            self.proxy.close()

    def __enter__(self) -> NodeAgent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
