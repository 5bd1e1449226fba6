"""The operator's conversation with the Kubernetes API: raw JSON requests, lists and watches.

Where it sits: above :mod:`spmd_operator.names`, below the informers, the leader elector and the
controller. Lean by design: plain ``aiohttp`` (kopf's own HTTP library) with the credentials
kopf's login produces (:func:`login`: the in-cluster service account, else the kubeconfig's
current context, through ``kopf.login_with_service_account`` / ``kopf.login_with_kubeconfig``;
an ``exec`` credential plugin in the kubeconfig is run here, as kubectl runs it). Requests carry
plain JSON, with no object model in between, so a pod template field newer than any client
library reaches the API server unchanged, and a 4,096-pod watch costs one ``json.loads`` per
event.

Errors: every failed request raises :class:`KubeError` with the HTTP status (0 when the server
could not be reached), the server's reason and message, and the path; callers decide what a 404
or 409 means for them (:meth:`Kube.create` and :meth:`Kube.delete` give the usual answers).
Every request is counted through the optional ``observe`` callback (verb, outcome), which the
metrics use.

Writes (create, patch, replace, delete) pass two gates:

* the fence (``may_write``, set by the leader elector): checked before every attempt AND at the
  last moment, once the request has its connection and its bytes are about to be written (a
  request waiting for a connection or a TLS handshake while the process was paused would
  otherwise go out after the pause): a replica that cannot prove it still holds the Lease sends
  nothing (:class:`Fenced`);
* a fair limiter: at most ``concurrency`` writes in flight, and a free slot goes to the job that
  has waited longest in turn (round robin over jobs), so a job creating 4,096 pods does not make
  a 4-pod job queue behind all of them; while a job writes a few at a time, any other job holds
  at most ``SHARED_DEPTH`` slots, so the 4-pod job's requests do not wait at the API server
  behind all of the large job's either (:class:`FairLimiter`).

The leader elector's own requests take neither gate: they go out at once, each bounded by the
time left before its renew deadline.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import datetime as dt
import itertools
import json
import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import kopf
import yaml

from . import names
from .podpaths import strict_message

logger = logging.getLogger(__name__)

#: Concurrent requests of the whole operator (creations and deletions of every job together).
DEFAULT_CONCURRENCY: Final = 48
#: Writes one job may keep in flight while another job writes a few at a time (FairLimiter): the
#: other job's requests then queue at the API server behind this many of its, not all of them.
SHARED_DEPTH: Final = 8
#: Seconds a job counts as writing a few at a time after its last write ended (FairLimiter).
ACTIVE_GRACE: Final = 0.5
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
#: What to ask for when only an object's metadata is wanted: the API server answers with a
#: PartialObjectMetadata (a ConfigMap's 160 KB payload is neither sent nor decoded).
METADATA: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
#: Seconds a single request may take (watches have their own, longer, limits).
REQUEST_TIMEOUT: Final = 60.0
#: Retries of a request that failed with 429, a 5xx or no answer at all, and their back-off.
RETRIES: Final = 4
RETRY_BACKOFF: Final = (0.2, 0.5, 1.0, 2.0)
USER_AGENT: Final = "spmdjob-operator"
#: Marks a request for the last-moment fence check; removed before the request is written.
_FENCE_HEADER: Final = "X-Spmdjob-Fenced"

Observer = Callable[[str, str], None]
Login = Callable[[], "kopf.ConnectionInfo"]
#: Who a write is for (a job's key), so the fair limiter can take turns; None: the operator's own.
Owner = Hashable


class KubeError(Exception):
    """An API request failed.

    Attributes:
        status: the HTTP status (0 when the server could not be reached).
        reason: the Status object's reason (``NotFound``, ``AlreadyExists``, ``Forbidden`` ...).
        message: the server's message, or the error's text.
        path: the request's path.
    """

    def __init__(self, status: int, message: str, *, reason: str = "", path: str = "") -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message
        self.path = path

    @property
    def namespace_terminating(self) -> bool:
        """The namespace is being deleted (nothing new may be created in it) or is gone."""
        if self.status == 403 and "being terminated" in self.message:
            return True
        return self.status == 404 and self.message.startswith("namespaces ") and self.message.endswith("not found")


#: The query of a create whose body must be taken whole: the API server refuses (400) a field the
#: object's type does not have, instead of dropping it with a warning no one reads.
STRICT: Final = {"fieldValidation": "Strict"}
#: The collections whose creates are Strict: what is built from the user's pod template.
STRICT_COLLECTIONS: Final = frozenset({"pods"})


class Fenced(Exception):
    """A write was not sent: this replica cannot prove it holds the leader Lease."""


def pods_url(namespace: str | None, name: str | None = None) -> str:
    """``/api/v1[/namespaces/<ns>]/pods[/<name>]``."""
    return _core_url(namespace, "pods", name)


def services_url(namespace: str | None, name: str | None = None) -> str:
    """``/api/v1[/namespaces/<ns>]/services[/<name>]``."""
    return _core_url(namespace, "services", name)


def configmaps_url(namespace: str | None, name: str | None = None) -> str:
    """``/api/v1[/namespaces/<ns>]/configmaps[/<name>]``."""
    return _core_url(namespace, "configmaps", name)


def events_url(namespace: str) -> str:
    """``/api/v1/namespaces/<ns>/events``."""
    return _core_url(namespace, "events", None)


def namespace_url(name: str) -> str:
    """``/api/v1/namespaces/<name>``."""
    return f"/api/v1/namespaces/{quote(name)}"


def jobs_url(namespace: str | None) -> str:
    """The SPMDJobs of a namespace (or of all namespaces)."""
    base = f"/apis/{names.GROUP}/{names.VERSION}"
    return f"{base}/namespaces/{quote(namespace)}/{names.PLURAL}" if namespace else f"{base}/{names.PLURAL}"


def custom_url(group: str, version: str, plural: str, namespace: str | None, name: str | None = None) -> str:
    """A namespaced custom resource's collection (all namespaces with None), or one object of it."""
    base = f"/apis/{group}/{version}"
    url = f"{base}/namespaces/{quote(namespace)}/{plural}" if namespace else f"{base}/{plural}"
    return f"{url}/{quote(name)}" if name else url


def job_url(namespace: str, name: str, subresource: str | None = None) -> str:
    """The SPMDJob ``name``, or one of its subresources (``status``)."""
    url = f"{jobs_url(namespace)}/{quote(name)}"
    return f"{url}/{subresource}" if subresource else url


def _core_url(namespace: str | None, plural: str, name: str | None) -> str:
    url = f"/api/v1/namespaces/{quote(namespace)}/{plural}" if namespace else f"/api/v1/{plural}"
    return f"{url}/{quote(name)}" if name else url


def _error(status: int, text: str, path: str) -> KubeError:
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        return KubeError(status, str(body.get("message") or text), reason=str(body.get("reason") or ""), path=path)
    return KubeError(status, text.strip()[:500] or f"HTTP {status}", path=path)



class FairLimiter:
    """At most ``limit`` holders at once; a freed slot goes to the owners in turn (round robin),
    and while another owner writes a few at a time, none holds more than ``shared`` slots.

    A plain semaphore serves waiters first come, first served: thousands of one job's pod
    creations queued first would all go before a small job's few. Here each owner (a job) has a
    queue of its own, and the owners take turns.

    Taking turns for the next free slot is not enough on its own: the slots a large job already
    holds are requests at the API server, and the small job's request is served after (or
    among) them, so each of its rounds of writes waits about ``limit`` requests' time. So while
    another owner writes a few at a time (it holds and waits for fewer than ``shared`` slots in
    all, or released one less than ``grace`` seconds ago: the moment between one round of a
    pass's writes and its next), an owner gets no new slot while it holds ``shared`` or more:
    the large job's requests at the server drain to ``shared`` and the small job's next rounds
    wait behind that many, not ``limit``. Alone, or beside other owners that want as many
    slots as it does (two large jobs), an owner may take any free slot: the turns share them.
    """

    def __init__(self, limit: int, shared: int | None = None, grace: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = max(1, limit)
        self.shared = max(1, min(self.limit, SHARED_DEPTH if shared is None else shared))
        self.grace = ACTIVE_GRACE if grace is None else grace
        self.held = 0
        self._clock = clock
        self._held_by: dict[Owner, int] = {}
        self._queues: collections.OrderedDict[Owner, collections.deque[asyncio.Future[None]]] = collections.OrderedDict()
        #: Owners by the time their last slot was released, oldest first.
        self._released: collections.OrderedDict[Owner, float] = collections.OrderedDict()

    async def acquire(self, owner: Owner) -> None:
        if self.held < self.limit and not self._queues and self._may_take(owner):
            self._take(owner)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(owner, collections.deque()).append(waiter)
        self._hand_out()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(owner)  # the slot was handed over just as the waiter was cancelled
            else:
                queue = self._queues.get(owner)
                if queue is not None and waiter in queue:
                    queue.remove(waiter)
                    if not queue:
                        del self._queues[owner]
            raise

    def release(self, owner: Owner) -> None:
        self.held -= 1
        left = self._held_by.get(owner, 0) - 1
        if left > 0:
            self._held_by[owner] = left
        else:
            self._held_by.pop(owner, None)
        self._released[owner] = self._clock()
        self._released.move_to_end(owner)
        self._hand_out()

    def waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def holding(self, owner: Owner) -> int:
        """Slots ``owner`` holds now."""
        return self._held_by.get(owner, 0)

    def _take(self, owner: Owner) -> None:
        self.held += 1
        self._held_by[owner] = self._held_by.get(owner, 0) + 1

    def _small_writer_besides(self, owner: Owner) -> bool:
        """Whether an owner other than ``owner`` writes a few at a time: it holds or waits for
        fewer than ``shared`` slots in all, or released its last one less than ``grace`` seconds
        ago (between two rounds of a pass's writes)."""
        stale = self._clock() - self.grace
        while self._released and next(iter(self._released.values())) <= stale:
            self._released.popitem(last=False)
        for other in itertools.chain(self._held_by, self._queues, self._released):
            queue = self._queues.get(other)
            if other != owner and self._held_by.get(other, 0) + (len(queue) if queue else 0) < self.shared:
                return True
        return False

    def _may_take(self, owner: Owner) -> bool:
        held = self._held_by.get(owner, 0)
        return held < self.shared or (held < self.limit and not self._small_writer_besides(owner))

    def _hand_out(self) -> None:
        """Free slots to the waiting owners, in turn, skipping an owner at its share."""
        while self._queues and self.held < self.limit:
            owner = next((o for o in self._queues if self._may_take(o)), None)
            if owner is None:
                return  # every waiting owner holds its share: a release hands out again
            queue = self._queues.pop(owner)
            waiter = queue.popleft()
            if queue:
                self._queues[owner] = queue  # to the back of the line: the next owner goes next
            if not waiter.done():
                self._take(owner)
                waiter.set_result(None)


class _Slot:
    def __init__(self, limiter: FairLimiter, owner: Owner) -> None:
        self.limiter, self.owner = limiter, owner

    async def __aenter__(self) -> None:
        await self.limiter.acquire(self.owner)

    async def __aexit__(self, *exc: object) -> None:
        self.limiter.release(self.owner)


# --- credentials ------------------------------------------------------------------------------


def login(settings: kopf.OperatorSettings | None = None) -> kopf.ConnectionInfo:
    """Credentials as kubectl finds them: the in-cluster service account, else $KUBECONFIG (or
    ~/.kube/config) and its current context.

    kopf's own minimal logins read the files; a kubeconfig user with an ``exec`` plugin (cloud
    providers' token helpers) is run here and its ExecCredential's token or client certificate
    used, with its expiration (kopf logs in again when it passes; :class:`Kube` on a 401).
    Supported: bearer tokens, client certificates, basic auth, exec plugins. Not supported: the
    deprecated ``auth-provider`` refresh flows (their current access-token is used as is).

    Raises:
        kopf.LoginError: no credentials found.
    """
    settings = settings or kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings)
    if info is not None:
        # kopf names the server kubernetes.default.svc, which only resolves with cluster DNS in the
        # pod's resolver; like client-go's in-cluster config, use the address the kubelet gives.
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and port:
            info = dataclasses.replace(info, server=f"https://{f'[{host}]' if ':' in host else host}:{port}")
        return info
    info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("no credentials: neither a service account nor a kubeconfig ($KUBECONFIG, ~/.kube/config)")
    plugin = _exec_plugin()
    if plugin is None:
        return info
    return _run_exec_plugin(info, plugin)


def _exec_plugin() -> dict[str, Any] | None:
    """The current context's user's ``exec`` section, if any (the first kubeconfig file naming it wins)."""
    paths = [os.path.expanduser(p.strip()) for p in (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep) if p.strip()]
    current, contexts, users = None, {}, {}
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f) or {}
        current = current or config.get("current-context")
        for item in config.get("contexts") or []:
            contexts.setdefault(item.get("name"), item.get("context") or {})
        for item in config.get("users") or []:
            users.setdefault(item.get("name"), item.get("user") or {})
    user = users.get(contexts.get(current, {}).get("user"), {})
    plugin = user.get("exec")
    return plugin if isinstance(plugin, dict) else None


def _run_exec_plugin(info: kopf.ConnectionInfo, plugin: Mapping[str, Any]) -> kopf.ConnectionInfo:
    """Runs a client-go credential plugin and folds its ExecCredential into ``info``."""
    env = {**os.environ, **{e["name"]: e["value"] for e in plugin.get("env") or []}}
    env["KUBERNETES_EXEC_INFO"] = json.dumps({
        "apiVersion": plugin.get("apiVersion", "client.authentication.k8s.io/v1"), "kind": "ExecCredential",
        "spec": {"interactive": False}})
    argv = [str(plugin.get("command")), *[str(a) for a in plugin.get("args") or []]]
    try:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
        status = json.loads(out).get("status") or {}
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise kopf.LoginError(f"the kubeconfig's exec credential plugin {argv[0]!r} failed: {e}") from e
    expiration = None
    if status.get("expirationTimestamp"):
        expiration = dt.datetime.fromisoformat(str(status["expirationTimestamp"]).replace("Z", "+00:00"))
    return dataclasses.replace(
        info, token=status.get("token") or info.token,
        certificate_data=status.get("clientCertificateData") or info.certificate_data,
        private_key_data=status.get("clientKeyData") or info.private_key_data,
        certificate_path=None if status.get("clientCertificateData") else info.certificate_path,
        private_key_path=None if status.get("clientKeyData") else info.private_key_path,
        expiration=expiration)


# --- the client -------------------------------------------------------------------------------


def _fenced_request_class(api: Kube) -> type[aiohttp.ClientRequest]:
    """aiohttp's request, asking ``api``'s fence once more right before its bytes are written."""

    class FencedRequest(aiohttp.ClientRequest):
        fenced = False

        async def send(self, conn: Any) -> Any:
            if self.headers.pop(_FENCE_HEADER, None) is not None:
                self.fenced = True
                api._fence(self.method, self.url.path)
            return await super().send(conn)

        async def write_bytes(self, writer: Any, conn: Any, *args: Any, **kwargs: Any) -> None:
            # The headers are only buffered until the body goes; before Python 3.12 the body is
            # written by a task of its own, a loop iteration (or a pause) after send(). Refused
            # here, nothing is written and the request fails as a failed body write would.
            if self.fenced:
                try:
                    api._fence(self.method, self.url.path)
                except Fenced as e:
                    conn.protocol.set_exception(e)
                    return
            await super().write_bytes(writer, conn, *args, **kwargs)

    return FencedRequest



class Kube:
    """Raw JSON requests to the API server; writes fenced and fairly limited.

    Args:
        info: where the API server is and how to log in (see :func:`login`).
        concurrency: the most writes in flight at once, across all jobs.
        observe: called with (verb, outcome) after every request; outcome is the HTTP status
            class (``2xx``, ``4xx``, ``5xx``) or ``error`` when the server was not reached.
        relogin: called for fresh credentials after a 401 (a rotated token, an expired exec
            credential); None: a 401 is final.
        user_agent: the User-Agent header (the API server's audit log records it): tells
            replicas apart.

    Attributes:
        may_write: the fence, asked before every write attempt; None: always (no election).
    """

    def __init__(self, info: kopf.ConnectionInfo, concurrency: int = DEFAULT_CONCURRENCY,
                 observe: Observer | None = None, *, relogin: Login | None = None,
                 user_agent: str = USER_AGENT) -> None:
        self.info = info
        self.concurrency = max(1, concurrency)
        self.limiter = FairLimiter(self.concurrency)
        self.observe = observe
        self.relogin = relogin
        self.user_agent = user_agent
        self.may_write: Callable[[], bool] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None
        self._headers: dict[str, str] = {}

    @classmethod
    async def connect(cls, *, concurrency: int = DEFAULT_CONCURRENCY, observe: Observer | None = None,
                      user_agent: str = USER_AGENT, settings: kopf.OperatorSettings | None = None) -> Kube:
        """Logs in like kubectl (see :func:`login`) and opens the connection pool."""
        api = cls(login(settings), concurrency, observe, relogin=lambda: login(settings), user_agent=user_agent)
        api._open()
        return api

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            info = self.info
            connector = aiohttp.TCPConnector(ssl=info.as_ssl_context() if info.server.startswith("https") else False,
                                             limit=self.concurrency + 16)
            self._session = aiohttp.ClientSession(
                base_url=info.server.rstrip("/") + "/", connector=connector, trust_env=info.trust_env,
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT), request_class=_fenced_request_class(self))
            self._headers = {**info.as_http_headers(), "Accept": "application/json", "User-Agent": self.user_agent}
        return self._session

    def _open_watches(self) -> aiohttp.ClientSession:
        """The watches' own pool, without a limit: a watch holds its connection for minutes, one per
        namespace and kind, and must never take one that a request (a write, a list, a Lease
        renewal) waits for. 25 watched namespaces once held all 64 of the shared pool."""
        self._open()
        if self._watch_session is None or self._watch_session.closed:
            info = self.info
            connector = aiohttp.TCPConnector(ssl=info.as_ssl_context() if info.server.startswith("https") else False,
                                             limit=0)
            self._watch_session = aiohttp.ClientSession(base_url=info.server.rstrip("/") + "/", connector=connector,
                                                        trust_env=info.trust_env)
        return self._watch_session

    def twin(self, concurrency: int = 2, *, user_agent: str | None = None) -> Kube:
        """A client of its own pool with the same credentials (the Lease's: its renewals never
        wait behind the jobs' requests)."""
        return Kube(self.info, concurrency, self.observe, relogin=self.relogin, user_agent=user_agent or self.user_agent)

    async def _login_again(self) -> bool:
        if self.relogin is None:
            return False
        try:
            info = await asyncio.get_running_loop().run_in_executor(None, self.relogin)
        except Exception as e:  # noqa: BLE001 - a failed re-login leaves the 401 to the caller
            logger.warning("logging in again after a 401 failed: %s", e)
            return False
        old, self._session = self._session, None
        old_watches, self._watch_session = self._watch_session, None
        self.info = info
        self._open()
        for session in (old, old_watches):
            if session is not None:
                await session.close()
        return True

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._watch_session is not None:
            await self._watch_session.close()
            self._watch_session = None

    def _count(self, verb: str, status: int) -> None:
        if self.observe is not None:
            self.observe(verb, f"{status // 100}xx" if status else "error")

    def _fence(self, method: str, path: str) -> None:
        if self.may_write is not None and not self.may_write():
            raise Fenced(f"{method} {path} not sent: this replica does not hold the leader Lease")

    async def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                      body: Any = None, content_type: str = "application/json", decode: bool = True,
                      timeout: float = REQUEST_TIMEOUT, retries: int = RETRIES, fenced: bool = False,
                      accept: str | None = None) -> Any:
        """One request; returns the decoded JSON answer (``decode=False``: True, the answer unread).
        Retries 429, 5xx and lost connections ``retries`` times; each attempt is bounded by
        ``timeout`` seconds. With ``fenced`` every attempt first asks the fence. ``accept``
        replaces the Accept header (:data:`METADATA`: the object's metadata only).

        Raises:
            KubeError: any other failure, or the last one once the retries are used up.
            Fenced: ``fenced`` and the fence said no.
        """
        verb = method.lower()
        data = None if body is None else json.dumps(body)
        relogged = False
        attempt = 0
        while True:
            if fenced:
                self._fence(method, path)
            session = self._open()
            headers = {**self._headers, "Content-Type": content_type}
            if accept:
                headers["Accept"] = accept
            if fenced:
                headers[_FENCE_HEADER] = "1"
            try:
                async with session.request(method, path.lstrip("/"), params=dict(query or {}), data=data,
                                           headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                    status = response.status
                    raw = await response.read()  # read whole, so that the connection is reused
                text = raw.decode("utf-8", "replace") if decode or not 200 <= status < 300 else ""
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                self._count(verb, 0)
                error = KubeError(0, f"{method} {path} failed: {e!r}", path=path)
            else:
                self._count(verb, status)
                if 200 <= status < 300:
                    if not decode:
                        return True
                    return json.loads(text) if text else {}
                error = _error(status, text, path)
                if status == 401 and not relogged:
                    relogged = True
                    if await self._login_again():
                        continue
                if status != 429 and status < 500:
                    raise error
            if attempt >= retries:
                raise error
            await asyncio.sleep(RETRY_BACKOFF[min(attempt, len(RETRY_BACKOFF) - 1)])
            attempt += 1

    async def get(self, path: str, *, metadata: bool = False) -> dict[str, Any] | None:
        """The object at ``path`` (``metadata``: its kind and metadata only), or None when it does
        not exist (404)."""
        try:
            return await self.request("GET", path, accept=METADATA if metadata else None)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def pages(self, path: str, *, label_selector: str | None = None, limit: int = 500,
                    metadata: bool = False) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """The collection ``path`` a page at a time: ``(items, resourceVersion of the list)``;
        ``metadata``: each item's metadata only.

        A caller that keeps only a summary of each object never holds thousands of them at once.
        """
        query: dict[str, Any] = {"limit": limit}
        if label_selector:
            query["labelSelector"] = label_selector
        while True:
            page = await self.request("GET", path, query=query, accept=METADATA_LIST if metadata else None)
            meta = page.get("metadata") or {}
            yield page.get("items") or [], str(meta.get("resourceVersion") or "")
            if not meta.get("continue"):
                return
            query["continue"] = meta["continue"]

    def slot(self, owner: Owner = None) -> _Slot:
        """A place among the writes in flight, taken in turn with the other owners' writes."""
        return _Slot(self.limiter, owner)

    async def create(self, path: str, body: Mapping[str, Any], *, keep: bool = True, owner: Owner = None) -> Any:
        """POSTs ``body`` to the collection ``path``; the created object (``keep=False``: True), or
        None if the name is taken (409). Not keeping the answer saves decoding thousands of pods.

        Pods, built from the user's template, go with field validation Strict (:data:`STRICT`): a
        field the Pod API does not know (one the CRD took: a newer Kubernetes' field on an older
        cluster) is a 400 whose message names it as ``PATH: unknown field`` (:func:`strict_message`),
        which fails the job as InvalidSpec, instead of a pod silently without it."""
        strict = path.rstrip("/").rsplit("/", 1)[-1] in STRICT_COLLECTIONS
        async with self.slot(owner):
            try:
                return await self.request("POST", path, query=STRICT if strict else None, body=dict(body),
                                          decode=keep, fenced=True)
            except KubeError as e:
                if e.status == 409 and e.reason == "AlreadyExists":
                    return None
                if strict and e.status in (400, 422) and strict_message(e.message) != e.message:
                    raise KubeError(e.status, strict_message(e.message), reason=e.reason, path=e.path) from e
                raise

    async def patch(self, path: str, patch: Mapping[str, Any], *, owner: Owner = None) -> dict[str, Any]:
        """Applies a JSON merge patch to the object at ``path``; returns the object as patched.
        A ``metadata.resourceVersion`` in the patch makes it conditional (409 Conflict if stale)."""
        async with self.slot(owner):
            result = await self.request("PATCH", path, body=dict(patch), content_type=MERGE_PATCH, fenced=True)
        return result if isinstance(result, dict) else {}

    async def json_patch(self, path: str, ops: list[Mapping[str, Any]], *, owner: Owner = None) -> dict[str, Any]:
        """Applies a JSON Patch (RFC 6902) to the object at ``path``; returns the object as patched.
        A ``test`` operation makes it conditional: the server refuses the whole patch (422) when
        the test fails."""
        async with self.slot(owner):
            result = await self.request("PATCH", path, body=list(ops), content_type=JSON_PATCH, fenced=True)
        return result if isinstance(result, dict) else {}

    async def replace(self, path: str, body: Mapping[str, Any], *, owner: Owner = None) -> dict[str, Any]:
        """PUTs the whole object (its metadata.resourceVersion makes it conditional: 409 if stale)."""
        async with self.slot(owner):
            result = await self.request("PUT", path, body=dict(body), fenced=True)
        return result if isinstance(result, dict) else {}

    async def delete(self, path: str, *, uid: str | None = None, propagation: str = "Background",
                     owner: Owner = None) -> bool:
        """Deletes the object at ``path``; False when it is already gone (404).

        With ``uid`` the deletion is conditional (a precondition): an object of the same name but
        another uid (a namesake created since) is left alone, and that also counts as gone.
        """
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            options["preconditions"] = {"uid": uid}
        async with self.slot(owner):
            try:
                # The answer (the object, with its deletionTimestamp) is not needed: not decoding
                # thousands of them keeps a mass deletion's garbage out of the heap.
                await self.request("DELETE", path, body=options, fenced=True, decode=False)
            except KubeError as e:
                if e.status == 404 or (uid and e.status == 409):
                    return False
                raise
        return True

    async def watch(self, path: str, *, resource_version: str, label_selector: str | None = None,
                    timeout_seconds: int = 270, metadata: bool = False) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Streams ``(type, object)`` watch events of the collection ``path`` from ``resource_version``
        (``metadata``: each object's metadata only).

        Types are ADDED, MODIFIED, DELETED, BOOKMARK and ERROR (the object is then a Status: 410
        means the version is too old and the caller must list again). The stream ends when the
        server closes it (``timeout_seconds``) or the connection breaks.
        """
        query: dict[str, Any] = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                                 "timeoutSeconds": str(timeout_seconds)}
        if label_selector:
            query["labelSelector"] = label_selector
        timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_connect=30, sock_read=timeout_seconds + 30)
        session = self._open_watches()
        headers = {**self._headers, "Accept": METADATA} if metadata else self._headers
        async with session.get(path.lstrip("/"), params=query, headers=headers, timeout=timeout) as response:
            self._count("watch", response.status)
            if response.status != 200:
                error = _error(response.status, await response.text(), path)
                if response.status == 401:
                    await self._login_again()
                raise error
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        yield str(event.get("type")), event.get("object") or {}


def merge_patched(target: Any, patch: Any) -> Any:
    """What a JSON merge patch (RFC 7386) makes of ``target``: objects merged key by key, ``None``
    removing a key, anything else replacing the value."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patched(out.get(key), value)
    return out
