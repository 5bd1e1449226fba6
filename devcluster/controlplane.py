"""A real Kubernetes control plane on loopback, for tests.

Part of the test cluster (devcluster/), above binaries.py and below nodeagent.py, kwoknodes.py
and the session fixture in tests/conftest.py. It starts etcd, kube-apiserver,
kube-controller-manager (garbage collection, EndpointSlices, service account tokens, root CA
publishing) and kube-scheduler as child processes, each in its own process group, all on
127.0.0.1 and free ports, with TLS and client certificates:

    with ControlPlane(bin_dir, state_dir) as cp:
        subprocess.run(["kubectl", "--kubeconfig", str(cp.kubeconfig), "get", "ns"])

Everything it writes (certificates, etcd data, one log file per component, the kubeconfig) lives
in `state_dir`. One certificate authority signs the API server's serving certificate and the
admin client certificate (CN=admin, O=system:masters) that kubectl, the Python client, the
controller-manager and the scheduler all use.
"""

from __future__ import annotations

import base64
import ctypes
import datetime
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from monarch_spmd.ports import free_port  # a free port below the ephemeral range: nothing takes it first

SERVICE_CIDR: Final = "10.0.0.0/24"
#: The API server's audit policy when auditing is on: every write, at Metadata level (who, what,
#: when, from which user agent, the answer's code), nothing for reads.
AUDIT_POLICY: Final = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
"""
STOP_GRACE_SECONDS: Final = 10.0
_PR_SET_PDEATHSIG: Final = 1


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up now: a preexec_fn must not load


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the thread that started it ends.

    A safety net for the control plane's processes and pod processes if the harness itself is
    killed; normal tear-down stops them first.
    """
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Certificates:
    """The cluster's CA, serving certificate, admin client certificate and service-account keys.

    Args:
        folder: where the PEM files are written.
        extra_ips: more IP addresses for the serving certificate (e.g. a pod bridge gateway that
            proxies to the API server, so in-pod clients verify it).
    """

    def __init__(self, folder: Path, extra_ips: list[str] | tuple[str, ...] = ()) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc)
        self._not_before = now - datetime.timedelta(hours=1)
        self._not_after = now + datetime.timedelta(days=365)

        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "monarch-spmd-test-ca")])
        ca = (
            self._builder(ca_name, ca_name, self._ca_key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self._ca = ca
        self.ca_crt = self._write("ca.crt", ca.public_bytes(serialization.Encoding.PEM))
        self.ca_key = self._write("ca.key", _pem_key(self._ca_key))

        service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
        names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"]
        ips = ["127.0.0.1", service_ip, *extra_ips]
        sans = [x509.DNSName(n) for n in names] + [
            x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips
        ]
        self.serving_crt, self.serving_key = self._leaf(
            "serving", "kube-apiserver", None, sans, x509.ExtendedKeyUsageOID.SERVER_AUTH
        )
        self.admin_crt, self.admin_key = self._leaf(
            "admin", "admin", "system:masters", [], x509.ExtendedKeyUsageOID.CLIENT_AUTH
        )
        sa_key = ec.generate_private_key(ec.SECP256R1())
        self.sa_key = self._write("sa.key", _pem_key(sa_key))
        self.sa_pub = self._write(
            "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )

    def client(self, name: str, group: str = "system:masters") -> tuple[Path, Path]:
        """A client certificate and key for user ``name`` in ``group`` (a test client whose
        requests the audit log tells apart by user name)."""
        return self._leaf(f"client-{name}", name, group, [], x509.ExtendedKeyUsageOID.CLIENT_AUTH)

    def _builder(self, subject: x509.Name, issuer: x509.Name, key) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
        )

    def _leaf(self, stem, cn, org, sans, usage) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        builder = self._builder(x509.Name(attrs), self._ca.subject, key).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        return (
            self._write(f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            self._write(f"{stem}.key", _pem_key(key)),
        )

    def _write(self, name: str, data: bytes) -> Path:
        path = self.folder / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path


def write_kubeconfig(path: Path, server: str, certs: Certificates) -> Path:
    """A kubeconfig with the certificates embedded, so the one file is all a client needs."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "monarch-spmd-test", "cluster": {
            "server": server, "certificate-authority-data": b64(certs.ca_crt)}}],
        "users": [{"name": "admin", "user": {
            "client-certificate-data": b64(certs.admin_crt),
            "client-key-data": b64(certs.admin_key)}}],
        "contexts": [{"name": "monarch-spmd-test", "context": {
            "cluster": "monarch-spmd-test", "user": "admin", "namespace": "default"}}],
        "current-context": "monarch-spmd-test",
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
    path.chmod(0o600)
    return path


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler as local processes.

    Args:
        bin_dir: the folder with the binaries (see binaries.ensure_binaries).
        state_dir: a folder of its own for certificates, etcd data, logs and the kubeconfig.
        extra_ips: more IP addresses the API server's certificate must be valid for.
        startup_timeout: seconds start() waits for the cluster to become ready.

    Attributes:
        kubeconfig: the admin kubeconfig (valid once start() returned).
        server: the API server's URL, https://127.0.0.1:<port>.
        api_port: the API server's port.
        certs: the Certificates.
        start_seconds: how long the last start() took.
    """

    def __init__(self, bin_dir: Path, state_dir: Path, extra_ips: list[str] | tuple[str, ...] = (),
                 startup_timeout: float = 120.0) -> None:
        self.bin_dir = Path(bin_dir)
        self.state_dir = Path(state_dir)
        self.extra_ips = tuple(extra_ips)
        self.startup_timeout = startup_timeout
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.api_port = 0
        self.server = ""
        self.start_seconds = 0.0
        self.processes: dict[str, subprocess.Popen] = {}
        self.args: dict[str, list[str]] = {}
        self.etcd_url = ""
        self.certs: Certificates | None = None

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start every component and wait until the cluster serves requests."""
        began = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began

    def _start(self) -> None:
        certs = self.certs = Certificates(self.state_dir / "pki", self.extra_ips)
        etcd_port, peer_port = free_port(), free_port()
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        write_kubeconfig(self.kubeconfig, self.server, certs)

        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self.etcd_url = etcd_url
        self._spawn("etcd", [
            "--name=default", f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
        ])
        self._spawn("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}", f"--cert-dir={self.state_dir / 'apiserver'}",
            f"--tls-cert-file={certs.serving_crt}", f"--tls-private-key-file={certs.serving_key}",
            f"--client-ca-file={certs.ca_crt}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={certs.sa_pub}",
            f"--service-account-signing-key-file={certs.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true", "--endpoint-reconciler-type=none",
            # `kubectl logs` goes from the API server to the node agent's log endpoint.
            f"--kubelet-client-certificate={certs.admin_crt}",
            f"--kubelet-client-key={certs.admin_key}",
            "--kubelet-preferred-address-types=InternalIP",
            "--profiling=false",
        ])
        self._wait_for("kube-apiserver", lambda: self._get("/readyz") == 200)

        component_auth = [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--profiling=false",
        ]
        self._spawn("kube-controller-manager", [
            *component_auth, f"--secure-port={free_port()}",
            f"--root-ca-file={certs.ca_crt}",
            f"--service-account-private-key-file={certs.sa_key}",
            f"--cluster-signing-cert-file={certs.ca_crt}",
            f"--cluster-signing-key-file={certs.ca_key}",
        ])
        self._spawn("kube-scheduler", [*component_auth, f"--secure-port={free_port()}"])
        # The service-account controller creates `default` in every namespace: a sign that the
        # controller-manager runs, and pods cannot be created before it exists.
        self._wait_for(
            "kube-controller-manager",
            lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default") == 200,
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        self.args[name] = list(args)
        log = open(self.state_dir / f"{name}.log", "ab")
        try:
            self.processes[name] = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent,
            )
        finally:
            log.close()

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.certs is not None
        ctx = ssl.create_default_context(cafile=str(self.certs.ca_crt))
        ctx.load_cert_chain(str(self.certs.admin_crt), str(self.certs.admin_key))
        return ctx

    def _get(self, path: str) -> int:
        """HTTP status of a GET on the API server, 0 when it does not answer."""
        try:
            with urllib.request.urlopen(self.server + path, context=self._ssl_context(),
                                        timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code
        except OSError:
            return 0

    def _wait_for(self, what: str, ready) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not ready():
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode}; see {self.state_dir / name}.log"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not ready after {self.startup_timeout}s; "
                                   f"see the logs in {self.state_dir}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop every component (newest first) and wait until no process of theirs is left."""
        for name in reversed(list(self.processes)):
            stop_process_group(self.processes.pop(name))

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def kill(self, *names: str) -> None:
        """SIGKILLs components (e.g. ``kube-apiserver``, ``etcd``), as a crash would: no clean-up."""
        for name in names:
            proc = self.processes.pop(name)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

    def revive(self, *names: str) -> None:
        """Starts killed components again with their old flags (etcd keeps its data) and waits."""
        order = [n for n in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler") if n in names]
        for name in order:
            self._spawn(name, self.args[name])
            if name == "etcd":
                self._wait_for("etcd", self._etcd_healthy)
            elif name == "kube-apiserver":
                self._wait_for("kube-apiserver", lambda: self._get("/readyz") == 200)

    def enable_audit(self) -> Path:
        """Turns on the API server's audit log of writes (:data:`AUDIT_POLICY`), restarting the
        API server once if it runs without it; returns the log's path (JSON lines)."""
        log = self.state_dir / "audit.log"
        args = self.args["kube-apiserver"]
        if not any(a.startswith("--audit-log-path") for a in args):
            policy = self.state_dir / "audit-policy.yaml"
            policy.write_text(AUDIT_POLICY)
            args += [f"--audit-policy-file={policy}", f"--audit-log-path={log}", "--audit-log-format=json",
                     "--audit-log-maxsize=0", "--audit-log-mode=blocking"]
            if "kube-apiserver" in self.processes:
                self.restart("kube-apiserver")
        return log

    def audit_events(self) -> list[dict]:
        """The audit log's events so far (writes only), oldest first."""
        log = self.state_dir / "audit.log"
        if not log.exists():
            return []
        events = []
        for line in log.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a line being written
        return events

    def restart(self, *names: str, down_seconds: float = 0.0) -> float:
        """Kills components, keeps them down ``down_seconds``, starts them again; returns the outage.

        The outage is measured until the API server answers again. With ``kube-apiserver`` its
        watch cache starts over, so a client watching from an older resourceVersion gets
        410 Gone and must list again, which is what an API server upgrade does to operators.
        """
        began = time.monotonic()
        names = names or ("kube-apiserver",)
        self.kill(*names)
        time.sleep(down_seconds)
        self.revive(*names)
        return time.monotonic() - began


def stop_process_group(proc: subprocess.Popen, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM the process group led by `proc`, SIGKILL it after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    # Anything else left in the group (children of the leader) goes too.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
