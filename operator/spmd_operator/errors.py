"""What a job's writes end in: the job gone, a child the API server refused to create, or the
first of several concurrent writes' failures.

Where it sits: above :mod:`.kube` (whose errors it reads) and :mod:`.lifecycle` (whose
:class:`~.lifecycle.Refusal` a refusal becomes), below the controller and its parts
(:mod:`.payloads`, :mod:`.creation`), which raise these and which the job's loop catches.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from . import kube, lifecycle

logger = logging.getLogger(__name__)


class JobGone(Exception):
    """The job no longer exists (or its namespace is being deleted): its loop ends quietly."""


class Refused(Exception):
    """The API server refused to create a child: carried to the next pass, not retried blindly."""

    def __init__(self, refusal: lifecycle.Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def refusal_of(error: object, body: Mapping[str, Any], index: int | None = None) -> lifecycle.Refusal | None:
    """The refusal a failed create means for the lifecycle (400, 403, 422), else None.

    A 403 because the namespace is being deleted is not one (the job's loop ends instead).
    """
    if not isinstance(error, kube.KubeError) or error.status not in (400, 403, 422) or error.namespace_terminating:
        return None
    return lifecycle.Refusal(
        kind=str(body.get("kind") or ""), name=str((body.get("metadata") or {}).get("name") or ""),
        code=error.status, reason=error.reason, message=error.message,
        at=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), index=index)


def raise_first(results: Iterable[Any]) -> None:
    """Of concurrent writes' results: logs every failure after the first and raises the first
    (:class:`JobGone` when one says the namespace is being deleted)."""
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors[1:]:
        logger.warning("a concurrent write also failed: %s", e)
    if errors:
        gone = [e for e in errors if isinstance(e, kube.KubeError) and e.namespace_terminating]
        if gone:
            raise JobGone("its namespace is being deleted") from gone[0]
        raise errors[0]
