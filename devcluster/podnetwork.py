"""The pod network of the test process nodes: a bridge, pod network namespaces, cluster names.

Part of the test cluster (devcluster/), used by nodeagent.py. Bridge creates a Linux bridge of
its own (`spmdbr<n>`, 10.244.<n>.0/24) and one network namespace per pod with a veth pair into
it; nothing sent by a pod is routed beyond the bridge. ApiProxy forwards <gateway>:<port> to the
API server on loopback, so pods reach it at KUBERNETES_SERVICE_HOST/PORT. ClusterDNS stands in
for cluster DNS: it keeps /etc/netns/<netns>/hosts of every pod (which `ip netns exec` mounts over
/etc/hosts) in step with the EndpointSlices of headless Services, so `<svc>`, `<svc>.<ns>`,
`<svc>.<ns>.svc` and `<svc>.<ns>.svc.cluster.local` resolve to the endpoint pod IPs, including
not-ready pods of a Service with publishNotReadyAddresses.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Final

from kubernetes import client, watch

log = logging.getLogger("nodeagent")

NETNS_DIR: Final = Path("/etc/netns")


def sh(*args: str, stdin: str | None = None) -> None:
    subprocess.run(args, input=stdin, text=True, check=True, capture_output=True)


def watch_forever(stop: threading.Event, list_fn: Callable, on_event: Callable,
                  **kwargs: Any) -> None:
    """List then watch `list_fn` until `stop`, calling on_event(type, obj); relists after errors.

    A listing calls on_event("SYNC", items) once with every current object.
    """
    while not stop.is_set():
        try:
            listing = list_fn(**kwargs)
            on_event("SYNC", listing.items)
            w = watch.Watch()
            w.resource_version = listing.metadata.resource_version
            while not stop.is_set():
                for ev in w.stream(list_fn, resource_version=w.resource_version,
                                   timeout_seconds=5, **kwargs):
                    on_event(ev["type"], ev["object"])
                    if stop.is_set():
                        break
        except Exception as err:  # network trouble, 410 Gone, a bug in a handler: relist
            if not stop.is_set():
                log.warning("watch %s: %s; relisting", list_fn.__name__, err)
                stop.wait(1)


class Bridge:
    """A Linux bridge of our own, the /24 of pod IPs on it and the pods' network namespaces.

    Bridge.create() takes the first free slot n (bridge `spmdbr<n>`, subnet 10.244.<n>.0/24, so
    several clusters can share a machine); the gateway address <subnet>.1 is the host's side.
    The bridge's alias names the process that made it, so a slot whose maker was killed is
    cleaned up and reused.
    """

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.name = f"spmdbr{slot}"
        self.subnet = ipaddress.ip_network(f"10.244.{slot}.0/24")
        self.gateway = str(self.subnet[1])
        #: The gateway's MAC: locally administered, one per slot, set once (see create()).
        self.mac = f"02:00:0a:f4:{slot:02x}:01"
        self.netns_prefix = f"spmd{slot}-"
        self._free = [str(ip) for ip in self.subnet.hosts()][1:]
        self._lock = threading.Lock()

    @classmethod
    def create(cls) -> Bridge:
        for slot in range(256):
            if cls._abandoned(slot):  # left by a harness that was killed
                cls(slot).destroy()
            try:  # creating the link is the lock: it fails if another cluster holds the slot
                sh("ip", "link", "add", f"spmdbr{slot}", "type", "bridge")
            except subprocess.CalledProcessError:
                continue
            bridge = cls(slot)
            sh("ip", "link", "set", bridge.name, "alias", f"monarch-spmd pid {os.getpid()}")
            # A bridge whose address was never set takes the lowest address of its ports, so a
            # pod's veth added or removed can change the gateway's MAC under the other pods: their
            # cached neighbour entry then names a port that is gone, and their packets to the
            # gateway (the API proxy) are dropped until the entry expires (seconds to a minute).
            # A set address never changes.
            sh("ip", "link", "set", bridge.name, "address", bridge.mac)
            sh("ip", "addr", "add", f"{bridge.gateway}/24", "dev", bridge.name)
            sh("ip", "link", "set", bridge.name, "up")
            # Pods reach each other and the gateway; nothing they send is routed further.
            Path(f"/proc/sys/net/ipv4/conf/{bridge.name}/forwarding").write_text("0")
            return bridge
        raise RuntimeError("no free spmdbr<n> bridge slot")

    @staticmethod
    def _abandoned(slot: int) -> bool:
        """True if bridge `spmdbr<slot>` exists and the process that made it is gone."""
        try:
            alias = Path(f"/sys/class/net/spmdbr{slot}/ifalias").read_text().split()
        except OSError:
            return False
        if alias[:2] != ["monarch-spmd", "pid"]:
            return False
        try:
            os.kill(int(alias[2]), 0)
            return False
        except ProcessLookupError:
            return True
        except (OSError, ValueError, IndexError):
            return False

    def add_pod(self, netns: str) -> str:
        """Create `netns` attached to the bridge with a fresh IP; return the IP.

        Its /etc/netns/<netns>/hosts starts empty: ClusterDNS.register fills it.
        """
        with self._lock:  # round robin: an IP is not handed out again soon after release
            ip = self._free.pop(0)
        veth = self.veth_name(netns)
        etc = NETNS_DIR / netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("")
        (etc / "resolv.conf").write_text("# cluster names come from /etc/hosts\n"
                                         "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        sh("ip", "netns", "add", netns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "link", "set", veth, "master", self.name, "up")
        sh("ip", "-n", netns, "-batch", "-", stdin=(
            "link set lo up\n"
            f"addr add {ip}/24 dev eth0\n"
            "link set eth0 up\n"
            f"route add default via {self.gateway}\n"))
        return ip

    def veth_name(self, netns: str) -> str:
        """The host's end of the pod's veth pair, a port of the bridge."""
        return f"veth{self.slot}x{netns[-6:]}"[:15]

    def remove_pod(self, netns: str, ip: str | None) -> None:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)  # its veth goes too
        shutil.rmtree(NETNS_DIR / netns, ignore_errors=True)
        if ip:
            with self._lock:
                self._free.append(ip)

    def destroy(self) -> None:
        """Remove every pod netns of this bridge, then the bridge."""
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for line in listing.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(self.netns_prefix):
                self.remove_pod(name, None)
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)


class TcpForwarder:
    """Forwards each TCP connection accepted on ``server`` to 127.0.0.1:<upstream>."""

    def __init__(self, server: socket.socket, upstream: int, name: str) -> None:
        self.upstream = upstream
        self._server = server
        threading.Thread(target=self._accept, daemon=True, name=name).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                conn.close()
                continue
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()


class ApiProxy(TcpForwarder):
    """Forwards TCP from <gateway>:<port> to the API server on 127.0.0.1:<port>."""

    def __init__(self, listen_host: str, port: int) -> None:
        self.port = port
        super().__init__(socket.create_server((listen_host, port)), port, "api-proxy")


class ClusterDNS:
    """Keeps each pod's /etc/hosts in step with the EndpointSlices of headless Services."""

    def __init__(self, api: client.ApiClient, stop: threading.Event) -> None:
        self._discovery = client.DiscoveryV1Api(api)
        self._slices: dict[str, list[str]] = {}  # slice uid -> its hosts lines
        self._pods: dict[str, str] = {}  # netns -> the pod's own lines
        self._written: dict[str, str] = {}
        self._lock = threading.Lock()
        threading.Thread(
            target=watch_forever, daemon=True, name="dns",
            args=(stop, self._discovery.list_endpoint_slice_for_all_namespaces, self._on_event),
            kwargs={"label_selector": "service.kubernetes.io/headless"},
        ).start()

    @staticmethod
    def slice_lines(s: client.V1EndpointSlice) -> list[str]:
        """Hosts lines for the ready (or published-not-ready) endpoints of one slice."""
        ns = s.metadata.namespace
        svc = (s.metadata.labels or {}).get("kubernetes.io/service-name")
        lines = []
        for ep in s.endpoints or []:
            if not svc or (ep.conditions and ep.conditions.ready is False):
                continue
            names = [svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"]
            if ep.hostname:
                host = f"{ep.hostname}.{svc}.{ns}.svc"
                names += [host, f"{host}.cluster.local"]
            lines += [f"{addr}\t{' '.join(names)}" for addr in ep.addresses]
        return lines

    def _on_event(self, kind: str, obj: Any) -> None:
        with self._lock:
            if kind == "SYNC":
                self._slices = {s.metadata.uid: self.slice_lines(s) for s in obj}
            elif kind == "DELETED":
                self._slices.pop(obj.metadata.uid, None)
            else:
                self._slices[obj.metadata.uid] = self.slice_lines(obj)
            self._write_all()

    def hosts(self, own_lines: str) -> str:
        lines = sorted({line for lines in self._slices.values() for line in lines})
        return ("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                + own_lines + "\n# headless services\n" + "".join(f"{line}\n" for line in lines))

    def register(self, netns: str, own_lines: str) -> None:
        """Write a pod's hosts file now and keep it up to date until unregister()."""
        with self._lock:
            self._pods[netns] = own_lines
            self._write_all()

    def unregister(self, netns: str) -> None:
        with self._lock:
            self._pods.pop(netns, None)
            self._written.pop(netns, None)

    def _write_all(self) -> None:
        for netns, own in self._pods.items():
            text = self.hosts(own)
            path = NETNS_DIR / netns / "hosts"
            if self._written.get(netns) != text and path.exists():
                # Rewrite in place: `ip netns exec` bind-mounted this very inode over /etc/hosts.
                with open(path, "r+") as f:
                    f.write(text)
                    f.truncate()
                self._written[netns] = text
