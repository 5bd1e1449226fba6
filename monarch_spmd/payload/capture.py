"""The hang capture: every rank's stack, on every member, then one rule over the gang.

A member whose rank hangs (no progress, or its watchdog) says ``hang``; the coordinator asks every
member to freeze its ranks (``freeze``), then, once all have (or FREEZE_SECONDS passed), to take
their stacks (``dump``); once every member reported (or STACKS_SECONDS passed) the rule over all
of them (:func:`.stacks.judge`) names the rank the round's failure is, and that failure stops the
round as any does. docs/restart-in-place.md, "A hang's stacks and its culprit", is the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import stacks
from .rendezvous import (ALL, DUMP, EV_HANG, FREEZE, FREEZE_SECONDS, MAX_TEXT, REASON_NO_PROGRESS, RUNNING_PHASE,
                         STACKS_SECONDS, Out, cut)


@dataclass
class Capture:
    """A hang being captured across the gang: who asked, who has frozen and reported."""

    member: int
    rank: int
    reason: str
    message: str
    at: float | None
    deadline: float
    dumping: bool = False
    detail: bool = True
    frozen: set[int] = field(default_factory=set)
    reported: set[int] = field(default_factory=set)
    rows: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # rank: (member, row)



class Capturing:
    """The coordinator's part that captures a hang. State: ``capture`` (the hang being captured;
    None: none)."""

    def _init_capturing(self) -> None:
        self.capture: Capture | None = None

    def hang(self, member: int, round_: int, info: Mapping[str, Any], now: float) -> list[Out]:
        """A member's rank hangs (``info``: rank, reason, message, at): every member freezes its
        ranks (``freeze``); the first hang of a round only."""
        self._clock(now)
        if (round_ != self.round or self.phase != RUNNING_PHASE or member not in self.incarnations
                or self.capture is not None):
            return []
        self.capture = Capture(member, int(info["rank"]), str(info["reason"]), str(info.get("message") or ""),
                                info.get("at"), now + FREEZE_SECONDS)
        return [Out(ALL, {"type": FREEZE, "round": self.round, "reason": self.capture.reason}),
                self._event(EV_HANG, member=member, node=self.nodes.get(member, ""), rank=self.capture.rank,
                            reason=self.capture.reason, message=cut(self.capture.message, MAX_TEXT))]

    def frozen(self, member: int, round_: int, now: float) -> list[Out]:
        """Member ``member`` has stopped its ranks: once every live member has, ``dump``."""
        self._clock(now)
        capture = self.capture
        if capture is None or capture.dumping or round_ != self.round or member not in self.incarnations:
            return []
        capture.frozen.add(member)
        return self._dump() if capture.frozen >= self._in_round() else []

    def _dump(self) -> list[Out]:
        assert self.capture is not None
        self.capture.dumping = True
        self.capture.deadline = self.now + STACKS_SECONDS
        return [Out(ALL, {"type": DUMP, "round": self.round})]

    def stacks(self, member: int, round_: int, ranks: list[dict[str, Any]], detail: bool, now: float) -> list[Out]:
        """Member ``member``'s ranks' states after the dump: once every live member's are in, the
        rule over all of them names the rank the round's failure is (:meth:`_judge`)."""
        self._clock(now)
        capture = self.capture
        if capture is None or round_ != self.round or member not in self.incarnations or member in capture.reported:
            return []
        capture.reported.add(member)
        capture.detail = capture.detail and detail
        for row in ranks:
            capture.rows[row["rank"]] = (member, row)
        return self._judge() if capture.dumping and capture.reported >= self._in_round() else []

    def _judge(self) -> list[Out]:
        """The rule (:func:`.stacks.judge`) over every rank reported; the named rank's failure
        stops the round as any failure does. Undecided, it names the rank whose hang was seen."""
        capture = self.capture
        assert capture is not None
        self.capture = None
        states = {rank: row["state"] for rank, (_, row) in capture.rows.items()}
        states.setdefault(capture.rank, stacks.RankState(capture.rank, stacks.NO_STACK))
        order = sorted(states, key=lambda r: (-capture.rows[r][1]["silent"] if r in capture.rows else 0.0, r))
        why = "went silent first" if capture.reason == REASON_NO_PROGRESS else "whose watchdog timer expired"
        verdict = stacks.judge(states, order, capture.rank, why, detail=capture.detail)
        member, row = capture.rows.get(verdict.rank, (capture.member, {}))
        own = row.get("said") or (capture.message if verdict.rank == capture.rank else f"rank {verdict.rank}")
        info = {"rank": verdict.rank, "local_rank": row.get("local_rank"), "pid": row.get("pid"),
                "exit_code": row.get("exit_code"), "returncode": row.get("returncode"), "signal": row.get("signal"),
                "reason": capture.reason, "message": stacks.failure_message(verdict, own, capture.detail),
                "tail": row.get("tail") or [], "at": capture.at}
        return self._record_failure(member, info)

