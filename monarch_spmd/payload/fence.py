"""The fence: no process of one rank runs twice, and none of round r runs once round r+1 started.

The coordinator (:mod:`.coordinator`) starts a round only once every lost member's processes are
gone or their time is up (``departing``: a member that left has its pod's grace, one superseded
its own stop grace, one gone without a word FENCE_SECONDS, in which its agent fences itself). And
it watches whether it may itself be the one cut off: back from a stall of its own, or a member
lost by silence with no observer (the operator) heard since (:meth:`Fencing.isolated`). Then the
gang may be going on elsewhere: it starts nothing, and stops what runs with the fence (``stop``
with ``fence``: every agent ends its processes within FENCE_GRACE); a stall as long as the node
controller's grace gives the gang up. docs/restart-in-place.md, "Invariants", says the bounds.
"""

from __future__ import annotations

from typing import Any

from .names import EX_TEMPFAIL
from .rendezvous import (ALL, FAILED, FENCE_SECONDS, FINISHED, LEAVE_MARGIN, LOST_LEFT, LOST_SUPERSEDED,
                         OBSERVER_SIGHT, REASON_COORDINATOR_LOST, STALL_GIVE_UP, STALL_SECONDS, STALL_WINDOW, STOP,
                         STOPPING, Out)


class Fencing:
    """The coordinator's part that holds rounds for lost members' processes and for its own sight.

    State: ``departing`` (agents lost whose processes may still run, (member, incarnation) -> until
    when), ``stalled_at`` (when it last came back from a stall), ``observers`` (connected now),
    ``observer_broke_at`` (when the last one's connection broke), ``observer_beat_at`` (an
    observer's last heartbeat; None: none ever, an observer of an earlier version or none),
    ``member_silent_at`` (when a member other than 0 was last lost by silence or a broken
    connection).
    """

    def _init_fencing(self) -> None:
        self.departing: dict[tuple[int, str], float] = {}
        self.stalled_at: float | None = None
        self.observers = 0
        self.observer_broke_at: float | None = None
        self.observer_beat_at: float | None = None
        self.member_silent_at: float | None = None
        #: When an observer last connected (or, before any did, when this coordinator started).
        self.observer_joined_at: float = self.now

    def stalled(self, now: float, seconds: float = STALL_SECONDS) -> list[Out]:
        """The coordinator itself was not running for ``seconds`` (at least STALL_SECONDS) until
        ``now``: its node froze, or it starved. What it stops next is stopped with the fence; a
        stall of STALL_GIVE_UP or more gives the gang up (fallback): the operator, which saw its
        node stop reporting, may have recreated it elsewhere meanwhile."""
        self._clock(now)
        self.stalled_at = now
        if seconds >= STALL_GIVE_UP and self.phase not in (FINISHED, FAILED):
            return self._fail(None, exit_code=EX_TEMPFAIL, reason=REASON_COORDINATOR_LOST, fallback=True,
                              message=f"the coordinator was stopped for {seconds:.0f}s (its node froze or starved): "
                                      "its gang may have been recreated meanwhile; the gang must be recreated")
        return []

    def observer_joined(self, now: float | None = None) -> list[Out]:
        """An observer (the operator, the local runner) said hello: a round held while the
        coordinator looked cut off (:meth:`isolated`) may start."""
        if now is not None:
            self._clock(now)
        self.observers += 1
        self.observer_broke_at = None
        self.observer_joined_at = self.now
        return self._maybe_go()

    def observer_beat(self, now: float) -> list[Out]:
        """An observer's heartbeat (observers of this version send one every HEARTBEAT_INTERVAL):
        the operator still hears this coordinator; a round held for it may start."""
        self._clock(now)
        self.observer_beat_at = now
        return self._maybe_go()

    def observer_left(self, broken: bool, now: float) -> list[Out]:
        """An observer's connection ended; ``broken``: by an error or silence, not closed by it."""
        self._clock(now)
        self.observers = max(0, self.observers - 1)
        if broken:
            self.observer_broke_at = now
        if self.phase == STOPPING and self.unseen():
            return [Out(ALL, self._stop_message())]  # out of sight while stopping: within the fence
        return []

    def isolated(self) -> bool:
        """Whether this coordinator may be the one cut off from the cluster: it lost a member by
        silence, and no observer (the operator) has been heard since (its heartbeat). Its node
        may then be the one partitioned, and the operator, hearing it no more, recreating the
        gang elsewhere: it starts no round (an elastic gang would shrink to the members beside
        it) and stops what runs within the fence, until an observer is heard again."""
        if self.member_silent_at is None:
            return False
        if self.observers and self.observer_beat_at is None:
            return False  # an observer of an earlier version, which sends nothing: it is there
        return self.observer_beat_at is None or self.observer_beat_at <= self.member_silent_at

    def unseen(self) -> bool:
        """Whether the gang may have been recreated without this coordinator knowing: it is back
        from a silence of its own (STALL_WINDOW), looks cut off (:meth:`isolated`), the
        operator's observer connection broke and none is back, or no observer was heard for
        OBSERVER_SIGHT (:meth:`out_of_sight`). What it stops then, it stops
        within the fence (a checkpoint a rank writes on SIGTERM is cut short while the operator
        is out of sight, the price of never running beside a new gang)."""
        return ((self.stalled_at is not None and self.now - self.stalled_at <= STALL_WINDOW) or self.isolated()
                or (self.observers == 0 and self.observer_broke_at is not None) or self.out_of_sight())

    def out_of_sight(self) -> bool:
        """Whether no observer has been heard for OBSERVER_SIGHT: none connected since this
        coordinator started, or the last heartbeat is that old (its node may be partitioned with
        every member on it, nothing of its own broken). An observer connected that never beats
        (an earlier version, the local runner) is in sight while connected."""
        if self.observers and self.observer_beat_at is None:
            return False
        heard = max(self.observer_joined_at, self.observer_beat_at or self.observer_joined_at)
        return self.now - heard >= OBSERVER_SIGHT

    def _stop_message(self) -> dict[str, Any]:
        stop: dict[str, Any] = {"type": STOP, "round": self.round}
        if self.unseen():
            # Just back from a silence of its own, or out of the operator's sight: the gang may be
            # going on elsewhere, so nothing of this round may linger (every agent ends its
            # processes within the fence).
            stop["fence"] = True
        return stop

    def _fence(self, reason: str) -> float:
        """How long a lost member's processes may still run: a member that left (its pod is being
        deleted) until the kubelet's SIGKILL; one superseded until its own stop grace; one that
        went without a word until it fences itself (FENCE_SECONDS)."""
        if reason == LOST_LEFT:
            return self.policy.stop_grace + LEAVE_MARGIN
        if reason == LOST_SUPERSEDED:
            return self.policy.stop_grace + FENCE_SECONDS
        return FENCE_SECONDS

    def departed(self, member: int, incarnation: str, now: float) -> list[Out]:
        """A lost member's agent has ended (its connection's end after it left): none of its
        processes runs any more."""
        self._clock(now)
        self.departing.pop((member, incarnation), None)
        return self._maybe_go()

    def _fenced(self) -> bool:
        """Whether no lost member's process may still run (the next round may start)."""
        for key, until in list(self.departing.items()):
            if self.now >= until:
                del self.departing[key]
        return not self.departing

