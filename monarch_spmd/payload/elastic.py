"""Elastic sizes (torchrun's ``--nnodes MIN:MAX``): a round may run fewer members than the gang.

A round closes at once when every member joined; an elastic gang's round also closes once member
0 and at least the minimum joined and ``elastic_wait`` passed without the others (torchrun's last
call). ``go`` then names the round's members; GROUP_RANK is a member's place among them
(:func:`group_of`). A member that is ready while a smaller round runs makes the gang grow: every
member restarts in a round with it (reason MembershipChange, a disruption, :mod:`.counting`).
docs/restart-in-place.md, "Elastic sizes (the agent and the coordinator)", is the reference.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from .counting import Failure
from .rendezvous import ALL, EV_RESIZE, EV_STARTED, GO, REASON_MEMBERSHIP, Out, ranges


def quorum_reached(joined: Collection[int], members: int) -> bool:
    """Whether every member 0..members-1 joined: a round closes at once (an elastic gang's round
    may also close on fewer, :meth:`Elastic._quorum`)."""
    return all(m in joined for m in range(members))


def group_of(member: int, participants: Sequence[int]) -> tuple[int, int] | None:
    """Member ``member``'s place in an elastic gang's round of ``participants`` (its ``go``'s
    members): (GROUP_RANK, GROUP_WORLD_SIZE), the members numbered densely in member order, as
    torchrun's rendezvous numbers its sorted participants. None: the member is not in the round."""
    if member not in participants:
        return None
    return sorted(participants).index(member), len(participants)


class Elastic:
    """The coordinator's part that decides who a round runs.

    State: ``min_members`` (the least a round starts with: the whole gang unless elastic),
    ``round_members`` (the members of the round that runs, or ran last), ``waiting`` (members
    ready for the next round while a smaller one runs: it grows), ``quorum_at`` (when an open
    elastic round had its minimum joined: its wait for the others runs).
    """

    def _init_elastic(self) -> None:
        low = self.policy.min_members
        self.min_members = low if 0 < low < self.members else self.members
        self.round_members: set[int] = set(range(self.members))
        self.waiting: set[int] = set()
        self.quorum_at: float | None = None

    @property
    def elastic(self) -> bool:
        """Whether a round may start with fewer than every member."""
        return self.min_members < self.members

    def _quorum(self) -> bool:
        """Whether the open round may close on the members joined: every member; or, elastic,
        member 0 (the coordinator's own) and at least the minimum once ``elastic_wait`` passed
        without the rest (the wait starts again if it falls below the minimum)."""
        if quorum_reached(self.joined, self.members):
            return True
        if not self.elastic or 0 not in self.joined or len(self.joined) < self.min_members:
            self.quorum_at = None
            return False
        if self.quorum_at is None:
            self.quorum_at = self.now
        return self.now >= self.quorum_at + self.policy.elastic_wait

    def _go(self) -> list[Out]:
        """The round starts with the members joined: ``go`` (with its members, elastic) and its
        events (a ``resize`` when they are not the last round's)."""
        self.quorum_at = None
        before = self.round_members
        self.round_members = set(self.joined)
        self.waiting = set()
        if not self.elastic:
            return [Out(ALL, {"type": GO, "round": self.round}), self._event(EV_STARTED, members=self.members)]
        members = sorted(self.round_members)
        out = [Out(ALL, {"type": GO, "round": self.round, "members": members}),
               self._event(EV_STARTED, members=len(members), round_members=members, max_members=self.members,
                           world_size=self.world_size // self.members * len(members) if self.world_size else None)]
        if self.round_members != before:
            out.append(self._event(EV_RESIZE, size=len(members), round_members=members, before=len(before),
                                   message=f"round {self.round} runs {len(members)} of {self.members} members "
                                           f"(at least {self.min_members}): {ranges(members)}"))
        return out

    def _grow(self, member: int) -> list[Out]:
        """Member ``member`` is ready while a smaller elastic round runs without it: every member
        restarts in a round with it (torchrun's agents restart their workers when a node waits)."""
        if member in self.waiting:
            return []
        self.waiting.add(member)
        size = len(self.round_members)
        message = f"member {member} is ready: the gang grows from {size} to {size + len(self.waiting)} members"
        self.received += 1
        self.failures.append(Failure(member, {"rank": None, "exit_code": None, "reason": REASON_MEMBERSHIP,
                                              "message": message, "tail": [], "at": self.wall(), "grow": True},
                                     self.received))
        out = [self._event(EV_RESIZE, member=member, size=size, next_size=size + len(self.waiting),
                           node=self.nodes.get(member, ""), message=message)]
        return out + self._stop()
