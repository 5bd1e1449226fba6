"""Kubernetes helpers shared by the operator benchmarks.

- Identities: every actor under test (the SPMDJob operator, the PyTorchJob controller, the
  no-operator floor) talks to the API server as its own ServiceAccount, with a kubeconfig holding a
  TokenRequest token, and a FlowSchema routes that account's requests to the ``exempt`` priority
  level (so no actor is throttled by API Priority and Fairness differently from another).
- Request counting at the API server: ``apiserver_flowcontrol_dispatched_requests_total`` on
  ``/metrics`` is labelled by flow schema, so the difference of that counter for an actor's own
  FlowSchema before and after a job is the number of requests the server dispatched for it.
- Watching: a thread per watched collection records when each pod was first seen and first seen
  Running, and when a job's status first reported it Running.
- Requests by verb (``Identity.count_by_verb``): one more FlowSchema per verb for the same
  account, matched before its own, so the same counter says how many were GETs, LISTs, WATCHes,
  writes...; ``requests_of`` sums them with the account's own schema.
- Process memory: peak resident set (VmHWM) from /proc.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import urlencode

import urllib3
import yaml

BENCH_NAMESPACE = "spmd-bench-system"
FLOW_PREFIX = "spmd-bench-"
#: The verbs of resource requests (as API Priority and Fairness sees them: a LIST is not a GET,
#: a WATCH is neither); ``Identity.count_by_verb`` gives each a FlowSchema.
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: The bucket of requests to non-resource URLs (discovery, /version...).
NON_RESOURCE = "nonresource"


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


class Kube:
    """A small, thread-safe JSON client for the API server, configured from a kubeconfig.

    Deliberately thin (urllib3 and json, no models), so the no-operator floor measures the API
    server and not a client library, and so the benchmarks do not depend on one client version.
    """

    def __init__(self, kubeconfig: str | os.PathLike, pool: int = 32) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = cfg["current-context"]
        ctx = next(c for c in cfg["contexts"] if c["name"] == ctx_name)["context"]
        cluster = next(c for c in cfg["clusters"] if c["name"] == ctx["cluster"])["cluster"]
        user = next(u for u in cfg["users"] if u["name"] == ctx["user"])["user"]
        self.server = cluster["server"].rstrip("/")
        self.cluster = cluster
        sslctx = ssl.create_default_context()
        if "certificate-authority-data" in cluster:
            sslctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        elif "certificate-authority" in cluster:
            sslctx.load_verify_locations(cafile=cluster["certificate-authority"])
        self.headers = {"Accept": "application/json"}
        if "client-certificate-data" in user:
            with tempfile.TemporaryDirectory() as d:
                crt, key = Path(d, "c.crt"), Path(d, "c.key")
                crt.write_bytes(base64.b64decode(user["client-certificate-data"]))
                key.write_bytes(base64.b64decode(user["client-key-data"]))
                sslctx.load_cert_chain(str(crt), str(key))
        elif "client-certificate" in user:
            sslctx.load_cert_chain(user["client-certificate"], user["client-key"])
        if "token" in user:
            self.headers["Authorization"] = f"Bearer {user['token']}"
        self.http = urllib3.PoolManager(maxsize=pool, block=False, ssl_context=sslctx, retries=False)

    def request(self, method: str, path: str, body=None, query: dict | None = None,
                content_type: str = "application/json", timeout: float = 60.0, ok404: bool = False):
        url = self.server + path + (("?" + urlencode(query)) if query else "")
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        r = self.http.request(method, url, body=data, headers=headers, timeout=timeout)
        if r.status == 404 and ok404:
            return None
        if r.status >= 300:
            raise ApiError(r.status, method, path, r.data.decode(errors="replace"))
        ctype = r.headers.get("Content-Type", "")
        return json.loads(r.data) if "json" in ctype else r.data.decode(errors="replace")

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def create(self, path: str, body: dict, exist_ok: bool = False):
        try:
            return self.request("POST", path, body)
        except ApiError as e:
            if exist_ok and e.status == 409:
                return None
            raise

    def patch(self, path: str, body: dict, kind: str = "merge"):
        ctype = {"merge": "application/merge-patch+json",
                 "strategic": "application/strategic-merge-patch+json",
                 "json": "application/json-patch+json"}[kind]
        return self.request("PATCH", path, body, content_type=ctype)

    def delete(self, path: str, body: dict | None = None):
        return self.request("DELETE", path, body, ok404=True)

    def watch(self, path: str, resource_version: str, timeout_seconds: int = 30,
              query: dict | None = None) -> Iterator[dict]:
        q = dict(query or {}, watch="true", resourceVersion=resource_version,
                 timeoutSeconds=str(timeout_seconds), allowWatchBookmarks="false")
        url = self.server + path + "?" + urlencode(q)
        r = self.http.request("GET", url, headers=self.headers, preload_content=False,
                              timeout=urllib3.Timeout(connect=10, read=timeout_seconds + 15))
        try:
            if r.status >= 300:
                raise ApiError(r.status, "WATCH", path, r.read().decode(errors="replace"))
            buf = b""
            for chunk in r.stream(65536):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            r.release_conn()


class Identity:
    """A ServiceAccount with cluster-admin, its kubeconfig and a FlowSchema that counts it."""

    def __init__(self, admin: Kube, name: str, folder: Path) -> None:
        self.name = name
        self.flow_schema = FLOW_PREFIX + name
        self.user = f"system:serviceaccount:{BENCH_NAMESPACE}:{name}"
        admin.create("/api/v1/namespaces", {"metadata": {"name": BENCH_NAMESPACE}}, exist_ok=True)
        admin.create(f"/api/v1/namespaces/{BENCH_NAMESPACE}/serviceaccounts",
                     {"metadata": {"name": name}}, exist_ok=True)
        admin.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "metadata": {"name": FLOW_PREFIX + name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": BENCH_NAMESPACE}],
        }, exist_ok=True)
        admin.create("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": self.flow_schema},
            "spec": {
                "matchingPrecedence": 100,
                "priorityLevelConfiguration": {"name": "exempt"},
                "rules": [{
                    "subjects": [{"kind": "ServiceAccount",
                                  "serviceAccount": {"name": name, "namespace": BENCH_NAMESPACE}}],
                    "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                       "clusterScope": True, "namespaces": ["*"]}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }],
            },
        }, exist_ok=True)
        token = admin.create(
            f"/api/v1/namespaces/{BENCH_NAMESPACE}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": 24 * 3600}},
        )["status"]["token"]
        self.kubeconfig = Path(folder) / f"kubeconfig-{name}"
        self.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        cluster = {k: v for k, v in admin.cluster.items()}
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "bench", "cluster": cluster}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "bench", "user": name, "namespace": "default"}}],
            "current-context": name,
        }))
        self.kubeconfig.chmod(0o600)

    def verb_schema(self, verb: str) -> str:
        """The FlowSchema counting this account's requests of one verb (or NON_RESOURCE)."""
        return f"{self.flow_schema}.{verb}"

    def count_by_verb(self, admin: Kube) -> None:
        """Adds a FlowSchema per verb (and one for non-resource URLs) for this account, matched
        before its own schema (precedence 99 < 100) and routed to the same ``exempt`` level: the
        API server's dispatched-requests counter then splits its requests by verb. Idempotent."""
        subject = {"kind": "ServiceAccount", "serviceAccount": {"name": self.name, "namespace": BENCH_NAMESPACE}}
        for verb in (*VERBS, NON_RESOURCE):
            if verb == NON_RESOURCE:
                rule = {"subjects": [subject], "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}
            else:
                rule = {"subjects": [subject], "resourceRules": [{
                    "verbs": [verb], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True,
                    "namespaces": ["*"]}]}
            admin.create("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", {
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                "metadata": {"name": self.verb_schema(verb)},
                "spec": {"matchingPrecedence": 99, "priorityLevelConfiguration": {"name": "exempt"},
                         "rules": [rule]},
            }, exist_ok=True)


_SAMPLE = re.compile(r'^apiserver_flowcontrol_dispatched_requests_total\{([^}]*)\}\s+([0-9.eE+]+)')


def dispatched_by_flow_schema(admin: Kube) -> dict[str, float]:
    """{flow schema: requests dispatched so far}, summed over priority levels, from /metrics."""
    text = admin.get("/metrics")
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        fs = labels.get("flow_schema", "")
        out[fs] = out.get(fs, 0.0) + float(m.group(2))
    return out


def _own(ident: Identity, flow_schema: str) -> bool:
    """Whether a flow schema counts requests of ``ident``: its own, or one of its verb schemas."""
    return flow_schema == ident.flow_schema or flow_schema.startswith(ident.flow_schema + ".")


def requests_of(admin: Kube, ident: Identity | Sequence[Identity]) -> int:
    """Requests dispatched so far for an identity (or the sum over several)."""
    idents = [ident] if isinstance(ident, Identity) else list(ident)
    counts = dispatched_by_flow_schema(admin)
    return int(sum(v for fs, v in counts.items() if any(_own(i, fs) for i in idents)))


def requests_by_verb(counts: dict[str, float], ident: Identity) -> dict[str, int]:
    """{verb: requests} of ``ident`` in a :func:`dispatched_by_flow_schema` reading, for an
    identity given ``count_by_verb``; what no verb schema matched is under ``"other"``."""
    out = {verb: int(counts.get(ident.verb_schema(verb), 0)) for verb in (*VERBS, NON_RESOURCE)}
    out["other"] = int(counts.get(ident.flow_schema, 0))
    return out


_REQUEST_TOTAL = re.compile(r'^apiserver_request_total\{([^}]*)\}\s+([0-9.eE+]+)')


def metrics_snapshot(admin: Kube) -> dict:
    """One read of the API server's /metrics: ``flow`` ({flow schema: dispatched requests}) and
    ``requests`` ({"VERB group/resource[/subresource]": apiserver_request_total, every client})."""
    text = admin.get("/metrics")
    flow: dict[str, float] = {}
    requests: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            fs = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))).get("flow_schema", "")
            flow[fs] = flow.get(fs, 0.0) + float(m.group(2))
            continue
        m = _REQUEST_TOTAL.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            res = "/".join(x for x in (labels.get("group"), labels.get("resource"), labels.get("subresource")) if x)
            key = f"{labels.get('verb', '?')} {res or '-'}"
            requests[key] = requests.get(key, 0.0) + float(m.group(2))
    return {"flow": flow, "requests": requests}


def wait_quiet(admin: Kube, ident: Identity | Sequence[Identity], quiet: float = 2.0, limit: float = 30.0,
               min_requests: int = 0) -> int:
    """Wait until the identity's (or identities') request counter has not moved for `quiet`
    seconds (at most `limit` seconds); returns the counter."""
    deadline = time.monotonic() + limit
    last = requests_of(admin, ident)
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = requests_of(admin, ident)
        if now != last or now < min_requests:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


class Watcher(threading.Thread):
    """Lists then watches a collection; calls `on_event(obj, t)` for each object state seen."""

    def __init__(self, kube: Kube, path: str, on_event: Callable[[dict, float], None],
                 query: dict | None = None, on_deleted: Callable[[dict, float], None] | None = None) -> None:
        super().__init__(daemon=True)
        self.kube, self.path, self.on_event, self.query = kube, path, on_event, query
        self.on_deleted = on_deleted
        self._stopping = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                listing = self.kube.get(self.path, query=self.query)
                t = time.time()
                for item in listing.get("items", []):
                    self.on_event(item, t)
                rv = listing["metadata"]["resourceVersion"]
                self.ready.set()
                while not self._stopping.is_set():
                    gone = False
                    for ev in self.kube.watch(self.path, rv, timeout_seconds=5, query=self.query):
                        t = time.time()
                        if ev["type"] == "ERROR":
                            gone = True  # e.g. 410 Gone: list again
                            break
                        obj = ev["object"]
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if ev["type"] != "DELETED":
                            self.on_event(obj, t)
                        elif self.on_deleted is not None:
                            self.on_deleted(obj, t)
                        if self._stopping.is_set():
                            break
                    if gone:
                        break
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            self.error = e
            self.ready.set()


class PodTimes:
    """First-seen, first-Running, first-Failed and deletion times of pods, thread safe."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.created: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.failed: dict[str, float] = {}
        self.phase: dict[str, str] = {}
        self.uids: dict[str, str] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.deleted: dict[str, float] = {}

    def on_deleted(self, pod: dict, t: float) -> None:
        with self.changed:
            self.deleted.setdefault(pod["metadata"]["name"], t)
            self.changed.notify_all()

    def on_event(self, pod: dict, t: float) -> None:
        name = pod["metadata"]["name"]
        phase = (pod.get("status") or {}).get("phase")
        with self.changed:
            self.created.setdefault(name, t)
            self.uids.setdefault(name, pod["metadata"].get("uid"))
            self.labels[name] = pod["metadata"].get("labels") or {}
            self.phase[name] = phase
            if phase == "Running":
                self.running.setdefault(name, t)
            elif phase == "Failed":
                self.failed.setdefault(name, t)
            self.changed.notify_all()

    def wait(self, predicate: Callable[[], bool], deadline: float) -> bool:
        """Wait (time.monotonic() deadline) until predicate() holds; call it under the lock."""
        with self.changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
            return True


def vm_hwm_mib(pid: int) -> float | None:
    """Peak resident set size of a live process, MiB (VmHWM from /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def delete_namespace(admin: Kube, name: str, timeout: float = 300.0,
                     strip: tuple[tuple[str, str, str], ...] = ()) -> float | None:
    """Delete a namespace and wait until it is gone; returns seconds, None on timeout.

    `strip`: (group, version, plural) of custom objects whose finalizers are removed if the
    namespace is still there after half the timeout (e.g. an operator that already stopped).
    """
    t0 = time.monotonic()
    admin.delete(f"/api/v1/namespaces/{name}", {"propagationPolicy": "Background"})
    stripped = False
    while time.monotonic() - t0 < timeout:
        if admin.get(f"/api/v1/namespaces/{name}", ok404=True) is None:
            return time.monotonic() - t0
        if not stripped and strip and time.monotonic() - t0 > timeout / 2:
            for g, v, p in strip:
                try:
                    items = admin.get(f"/apis/{g}/{v}/namespaces/{name}/{p}").get("items", [])
                except ApiError:
                    continue
                for it in items:
                    try:
                        admin.patch(f"/apis/{g}/{v}/namespaces/{name}/{p}/{it['metadata']['name']}",
                                    {"metadata": {"finalizers": None}})
                    except ApiError:
                        pass
            stripped = True
        time.sleep(0.5)
    return None
