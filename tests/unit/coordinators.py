"""A coordinator for the state machine's table tests, as the operator observes it in a cluster.

A coordinator that loses a member by silence holds its next round until an observer's heartbeat
says it is still heard (coordinator.Coordinator.isolated). The tables of rounds, spares and
elastic sizes are about other rules: their coordinator is observed, and its observer beats right
after each loss. tests/unit/test_isolation.py holds the isolation rule itself.
"""

from __future__ import annotations

from typing import Any

from monarch_spmd.payload.coordinator import Coordinator
from monarch_spmd.payload.rendezvous import Out


class Observed(Coordinator):
    """A coordinator with an observer connected that beats just after every member lost."""

    def start(self) -> list[Out]:
        out = super().start()
        self.observer_joined(self.now)
        return out

    def lost(self, member: int, reason: str, now: float, **kwargs: Any) -> list[Out]:
        out = super().lost(member, reason, now, **kwargs)
        return out + self.observer_beat(now + 0.001)
