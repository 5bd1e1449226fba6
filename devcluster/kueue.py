"""Kueue, the real one, against the test cluster: its controller-manager as a local process.

Part of the test cluster (devcluster/), beside kwoknodes.py and nodeagent.py, above
controlplane.py; localcluster.py starts it with `kueue=True`, tests/conftest.py's `kueue_cluster`
fixture starts it on the session's cluster. build-kueue.sh builds the manager from the Go module
proxy (sigs.k8s.io/kueue, KUEUE_VERSION) once per machine and extracts the same module's CRDs and
webhook configurations beside it.

    kueue = Kueue(kueue_dir, bin_dir, kubeconfig, certs, state_dir / "kueue")
    kueue.start()          # CRDs, namespace kueue-system, certificates, the process, webhooks
    kueue.stop()           # webhooks removed first, so the API server never calls a dead Kueue

What runs, and why this way (there is no kube-proxy, so nothing reaches a Service ClusterIP):

- The manager listens on 127.0.0.1 only, on free ports: webhooks (TLS, a serving certificate for
  127.0.0.1 signed by the cluster's CA), health probes (/readyz), metrics. Leader election is off;
  the visibility API server (an aggregated API, VisibilityOnDemand) is off: it would need its own
  certificates and an APIService nothing could reach.
- Kueue's own certificate management is off: it signs certificates for the Service's DNS name,
  which the API server cannot reach here, and it refuses to become ready unless every Kueue CRD
  has a conversion webhook configured. With it off, Kueue reads the webhook certificate from
  `webhook.certDir` and the metrics certificate from a path compiled into it,
  /etc/kueue/metrics/certs; the process runs in a mount namespace of its own in which this
  cluster's folder is bind-mounted there (the host only gets the empty mount point).
- Webhooks: only those on Kueue's own objects (kueue.x-k8s.io: Workload, ClusterQueue,
  ResourceFlavor, Cohort ...) are installed, rewritten to `url: https://127.0.0.1:<port>/...` with
  the cluster CA as caBundle. They are Kueue's defaulting and validation, the checks a Workload
  an operator writes meets on a real cluster, so they are worth having. The webhooks on pods,
  Jobs, Deployments ... are left out on purpose: they are `failurePolicy: Fail`, so installing
  them would put every pod of every test behind this process, and the job integrations they
  serve (Kueue suspending a Job it did not create) are not what an operator that creates its own
  Workloads needs. Kueue's controllers and scheduler do not depend on any webhook.
- The CRDs are served as build-kueue.sh extracted them (config/components/crd/bases): v1beta2
  is the storage version, no conversion webhook; use kueue.x-k8s.io/v1beta2.
"""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Final

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from devcluster.controlplane import Certificates, die_with_parent, free_port, stop_process_group

BUILD_SCRIPT: Final = Path(__file__).with_name("build-kueue.sh")
API_GROUP: Final = "kueue.x-k8s.io"
API_VERSION: Final = "v1beta2"
NAMESPACE: Final = "kueue-system"
METRICS_CERT_PATH: Final = Path("/etc/kueue/metrics/certs")  # compiled into cmd/kueue/main.go
WEBHOOK_PREFIX: Final = "monarch-spmd-kueue-"


def ensure_kueue(quiet: bool = False) -> Path:
    """The folder with Kueue's manager, CRDs and webhooks, built first if this machine has none.

    build-kueue.sh builds it once per machine (minutes); later calls return at once.
    """
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL if quiet else None, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed (exit {result.returncode}); "
                           "run it by hand to see why")
    return Path(lines[-1])


def serving_certificate(certs: Certificates, folder: Path) -> tuple[Path, Path]:
    """tls.crt and tls.key in `folder`: a serving certificate for 127.0.0.1 signed by the CA."""
    ca_cert = x509.load_pem_x509_certificate(certs.ca_crt.read_bytes())
    ca_key = serialization.load_pem_private_key(certs.ca_key.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kueue")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    crt, pem_key = folder / "tls.crt", folder / "tls.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem_key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    pem_key.chmod(0o600)
    return crt, pem_key


def kueue_webhooks(manifests: str, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations reduced to its own API group, pointed at 127.0.0.1:port.

    Args:
        manifests: the text of config/components/webhook/manifests.yaml of the Kueue module.
        port: where the manager's webhook server listens on 127.0.0.1.
        ca_bundle: PEM of the CA that signed the webhook server's certificate.
    """
    configurations = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        kept = []
        for hook in doc.get("webhooks", []):
            groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
            if groups != {API_GROUP}:
                continue
            hook = copy.deepcopy(hook)
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                    "caBundle": base64.b64encode(ca_bundle).decode()}
            kept.append(hook)
        if kept:
            kind = doc["kind"]
            name = WEBHOOK_PREFIX + ("mutating" if kind.startswith("Mutating") else "validating")
            configurations.append({"apiVersion": doc["apiVersion"], "kind": kind,
                                   "metadata": {"name": name}, "webhooks": kept})
    return configurations


def manager_config(*, webhook_port: int, cert_dir: Path, health_port: int,
                   metrics_port: int, frameworks: tuple[str, ...]) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for one local manager."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "featureGates": {"VisibilityOnDemand": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(frameworks)},
    }


class Kueue:
    """Kueue's controller-manager as a local process against a running test control plane.

    Args:
        kueue_dir: build-kueue.sh's folder (the `kueue` binary, crds/, webhooks.yaml).
        bin_dir: the cluster's binaries (kubectl applies the CRDs).
        kubeconfig: admin kubeconfig of the cluster.
        certs: the control plane's Certificates; its CA signs Kueue's serving certificate.
        state_dir: a folder of its own (config, certificates, kueue.log).
        webhooks: install Kueue's webhooks on kueue.x-k8s.io objects (see the module docstring).
        frameworks: Kueue's job integrations (`integrations.frameworks`); the default is
            Kueue's own default. They act only on objects labelled `kueue.x-k8s.io/queue-name`.

    Attributes:
        webhook_port, health_port, metrics_port: where the manager listens on 127.0.0.1.
        log_path: the manager's log.
    """

    def __init__(self, kueue_dir: Path, bin_dir: Path, kubeconfig: Path, certs: Certificates,
                 state_dir: Path, *, webhooks: bool = True,
                 frameworks: tuple[str, ...] = ("batch/job",)) -> None:
        self.kueue_dir, self.bin_dir = Path(kueue_dir), Path(bin_dir)
        self.kubeconfig, self.certs, self.state_dir = kubeconfig, certs, Path(state_dir)
        self.with_webhooks, self.frameworks = webhooks, tuple(frameworks)
        self.webhook_port = self.health_port = self.metrics_port = 0
        self.log_path = self.state_dir / "kueue.log"
        self.process: subprocess.Popen | None = None
        self.installed_webhooks: list[dict[str, Any]] = []

    def __enter__(self) -> Kueue:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _kubectl(self, *args: str, input: str | None = None) -> None:
        result = subprocess.run([str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}",
                                 *args], input=input, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{result.stdout}{result.stderr}")

    def install_crds(self) -> None:
        """Apply Kueue's CRDs (server-side: they are too large for client-side apply)."""
        crds = str(self.kueue_dir / "crds")
        self._kubectl("apply", "--server-side", "--force-conflicts", "-f", crds)
        self._kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", crds)

    def start(self, timeout: float = 120.0) -> None:
        """CRDs, namespace, certificates, the manager; waits until it is ready, then webhooks."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        self.install_crds()
        core = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        try:
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        except ApiException as err:
            if err.status != 409:
                raise
        cert_dir = self.state_dir / "certs"
        serving_certificate(self.certs, cert_dir)
        self.webhook_port, self.health_port = free_port(), free_port()
        self.metrics_port = free_port()
        cfg = self.state_dir / "config.yaml"
        cfg.write_text(json.dumps(manager_config(
            webhook_port=self.webhook_port, cert_dir=cert_dir, health_port=self.health_port,
            metrics_port=self.metrics_port, frameworks=self.frameworks), indent=2))
        # The metrics certificate path is fixed in Kueue; give this process its own view of it.
        METRICS_CERT_PATH.mkdir(parents=True, exist_ok=True)
        command = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   'mount --bind "$0" "$1" && shift && exec "$@"',
                   str(cert_dir), str(METRICS_CERT_PATH),
                   str(self.kueue_dir / "kueue"), f"--config={cfg}", "--zap-log-level=2"]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=die_with_parent)
        self._wait_ready(timeout)
        if self.with_webhooks:
            self.install_webhooks()

    def _wait_ready(self, timeout: float) -> None:
        """Wait for /readyz: Kueue reports ready once its webhook server serves."""
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"kueue exited with {self.process.returncode}; "
                                   f"{self.log_path}:\n{tail}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"kueue not ready after {timeout}s; see {self.log_path}")
            time.sleep(0.3)

    def install_webhooks(self) -> None:
        """Register Kueue's webhooks on its own objects with the API server (see the docstring)."""
        manifests = (self.kueue_dir / "webhooks.yaml").read_text()
        configurations = kueue_webhooks(manifests, self.webhook_port,
                                        self.certs.ca_crt.read_bytes())
        self._kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                      input="\n---\n".join(json.dumps(c) for c in configurations))
        self.installed_webhooks = configurations
        self._wait_webhooks_serve()

    def _wait_webhooks_serve(self, timeout: float = 30.0) -> None:
        """A dry-run ResourceFlavor create goes through the mutating webhook once it is live."""
        api = client.CustomObjectsApi(config.new_client_from_config(str(self.kubeconfig)))
        probe = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "ResourceFlavor",
                 "metadata": {"name": "monarch-spmd-webhook-probe"}}
        deadline = time.monotonic() + timeout
        while True:
            try:
                made = api.create_cluster_custom_object(API_GROUP, API_VERSION, "resourceflavors",
                                                        probe, dry_run="All")
                # Kueue's ResourceFlavor webhook adds its finalizer: proof the call reached it.
                if "kueue.x-k8s.io/resource-in-use" in made["metadata"].get("finalizers", []):
                    return
            except ApiException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kueue's webhooks do not answer; see {self.log_path}")
            time.sleep(0.3)

    def remove_webhooks(self) -> None:
        for conf in self.installed_webhooks:
            kind = conf["kind"].lower() + "s"
            subprocess.run([str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}",
                            "delete", "--ignore-not-found", f"{kind}.admissionregistration.k8s.io",
                            conf["metadata"]["name"]], capture_output=True, timeout=60)
        self.installed_webhooks = []

    def stop(self) -> None:
        """Remove the webhooks, then stop the manager; safe to call more than once."""
        if self.installed_webhooks:
            self.remove_webhooks()
        if self.process is not None:
            stop_process_group(self.process)
            self.process = None

    def describe(self) -> dict[str, Any]:
        return {"kueue_dir": str(self.kueue_dir), "kueue_log": str(self.log_path),
                "kueue_webhook_port": self.webhook_port}


# --- objects for tests: a flavor for the kwok nodes, queues with a quota ----------------------


def resource_flavor(name: str, *, node_labels: dict[str, str] | None = None,
                    node_taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A ResourceFlavor: the nodes it stands for (labels) and the taints they carry.

    A workload is admitted to a flavor with `nodeTaints` only if its pods tolerate them.
    """
    spec: dict[str, Any] = {}
    if node_labels:
        spec["nodeLabels"] = dict(node_labels)
    if node_taints:
        spec["nodeTaints"] = [dict(t) for t in node_taints]
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "ResourceFlavor",
            "metadata": {"name": name}, "spec": spec}


def cluster_queue(name: str, flavor: str, quota: dict[str, str | int], *,
                  preemption: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ClusterQueue open to every namespace with one flavor and a nominal quota per resource.

    Args:
        quota: resource name -> nominal quota, e.g. {"cpu": "8", "nvidia.com/gpu": 4}. A
            workload that requests a resource not named here is never admitted.
        preemption: the ClusterQueue's spec.preemption, e.g. {"withinClusterQueue":
            "LowerPriority"}; Kueue's default is never to preempt.
    """
    spec: dict[str, Any] = {
        "namespaceSelector": {},  # every namespace; left out, none would match
        "resourceGroups": [{
            "coveredResources": list(quota),
            "flavors": [{"name": flavor, "resources": [
                {"name": r, "nominalQuota": str(q)} for r, q in quota.items()]}],
        }],
    }
    if preemption:
        spec["preemption"] = dict(preemption)
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "ClusterQueue",
            "metadata": {"name": name}, "spec": spec}


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
    """A LocalQueue: what a Workload's spec.queueName names, in the Workload's namespace."""
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue_name}}
