"""What the controller keeps of one SPMDJob between passes: its newest object and its own memory.

Where it sits: below the controller, which runs one asyncio task per :class:`JobLoop`, and below
the controller's parts that read the jobs it knows (:mod:`.payloads`, :mod:`.collector`) or hold a
job's observer connection (:mod:`.observers`); above :mod:`.lifecycle` and :mod:`.observer`,
whose objects it holds. No API request here: only state and how a new object replaces it.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import lifecycle
from .observer import Observer

JobKey = tuple[str, str]


@dataclass
class JobLoop:
    """The reconcile loop of one SPMDJob.

    Attributes:
        key: ``(namespace, name)``.
        body: the newest version of the job known (from the watch, a resync or our own patch).
        written: the status our last patch produced, until the watch delivers it.
        rejection: the API server's latest refusal to create a child (400, 403, 422), for the
            next pass; cleared when a pass tries to create children again.
        created: child name -> when this operator created it (monotonic), so a child the
            informers have not shown yet is not POSTed again within CREATED_MEMORY_SECONDS.
        foreign_reported: names of a namesake's children already reported in an Event.
        check_now: GET the job from the server before the next pass (a listed job, activation,
            a re-list; not a job the leader's watch reported as ADDED).
        next_check: when the next periodic GET is due (loop time).
        observer: restart in place: the connection to the current gang's coordinator (or, once
            its rank-0 pod is gone, what it heard last), None when there is none; opened and
            closed by :class:`.observers.Observers`.
    """

    key: JobKey
    body: dict[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    written: dict[str, Any] | None = None
    rejection: lifecycle.Refusal | None = None
    created: dict[str, float] = field(default_factory=dict)
    foreign_reported: set[str] = field(default_factory=set)
    status_written: float | None = None
    #: When this job's waiting progress-only patch may go (its turn in Controller.progress_turns).
    progress_turn: float | None = None
    check_now: bool = True
    next_check: float = 0.0
    observer: Observer | None = None
    #: Restart in place: the agent token of each attempt this process made pods for, until the
    #: pod cache shows them (an attempt's pods must all carry one token).
    tokens: dict[int, str] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return str((self.body.get("metadata") or {}).get("uid", ""))

    def accept(self, body: Mapping[str, Any]) -> None:
        """Takes ``body`` from the job watch unless it predates the status this loop wrote."""
        if self.written is not None:
            if (body.get("status") or {}) != self.written:
                return
            self.written = None
        self.body = copy.deepcopy(dict(body))

    def wrote(self, body: Mapping[str, Any]) -> None:
        """Takes the object our own status patch returned."""
        self.body = copy.deepcopy(dict(body))
        self.written = copy.deepcopy(dict(body.get("status") or {}))

    def resynced(self, body: Mapping[str, Any]) -> None:
        """Takes the object just read from the server: authoritative."""
        self.body = copy.deepcopy(dict(body))
        self.written = None

    def new_term(self) -> None:
        """Forgets what an earlier leadership term remembered: read everything again first (its
        observer connection is closed apart, by :meth:`.observers.Observers.close`)."""
        self.written = None
        self.created.clear()
        self.status_written = None
        self.progress_turn = None
        self.check_now = True
