"""Each defect of failure handling, kept as its minimal schedule: the schedule holds every
invariant now, and with the defect put back (the old rule, as a mutation of the product) it
breaks the invariant it once broke. The schedules are the simulation's own finds, shrunk by
Hypothesis (or, for a long run's find, by dropping faults while the defect still shows).

Replay one with ``python -m tests.sim --replay '<json>'`` to read its log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from monarch_spmd.payload import fence, hub
from monarch_spmd.payload.coordinator import Coordinator
from spmd_operator.lifecycle import gang, inplace, spares

from .core import Violation
from .operator import Operator as SimOperator
from .sim import run
from .test_mutations import MUTATIONS


def _base(**fields: Any) -> dict[str, Any]:
    return {"seed": 0, "pods": 2, "procs": 1, "spares": 0, "min": None, "elastic_wait": None, "max_restarts": 0,
            "grace": 2, "backoff": 1, "train": 30.0, "extra_nodes": 1, "capacity": 1, "stubborn": 0.0,
            "faults": [], **fields}


def _mutation(name: str) -> Callable[[pytest.MonkeyPatch], None]:
    return MUTATIONS[name][1]


@dataclass(frozen=True)
class Regression:
    defect: str
    fix: str
    schedule: dict[str, Any]
    broke: str
    old_rule: Callable[[pytest.MonkeyPatch], None]


DRAIN = [{"t": 5.0, "kind": "drain"}]

REGRESSIONS: dict[str, Regression] = {r.defect: r for r in (
    Regression(
        "a lost member's peers are blamed",
        "the root cause is the earliest failure more than CONSEQUENCE_SECONDS before the round's first "
        "disruption; losses are dated by the member's leave or when it was last heard (counting.root_cause)",
        _base(seed=1, procs=2, spares=1, faults=DRAIN),
        "invariant 2", _mutation("losses sort after every failure")),
    Regression(
        "a pod deleted counts against maxRestarts",
        "PodDeleted and PodMissing are disruptions (failures.DISRUPTION_REASONS); only a member's own "
        "container failing is charged (lifecycle.inplace.charged)",
        _base(min=1, elastic_wait=1, faults=[{"t": 5.0, "kind": "delete", "target": 0}]),
        "invariant 2", _mutation("a pod deleted is the program's failure")),
    Regression(
        "the next round starts while a departed member's ranks still run",
        "go waits until each lost member's agent ended or its fence passed (fence.Fencing._fenced)",
        _base(grace=5, min=1, elastic_wait=1, stubborn=0.3, faults=DRAIN),
        "invariant 3", _mutation("no wait for a departed member")),
    Regression(
        "a member that left is given no time to end",
        "a member that said leave may run until its pod's grace and LEAVE_MARGIN, unless its agent ends "
        "first (fence.Fencing._fence)",
        _base(grace=5, min=1, elastic_wait=1, stubborn=0.3, faults=DRAIN),
        "invariant 3",
        lambda mp: mp.setattr(fence.Fencing, "_fence", lambda self, reason: fence.FENCE_SECONDS)),
    Regression(
        "fencing is SIGTERM plus the stop grace",
        "an agent cut off from its coordinator ends its ranks within FENCE_GRACE (1 s), whatever its grace",
        _base(grace=30, stubborn=0.3, faults=[{"t": 5.0, "kind": "freeze", "target": 0, "duration": 8.1}]),
        "invariant 3", _mutation("the fence is the stop grace")),
    Regression(
        "a coordinator back from a stall stops its round with the stop grace",
        "a round stopped within STALL_WINDOW of a stall, or out of the operator's sight, is stopped with "
        "the fence (fence.Fencing.unseen)",
        _base(procs=2, grace=5, stubborn=0.3, faults=[{"t": 5.0, "kind": "freeze", "target": 0, "duration": 10.6}]),
        "invariant 3", lambda mp: mp.setattr(fence.Fencing, "unseen", lambda self: False)),
    Regression(
        "a coordinator gives its gang up after any stall of its own",
        "only a stall of STALL_GIVE_UP (the node controller's 40 s) gives the gang up",
        _base(faults=[{"t": 5.0, "kind": "freeze", "target": 0, "duration": 2.8}]),
        "invariant 4", _mutation("any stall gives the gang up")),
    Regression(
        "a spare lost between its assign and its hello strands the place until the join timeout",
        "the place is free again ASSIGN_SECONDS after it was given (takeover.Takeovers._assignments)",
        _base(seed=2, pods=4, spares=1, faults=DRAIN),
        "invariant 5", _mutation("a spare's place waits forever")),
    Regression(
        "a coordinator that lost a member by silence never starts a round again",
        "isolation ends when an observer's heartbeat is heard again (fence.Fencing.isolated)",
        _base(spares=1, faults=[*DRAIN, {"t": 5.0, "kind": "partition", "target": 0, "duration": 8.3}]),
        "invariant 5", _mutation("isolated for good")),
    Regression(
        "a frozen node's pod holds the next gang for its grace period",
        "nodes judged lost are remembered (status.lostNodes) and their pods block nothing; a deleted pod "
        "still Running stop grace + 10 s later marks its node lost (lifecycle.inplace.overdue)",
        _base(faults=[{"t": 5.0, "kind": "delete", "target": 0}, {"t": 5.0, "kind": "freeze", "target": 0}]),
        "invariant 5", _mutation("lost nodes forgotten")),
    Regression(
        "a spare that crashes on every start is replaced about once a second",
        "crashed spares back off (10 s doubling to 300 s) and are deleted (lifecycle.spares)",
        _base(spares=2, faults=[{"t": 0.1, "kind": "spares_crash", "target": 0, "duration": 19.0}]),
        "invariant 7", _mutation("no back-off for spares")),
    Regression(
        "the silence of a member's earlier pod is taken for its running replacement's node lost",
        "the hello names the pod and so does the coordinator's lost event; the operator judges a silent "
        "loss only against the pod it names (lifecycle.inplace.of_pod)",
        _base(seed=17081, pods=4, procs=2, grace=5, stubborn=0.3, faults=[
            {"t": 5.0, "kind": "partition", "target": 0, "duration": 8.5}, {"t": 5.0, "kind": "delete", "target": 2},
            {"t": 11.1, "kind": "delete", "target": 3}, {"t": 25.0, "kind": "delete", "target": 0}]),
        "invariant 3", lambda mp: mp.setattr(inplace, "of_pod", lambda event, pod: True)),
    Regression(
        "a pod is created alone for a member a spare took two rounds before",
        "a takeover holds the member's place however many rounds ago it was; only a failure of the "
        "spare's own pod is a later loss (lifecycle.inplace._of_spare)",
        _base(seed=989181, pods=3, spares=2, extra_nodes=2, train=60.0, faults=[
            {"t": 6.8, "kind": "operator", "duration": 17.9}, {"t": 7.3, "kind": "delete", "target": 1},
            {"t": 9.6, "kind": "delete", "target": 2}]),
        "invariant 7", lambda mp: mp.setattr(
            inplace, "_of_spare", lambda p, f, took: not inplace.recent(inplace.view(p), took))),
    Regression(
        "a spare made after a crashed one is given the crashed one's name",
        "the attempt's next spare index is kept in status.spares.next (lifecycle.spares.next_index)",
        _base(seed=1, spares=1, train=120.0, faults=[{"t": 0.1, "kind": "spares_crash", "target": 0, "duration": 90.0}]),
        "invariant 7", lambda mp: mp.setattr(spares, "next_index", lambda p, gang, used: max(used, default=-1) + 1)),
    Regression(
        "a member whose ranks all succeeded, cut off by its coordinator's frozen node, restarts the gang for good",
        "a member that finished its part of the round is not lost when its agent goes "
        "(coordinator.Coordinator.finished_its_part): the round finishes with the others",
        _base(pods=3, capacity=2, stubborn=0.3, train=84.0, faults=[
            {"t": 0.9, "kind": "drain"}, {"t": 13.3, "kind": "delete", "target": 0},
            {"t": 102.4, "kind": "freeze", "target": 0, "duration": 8.5}]),
        # (The operator's later rule, ended_but_lost, would also get the gang going again: both put back.)
        "invariant 5", lambda mp: (mp.setattr(Coordinator, "finished_its_part", lambda self, member: False),
                                   mp.setattr(inplace, "ended_but_lost", lambda p, current: []))),
    Regression(
        "an operator just started connects to a gang it gives up in the same pass, and the gang's next round runs "
        "beside the new one",
        "a pass that deletes the observed gang's rank-0 pod stops its observer before anything else "
        "(controller.Controller.reconcile_once): no heartbeat tells the coordinator, isolated by a loss, that "
        "the operator sees it",
        _base(seed=7031, pods=3, procs=2, min=1, elastic_wait=1, grace=30, capacity=2, faults=[
            {"t": 0.1, "kind": "operator", "duration": 19.1}, {"t": 5.0, "kind": "freeze", "target": 0, "duration": 8.1}]),
        "invariant 3", lambda mp: mp.setattr(SimOperator, "gives_up", lambda self, plan: False)),
    Regression(
        "a member whose pod Succeeded after its coordinator lost it is never created again",
        "a pod that Succeeded while the coordinator, its round not over, lost its member is a lost member, "
        "created again alone (lifecycle.inplace.ended_but_lost)",
        _base(seed=2, train=77.0, faults=[{"t": 5.0, "kind": "delete", "target": 1},
                                          {"t": 86.4, "kind": "freeze", "target": 1, "duration": 8.1}]),
        "invariant 5", lambda mp: mp.setattr(inplace, "ended_but_lost", lambda p, current: [])),
    Regression(
        "an elastic member lost while the round it waited for is open still counts as joined, and the round "
        "goes without it and never stops",
        "a member lost while a round is open leaves its joined members, whether or not it waited for that "
        "round while a smaller one ran (coordinator.Coordinator._outside_round)",
        _base(seed=140407, pods=3, procs=2, min=1, elastic_wait=1, grace=5, extra_nodes=2, stubborn=0.3,
              train=45.0, faults=[{"t": 2.7, "kind": "drain"}, {"t": 59.7, "kind": "drain"},
                                  {"t": 70.2, "kind": "drain"}]),
        "invariant 5", lambda mp: mp.setattr(
            Coordinator, "_outside_round", lambda self, m: m in self.waiting or (
                self.phase in ("running", "stopping") and m not in self.round_members))),
    Regression(
        "a new attempt starts beside a hot spare of the old one that the old coordinator gave a place before "
        "its SIGTERM came",
        "the next attempt waits for the older attempts' spares to terminate as for their members "
        "(lifecycle.gang.older_spares)",
        _base(seed=49, procs=2, spares=2, grace=5, extra_nodes=2, stubborn=0.3,
              faults=[{"t": 1.7, "kind": "delete", "target": 0}]),
        "invariant 3", lambda mp: mp.setattr(gang, "older_spares", lambda p: [])),
    Regression(
        "a member lost while no spare was ready gets a new pod although a spare pod is on its way, and the "
        "spare takes the place at its hello: the new pod is turned away",
        "once a loss came without a takeover, no pod is created while more spare pods live than the "
        "coordinator has ready, for up to SPARE_ARRIVAL_SECONDS after the loss (inplace._spare_may_come)",
        _base(seed=794, pods=4, procs=2, spares=2, min=1, elastic_wait=1, grace=5, capacity=2, train=36.0,
              faults=[{"t": 37.9, "kind": "freeze", "target": 0, "duration": 9.6}, {"t": 82.9, "kind": "drain"}]),
        "invariant 7", lambda mp: mp.setattr(inplace, "SPARE_ARRIVAL_SECONDS", 0.0)),
    Regression(
        "a whole gang on a partitioned node, rank 0's pod deleted: the operator recreates it once the "
        "deletion is overdue, and when the partition heals the other member's ranks run out their pod's "
        "grace beside the new attempt (only rank 0's own agent knew it was out of the operator's sight)",
        "a member that leaves while its coordinator is out of the operator's sight is told to stop within "
        "the fence (hub.Hub.fence_departing)",
        _base(seed=97198, procs=2, capacity=2, stubborn=0.3,
              faults=[{"t": 5.0, "kind": "partition", "target": 0, "duration": 12.3},
                      {"t": 5.0, "kind": "delete", "target": 0}]),
        "invariant 3", lambda mp: mp.setattr(hub.Hub, "fence_departing", lambda self, peer: None)),
    Regression(
        "rank 0's node partitioned before the operator's observer ever connected, the other member never "
        "joined (an elastic round of one), rank 0's pod deleted: the gang is recreated once the deletion is "
        "overdue, and when the node is back rank 0 runs out its pod's grace beside the new attempt (nothing of "
        "the old coordinator broke, so it did not know it was out of the operator's sight)",
        "a coordinator that has heard no observer for OBSERVER_SIGHT (none connected since it started, or "
        "no heartbeat since) is out of sight: what it stops, and a pod deletion's SIGTERM, end within the "
        "fence (fence.Fencing.out_of_sight)",
        _base(seed=254, min=1, elastic_wait=1, extra_nodes=2, stubborn=0.3,
              faults=[{"t": 1.3, "kind": "partition", "target": 0, "duration": 22.0},
                      {"t": 5.0, "kind": "delete", "target": 0}]),
        "invariant 3", lambda mp: mp.setattr(fence.Fencing, "out_of_sight", lambda self: False)),
    Regression(
        "a node judged lost came back and took a pod of the next attempt; when that attempt's rank 0 was "
        "deleted, the attempt after it did not wait for that pod (its node was still remembered as lost) and "
        "its ranks ran out their 30 s grace beside the new gang",
        "a node remembered as lost holds up only the pods that were on it when it was lost; one judged lost "
        "again is remembered from then (lifecycle.gang._there_when_lost, Pass.remembered_lost_nodes)",
        _base(seed=4346287, pods=3, grace=30, capacity=2, extra_nodes=2, stubborn=0.3,
              faults=[{"t": 5.0, "kind": "partition", "target": 1, "duration": 12.8},
                      {"t": 18.5, "kind": "freeze", "target": 0}, {"t": 5.0, "kind": "delete", "target": 2},
                      {"t": 18.5, "kind": "drain"}, {"t": 57.0, "kind": "delete", "target": 0}]),
        "invariant 3", lambda mp: mp.setattr(gang, "_there_when_lost", lambda pod, remembered: pod.node in remembered)),
    Regression(
        "the same, with the pod created in the very second its node was judged lost (times are whole "
        "seconds): it was taken for one that was there, and its ranks ran beside the next gang",
        "a pod created in the second of the loss is waited for (lifecycle.gang._there_when_lost: created "
        "strictly before)",
        _base(seed=82310, procs=2, min=1, elastic_wait=3,
              faults=[{"t": 2.0, "kind": "partition", "target": 1, "duration": 29.6},
                      {"t": 49.6, "kind": "delete", "target": 0}]),
        "invariant 3", lambda mp: mp.setattr(gang, "_there_when_lost", _within_the_second)),
)}


def _within_the_second(pod: Any, remembered: dict[str, Any]) -> bool:
    """The first rule of _there_when_lost: a pod created in the second of the loss was there."""
    if pod.node not in remembered:
        return False
    at, created = remembered[pod.node], gang.parse_time(pod.created)
    return at is None or created is None or created <= at


@pytest.mark.parametrize("defect", list(REGRESSIONS))
def test_the_minimal_schedule_of_each_defect_holds_every_invariant(defect: str) -> None:
    run(REGRESSIONS[defect].schedule)


@pytest.mark.parametrize("defect", list(REGRESSIONS))
def test_the_minimal_schedule_of_each_defect_breaks_its_invariant_under_the_old_rule(
        defect: str, monkeypatch: pytest.MonkeyPatch) -> None:
    regression = REGRESSIONS[defect]
    regression.old_rule(monkeypatch)
    with pytest.raises(Violation) as e:
        run(regression.schedule)
    assert str(e.value).startswith(regression.broke), str(e.value)[:300]
