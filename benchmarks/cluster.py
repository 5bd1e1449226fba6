"""The cluster the operator benchmarks run on, and the controllers under test.

``bench_cluster()`` either attaches to a running cluster (``--kubeconfig``, e.g. one started with
``python -m devcluster up``) or starts the project's test cluster itself through its API
(``devcluster``: a real etcd + kube-apiserver + controller-manager + scheduler on loopback, and
kwok fake nodes). Pods land on kwok nodes only with the kwok toleration and node selector, which
every workload here sets.

Controllers are started fresh for each trial as child processes, each with its own identity
(``benchmarks.kube.Identity``), so their request counts and peak memory belong to one job:

- ``SpmdOperator``: ``python -m spmd_operator --all-namespaces``
- ``PyTorchJobOperator``: Kubeflow's training-operator v1 (built by build-pytorchjob.sh) with only
  the PyTorchJob scheme. Its webhook certificate rotator expects a Secret mounted in a pod; here
  the Secret is created empty, the rotator fills it, and its files are copied to the rotator's
  certificate folder, which is what the volume mount would have done. No webhook configuration
  entry points at it, so the API server never calls it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import kube
from benchmarks.common import PY, REPO
from devcluster.controlplane import stop_process_group

KWOK_NODE_SELECTOR = {"type": "kwok"}
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
SPMD_CRD = REPO / "crds" / "spmd.monarch.dev_spmdjobs.yaml"
PYTORCHJOB_BUILD = REPO / "benchmarks" / "build-pytorchjob.sh"
# Hard-coded in training-operator v1.9.3 (pkg/cert): where it reads its serving certificate.
PYTORCHJOB_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
PYTORCHJOB_NAMESPACE = "kubeflow"


@dataclass
class Cluster:
    kubeconfig: Path
    bin_dir: Path | None
    state_dir: Path
    admin: kube.Kube
    identities: dict[str, kube.Identity] = field(default_factory=dict)
    crds: set[str] = field(default_factory=set)

    def identity(self, name: str) -> kube.Identity:
        if name not in self.identities:
            self.identities[name] = kube.Identity(self.admin, name, self.state_dir)
        return self.identities[name]

    def kubectl(self) -> str:
        if self.bin_dir and (self.bin_dir / "kubectl").exists():
            return str(self.bin_dir / "kubectl")
        found = shutil.which("kubectl")
        if not found:
            raise RuntimeError("kubectl not found (set MONARCH_SPMD_K8S_BIN)")
        return found

    def apply_crd(self, path: Path, name: str) -> None:
        if name in self.crds:
            return
        r = subprocess.run([self.kubectl(), "--kubeconfig", str(self.kubeconfig), "apply",
                            "--server-side", "--force-conflicts", "-f", str(path)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"kubectl apply -f {path} failed: {r.stderr.strip()[-2000:]}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            crd = self.admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", ok404=True)
            conds = {c["type"]: c["status"] for c in ((crd or {}).get("status") or {}).get("conditions") or []}
            if conds.get("Established") == "True":
                self.crds.add(name)
                return
            time.sleep(0.2)
        raise TimeoutError(f"CRD {name} not established")


def pod_placement() -> dict:
    """PodSpec fields that put a pod on a kwok node (and only there)."""
    return {"tolerations": [dict(KWOK_TOLERATION)], "nodeSelector": dict(KWOK_NODE_SELECTOR)}


@contextlib.contextmanager
def bench_cluster(kubeconfig: str | os.PathLike | None = None, kwok_nodes: int = 4,
                  state_dir: str | os.PathLike | None = None,
                  bin_dir: str | os.PathLike | None = None) -> Iterator[Cluster]:
    """A cluster with kwok nodes: the one `kubeconfig` names (e.g. the `cluster` test fixture's,
    or one from `python -m devcluster up`), or, without one, the test cluster's control plane
    and kwok nodes started here (no process node: nothing here runs a real container)."""
    state = Path(state_dir or tempfile.mkdtemp(prefix="spmd-bench-"))
    state.mkdir(parents=True, exist_ok=True)
    if kubeconfig:
        bin_dir = bin_dir or os.environ.get("MONARCH_SPMD_K8S_BIN")
        yield Cluster(Path(kubeconfig), Path(bin_dir) if bin_dir else None, state, kube.Kube(kubeconfig))
        return
    sys.path.insert(0, str(REPO))
    from devcluster.binaries import ensure_binaries
    from devcluster.controlplane import ControlPlane
    from devcluster.kwoknodes import KwokNodes

    bin_dir = ensure_binaries()
    cp = ControlPlane(bin_dir, state / "cluster")
    cp.start()
    nodes = None
    try:
        # Room for the largest job of every actor at once: 1024 pods of a PyTorchJob may still be
        # leaving while the next job arrives.
        nodes = KwokNodes(bin_dir, cp.kubeconfig, state / "kwok", count=kwok_nodes, pods=1000)
        nodes.start()
        yield Cluster(cp.kubeconfig, bin_dir, state, kube.Kube(cp.kubeconfig))
    finally:
        if nodes is not None:
            nodes.stop()
        cp.stop()
        # etcd's data is the bulk of the state folder; the component logs stay for a look.
        shutil.rmtree(cp.state_dir / "etcd", ignore_errors=True)


def ensure_pytorchjob() -> Path:
    """The training-operator cache folder, building it first if needed (cached, versioned)."""
    out = subprocess.run(["bash", str(PYTORCHJOB_BUILD)], check=True, stdout=subprocess.PIPE,
                         text=True).stdout.strip().splitlines()
    return Path(out[-1])


class Controller:
    """A controller process under test: started fresh, with its own identity."""

    name = "controller"
    identity_name = "controller"

    def __init__(self, cluster: Cluster, log_dir: Path) -> None:
        self.cluster = cluster
        self.ident = cluster.identity(self.identity_name)
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def prepare(self) -> None:
        pass

    def started(self, deadline: float) -> None:
        """Called after spawning, until ready; raise on failure."""

    def start(self, timeout: float = 120.0) -> None:
        self.prepare()
        cmd, env = self.command()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log = self.log_dir / f"{self.name}.log"
        t0 = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = t0 + timeout
        self.started(deadline)
        # Ready when its start-up requests (lists, watches, CRD checks) have died down.
        kube.wait_quiet(self.cluster.admin, self.ident, quiet=2.0, limit=max(5.0, deadline - time.monotonic()),
                        min_requests=1)
        self.check_alive()
        self.ready_s = time.monotonic() - t0

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def peak_rss_mib(self) -> float | None:
        return kube.vm_hwm_mib(self.proc.pid) if self.proc else None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)
            self.proc = None


class SpmdOperator(Controller):
    name = "spmd-operator"
    identity_name = "spmd-operator"

    def prepare(self) -> None:
        self.cluster.apply_crd(SPMD_CRD, "spmdjobs.spmd.monarch.dev")

    def command(self):
        env = dict(os.environ, KUBECONFIG=str(self.ident.kubeconfig), PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO / "operator"), str(REPO), env.get("PYTHONPATH", "")] if p)
        from devcluster.controlplane import free_port

        # Its own health port: the default (0.0.0.0:8080) may be taken on a shared machine.
        return [PY, "-m", "spmd_operator", "--all-namespaces",
                f"--liveness=http://127.0.0.1:{free_port()}/healthz"], env


class PyTorchJobOperator(Controller):
    name = "pytorchjob-operator"
    identity_name = "pytorchjob-operator"

    def prepare(self) -> None:
        self.home = ensure_pytorchjob()
        self.cluster.apply_crd(self.home / "crds" / "kubeflow.org_pytorchjobs.yaml", "pytorchjobs.kubeflow.org")
        a = self.cluster.admin
        a.create("/api/v1/namespaces", {"metadata": {"name": PYTORCHJOB_NAMESPACE}}, exist_ok=True)
        a.create(f"/api/v1/namespaces/{PYTORCHJOB_NAMESPACE}/secrets",
                 {"metadata": {"name": "training-operator-webhook-cert"}}, exist_ok=True)
        a.create("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                 {"metadata": {"name": "validator.training-operator.kubeflow.org"}, "webhooks": []},
                 exist_ok=True)

    def command(self):
        from devcluster.controlplane import free_port

        self.probe_port = free_port()
        env = dict(os.environ, KUBECONFIG=str(self.ident.kubeconfig), MY_POD_NAMESPACE=PYTORCHJOB_NAMESPACE)
        return [str(self.home / "bin" / "training-operator.v1"), "--enable-scheme=pytorchjob",
                "--metrics-bind-address=0", f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
                f"--webhook-server-port={free_port()}"], env

    def started(self, deadline: float) -> None:
        # Stand in for the Secret volume mount: copy the rotator's certificate into its folder.
        copied = False
        while time.monotonic() < deadline:
            self.check_alive()
            if not copied:
                sec = self.cluster.admin.get(
                    f"/api/v1/namespaces/{PYTORCHJOB_NAMESPACE}/secrets/training-operator-webhook-cert")
                data = sec.get("data") or {}
                if data.get("tls.crt") and data.get("tls.key"):
                    import base64

                    PYTORCHJOB_CERT_DIR.mkdir(parents=True, exist_ok=True)
                    for k in ("tls.crt", "tls.key", "ca.crt"):
                        if k in data:
                            (PYTORCHJOB_CERT_DIR / k).write_bytes(base64.b64decode(data[k]))
                    copied = True
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{self.name} not ready; see {self.log}")
