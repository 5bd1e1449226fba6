"""Each invariant catches its bug: a rule of the product broken on purpose (the bug it once had,
or one it could have), and the simulation must find a violation of that invariant within the CI
profile's schedules. A mutation the simulation cannot catch would mean an invariant that checks
nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from monarch_spmd.payload import coordinator, counting, failures, fence, rendezvous, takeover
from spmd_operator.lifecycle import inplace, spares, status

from .core import Violation
from .profiles import CI_EXAMPLES, search
from .sim import run


def _old_root_cause(found):
    """The rule before the simulation: the earliest failure by its time, losses (no time) last."""
    def key(f):
        at = f.info.get("at") if not f.disruption else None
        return (float(at) if isinstance(at, (int, float)) else float("inf"), f.received)
    return min(found, key=key)


def _spares_said_one_more(tend: Callable[[Any], None]) -> Callable[[Any], None]:
    def said(p: Any) -> None:
        tend(p)
        if isinstance(p.new.get("spares"), dict):
            p.new["spares"] = {**p.new["spares"], "ready": int(p.new["spares"].get("ready") or 0) + 1}
    return said


MUTATIONS: dict[str, tuple[str | tuple[str, ...], Callable[[pytest.MonkeyPatch], None]]] = {
    # 1. counting: a peer's broken collective, reported before the loss it follows, is charged
    # (with maxRestarts 0 it fails the job: invariant 2, its twin).
    "losses sort after every failure": (
        ("invariant 1", "invariant 2"), lambda mp: mp.setattr(counting, "root_cause", _old_root_cause)),
    # 2. no failure from disruptions: a pod deleted by hand counted against maxRestarts (the
    # operator's old rule).
    "a pod deleted is the program's failure": (
        "invariant 2", lambda mp: mp.setattr(failures, "DISRUPTION_REASONS",
                                            failures.DISRUPTION_REASONS - {"PodDeleted", "PodMissing"})),
    # 3. one round at a time: the next round does not wait for a departed member's processes.
    "no wait for a departed member": (
        "invariant 3", lambda mp: mp.setattr(coordinator.Coordinator, "_fenced", lambda self: True)),
    # 3. fencing: an agent cut off keeps its processes for the whole stop grace.
    "the fence is the stop grace": (
        "invariant 3", lambda mp: mp.setattr(rendezvous, "FENCE_GRACE", 60.0)),
    # 4. no needless recreation: a coordinator gives its gang up after any stall of its own.
    "any stall gives the gang up": (
        "invariant 4", lambda mp: mp.setattr(fence, "STALL_GIVE_UP", rendezvous.STALL_SECONDS)),
    # 5. liveness: a spare given a place that never arrives strands it until the join timeout.
    "a spare's place waits forever": (
        "invariant 5", lambda mp: mp.setattr(takeover, "ASSIGN_SECONDS", 1e9)),
    # 5. liveness: a coordinator that lost a member by silence stays isolated whatever it hears
    # (its round never starts: the gang waits for ever, or is given up at the round's timeout while
    # every member is live, invariant 4, whichever the profile's first such schedule shows).
    "isolated for good": (
        ("invariant 5", "invariant 4"), lambda mp: mp.setattr(coordinator.Coordinator, "isolated",
                                            lambda self: self.member_silent_at is not None)),
    # 5. liveness: nodes judged lost are forgotten, their pods hold the next attempt.
    "lost nodes forgotten": (
        "invariant 5", lambda mp: (mp.setattr(status.Pass, "remembered_lost_nodes", lambda self: {}),
                                   mp.setattr(inplace, "overdue", lambda p, pod: False))),
    # 6. agreement: the status says a spare more than the coordinator has.
    "the status says one spare too many": (
        "invariant 6", lambda mp: mp.setattr(spares, "tend", _spares_said_one_more(spares.tend))),
    # 7. bounded pods: spares that crash are replaced at once.
    "no back-off for spares": (
        "invariant 7", lambda mp: (mp.setattr(spares, "SPARE_BACKOFF", 0.0),
                                   mp.setattr(spares, "SPARE_MAX_BACKOFF", 0.0))),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_the_simulation_catches_each_invariants_bug(mutation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    invariant, apply = MUTATIONS[mutation]
    apply(monkeypatch)
    found = search(CI_EXAMPLES, shrink=False)
    assert found is not None, f"{mutation}: no schedule of the CI profile breaks an invariant"
    with pytest.raises(Violation) as e:
        run(found)
    expected = (invariant,) if isinstance(invariant, str) else invariant
    assert str(e.value).startswith(expected), f"{mutation}: expected {expected}, got: {str(e.value)[:300]}"


def test_every_invariant_has_a_mutation_it_catches():
    caught = set()
    for invariant, _ in MUTATIONS.values():
        caught.update((invariant,) if isinstance(invariant, str) else invariant)
    assert caught == {f"invariant {n}" for n in range(1, 8)}
