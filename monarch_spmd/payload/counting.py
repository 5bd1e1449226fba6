"""What a restart is charged to: the one place that decides what counts against maxRestarts.

A round of a gang ends in failures (a process of the program failed, a member was lost, a member
joined an elastic gang). :func:`root_cause` names the one the restart is charged to, and
:meth:`Count.decide` what follows from it: a disruption (a member lost, a takeover, a membership
change) is never counted and never backs off; the program's failure is counted, backs off as a
crash loop does, and gives the gang up when it is permanent, when the restarts are spent, or when
one member caused too many in a row. The coordinator (:mod:`.coordinator`) calls it once per
round it stops; the operator's view of what counts (its lifecycle's ``failure``) reads the same
rule from the restart events. docs/what-counts.md is the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from . import failures
from .names import EX_TEMPFAIL
from .rendezvous import (DEFAULT_BACKOFF, DEFAULT_BACKOFF_RESET, DEFAULT_ELASTIC_WAIT, DEFAULT_JOIN_TIMEOUT,
                         DEFAULT_MAX_BACKOFF, DEFAULT_MEMBER_FAILURE_LIMIT, REASON_ERROR, REASON_MEMBER_LOST,
                         REASON_MEMBERSHIP, REASON_REPEATED)

#: A process failure that came at most this long before a disruption of its round (a member
#: lost, a takeover, a member joining an elastic gang), or any time after it, is taken for that
#: disruption's consequence: the peers' collectives break when a member's processes go, a moment
#: before the member's loss reaches the coordinator (the ranks die first, then the agent's leave
#: or its connection's end), and clocks of nodes differ a little.
CONSEQUENCE_SECONDS: Final = 1.0


def backoff_seconds(consecutive: int, initial: float, maximum: float) -> float:
    """The wait before the ``consecutive``-th restart in a row (1 = the first after a healthy
    stretch): none for the first, then ``initial`` doubling for each further one, at most
    ``maximum``."""
    if consecutive <= 1 or initial <= 0:
        return 0.0
    return float(min(maximum, initial * 2 ** (consecutive - 2)))


@dataclass(frozen=True)
class Policy:
    """What the coordinator decides a failure with (the worker's MONARCH_SPMD_* policy inputs).

    Attributes:
        max_restarts: restarts counted against the limit (spec.restartPolicy.maxRestarts).
        disruptions: restarts so far that do not count (the operator's disruptions).
        permanent_exit_codes, retryable_exit_codes, permanent_reasons: spec.restartPolicy's.
        backoff, max_backoff, backoff_reset: the back-off rule (:func:`backoff_seconds`); a round
            that ran ``backoff_reset`` seconds before it failed starts the count again.
        join_timeout: seconds a round may stay open after its back-off (or members may take to
            stop) before the gang is given up in place (RoundTimeout: exit 75, recreate).
        member_failure_limit: restarts in place in a row caused by one member before the gang
            is recreated instead (RepeatedFailure).
        min_members: an elastic gang's minimum (torchrun's --nnodes MIN): a round may start with
            this many members once ``elastic_wait`` passed without the others; 0: every member
            (a fixed size).
        elastic_wait: see ``min_members``.
        stop_grace: the pods' grace (terminationGracePeriodSeconds): how long a member that left
            may take to end its processes.
    """

    max_restarts: int = 0
    disruptions: int = 0
    permanent_exit_codes: tuple[int, ...] = ()
    retryable_exit_codes: tuple[int, ...] = ()
    permanent_reasons: tuple[str, ...] = ()
    backoff: float = DEFAULT_BACKOFF
    max_backoff: float = DEFAULT_MAX_BACKOFF
    backoff_reset: float = DEFAULT_BACKOFF_RESET
    join_timeout: float = DEFAULT_JOIN_TIMEOUT
    member_failure_limit: int = DEFAULT_MEMBER_FAILURE_LIMIT
    min_members: int = 0
    elastic_wait: float = DEFAULT_ELASTIC_WAIT
    stop_grace: float = 30.0

    def is_permanent(self, exit_code: int | None, reason: str | None) -> bool:
        return failures.is_permanent(exit_code, reason, permanent_reasons=self.permanent_reasons,
                                     permanent_exit_codes=self.permanent_exit_codes,
                                     retryable_exit_codes=self.retryable_exit_codes)


@dataclass
class Failure:
    """One failure of a round as the coordinator recorded it: a process's (``info`` as its member
    reported it), a member's loss (reason MemberLost) or a member's joining (MembershipChange)."""

    member: int
    info: dict[str, Any]
    received: int  # the order the coordinator saw it in

    @property
    def key(self) -> tuple[float, int]:
        at = self.info.get("at")
        return (float(at) if isinstance(at, (int, float)) else float("inf"), self.received)

    @property
    def disruption(self) -> bool:
        """Not a process of the program failing: a member lost, or a member joining (a grow)."""
        return self.info.get("reason") in (REASON_MEMBER_LOST, REASON_MEMBERSHIP)


def root_cause(failures: Sequence[Failure]) -> Failure:
    """A round's root cause, THE rule of what a restart is charged to: the earliest process
    failure that came more than CONSEQUENCE_SECONDS before every disruption of the round, else
    the earliest disruption (its consequences are not the program's failures); in a round
    without disruptions, the earliest failure."""
    disruptions = [f for f in failures if f.disruption]
    crashes = [f for f in failures if not f.disruption]
    if not disruptions:
        return min(crashes, key=lambda f: f.key)
    first = min(disruptions, key=lambda f: f.key)
    independent = [f for f in crashes if f.key[0] < first.key[0] - CONSEQUENCE_SECONDS]
    return min(independent, key=lambda f: f.key) if independent else first


@dataclass(frozen=True)
class Decision:
    """What a round's failures come to (:meth:`Count.decide`).

    Attributes:
        root: the failure the restart is charged to.
        disruption: whether it is a disruption (not counted, no back-off).
        counted: restarts counted against maxRestarts before this one.
        backoff: seconds before the next round may start.
        give_up: None, or the ``fail`` to send (the :meth:`.coordinator.Coordinator._fail`
            keywords: exit_code, reason, and one of permanent, exhausted, fallback with a message).
    """

    root: Failure
    disruption: bool
    counted: int
    backoff: float = 0.0
    give_up: dict[str, Any] | None = None

    @property
    def cause(self) -> dict[str, Any]:
        """The cause a restart event and the next round's event carry."""
        info = self.root.info
        return {"rank": info.get("rank"), "member": self.root.member, "exit_code": info.get("exit_code"),
                "reason": info.get("reason") or REASON_ERROR, "message": info.get("message"),
                "tail": info.get("tail") or [], "disruption": self.disruption}


@dataclass
class Count:
    """The restarts of one gang: disruptions (never counted), the program's failures in a row
    (the back-off's count) and the member that caused the latest of them (RepeatedFailure)."""

    policy: Policy
    disruptions: int = 0
    consecutive: int = 0
    streak_member: int | None = None
    streak: int = 0

    def counted(self, round_: int) -> int:
        """Restarts counted against maxRestarts by round ``round_`` (every restart before it
        that was not a disruption)."""
        return round_ - self.disruptions

    def decide(self, round_: int, failures: Sequence[Failure], *, healthy: bool) -> Decision:
        """Round ``round_`` stopped with ``failures`` (at least one); ``healthy``: it had run
        backoff_reset seconds before its first failure (the back-off's count starts again)."""
        root = root_cause(failures)
        if root.disruption:
            # A member lost (its pod deleted, evicted, its node gone; a spare took its place or
            # not), or one that joined: not the program's failure, and what broke in its round
            # because of it is not either (root_cause). The operator, which sees why a pod went,
            # may still charge a loss to the program (a container OOM-killed): its count rules.
            self.disruptions += 1
        if healthy:
            self.consecutive = 0
            self.streak, self.streak_member = 0, None
        counted = self.counted(round_)
        if root.disruption:
            return Decision(root, True, counted)  # at once: only a crash loop backs off
        code, reason = root.info.get("exit_code"), root.info.get("reason") or REASON_ERROR
        if self.policy.is_permanent(code, reason):
            return Decision(root, False, counted, give_up={"exit_code": code, "reason": reason, "permanent": True})
        if counted >= self.policy.max_restarts:
            return Decision(root, False, counted, give_up={"exit_code": code, "reason": reason, "exhausted": True})
        self.streak = self.streak + 1 if self.streak_member == root.member else 1
        self.streak_member = root.member
        if self.streak >= self.policy.member_failure_limit:
            return Decision(root, False, counted, give_up={
                "exit_code": EX_TEMPFAIL, "reason": REASON_REPEATED, "fallback": True,
                "message": f"member {root.member} caused {self.streak} restarts in place in a row; "
                           f"the gang is recreated on fresh pods"})
        self.consecutive += 1
        backoff = backoff_seconds(self.consecutive, self.policy.backoff, self.policy.max_backoff)
        return Decision(root, False, counted, backoff)
