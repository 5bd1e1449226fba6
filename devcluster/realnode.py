"""Real nodes for the test cluster: kubelet + containerd + runc + CNI, with CoreDNS as cluster DNS.

Part of the test cluster (devcluster/), beside nodeagent.py (the process node) and kwoknodes.py,
above controlplane.py; localcluster.py starts it with `real_nodes=N`. Pods on a real node run the
images they name in real containers (cgroups, memory limits, OOMKilled, read-only root file
systems, non-root users, dropped capabilities, probes), with images imported from the tars
scripts/build-images.sh caches; nothing is ever pulled (use imagePullPolicy Never/IfNotPresent).

Layout of one cluster's real nodes (slot s: the first free one on this machine, held by a lock):

    host                              netns msrn<s> (all real nodes of the cluster)
    127.0.0.1:<api>  <-- proxy <--    10.0.0.1:443 (the `kubernetes` Service's ClusterIP, on lo)
    CoreDNS 10.246.<s>.1:53   ----    eth0 10.246.<s>.2, node IPs 10.246.<s>.10+i
    veth msrnh<s> 10.246.<s>.1        kubelet i on <node IP>:10250, containerd i (own socket, root)
    route 10.247.<8s>.0/21 -> .2      bridge msrn<s>b<i> 10.247.<8s+i>.1/24 -> pods of node i

Every real node lives in one network namespace of the cluster's own, as the machines of a small
cluster share a LAN: pods of different nodes reach each other through it (it forwards; nothing
else does, and it has no route off this machine), the API server reaches each kubelet on its node
IP, pods reach the API server at the ClusterIP the kubelet puts in KUBERNETES_SERVICE_HOST (no
kube-proxy: a proxy listens on that address in the namespace) and resolve names through CoreDNS,
which runs on the host (kubernetes plugin: headless Services resolve to their pods' IPs, pods
to `a-b-c-d.<ns>.pod`; ClusterIP Services resolve but nothing routes to them).

Nodes are named `real-node-<i>`, labelled `type=real` and tainted REAL_TAINT: only pods with
REAL_TOLERATION land there. Each containerd keeps its root (images, layers) per slot under
~/.cache/monarch-spmd/realnode, so images are imported once per machine, not per start.
Component logs go to <state_dir>/realnode/ (containerd-<i>.log, kubelet-<i>.log, coredns.log).
"""

from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Final

import yaml
from kubernetes import client, config

from devcluster.controlplane import SERVICE_CIDR, die_with_parent, free_port, stop_process_group
from devcluster.podnetwork import TcpForwarder

log = logging.getLogger("realnode")

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
BUILD_SCRIPT: Final = Path(__file__).with_name("build-realnode.sh")
IMAGES_SCRIPT: Final = REPO_ROOT / "scripts" / "build-images.sh"
CACHE: Final = Path(os.environ.get("MONARCH_SPMD_CACHE", Path.home() / ".cache" / "monarch-spmd"))
RUN_DIR: Final = Path("/run/monarch-spmd")
CNI_BIN: Final = "/usr/lib/cni"
CGROUP_ROOT: Final = Path("/sys/fs/cgroup")

REAL_LABEL: Final = "monarch-spmd.dev/real-node"
REAL_TAINT: Final = {"key": REAL_LABEL, "value": "true", "effect": "NoSchedule"}
REAL_TOLERATION: Final = {"key": REAL_LABEL, "operator": "Exists", "effect": "NoSchedule"}
NODE_PREFIX: Final = "real-node-"
MAX_NODES: Final = 8
# Images imported into every real node (names as scripts/build-images.sh prints them).
NODE_IMAGES: Final = ("pause", "operator", "worker-cpu", "debian-torch")
# Kernel settings the kubelet changes on start (not namespaced); put back when the nodes stop.
KERNEL_TUNABLES: Final = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                          "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                          "kernel/keys/root_maxbytes")

_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNET: Final = 0x40000000


def sh(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(args, input=stdin, text=True, capture_output=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def ensure_realnode_binaries() -> Path:
    """The folder with kubelet and coredns (build-realnode.sh builds them once per machine)."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed (exit {result.returncode})")
    return Path(lines[-1])


def ensure_images(names: tuple[str, ...] = NODE_IMAGES) -> dict[str, tuple[str, Path]]:
    """{name: (reference, tar)} of the images, built first where this machine has none yet."""
    result = subprocess.run(["bash", str(IMAGES_SCRIPT), *names], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{IMAGES_SCRIPT.name} failed (exit {result.returncode})")
    images = {}
    for line in result.stdout.splitlines():
        name, ref, tar = line.split("\t")
        images[name] = (ref, Path(tar))
    return images


def containerd_ref(ref: str) -> str:
    """A reference as containerd names it (`monarch-spmd/x:1` -> `docker.io/monarch-spmd/x:1`)."""
    first = ref.split("/", 1)[0]
    if "/" not in ref:
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return ref
    return f"docker.io/{ref}"


def in_netns(netns: str, fn: Any) -> Any:
    """Run fn() in a thread that joined network namespace `netns`; sockets it makes stay there."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            with open(f"/run/netns/{netns}") as f:
                if _libc.setns(f.fileno(), _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({netns})")
            out["value"] = fn()
        except BaseException as err:  # handed to the caller
            out["error"] = err

    # The thread ends right after: its namespace never leaks into other work.
    t = threading.Thread(target=run, name=f"netns-{netns}")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


class NetnsProxy(TcpForwarder):
    """Forwards TCP from <address>:<port> inside a network namespace to 127.0.0.1:<upstream>."""

    def __init__(self, netns: str, address: str, port: int, upstream: int) -> None:
        super().__init__(in_netns(netns, lambda: socket.create_server((address, port))), upstream, "netns-proxy")


class Slot:
    """Slot s of this machine's real-node networks, held through a lock file while in use."""

    def __init__(self, number: int, lock: Any) -> None:
        self.number, self._lock = number, lock
        self.netns = f"msrn{number}"
        self.host_veth = f"msrnh{number}"
        self.link = ipaddress.ip_network(f"10.246.{number}.0/24")
        self.host_ip, self.netns_ip = str(self.link[1]), str(self.link[2])
        self.pod_range = ipaddress.ip_network(f"10.247.{number * MAX_NODES}.0/21")
        self.cache = CACHE / "realnode" / f"slot-{number}"

    @classmethod
    def acquire(cls) -> Slot:
        (CACHE / "realnode").mkdir(parents=True, exist_ok=True)
        for number in range(32):
            lock = open(CACHE / "realnode" / f"slot-{number}.lock", "w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.close()
                continue
            lock.write(str(os.getpid()))
            lock.flush()
            return cls(number, lock)
        raise RuntimeError("no free real-node slot (32 clusters with real nodes on this machine?)")

    def node_ip(self, index: int) -> str:
        return str(self.link[10 + index])

    def pod_subnet(self, index: int) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(f"10.247.{self.number * MAX_NODES + index}.0/24")

    @property
    def run(self) -> Path:
        """Folder of this slot's sockets, runtime state and kubelet roots (stable paths)."""
        return RUN_DIR / f"rn{self.number}"

    def run_dir(self, index: int) -> Path:
        return self.run / f"node-{index}"

    def cgroup_name(self, index: int) -> str:
        return f"monarch-spmd-rn{self.number}-{index}"

    def release(self) -> None:
        self._lock.close()

    # --- the network -------------------------------------------------------------------------

    def create_network(self, nodes: int) -> None:
        sh("ip", "netns", "add", self.netns)
        sh("ip", "link", "add", self.host_veth, "type", "veth", "peer", "name", "eth0",
           "netns", self.netns)
        sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_veth)
        sh("ip", "link", "set", self.host_veth, "up")
        service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
        batch = ["link set lo up", f"addr add {self.netns_ip}/24 dev eth0",
                 f"addr add {service_ip}/32 dev lo"]
        batch += [f"addr add {self.node_ip(i)}/24 dev eth0" for i in range(nodes)]
        batch += ["link set eth0 up"]
        sh("ip", "-n", self.netns, "-batch", "-", stdin="\n".join(batch) + "\n")
        # The namespace routes between its node bridges (pods of different nodes talk); it has
        # no default route, so nothing a pod sends leaves this machine.
        sh("nsenter", f"--net=/run/netns/{self.netns}", "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sh("ip", "route", "replace", str(self.pod_range), "via", self.netns_ip)

    def clean(self) -> None:
        """Remove what a previous user of this slot left: processes, mounts, cgroups, network."""
        cgroups = [self.cgroup_name(i) for i in range(MAX_NODES)]
        kill_cgroup_processes(cgroups)  # the containers
        prefix = str(self.run) + "/"  # kubelets, containerds, shims, CoreDNS: their paths
        for pid, cmdline in processes():
            if prefix in cmdline and pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        unmount_under(self.run)
        shutil.rmtree(self.run, ignore_errors=True)
        remove_cgroups(cgroups)
        sh("ip", "route", "del", str(self.pod_range), check=False)
        sh("ip", "link", "del", self.host_veth, check=False)
        sh("ip", "netns", "del", self.netns, check=False)


def processes() -> list[tuple[int, str]]:
    """(pid, command line) of every process on this machine."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                            .decode(errors="replace")))
            except OSError:
                pass
    return out


def cgroup_dirs(name: str) -> list[Path]:
    """The folders of cgroup `/<name>` in every mounted v1 hierarchy (or the v2 one)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT / name]
    return [d / name for d in sorted(CGROUP_ROOT.iterdir())
            if d.is_dir() and not d.is_symlink() and d.name != "unified"]


def kill_cgroup_processes(names: list[str]) -> None:
    for name in names:
        for top in cgroup_dirs(name):
            if not top.exists():
                continue
            for procs in top.rglob("cgroup.procs"):
                try:
                    pids = procs.read_text().split()
                except OSError:
                    continue
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass


def remove_cgroups(names: list[str]) -> None:
    for name in names:
        for top in cgroup_dirs(name):
            if not top.exists():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                try:
                    d.rmdir()
                except OSError:
                    pass
            try:
                top.rmdir()
            except OSError:
                pass


def unmount_under(folder: Path) -> None:
    prefix = str(folder).rstrip("/") + "/"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    points = [line.split()[4] for line in lines]
    for point in sorted((p for p in points if p.startswith(prefix) or p == prefix[:-1]),
                        key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


class RealNodes:
    """`count` real kubelet nodes (real-node-0 ...) and the cluster DNS, in a network of their own.

    Args:
        bin_dir: the folder with kubectl (control plane binaries).
        realnode_bin: the folder with kubelet and coredns (ensure_realnode_binaries()).
        kubeconfig: admin kubeconfig of the cluster; its certificates are reused by the kubelets.
        ca_crt: the cluster CA (kubelets accept the API server's client certificate with it).
        api_port: the API server's port on 127.0.0.1.
        state_dir: where configs and logs go (<state_dir>/realnode/).
        count: how many nodes (1 to 8).
        images: {name: (reference, tar)} to import into every node (ensure_images()).

    Attributes:
        names: the node names. dns_ip: CoreDNS's address (every pod's nameserver).
        pod_subnets: {node name: its pod CIDR}. slot: the Slot held.
    """

    def __init__(self, bin_dir: Path, realnode_bin: Path, kubeconfig: Path, ca_crt: Path,
                 api_port: int, state_dir: Path, count: int,
                 images: dict[str, tuple[str, Path]]) -> None:
        if not 1 <= count <= MAX_NODES:
            raise ValueError(f"real_nodes must be 1..{MAX_NODES}, not {count}")
        self.bin_dir, self.realnode_bin = Path(bin_dir), Path(realnode_bin)
        self.kubeconfig, self.ca_crt, self.api_port = kubeconfig, ca_crt, api_port
        self.dir = Path(state_dir) / "realnode"
        self.count, self.images = count, images
        self.names = [f"{NODE_PREFIX}{i}" for i in range(count)]
        self.slot: Slot | None = None
        self.proxy: NetnsProxy | None = None
        self.processes: dict[str, subprocess.Popen] = {}
        self.dns_ip = ""
        self.pod_subnets: dict[str, str] = {}
        self._tunables: dict[str, str] = {}

    # --- start -----------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        slot = self.slot = Slot.acquire()
        (self.dir / "slot").write_text(str(slot.number))
        try:
            slot.clean()
            slot.create_network(self.count)
            self.dns_ip = slot.host_ip
            self.pod_subnets = {n: str(slot.pod_subnet(i)) for i, n in enumerate(self.names)}
            service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
            self.proxy = NetnsProxy(slot.netns, service_ip, 443, self.api_port)
            self._start_coredns()
            self._prepare_images()
            for i in range(self.count):  # from this thread: they die with the thread that forks
                self._start_containerd(i)
            self._tunables = {t: (Path("/proc/sys") / t).read_text() for t in KERNEL_TUNABLES}
            for i in range(self.count):
                self._start_kubelet(i)
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, args: list[str], netns: bool = True) -> subprocess.Popen:
        command = (["nsenter", f"--net=/run/netns/{self.slot.netns}", "--"] if netns else []) + args
        with open(self.dir / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=die_with_parent)
        self.processes[name] = proc
        return proc

    def _start_coredns(self) -> None:
        ready = free_port()
        self.slot.run.mkdir(parents=True, exist_ok=True)
        corefile = self.slot.run / "Corefile"  # under the slot's folder: clean() finds CoreDNS
        # No cache: a restarted gang's new pods must resolve at once. Answers carry TTL 5.
        corefile.write_text(
            ".:53 {\n"
            f"    bind {self.dns_ip}\n"
            "    errors\n"
            "    log\n"
            f"    ready 127.0.0.1:{ready}\n"
            "    kubernetes cluster.local in-addr.arpa ip6.arpa {\n"
            f"        kubeconfig {self.kubeconfig}\n"
            "        pods insecure\n"
            "        fallthrough in-addr.arpa ip6.arpa\n"
            "    }\n"
            "}\n")
        proc = self._spawn("coredns", [str(self.realnode_bin / "coredns"), "-conf", str(corefile)],
                           netns=False)
        self._wait(lambda: http_ok(f"http://127.0.0.1:{ready}/ready"), 60, "coredns", proc)

    def _containerd_paths(self, i: int) -> tuple[Path, Path, Path]:
        run = self.slot.run_dir(i)
        return self.slot.cache / f"containerd-{i}", run / "containerd", run / "containerd.sock"

    def _start_containerd(self, i: int) -> None:
        root, state, sock = self._containerd_paths(i)
        node_dir = self.dir / f"node-{i}"
        cni_conf = node_dir / "cni"
        for d in (root, state, cni_conf):
            d.mkdir(parents=True, exist_ok=True)
        subnet = self.slot.pod_subnet(i)
        (cni_conf / "10-monarch-spmd.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0",
            "name": f"monarch-spmd-rn{self.slot.number}-{i}",
            "plugins": [{
                "type": "bridge", "bridge": f"msrn{self.slot.number}b{i}", "isGateway": True,
                "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": str(subnet)}]],
                         "routes": [{"dst": "0.0.0.0/0"}],
                         "dataDir": str(self.slot.run_dir(i) / "ipam")},
            }],
        }, indent=1))
        toml = self.slot.run_dir(i) / "containerd.toml"
        toml.write_text(f"""version = 2
root = "{root}"
state = "{state}"
# Plugins that would share machine-wide paths with another containerd.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.grpc.v1.introspection.plugins"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.images['pause'][0]}"
  # Root here lacks CAP_SYS_RESOURCE: a lower OOM score than containerd's own cannot be set.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
""")
        proc = self._spawn(f"containerd-{i}", ["containerd", "--config", str(toml)])
        self._wait(lambda: self.ctr(i, "version", check=False).returncode == 0, 60,
                   f"containerd-{i}", proc)

    # --- a node that freezes ------------------------------------------------------------------

    def _node_pids(self, i: int) -> list[int]:
        """Node i's kubelet, containerd and containerd's shims (its containers' parents)."""
        pids = [proc.pid for name, proc in self.processes.items()
                if name in (f"kubelet-{i}", f"containerd-{i}") and proc.poll() is None]
        sock = str(self._containerd_paths(i)[2])
        pids += [pid for pid, cmdline in processes() if "containerd-shim" in cmdline and sock in cmdline]
        return pids

    def _freezer(self, i: int) -> Path | None:
        """Node i's cgroup in the v1 freezer hierarchy (its pods' cgroups are under it)."""
        path = CGROUP_ROOT / "freezer" / self.slot.cgroup_name(i)
        return path if (path / "freezer.state").exists() else None

    def freeze(self, i: int) -> None:
        """Node i as a machine that froze, lost power or fell off the network: its kubelet,
        containerd and shims stopped (SIGSTOP), its containers frozen (the cgroup freezer), its
        pods' bridge down. Nothing sent to it is acknowledged and nothing on it takes a step, so
        the API server hears nothing of it either (its pods keep their last status). thaw()
        undoes it."""
        assert self.slot is not None
        for pid in self._node_pids(i):
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        freezer = self._freezer(i)
        if freezer is not None:
            (freezer / "freezer.state").write_text("FROZEN")
        sh("ip", "-n", self.slot.netns, "link", "set", f"msrn{self.slot.number}b{i}", "down")

    def thaw(self, i: int) -> None:
        """Node i as it was before freeze()."""
        assert self.slot is not None
        sh("ip", "-n", self.slot.netns, "link", "set", f"msrn{self.slot.number}b{i}", "up", check=False)
        freezer = self._freezer(i)
        if freezer is not None:
            (freezer / "freezer.state").write_text("THAWED")
        for pid in self._node_pids(i):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def ctr(self, i: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`ctr` against node i's containerd, namespace k8s.io (the CRI's)."""
        sock = self._containerd_paths(i)[2]
        return sh("ctr", "--address", str(sock), "--namespace", "k8s.io", *args, check=check)

    def _prepare_images(self) -> None:
        """Bring every node's containerd root up to date with the image tars.

        Node 0's containerd imports each image whose tar changed since it last imported it (a
        changed image shares most layers with the old one: only new layers are unpacked). The
        other nodes' roots are then hard-linked copies of node 0's, made while no containerd
        runs (their own metadata databases copied for real), so several nodes cost the disk of
        one: committed layers are never written, each container writes to a layer of its own.
        A slot whose node 0 is out of date first takes such a copy of another slot's up-to-date
        root when one is idle: an import costs minutes and its root about 15 GB of disk, enough
        to put the suite's own nodes under disk pressure (the kubelet then evicts every pod).
        """
        marks = {name: tar.name for name, (_, tar) in self.images.items()}
        if self._marks(0) != marks:
            self._link_from_another_slot(marks)
        for attempt in (1, 2):
            if self._marks(0) == marks:
                break
            self._start_containerd(0)
            try:
                self._import_images(0, marks)
            except RuntimeError as err:
                if attempt == 2:
                    raise
                # A root left inconsistent (e.g. by a containerd killed while it unpacked):
                # start over from an empty one.
                log.warning("node 0: import failed (%s); importing into a new root", err)
                shutil.rmtree(self._containerd_paths(0)[0], ignore_errors=True)
            finally:
                stop_process_group(self.processes.pop("containerd-0"))
        root0 = self._containerd_paths(0)[0]
        for i in range(1, self.count):
            if self._marks(i) == marks:
                continue
            began = time.monotonic()
            link_root(root0, self._containerd_paths(i)[0])
            log.info("node %d: images linked from node 0 in %.1fs", i, time.monotonic() - began)

    def _link_from_another_slot(self, marks: dict[str, str]) -> bool:
        """Node 0's root linked from the other slot's node 0 that holds most of ``marks`` (more
        than node 0 does; the import then adds only what it lacks, e.g. an operator image changed
        by a commit), taken only while that slot's lock is free (no containerd writes it meanwhile).
        False if none."""
        root0 = self._containerd_paths(0)[0]

        def held(found: dict[str, str]) -> int:
            return sum(found.get(name) == tar for name, tar in marks.items())

        best, most = None, held(self._marks(0))
        for other in sorted((CACHE / "realnode").glob("slot-*/containerd-0")):
            try:
                found = held(json.loads((other / "monarch-spmd-imported.json").read_text()))
            except (OSError, ValueError):
                continue
            if other != root0 and found > most:
                best, most = other, found
        if best is None:
            return False
        number = best.parent.name.removeprefix("slot-")
        # Opened without truncating: a holder wrote its pid there.
        with open(CACHE / "realnode" / f"slot-{number}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # in use: its containerd may be writing
            began = time.monotonic()
            link_root(best, root0)
        log.info("node 0: images linked from slot %s (%d of %d wanted) in %.1fs", number, most, len(marks),
                 time.monotonic() - began)
        return True

    def _marks_file(self, i: int) -> Path:
        return self._containerd_paths(i)[0] / "monarch-spmd-imported.json"

    def _marks(self, i: int) -> dict[str, str]:
        try:
            return json.loads(self._marks_file(i).read_text())
        except (OSError, ValueError):
            return {}

    def _import_images(self, i: int, want: dict[str, str]) -> None:
        marks = self._marks(i)
        present = set(self.ctr(i, "images", "ls", "-q").stdout.split())
        for name, (ref, tar) in self.images.items():
            if marks.get(name) == want[name] and containerd_ref(ref) in present:
                continue
            began = time.monotonic()
            self.ctr(i, "images", "import", str(tar))
            marks[name] = want[name]
            log.info("node %d: imported %s in %.0fs", i, ref, time.monotonic() - began)
        # Images no longer wanted (e.g. a tar renamed) are left to containerd's garbage collector.
        marks = {k: v for k, v in marks.items() if k in want}
        tmp = self._marks_file(i).with_suffix(".tmp")  # never written in place: it may be linked
        tmp.write_text(json.dumps(marks, indent=1))
        tmp.replace(self._marks_file(i))

    def _start_kubelet(self, i: int) -> None:
        node_dir = self.dir / f"node-{i}"
        run = self.slot.run_dir(i)
        sock = self._containerd_paths(i)[2]
        node_ip = self.slot.node_ip(i)
        cgroup = self.slot.cgroup_name(i)
        for d in cgroup_dirs(cgroup):  # the kubelet wants its cgroup root to exist
            d.mkdir(parents=True, exist_ok=True)
        kubeconfig = node_dir / "kubeconfig"
        kc = yaml.safe_load(self.kubeconfig.read_text())
        service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
        for c in kc["clusters"]:  # through the proxy in the namespace, as pods do
            c["cluster"]["server"] = f"https://{service_ip}:443"
        kubeconfig.write_text(json.dumps(kc))
        kubeconfig.chmod(0o600)
        kubelet_config = node_dir / "kubelet.yaml"
        kubelet_config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": node_ip, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": node_ip, "healthzPort": 10248,
            "containerRuntimeEndpoint": f"unix://{sock}",
            "imageServiceEndpoint": f"unix://{sock}",
            # cgroup v1 without systemd here; each node its own cgroup root.
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{cgroup}", "failCgroupV1": False,
            "failSwapOn": False,
            "clusterDNS": [self.dns_ip], "clusterDomain": "cluster.local", "resolvConf": "",
            "authentication": {"x509": {"clientCAFile": str(self.ca_crt)},
                               "webhook": {"enabled": False}, "anonymous": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "registerWithTaints": [REAL_TAINT],
            # This machine's disk is shared with everything else: never evict, never delete the
            # imported images.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "podLogsDir": str(node_dir / "pod-logs"),
            "volumePluginDir": str(run / "volume-plugins"),
            "maxPods": 60, "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "4s", "syncFrequency": "10s",
        }, indent=1))
        self._spawn(f"kubelet-{i}", [
            str(self.realnode_bin / "kubelet"), f"--config={kubelet_config}",
            f"--kubeconfig={kubeconfig}", f"--root-dir={run / 'kubelet'}",
            f"--cert-dir={run / 'pki'}", f"--hostname-override={self.names[i]}",
            f"--node-ip={node_ip}", f"--node-labels=type=real,{REAL_LABEL}=true", "--v=2",
        ])

    def _wait_ready(self, timeout: float) -> None:
        core = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        deadline = time.monotonic() + timeout
        while True:
            ready = {n.metadata.name for n in core.list_node().items
                     if any(c.type == "Ready" and c.status == "True"
                            for c in n.status.conditions or [])}
            if ready >= set(self.names):
                return
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.dir}/{name}.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"real nodes not Ready after {timeout}s: "
                                   f"{sorted(set(self.names) - ready)}; see {self.dir}")
            time.sleep(0.5)

    def _wait(self, check: Any, timeout: float, what: str, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}; see {self.dir}/{what}.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not ready after {timeout}s; see {self.dir}/{what}.log")
            time.sleep(0.2)

    # --- stop ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every pod (through the kubelets), the kubelets, containerd, CoreDNS, the network."""
        if self.slot is None:
            return
        for i in range(self.count):  # a node a test left frozen must still stop
            try:
                self.thaw(i)
            except Exception as err:  # noqa: BLE001 - best effort before the clean-up
                log.warning("real nodes: thawing node %d failed: %s", i, err)
        try:
            self._drain()
        except Exception as err:  # the API server may be gone: the slot clean-up still runs
            log.warning("real nodes: draining pods failed: %s", err)
        for name in [n for n in self.processes if n.startswith("kubelet")]:
            stop_process_group(self.processes.pop(name))
        for name in [n for n in self.processes if n.startswith("containerd")]:
            i = int(name.rsplit("-", 1)[1])
            self._remove_containers(i)
            stop_process_group(self.processes.pop(name))
        for name in list(self.processes):
            stop_process_group(self.processes.pop(name))
        if self.proxy:
            self.proxy.close()
            self.proxy = None
        for tunable, value in self._tunables.items():
            try:
                (Path("/proc/sys") / tunable).write_text(value)
            except OSError:
                pass
        self._tunables = {}
        self.slot.clean()
        self.slot.release()
        self.slot = None

    def _drain(self, timeout: float = 30.0) -> None:
        """Delete every pod bound to a real node and wait until the kubelets stopped them."""
        if not any(n.startswith("kubelet") and p.poll() is None for n, p in self.processes.items()):
            return
        core = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        for name in self.names:  # cordoned first: a Deployment's replacement pods go nowhere
            core.patch_node(name, {"spec": {"unschedulable": True}})
        for name in self.names:
            pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
            for pod in pods:
                try:
                    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                               grace_period_seconds=0)
                except client.ApiException:
                    pass
        deadline = time.monotonic() + timeout
        for i in range(self.count):
            if f"containerd-{i}" not in self.processes:
                continue
            while time.monotonic() < deadline:
                if not self.ctr(i, "tasks", "ls", "-q", check=False).stdout.split():
                    break
                time.sleep(0.5)

    def _remove_containers(self, i: int) -> None:
        """Whatever the kubelet left in containerd: tasks killed, containers removed."""
        for cid in self.ctr(i, "containers", "ls", "-q", check=False).stdout.split():
            self.ctr(i, "tasks", "kill", "-s", "SIGKILL", cid, check=False)
            self.ctr(i, "tasks", "delete", "-f", cid, check=False)
            self.ctr(i, "containers", "delete", cid, check=False)

    def describe(self) -> dict[str, Any]:
        return {"real_nodes": self.names, "cluster_dns": self.dns_ip,
                "pod_subnets": self.pod_subnets,
                "slot": self.slot.number if self.slot else None}


def http_ok(url: str) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def link_root(source: Path, root: Path) -> None:
    """`root` made a copy of containerd root `source` whose files are hard links (no disk), but for
    its bolt databases, which containerd writes in place: each root its own."""
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    sh("cp", "-al", str(source), str(root))
    for db in root.rglob("*.db"):
        copy = db.with_name(db.name + ".copy")
        shutil.copy2(db, copy)
        copy.replace(db)


def clean_slot(number: int) -> None:
    """Clean up slot `number` after its cluster was killed (python -m devcluster down)."""
    lock = open(CACHE / "realnode" / f"slot-{number}.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return  # still held: its cluster is alive and cleans up itself
    slot = Slot(number, lock)
    slot.clean()
    slot.release()
