"""The operator's writes to the Kubernetes API: create, patch and delete by URL, as raw JSON.

Where it sits: above :mod:`spmd_operator.names`, below :mod:`spmd_operator.handlers`, which is its
only user. Reads come from kopf's watches and index, never from here.

It goes through kopf's own API client (``kopf._cogs.clients.api``): the same authenticated
aiohttp session and credentials kopf logs in with (kubeconfig or in-cluster service account,
re-authenticated on 401), the same retries on 429 / 5xx, and no object model in between, so a
pod template field newer than any client library reaches the API server unchanged. kopf does not
export this client, so this module is the one place that depends on its internals (checked with
kopf 1.45); every call must happen inside the operator's tasks (handlers, or tasks they start),
where kopf's credentials are in context.

Idempotence is built in: :meth:`Kube.create` reports an existing object (409) as ``False``,
:meth:`Kube.delete` a missing one (404) as ``False``; every other error is raised as
:class:`KubeError` with the HTTP status and the server's message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from kopf._cogs.clients import api as _kopf_api
from kopf._cogs.clients import errors as _kopf_errors

from . import names

#: Concurrent requests of the whole operator (creations and deletions of every job together).
DEFAULT_CONCURRENCY: Final = 48
MERGE_PATCH: Final = "application/merge-patch+json"


class KubeError(Exception):
    """An API request failed.

    Attributes:
        status: the HTTP status (0 when the server could not be reached).
        message: the server's message, or the error's text.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message


def pods_url(namespace: str, name: str | None = None) -> str:
    """``/api/v1/namespaces/<ns>/pods[/<name>]``."""
    return _core_url(namespace, "pods", name)


def services_url(namespace: str, name: str | None = None) -> str:
    """``/api/v1/namespaces/<ns>/services[/<name>]``."""
    return _core_url(namespace, "services", name)


def configmaps_url(namespace: str, name: str | None = None) -> str:
    """``/api/v1/namespaces/<ns>/configmaps[/<name>]``."""
    return _core_url(namespace, "configmaps", name)


def job_url(namespace: str, name: str, subresource: str | None = None) -> str:
    """The SPMDJob ``name``, or one of its subresources (``status``)."""
    url = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{quote(namespace)}/{names.PLURAL}/{quote(name)}"
    return f"{url}/{subresource}" if subresource else url


def _core_url(namespace: str, plural: str, name: str | None) -> str:
    url = f"/api/v1/namespaces/{quote(namespace)}/{plural}"
    return f"{url}/{quote(name)}" if name else url


class Kube:
    """Raw JSON requests to the API server with a shared concurrency limit.

    Args:
        settings: kopf's operator settings (timeouts and retry backoffs of its client).
        logger: where request errors are logged.
        concurrency: the most requests in flight at once, across all jobs.
    """

    def __init__(self, settings: Any, logger: logging.Logger, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self._settings = settings
        self._logger = logger
        self._limit = asyncio.Semaphore(max(1, concurrency))

    async def _request(self, method: str, url: str, payload: object = None, headers: dict[str, str] | None = None) -> Any:
        async with self._limit:
            try:
                response = await _kopf_api.request(
                    method, url, payload=payload, headers=headers, settings=self._settings, logger=self._logger
                )
                async with response:
                    return await response.json()
            except _kopf_errors.APIError as e:
                raise KubeError(e.status, e.message or str(e)) from e
            except (OSError, asyncio.TimeoutError) as e:
                raise KubeError(0, f"{method.upper()} {url} failed: {e!r}") from e

    async def create(self, url: str, body: Mapping[str, Any]) -> bool:
        """POSTs ``body`` to the collection ``url``; False when it already exists (409)."""
        try:
            await self._request("post", url, dict(body))
        except KubeError as e:
            if e.status == 409:
                return False
            raise
        return True

    async def patch(self, url: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Applies a JSON merge patch to the object at ``url``; returns the object as patched."""
        result = await self._request("patch", url, dict(patch), headers={"Content-Type": MERGE_PATCH})
        return result if isinstance(result, dict) else {}

    async def delete(self, url: str, propagation: str = "Background") -> bool:
        """Deletes the object at ``url``; False when it is already gone (404)."""
        try:
            await self._request("delete", url, {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation})
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return True
