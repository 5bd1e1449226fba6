"""Hot spares: warm agents that take a lost member's place without recreating the gang.

A spare's agent connects as ``spare`` and waits. When a member other than 0 is lost, the lowest
ready spare is given its place (``assign``) and says hello as that member within ASSIGN_SECONDS,
or the place is free again (for another spare, or the operator's new pod). While a spare is on
its way or holds the place, a pod created for the same loss is turned away (:meth:`Takeovers.admits`):
it would supersede the spare and restart the gang once more for nothing. The loss is a disruption
(:mod:`.counting`). docs/restart-in-place.md, "Hot spares (the agent and the coordinator)", is the reference.
"""

from __future__ import annotations

from .rendezvous import (ASSIGN, ASSIGN_SECONDS, EV_SPARE, EV_TAKEOVER, FAIL, FAILED, FINISH, FINISHED,
                         LOST_SUPERSEDED, MAX_NAME, ROLE_SPARE, VERSION, WELCOME, Out, cut)


class Takeovers:
    """The coordinator's part that keeps the spares and gives them lost members' places.

    State: ``spares`` (connected and not yet given a place: index -> (incarnation, node)),
    ``taken_over`` (members whose place a spare took and who have not said hello since),
    ``assigned`` (members whose place a spare was given, until it says hello as the member:
    member -> (spare, until when it may)), ``spare_held`` (members held by a spare that
    arrived: member -> (spare, its incarnation as the member)), ``takeovers`` (how many).
    """

    def _init_takeovers(self) -> None:
        self.spares: dict[int, tuple[str, str]] = {}
        self.taken_over: set[int] = set()
        self.assigned: dict[int, tuple[int, float]] = {}
        self.spare_held: dict[int, tuple[int, str]] = {}
        self.takeovers = 0
        #: Nodes of members lost without a word (their connection broke or fell silent): the
        #: node may be gone with them, and a spare there with it (:meth:`_take_over`).
        self.suspect_nodes: set[str] = set()

    def _arrived(self, member: int, incarnation: str, spare: int | None) -> None:
        """Member ``member``'s hello as ``incarnation``; ``spare``: the spare it was. The spare
        given its place holds it from now on; any other pod of the member ends that hold."""
        pending = self.assigned.get(member)
        if pending is not None and spare == pending[0]:
            del self.assigned[member]
            self.spare_held[member] = (spare, incarnation)
        elif spare is None:
            self.spare_held.pop(member, None)

    def spare_hello(self, spare: int, incarnation: str, now: float, *, node: str = "") -> list[Out]:
        """A spare's agent connected (a new incarnation supersedes an older one): it waits, warm,
        for a lost member's place. A member lost while no spare was ready gets this one at once."""
        self._clock(now)
        old = self.spares.get(spare)
        out: list[Out] = []
        if old is not None and old[0] != incarnation:
            out.append(Out(f"{ROLE_SPARE}:{spare}", {"type": FAIL, "reason": LOST_SUPERSEDED}, drop=True))
        self.spares[spare] = (incarnation, cut(node, MAX_NAME))
        out.append(Out(f"{ROLE_SPARE}:{spare}", {"type": WELCOME, "v": VERSION, "round": self.round, "phase": self.phase}))
        out.append(self._event(EV_SPARE, spare=spare, node=self.spares[spare][1], state="ready", ready=len(self.spares)))
        if self.phase in (FINISHED, FAILED):
            out.append(Out(f"{ROLE_SPARE}:{spare}", {"type": FINISH, "round": self.round}))
            return out
        waiting = [m for m in range(1, self.members) if m in self.seen and m not in self.incarnations
                   and m not in self.taken_over]
        if waiting:
            out.extend(self._take_over(waiting[0]))
        return out

    def spare_lost(self, spare: int, incarnation: str | None, now: float) -> list[Out]:
        """A waiting spare's connection closed (its pod is gone): it is no longer ready."""
        self._clock(now)
        if spare not in self.spares or (incarnation is not None and self.spares[spare][0] != incarnation):
            return []
        _, node = self.spares.pop(spare)
        return [self._event(EV_SPARE, spare=spare, node=node, state="gone", ready=len(self.spares))]

    def _take_over(self, member: int, silent: bool = False) -> list[Out]:
        """Member ``member`` is lost: the lowest ready spare on another node takes its place
        (``assign``), and joins the next round as that member. Member 0 runs the coordinator: its
        loss ends the gang. A member lost in ``silent`` (its heartbeats stopped, or its connection
        timed out: nothing answered from its node) may have lost its node: no spare on that node,
        nor on one of an earlier such loss, is given a place (a frozen node's spare falls silent a
        moment after its member; given the place it would never arrive). A member that left, or
        whose connection was closed or reset by its node's kernel (the node is up), may be followed
        by a spare on its own node when no other is ready."""
        if member == 0 or not self.spares or self.phase in (FINISHED, FAILED):
            return []
        here = self.nodes.get(member, "")
        if silent and here:
            self.suspect_nodes.add(here)
        fit = [s for s, (_, node) in self.spares.items() if not node or node not in self.suspect_nodes]
        if not fit:
            return []  # every ready spare may be lost with the member: the operator replaces it
        spare = min(fit, key=lambda s: (bool(here) and self.spares[s][1] == here, s))
        _, node = self.spares.pop(spare)
        self.taken_over.add(member)
        self.assigned[member] = (spare, self.now + ASSIGN_SECONDS)
        self.takeovers += 1
        return [Out(f"{ROLE_SPARE}:{spare}", {"type": ASSIGN, "member": member, "round": self.round}),
                self._event(EV_TAKEOVER, member=member, spare=spare, node=node, ready=len(self.spares),
                            takeovers=self.takeovers)]

    def admits(self, member: int, spare: int | None) -> str | None:
        """Why a member's hello is refused, or None: while a spare given member ``member``'s place
        is on its way or holds it, a pod of that member that is not that spare (a replacement
        created for the same loss) is turned away: it would supersede the spare and restart the
        gang once more for nothing."""
        if self.phase in (FINISHED, FAILED):
            return None
        pending = self.assigned.get(member)
        if pending is not None and spare != pending[0]:
            return f"member {member}'s place is taken by hot spare {pending[0]}"
        held = self.spare_held.get(member)
        if spare is None and held is not None and self.incarnations.get(member) == held[1]:
            return f"member {member}'s place is held by hot spare {held[0]}, whose agent runs"
        return None

    def _assignments(self) -> list[Out]:
        """Spares that did not say hello as the member they were given within ASSIGN_SECONDS (the
        spare's pod went, its connection was cut): the place is free again, for another spare."""
        out: list[Out] = []
        for member, (spare, until) in sorted(self.assigned.items()):
            if self.now < until or member in self.incarnations:
                continue
            del self.assigned[member]
            self.taken_over.discard(member)
            out.append(self._event(EV_TAKEOVER, member=member, spare=spare, state="failed", ready=len(self.spares),
                                   takeovers=self.takeovers,
                                   message=f"hot spare {spare} did not take member {member}'s place within "
                                           f"{ASSIGN_SECONDS:g}s"))
            out.extend(self._take_over(member))
        return out

