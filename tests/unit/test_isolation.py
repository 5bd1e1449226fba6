"""The coordinator's rules for what it cannot see: a member lost without a word, its own stall,
its isolation from the operator, a departing member's processes, a spare that never arrives,
and which failure a restart is charged to (counting.root_cause).

Each rule is the fix of a schedule the simulation found (tests/sim); these tables hold the rule
at the state machine's level."""

from __future__ import annotations

import json

from monarch_spmd.payload import rendezvous as rv
from monarch_spmd.payload.coordinator import Coordinator, Policy
from monarch_spmd.payload.rendezvous import ALL


def machine(members: int = 3, wall: list[float] | None = None, **policy) -> Coordinator:
    clock = wall if wall is not None else [1000.0]
    c = Coordinator(members, 0, Policy(**{"max_restarts": 0, "backoff": 0.0, **policy}), now=0.0,
                    world_size=members, run_id="job", wall=lambda: clock[0])
    c.start()
    return c


def running(c: Coordinator, now: float = 1.0) -> None:
    for m in range(c.members):
        c.hello(m, f"inc-{m}", now)
    for m in range(c.members):
        c.join(m, 0, now)
    for m in range(c.members):
        c.running(m, 0, [{"rank": m, "local_rank": 0, "pid": 100 + m}], now)


def to_all(outs):
    return [o.message for o in outs if o.to == ALL]


def rejoin(c: Coordinator, members, now: float):
    outs = []
    for m in members:
        outs += c.exited(m, c.round, [{"rank": m, "exit_code": 143, "stopped": True}], now)
        outs += c.join(m, c.round + 1, now)
    return outs


def test_a_silent_loss_holds_the_next_round_until_the_operator_is_heard():
    c = machine()
    running(c)
    c.observer_joined(1.0)
    c.observer_beat(2.0)
    assert not c.isolated()
    outs = c.lost(2, rv.LOST_DISCONNECTED, 5.0, heard=4.5)
    assert c.isolated(), "no observer heard since: this coordinator may be the one cut off"
    assert to_all(outs) == [{"type": rv.STOP, "round": 0, "fence": True}], "stopped within the fence"
    c.hello(2, "new", 5.5)
    assert to_all(rejoin(c, [0, 1, 2], 7.0)) == [], "no round while isolated"
    assert to_all(c.observer_beat(8.0)) == [{"type": rv.GO, "round": 1}], "heard again: it goes on"


def test_a_loss_with_a_word_or_an_earlier_observer_that_never_beats_isolates_nothing():
    c = machine()
    running(c)
    outs = c.lost(2, rv.LOST_LEFT, 5.0, at=1004.0)
    assert not c.isolated() and to_all(outs) == [{"type": rv.STOP, "round": 0}]
    c = machine()
    running(c)
    c.observer_joined(1.0)  # an operator of an earlier version: it sends nothing after hello
    c.lost(2, rv.LOST_HEARTBEAT, 5.0)
    assert not c.isolated()


def test_a_stall_of_its_own_stops_within_the_fence_and_a_long_one_gives_the_gang_up():
    c = machine()
    running(c)
    c.observer_joined(1.0)
    c.observer_beat(1.5)
    assert c.stalled(10.0, 8.0) == []
    outs = c.lost(2, rv.LOST_DISCONNECTED, 10.1)
    assert {"type": rv.STOP, "round": 0, "fence": True} in to_all(outs)
    c = machine()
    running(c)
    outs = c.stalled(50.0, rv.STALL_GIVE_UP)
    [fail] = to_all(outs)
    assert (fail["type"], fail["reason"], fail["fallback"]) == (rv.FAIL, rv.REASON_COORDINATOR_LOST, True)


def test_the_root_cause_is_the_loss_when_the_peers_broke_after_it():
    clock = [1000.0]
    c = machine(wall=clock)
    running(c)
    c.observer_joined(1.0)
    # Member 2's pod is deleted: its leave says when (1005.0); member 1's rank breaks 0.2 s later,
    # and its report even reaches the coordinator first.
    c.failure(1, 0, {"rank": 1, "exit_code": 1, "reason": "Error", "at": 1005.2}, 5.3)
    c.lost(2, rv.LOST_LEFT, 5.4, at=1005.0)
    c.observer_beat(5.5)
    c.departed(2, "inc-2", 5.6)
    c.hello(2, "new", 6.0)
    outs = rejoin(c, [0, 1, 2], 7.0)
    [restart] = [o.message for o in outs if o.message.get("type") == rv.EV_RESTART]
    assert (restart["reason"], restart["disruption"], restart["counted"]) == (rv.REASON_MEMBER_LOST, True, 0)
    assert to_all(outs) == [{"type": rv.GO, "round": 1}], "maxRestarts 0: the loss and its consequence cost nothing"


def test_a_failure_well_before_a_loss_is_the_programs_and_counted():
    c = machine()
    running(c)
    c.failure(1, 0, {"rank": 1, "exit_code": 1, "reason": "Error", "at": 1000.0}, 1.5)
    c.lost(2, rv.LOST_LEFT, 5.0, at=1005.0)
    c.departed(2, "inc-2", 5.1)
    outs = rejoin(c, [0, 1], 6.0)
    [fail] = to_all(outs)
    assert (fail["type"], fail["rank"], fail["exhausted"]) == (rv.FAIL, 1, True)


def test_a_silent_loss_is_dated_when_the_member_was_last_heard_not_when_it_was_noticed():
    clock = [1000.0]
    c = machine(wall=clock)
    running(c)
    c.observer_joined(1.0)
    # The coordinator itself was frozen: a peer's broken collective (at 1002) and the loss of a
    # member last heard at 1.5 (1001.5, its node froze) are noticed together at 12.
    clock[0] = 1012.0
    c.failure(1, 0, {"rank": 1, "exit_code": 1, "reason": "Error", "at": 1002.0}, 12.0)
    c.lost(2, rv.LOST_DISCONNECTED, 12.0, heard=1.5)
    c.observer_beat(12.5)
    c.hello(2, "new", 13.0)
    outs = rejoin(c, [0, 1, 2], 14.0) + c.tick(14.0 + rv.FENCE_SECONDS)
    [restart] = [o.message for o in outs if o.message.get("type") == rv.EV_RESTART]
    assert restart["disruption"] is True


def test_a_spare_that_never_says_hello_in_its_place_gives_the_place_back():
    c = machine(members=3)
    running(c)
    c.observer_joined(1.0)
    c.spare_hello(0, "spare-0", 1.0)
    outs = c.lost(2, rv.LOST_LEFT, 5.0, at=1005.0)
    assert [o.message for o in outs if o.to == "spare:0"] == [{"type": rv.ASSIGN, "member": 2, "round": 0}]
    assert c.admits(2, None) is not None, "a replacement pod is turned away while the spare is on its way"
    assert c.admits(2, 0) is None, "the spare itself is welcome"
    outs = c.tick(5.0 + rv.ASSIGN_SECONDS)
    [failed] = [o.message for o in outs if o.message.get("type") == rv.EV_TAKEOVER]
    assert (failed["member"], failed["state"]) == (2, "failed")
    assert c.admits(2, None) is None and 2 not in c.taken_over


def test_the_next_round_waits_for_what_a_member_that_left_still_runs():
    c = machine(stop_grace=10.0)
    running(c)
    c.observer_joined(1.0)
    c.lost(2, rv.LOST_LEFT, 3.0, at=1003.0)
    c.hello(2, "new", 3.5)
    assert to_all(rejoin(c, [0, 1], 4.0) + c.join(2, 1, 4.0)) == []
    assert to_all(c.tick(3.0 + 10.0 + rv.LEAVE_MARGIN - 0.1)) == []
    assert to_all(c.departed(2, "inc-2", 3.0 + 12.0)) == [{"type": rv.GO, "round": 1}], "its agent ended"


def test_an_observers_heartbeat_is_the_only_thing_it_may_say():
    from monarch_spmd.payload import hub

    sent, closed = [], []
    h = hub.Hub(machine(), "", lambda p, d: sent.append(d) or True, lambda p: closed.append(p))
    peer = h.accepted("conn", 0.0)
    h.received(peer, rv.encode({"type": "hello", "role": "observer", "versions": [1]}), 0.1)
    h.received(peer, rv.encode({"type": "hb"}), 1.0)
    assert h.machine.observer_beat_at == 1.0 and peer.open
    h.received(peer, rv.encode({"type": "join", "round": 0}), 1.5)
    assert not peer.open and b"may send only hb" in sent[-1]


def _hub_with_gang(observer_broke: bool):
    """A hub of three members and one observer (the operator) over an in-memory transport; the
    observer's connection broken by the kernel's timeout when ``observer_broke``."""
    from monarch_spmd.payload import hub as hub_mod
    sent: dict[int, list[dict]] = {}
    c = machine()
    h = hub_mod.Hub(c, "", lambda peer, data: sent.setdefault(id(peer), []).extend(
        json.loads(line) for line in data.decode().splitlines()) or True, lambda peer: None)
    h.start()
    peers = []
    for m in range(3):
        p = h.accepted(object(), 1.0)
        h.received(p, rv.encode({"type": rv.HELLO, "versions": [rv.VERSION], "role": rv.ROLE_MEMBER,
                                 "member": m, "incarnation": f"inc-{m}"}), 1.0)
        peers.append(p)
    for m, p in enumerate(peers):
        h.received(p, rv.encode({"type": rv.JOIN, "round": 0}), 1.0)
    for m, p in enumerate(peers):
        h.received(p, rv.encode({"type": rv.RUNNING, "round": 0, "procs": [{"rank": m, "local_rank": 0}]}), 1.0)
    observer = h.accepted(object(), 1.0)
    h.received(observer, rv.encode({"type": rv.HELLO, "versions": [rv.VERSION], "role": rv.ROLE_OBSERVER}), 1.0)
    h.received(observer, rv.encode({"type": rv.HEARTBEAT}), 2.0)
    if observer_broke:
        h.received(observer, b"", 10.0, error=True)
    return h, peers, sent


def test_a_member_that_leaves_while_the_operator_does_not_see_its_coordinator_is_fenced_too():
    # A whole gang on a node partitioned, rank 0's pod deleted meanwhile: the operator recreated it
    # elsewhere, and once the node is back every pod's SIGTERM comes. The leaving member's ranks
    # must not run out their pod's grace beside the new attempt (tests/sim, seed 97198).
    h, peers, sent = _hub_with_gang(observer_broke=True)
    assert h.machine.unseen()
    h.received(peers[1], rv.encode({"type": rv.LEAVE, "round": 0, "signal": 15}), 20.0)
    assert {"type": rv.STOP, "round": 0, "fence": True} in sent[id(peers[1])], "the leaving member is fenced"
    assert {"type": rv.STOP, "round": 0, "fence": True} in sent[id(peers[2])], "and so are the others"


def test_a_member_that_leaves_in_the_operators_sight_keeps_its_pods_grace():
    h, peers, sent = _hub_with_gang(observer_broke=False)
    h.received(h.observers[0], rv.encode({"type": rv.HEARTBEAT}), 19.5)  # heard a moment ago
    assert not h.machine.unseen()
    h.received(peers[1], rv.encode({"type": rv.LEAVE, "round": 0, "signal": 15}), 20.0)
    assert not [m for m in sent.get(id(peers[1]), []) if m.get("type") == rv.STOP], \
        "a checkpoint on SIGTERM keeps the pod's grace"
    assert {"type": rv.STOP, "round": 0} in sent[id(peers[2])]


def test_a_coordinator_that_hears_no_observer_for_its_sight_is_out_of_it():
    # A gang whose every member sits on one node that is partitioned before the operator's
    # observer ever connected (tests/sim, seed 254): nothing of its own breaks, yet the operator
    # may recreate it elsewhere; after OBSERVER_SIGHT it stops (and fences a leaving member)
    # within the fence.
    c = machine()
    running(c)
    c._clock(rv.OBSERVER_SIGHT - 0.5)
    assert not c.unseen()
    c._clock(rv.OBSERVER_SIGHT + 0.1)
    assert c.out_of_sight() and c.unseen()
    c.observer_joined(20.0)
    c.observer_beat(21.0)
    assert not c.unseen(), "heard again"
    c._clock(21.0 + rv.OBSERVER_SIGHT)
    assert c.unseen(), "its heartbeats stopped (a partition before the connection breaks)"
    old = machine()
    running(old)
    old.observer_joined(1.0)  # the local runner's observer: connected, never beats
    old._clock(100.0)
    assert not old.unseen()
