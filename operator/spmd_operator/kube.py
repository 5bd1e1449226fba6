"""The operator's conversation with the Kubernetes API: raw JSON requests, lists and watches.

Where it sits: above :mod:`spmd_operator.names`, below the informers and the controller. It is
built on ``kubernetes_asyncio`` (a maintained asyncio client): its configuration loaders (the
in-cluster service account, or a kubeconfig and its current context), its authenticated aiohttp
session and its token refresh. Requests carry plain JSON, with no object model in between, so a
pod template field newer than any client library reaches the API server unchanged, and a
4,096-pod watch costs one ``json.loads`` per event.

Errors: every failed request raises :class:`KubeError` with the HTTP status (0 when the server
could not be reached), the server's reason and message, and the path; callers decide what a 404
or 409 means for them (:meth:`Kube.create` and :meth:`Kube.delete` give the usual answers).
Every request is counted through the optional ``observe`` callback (verb, outcome), which the
metrics use.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from . import names

logger = logging.getLogger(__name__)

#: Concurrent requests of the whole operator (creations and deletions of every job together).
DEFAULT_CONCURRENCY: Final = 48
MERGE_PATCH: Final = "application/merge-patch+json"
#: Seconds a single request may take (watches have their own, longer, limits).
REQUEST_TIMEOUT: Final = 60.0
#: Retries of a request that failed with 429, a 5xx or no answer at all, and their back-off.
RETRIES: Final = 4
RETRY_BACKOFF: Final = (0.2, 0.5, 1.0, 2.0)

Observer = Callable[[str, str], None]


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


class Kube:
    """Raw JSON requests to the API server with a shared concurrency limit for writes.

    Args:
        api: a configured ``kubernetes_asyncio`` ApiClient (see :meth:`connect`).
        concurrency: the most writes in flight at once, across all jobs.
        observe: called with (verb, outcome) after every request; outcome is the HTTP status
            class (``2xx``, ``4xx``, ``5xx``) or ``error`` when the server was not reached.
    """

    def __init__(self, api: k8s_client.ApiClient, concurrency: int = DEFAULT_CONCURRENCY,
                 observe: Observer | None = None) -> None:
        self._api = api
        self.concurrency = max(1, concurrency)
        self._limit = asyncio.Semaphore(self.concurrency)
        self.observe = observe

    @classmethod
    async def connect(cls, *, kubeconfig: str | None = None, context: str | None = None,
                      concurrency: int = DEFAULT_CONCURRENCY, observe: Observer | None = None) -> Kube:
        """Logs in like kubectl: the in-cluster service account if present, else the kubeconfig."""
        configuration = k8s_client.Configuration()
        try:
            if kubeconfig:
                raise k8s_config.ConfigException("a kubeconfig was given")
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            await k8s_config.load_kube_config(config_file=kubeconfig, context=context,
                                              client_configuration=configuration)
        configuration.connection_pool_maxsize = max(concurrency + 8, 16)
        return cls(k8s_client.ApiClient(configuration), concurrency, observe)

    async def close(self) -> None:
        await self._api.close()

    def _count(self, verb: str, status: int) -> None:
        if self.observe is not None:
            self.observe(verb, f"{status // 100}xx" if status else "error")

    async def _send(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                    body: Any = None, content_type: str = "application/json",
                    timeout: Any = REQUEST_TIMEOUT) -> aiohttp.ClientResponse:
        return await self._api.call_api(
            path, method,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )

    async def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                      body: Any = None, content_type: str = "application/json", decode: bool = True) -> Any:
        """One request; returns the decoded JSON answer (``decode=False``: True, the answer unread).
        Retries 429, 5xx and lost connections.

        Raises:
            KubeError: any other failure, or the last one once the retries are used up.
        """
        verb = method.lower()
        for attempt in range(RETRIES + 1):
            try:
                response = await self._send(method, path, query=query, body=body, content_type=content_type)
                async with response:
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
                if status != 429 and status < 500:
                    raise error
            if attempt == RETRIES:
                raise error
            await asyncio.sleep(RETRY_BACKOFF[min(attempt, len(RETRY_BACKOFF) - 1)])
        raise AssertionError("unreachable")

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when it does not exist (404)."""
        try:
            return await self.request("GET", path)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def pages(self, path: str, *, label_selector: str | None = None,
                    limit: int = 500) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """The collection ``path`` a page at a time: ``(items, resourceVersion of the list)``.

        A caller that keeps only a summary of each object never holds thousands of them at once.
        """
        query: dict[str, Any] = {"limit": limit}
        if label_selector:
            query["labelSelector"] = label_selector
        while True:
            page = await self.request("GET", path, query=query)
            meta = page.get("metadata") or {}
            yield page.get("items") or [], str(meta.get("resourceVersion") or "")
            if not meta.get("continue"):
                return
            query["continue"] = meta["continue"]

    async def create(self, path: str, body: Mapping[str, Any], *, keep: bool = True) -> Any:
        """POSTs ``body`` to the collection ``path``; the created object (``keep=False``: True), or
        None if the name is taken (409). Not keeping the answer saves decoding thousands of pods."""
        async with self._limit:
            try:
                return await self.request("POST", path, body=dict(body), decode=keep)
            except KubeError as e:
                if e.status == 409 and e.reason == "AlreadyExists":
                    return None
                raise

    async def patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Applies a JSON merge patch to the object at ``path``; returns the object as patched."""
        async with self._limit:
            result = await self.request("PATCH", path, body=dict(patch), content_type=MERGE_PATCH)
        return result if isinstance(result, dict) else {}

    async def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUTs the whole object (its metadata.resourceVersion makes it conditional: 409 if stale)."""
        async with self._limit:
            result = await self.request("PUT", path, body=dict(body))
        return result if isinstance(result, dict) else {}

    async def delete(self, path: str, *, uid: str | None = None, propagation: str = "Background") -> bool:
        """Deletes the object at ``path``; False when it is already gone (404).

        With ``uid`` the deletion is conditional (a precondition): an object of the same name but
        another uid (a namesake created since) is left alone, and that also counts as gone.
        """
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            options["preconditions"] = {"uid": uid}
        async with self._limit:
            try:
                await self.request("DELETE", path, body=options)
            except KubeError as e:
                if e.status == 404 or (uid and e.status == 409):
                    return False
                raise
        return True

    async def watch(self, path: str, *, resource_version: str, label_selector: str | None = None,
                    timeout_seconds: int = 270) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Streams ``(type, object)`` watch events of the collection ``path`` from ``resource_version``.

        Types are ADDED, MODIFIED, DELETED, BOOKMARK and ERROR (the object is then a Status: 410
        means the version is too old and the caller must list again). The stream ends when the
        server closes it (``timeout_seconds``) or the connection breaks.
        """
        query: dict[str, Any] = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                                 "timeoutSeconds": str(timeout_seconds)}
        if label_selector:
            query["labelSelector"] = label_selector
        timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_connect=30, sock_read=timeout_seconds + 30)
        response = await self._send("GET", path, query=query, timeout=timeout)
        async with response:
            self._count("watch", response.status)
            if response.status != 200:
                raise _error(response.status, await response.text(), path)
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        yield str(event.get("type")), event.get("object") or {}
