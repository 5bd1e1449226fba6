"""The coordinator's events: what its observers (the operator, the local runner) see of the gang.

Every step of the coordinator's state machine (:mod:`.coordinator`) that an observer should know
of is an event (docs/restart-in-place.md, "The observer protocol"); those that say where the gang
stands are kept in a bounded history, which a (re)connecting observer receives in its welcome.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from .rendezvous import (HISTORY_EVENTS, HISTORY_LIMIT, HISTORY_WHOLE, MAX_HISTORY_BYTES, OBSERVERS, VERSION,
                         WELCOME, Out, _event_size, cut)


class History:
    """The coordinator's part that numbers its events and keeps their history.

    State: ``seq`` (the last event's number), ``history`` (at most HISTORY_LIMIT events and
    MAX_HISTORY_BYTES of JSON), ``history_bytes``, ``history_compacted`` (the oldest events that
    lost their output lines), ``history_dropped`` (events forgotten).
    """

    def _init_history(self) -> None:
        self.seq = 0
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_LIMIT)
        self.history_bytes = 0
        self.history_compacted = 0
        self.history_dropped = 0

    def _event(self, kind: str, **fields: Any) -> Out:
        self.seq += 1
        event = {"type": kind, "seq": self.seq, "time": self.wall(), "round": fields.pop("round", self.round), **fields}
        if kind in HISTORY_EVENTS:
            self._remember(event)
        return Out(OBSERVERS, event)

    def _remember(self, event: dict[str, Any]) -> None:
        """Keeps ``event`` in the history, within MAX_HISTORY_BYTES, so a welcome always fits a
        line: the oldest events first lose their output lines and long texts (``compacted``), the
        newest HISTORY_WHOLE never; then the oldest go (``history_dropped`` counts them)."""
        if len(self.history) == self.history.maxlen:
            self._forget_oldest()
        self.history.append(event)
        self.history_bytes += _event_size(event)
        while self.history_bytes > MAX_HISTORY_BYTES and len(self.history) > 1:
            i = self.history_compacted  # compacted events are always the oldest ones
            if i < len(self.history) - HISTORY_WHOLE:
                old = self.history[i]
                small = {k: v for k, v in old.items() if k not in ("tail", "cause")}
                if isinstance(old.get("cause"), Mapping):
                    small["cause"] = {k: v for k, v in old["cause"].items() if k != "tail"}
                if isinstance(small.get("message"), str):
                    small["message"] = cut(small["message"], 200)
                small["compacted"] = True
                self.history_bytes += _event_size(small) - _event_size(old)
                self.history[i] = small
                self.history_compacted += 1
            else:
                self._forget_oldest()

    def _forget_oldest(self) -> None:
        self.history_bytes -= _event_size(self.history.popleft())
        self.history_compacted = max(0, self.history_compacted - 1)
        self.history_dropped += 1

    def observer_welcome(self) -> dict[str, Any]:
        """The ``welcome`` an observer gets: the state now and the history."""
        return {"type": WELCOME, "v": VERSION, "run_id": self.run_id, "members": self.members,
                "world_size": self.world_size, "first_round": self.first_round, "round": self.round,
                "phase": self.phase, "max_restarts": self.policy.max_restarts, "disruptions": self.disruptions,
                "time": self.wall(), "seq": self.seq, "history": list(self.history),
                "history_dropped": self.history_dropped, "spares": len(self.spares),
                **({"min_members": self.min_members, "round_members": sorted(self.round_members)} if self.elastic else {})}

