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
- ``JobSetOperator``: JobSet's controller manager (built by build-jobset.sh) WITH its webhooks, as
  it is deployed: the JobSet defaulting and validation webhooks and the pod webhooks (which, as in
  JobSet's kustomize patches, only see pods labelled ``jobset.sigs.k8s.io/jobset-name``). There is
  no kube-proxy here, so the API server cannot reach a webhook behind a Service ClusterIP: the
  manager serves its webhooks on 127.0.0.1 with a certificate of a CA made for it, and the webhook
  configurations say ``url: https://127.0.0.1:<port>/...`` with that CA as caBundle (what
  devcluster/kueue.py does for Kueue). JobSet's own certificate management is off (it signs for
  the Service's DNS name). A JobSet's pods are created by the Job controller of
  kube-controller-manager, so that controller is part of the JobSet actor: in the benchmark's own
  cluster the control plane's controller-manager runs without it (``--controllers=*,-job``) and
  each JobSet trial starts a second kube-controller-manager running only the Job controller
  (same binary, default flags) as its own identity, so its requests and memory are counted with
  JobSet's. On a cluster given by ``--kubeconfig`` the Job controller is the cluster's and only
  the JobSet manager's requests and memory can be counted (``job_controller_counted: false``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import types
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
# Hard-coded in training-operator v1.9.3 (pkg/cert): where it reads its serving certificate. One
# folder for every instance on the machine: two benchmarks at once (the suite's two workers) wrote
# each other's files under a starting operator ("tls: failed to find any PEM data"). Each instance
# runs in a mount namespace of its own where a folder of its trial is bound over this path.
PYTORCHJOB_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
PYTORCHJOB_NAMESPACE = "kubeflow"
JOBSET_BUILD = REPO / "benchmarks" / "build-jobset.sh"
JOBSET_NAMESPACE = "jobset-system"
JOBSET_WEBHOOK_PREFIX = "spmd-bench-jobset-"
#: Pods per kwok node (devcluster's default); the benchmarks add nodes for larger jobs.
KWOK_PODS_PER_NODE = 1000


@dataclass
class Cluster:
    kubeconfig: Path
    bin_dir: Path | None
    state_dir: Path
    admin: kube.Kube
    identities: dict[str, kube.Identity] = field(default_factory=dict)
    crds: set[str] = field(default_factory=set)
    #: The control plane when this benchmark started it (None for a cluster given by kubeconfig).
    control_plane: object | None = None
    #: Whether the control plane's controller-manager runs without its Job controller (JobSet).
    job_controller_split: bool = False
    #: The kwok nodes when this benchmark started them.
    kwok: object | None = None

    def plane_pids(self) -> dict[str, int]:
        """The processes of the control plane this benchmark started, by name (kube-apiserver,
        etcd, kube-controller-manager, kube-scheduler, kwok); empty for a cluster given by
        kubeconfig."""
        out = {name: proc.pid for name, proc in (getattr(self.control_plane, "processes", None) or {}).items()}
        process = getattr(self.kwok, "process", None)
        if process is not None:
            out["kwok"] = process.pid
        return out

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

    def split_job_controller(self) -> bool:
        """Runs the control plane's controller-manager without its Job controller (once), so a
        JobSet trial can run the Job controller as a process of its own; False when this is not
        the benchmark's own cluster."""
        cp = self.control_plane
        if cp is None:
            return False
        if not self.job_controller_split:
            name = "kube-controller-manager"
            cp.args[name] = [a for a in cp.args[name] if not a.startswith("--controllers=")] + ["--controllers=*,-job"]
            cp.restart(name)
            self.job_controller_split = True
        return True


def pod_placement() -> dict:
    """PodSpec fields that put a pod on a kwok node (and only there)."""
    return {"tolerations": [dict(KWOK_TOLERATION)], "nodeSelector": dict(KWOK_NODE_SELECTOR)}


def kwok_pod_stages_without_completion() -> str:
    """kwok's own default pod stages (v0.7.0, ``kustomize/stage/pod/fast``) less ``pod-complete``,
    which makes every pod owned by a Job Succeeded as soon as it runs. Training pods run until
    the training ends; a JobSet's pods are owned by a Job, and completing them at once would make
    its Job controller remove N tracking finalizers (N more requests) and its job finish."""
    import json as _json

    out = subprocess.run(["go", "mod", "download", "-json", "sigs.k8s.io/kwok@v0.7.0"], check=True,
                         capture_output=True, text=True, env=dict(os.environ, GOFLAGS="-mod=mod"))
    fast = Path(_json.loads(out.stdout)["Dir"]) / "kustomize" / "stage" / "pod" / "fast"
    return "\n---\n".join((fast / f).read_text() for f in ("pod-ready.yaml", "pod-delete.yaml"))


def _kwok_nodes_class():
    """Defined on first use: devcluster.kwoknodes imports the kubernetes client, which the floor's
    client process (it imports this module) should not pay for."""
    from devcluster.kwoknodes import KwokNodes

    class _Nodes(KwokNodes):
        """devcluster's kwok nodes, whose pods never complete by themselves (see
        :func:`kwok_pod_stages_without_completion`); otherwise the same start-up."""

        def stages(self) -> str:
            return kwok_pod_stages_without_completion()

    return _Nodes


@contextlib.contextmanager
def bench_cluster(kubeconfig: str | os.PathLike | None = None, kwok_nodes: int = 4,
                  state_dir: str | os.PathLike | None = None,
                  bin_dir: str | os.PathLike | None = None,
                  kwok_pods: int = KWOK_PODS_PER_NODE) -> Iterator[Cluster]:
    """A cluster with kwok nodes: the one `kubeconfig` names (e.g. the `cluster` test fixture's,
    or one from `python -m devcluster up`), or, without one, the test cluster's control plane
    and `kwok_nodes` kwok nodes of `kwok_pods` pods each started here (no process node: nothing
    here runs a real container). On the nodes started here no pod completes by itself, not even
    a Job's (kwok's default makes those Succeeded at once)."""
    state = Path(state_dir or tempfile.mkdtemp(prefix="spmd-bench-"))
    state.mkdir(parents=True, exist_ok=True)
    if kubeconfig:
        bin_dir = bin_dir or os.environ.get("MONARCH_SPMD_K8S_BIN")
        yield Cluster(Path(kubeconfig), Path(bin_dir) if bin_dir else None, state, kube.Kube(kubeconfig))
        return
    sys.path.insert(0, str(REPO))
    from devcluster.binaries import ensure_binaries
    from devcluster.controlplane import ControlPlane

    bin_dir = ensure_binaries()
    cp = ControlPlane(bin_dir, state / "cluster")
    cp.start()
    nodes = None
    try:
        # Room for the largest job (the callers size it: every trial's namespace is gone before
        # the next starts, but a gang restart with TerminatingOrFailed holds two gangs at once).
        nodes = _kwok_nodes_class()(bin_dir, cp.kubeconfig, state / "kwok", count=kwok_nodes, pods=kwok_pods)
        nodes.start()
        yield Cluster(cp.kubeconfig, bin_dir, state, kube.Kube(cp.kubeconfig), control_plane=cp, kwok=nodes)
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
        kube.wait_quiet(self.cluster.admin, self.identities(), quiet=2.0,
                        limit=max(5.0, deadline - time.monotonic()), min_requests=1)
        self.check_alive()
        self.ready_s = time.monotonic() - t0

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def identities(self) -> list[kube.Identity]:
        """Every identity whose requests count as this controller's."""
        return [self.ident]

    def peak_rss_mib(self) -> float | None:
        return kube.vm_hwm_mib(self.proc.pid) if self.proc else None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)
            self.proc = None


class SpmdOperator(Controller):
    name = "spmd-operator"
    identity_name = "spmd-operator"
    #: More command-line flags for the operator (a benchmark's ``--operator-flag``), after its own.
    extra_flags: tuple[str, ...] = ()
    #: More environment for the operator's process (a benchmark's ``--operator-env``).
    extra_env: tuple[tuple[str, str], ...] = ()

    def prepare(self) -> None:
        self.cluster.apply_crd(SPMD_CRD, "spmdjobs.spmd.monarch.dev")

    def command(self):
        env = dict(os.environ, KUBECONFIG=str(self.ident.kubeconfig), PYTHONUNBUFFERED="1")
        env.update(self.extra_env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO / "operator"), str(REPO), env.get("PYTHONPATH", "")] if p)
        from devcluster.controlplane import free_port

        # Its own health port: the default (0.0.0.0:8080) may be taken on a shared machine.
        # One replica, measured alone: no leader election where the operator has it.
        flags = spmd_operator_extra_flags(env)
        self.metrics_port = next((int(f.split("=", 1)[1]) for f in flags if f.startswith("--metrics-port=")), None)
        return [PY, "-m", "spmd_operator", "--all-namespaces",
                f"--liveness=http://127.0.0.1:{free_port()}/healthz", *flags, *self.extra_flags], env

    def scrape(self) -> dict[str, float]:
        """The operator's own counters (requests by verb and outcome, reconcile passes), or {}."""
        if not getattr(self, "metrics_port", None):
            return {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith(("spmdjob_api_requests_total", "spmdjob_reconcile_duration_seconds_count",
                                "spmdjob_reconcile_duration_seconds_sum", "spmdjob_pods_created_total")):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out


_SPMD_FLAGS: list[str] | None = None


def spmd_operator_extra_flags(env: dict[str, str]) -> list[str]:
    """Flags this version of the operator has that keep the measurement to one replica
    (``--no-leader-election``) and off ports others may hold (``--metrics-port``: a free one)."""
    global _SPMD_FLAGS
    if _SPMD_FLAGS is None:
        help_text = subprocess.run([PY, "-m", "spmd_operator", "--help"], cwd=REPO, env=env,
                                   capture_output=True, text=True, timeout=60).stdout
        _SPMD_FLAGS = [f for f in ("--no-leader-election",) if f in help_text]
        if "--metrics-port" in help_text:
            _SPMD_FLAGS.append("--metrics-port")  # a port of its own, below
    flags = [f for f in _SPMD_FLAGS if f != "--metrics-port"]
    if "--metrics-port" in _SPMD_FLAGS:
        from devcluster.controlplane import free_port

        # Metrics stay on (the default), on a free port: the default one may be taken here.
        flags.append(f"--metrics-port={free_port()}")
    return flags


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
        self.cert_dir = self.log_dir / "pytorchjob-certs"
        shutil.rmtree(self.cert_dir, ignore_errors=True)
        self.cert_dir.mkdir(parents=True)
        binary = [str(self.home / "bin" / "training-operator.v1"), "--enable-scheme=pytorchjob",
                  "--metrics-bind-address=0", f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
                  f"--webhook-server-port={free_port()}"]
        # `exec`: the operator is the process the benchmark stops and measures.
        bind = (f'mkdir -p {shlex.quote(str(PYTORCHJOB_CERT_DIR))} && mount --bind {shlex.quote(str(self.cert_dir))} '
                f'{shlex.quote(str(PYTORCHJOB_CERT_DIR))} && exec "$@"')
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, "sh", *binary], env

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

                    for k in ("tls.crt", "tls.key", "ca.crt"):
                        if k in data:  # whole files only: the operator watches the folder
                            part = self.cert_dir / f".{k}.part"
                            part.write_bytes(base64.b64decode(data[k]))
                            part.rename(self.cert_dir / k)
                    copied = True
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{self.name} not ready; see {self.log}")


def ensure_jobset() -> Path:
    """JobSet's cache folder, building it first if needed (cached, versioned)."""
    out = subprocess.run(["bash", str(JOBSET_BUILD)], check=True, stdout=subprocess.PIPE,
                         text=True).stdout.strip().splitlines()
    return Path(out[-1])


def _self_signed_ca(folder: Path) -> tuple[Path, Path]:
    """ca.crt and ca.key in `folder`: a CA made for one webhook server."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spmd-bench-webhook-ca")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    crt, pem = folder / "ca.crt", folder / "ca.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


def jobset_webhooks(manifests: str, patches: str, port: int, ca_bundle: bytes) -> list[dict]:
    """JobSet's webhook configurations as its kustomization installs them (the pod webhooks get
    their objectSelector from the patches), pointed at 127.0.0.1:port with `ca_bundle`."""
    import base64
    import copy

    import yaml

    replaced = {}
    for doc in yaml.safe_load_all(patches):
        for op in doc or []:
            if op.get("op") == "replace":
                replaced[op["value"]["name"]] = op["value"]
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        hooks = []
        for hook in doc.get("webhooks", []):
            hook = copy.deepcopy(replaced.get(hook["name"], hook))
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                    "caBundle": base64.b64encode(ca_bundle).decode()}
            hooks.append(hook)
        kind = doc["kind"]
        out.append({"apiVersion": doc["apiVersion"], "kind": kind,
                    "metadata": {"name": JOBSET_WEBHOOK_PREFIX + ("mutating" if kind.startswith("Mutating") else "validating")},
                    "webhooks": hooks})
    return out


class JobSetOperator(Controller):
    """JobSet's controller manager with its webhooks, plus the Job controller that makes the pods
    (see the module docstring)."""

    name = "jobset-controller"
    identity_name = "jobset-controller"

    def __init__(self, cluster: Cluster, log_dir: Path) -> None:
        super().__init__(cluster, log_dir)
        self.job_ident: kube.Identity | None = None
        self.job_proc: subprocess.Popen | None = None
        self.webhooks: list[dict] = []

    def identities(self) -> list[kube.Identity]:
        return [self.ident] + ([self.job_ident] if self.job_ident else [])

    @property
    def job_controller_counted(self) -> bool:
        return self.job_ident is not None

    def prepare(self) -> None:
        self.home = ensure_jobset()
        self.cluster.apply_crd(self.home / "crds" / "jobset.x-k8s.io_jobsets.yaml", "jobsets.jobset.x-k8s.io")
        self.cluster.admin.create("/api/v1/namespaces", {"metadata": {"name": JOBSET_NAMESPACE}}, exist_ok=True)
        self._remove_webhooks()  # a previous run's, pointing at a dead port
        if self.cluster.split_job_controller():
            self.job_ident = self.cluster.identity("job-controller")

    def command(self):
        import json

        from devcluster.controlplane import free_port
        from devcluster.kueue import serving_certificate

        state = self.log_dir / "jobset"
        ca_crt, ca_key = _self_signed_ca(state / "ca")
        cert_dir = state / "certs"

        # serving_certificate reads only the CA's two files from the Certificates it is given.
        serving_certificate(types.SimpleNamespace(ca_crt=ca_crt, ca_key=ca_key), cert_dir)
        self.ca_bundle = ca_crt.read_bytes()
        self.webhook_port, self.probe_port = free_port(), free_port()
        cfg = state / "config.yaml"
        cfg.write_text(json.dumps({
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": self.webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.probe_port}"},
        }))
        env = dict(os.environ, KUBECONFIG=str(self.ident.kubeconfig), POD_NAMESPACE=JOBSET_NAMESPACE)
        return [str(self.home / "bin" / "jobset-manager"), f"--config={cfg}", "--zap-log-level=2"], env

    def started(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.25)
        else:
            raise TimeoutError(f"{self.name} not ready; see {self.log}")
        self._install_webhooks()
        if self.job_ident is not None:
            self._start_job_controller()

    def _install_webhooks(self) -> None:
        kinds = {"MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
                 "ValidatingWebhookConfiguration": "validatingwebhookconfigurations"}
        self.webhooks = jobset_webhooks((self.home / "webhooks.yaml").read_text(),
                                        (self.home / "webhook-patches.yaml").read_text(),
                                        self.webhook_port, self.ca_bundle)
        for conf in self.webhooks:
            self.cluster.admin.create(f"/apis/admissionregistration.k8s.io/v1/{kinds[conf['kind']]}", conf)

    def _remove_webhooks(self) -> None:
        for plural, suffix in (("mutatingwebhookconfigurations", "mutating"),
                               ("validatingwebhookconfigurations", "validating")):
            self.cluster.admin.delete(f"/apis/admissionregistration.k8s.io/v1/{plural}/{JOBSET_WEBHOOK_PREFIX}{suffix}")
        self.webhooks = []

    def _start_job_controller(self) -> None:
        """kube-controller-manager with only the Job controller, as its own identity."""
        from devcluster.controlplane import free_port

        assert self.job_ident is not None and self.cluster.bin_dir is not None
        kc = str(self.job_ident.kubeconfig)
        with open(self.log_dir / "job-controller.log", "ab") as log:
            self.job_proc = subprocess.Popen(
                [str(self.cluster.bin_dir / "kube-controller-manager"), f"--kubeconfig={kc}",
                 f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                 "--controllers=job", "--leader-elect=false", "--bind-address=127.0.0.1",
                 f"--secure-port={free_port()}", "--profiling=false"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def check_alive(self) -> None:
        super().check_alive()
        if self.job_proc is not None and self.job_proc.poll() is not None:
            raise RuntimeError(f"the Job controller exited with {self.job_proc.returncode}; "
                               f"see {self.log_dir / 'job-controller.log'}")

    def job_controller_rss_mib(self) -> float | None:
        return kube.vm_hwm_mib(self.job_proc.pid) if self.job_proc else None

    def stop(self) -> None:
        # Webhooks first: with failurePolicy Fail, a dead webhook would refuse JobSet pods.
        try:
            self._remove_webhooks()
        finally:
            if self.job_proc is not None:
                stop_process_group(self.job_proc)
                self.job_proc = None
            super().stop()
