"""Hot spares in the coordinator (monarch_spmd.payload.rendezvous): a spare that said hello waits;
a lost member's place goes to the lowest ready spare (``assign``), the round restarts with it as
that member, and the loss is not counted against maxRestarts. Driven by hand; tests/lib/test_spares.py
runs it with real workers and ranks."""

from __future__ import annotations

import pytest

from monarch_spmd.payload import rendezvous as rv
from monarch_spmd.payload.rendezvous import ALL, OBSERVERS

from .test_gang_capture import running_gang




def to(outs, who):
    return [o.message for o in outs if o.to == who]


def events(outs, kind):
    return [o.message for o in outs if o.to == OBSERVERS and o.message["type"] == kind]


def test_a_lost_member_is_taken_over_by_the_lowest_ready_spare_and_the_restart_is_not_counted():
    c = running_gang()
    outs = c.spare_hello(3, "s3", 2.0, node="node-c") + c.spare_hello(1, "s1", 2.0, node="node-b")
    assert to(outs, "spare:1")[0]["type"] == rv.WELCOME
    assert [e["ready"] for e in events(outs, rv.EV_SPARE)] == [1, 2]
    outs = c.lost(2, rv.LOST_HEARTBEAT, 5.0)
    assert to(outs, "spare:1") == [{"type": rv.ASSIGN, "member": 2, "round": 0}]
    [takeover] = events(outs, rv.EV_TAKEOVER)
    assert (takeover["member"], takeover["spare"], takeover["node"], takeover["ready"]) == (2, 1, "node-b", 1)
    [failure] = events(outs, rv.EV_FAILURE)
    assert failure["reason"] == rv.REASON_MEMBER_LOST and "a hot spare takes its place" in failure["message"]
    assert to(outs, ALL) == [{"type": rv.STOP, "round": 0}]
    # The others stop and join round 1; the spare connects as member 2 and joins too.
    for m in (0, 1):
        c.exited(m, 0, [{"rank": m, "exit_code": 143, "stopped": True}], 6.0)
        c.join(m, 1, 6.0)
    outs = c.hello(2, "spare-as-2", 6.1, node="node-b")
    assert to(outs, 2)[0]["round"] == 1
    outs = c.join(2, 1, 6.2)
    [restart] = [e for e in c.history if e["type"] == rv.EV_RESTART]
    assert (restart["reason"], restart["counted"], restart["max_restarts"]) == (rv.REASON_MEMBER_LOST, 0, 0)
    assert to(outs, ALL) == [], "member 2's old agent, lost without a word, may still be fencing itself"
    outs = c.tick(5.0 + rv.FENCE_SECONDS)
    assert to(outs, ALL) == [{"type": rv.GO, "round": 1}], "maxRestarts 0 and still going: the loss was not counted"
    assert c.takeovers == 1 and list(c.spares) == [3]


def test_a_loss_with_no_spare_ready_waits_and_the_next_spare_to_come_takes_it():
    c = running_gang(max_restarts=3)
    outs = c.lost(1, rv.LOST_DISCONNECTED, 5.0)
    assert not events(outs, rv.EV_TAKEOVER)
    outs = c.spare_hello(0, "s0", 7.0)
    assert to(outs, "spare:0")[-1] == {"type": rv.ASSIGN, "member": 1, "round": 0}
    assert c.spare_hello(1, "s1", 8.0) and not c.taken_over - {1}


def _gang_on_nodes() -> rv.Coordinator:
    """Three members: member 0 on node-a, members 1 and 2 on node-b (their hellos say so)."""
    c = running_gang()
    for m, node in ((0, "node-a"), (1, "node-b"), (2, "node-b")):
        c.incarnations.pop(m)
        c.hello(m, f"inc-{m}", 1.5, node=node)
    return c


@pytest.mark.parametrize("reason", [rv.LOST_DISCONNECTED, rv.LOST_HEARTBEAT])
def test_a_member_lost_in_silence_is_never_taken_over_by_a_spare_on_its_own_node(reason):
    # A frozen node: its member's connection times out a moment before its spare's. The spare there
    # would never arrive; the lower index does not matter, the one on another node takes the place.
    c = _gang_on_nodes()
    c.spare_hello(0, "s0", 2.0, node="node-b")
    c.spare_hello(1, "s1", 2.0, node="node-c")
    outs = c.lost(1, reason, 5.0, silent=True)
    [takeover] = events(outs, rv.EV_TAKEOVER)
    assert (takeover["spare"], takeover["node"]) == (1, "node-c"), takeover
    # Member 2 on the same node, lost a moment later: the spare on node-b is not given its place
    # either (the node is suspect), and no spare is ready elsewhere: the operator replaces it.
    assert not events(c.lost(2, reason, 5.5, silent=True), rv.EV_TAKEOVER) and list(c.spares) == [0]


def test_only_a_spare_on_the_silent_members_node_takes_no_place_and_a_spare_elsewhere_later_does():
    c = _gang_on_nodes()
    c.spare_hello(0, "s0", 2.0, node="node-b")
    assert not events(c.lost(1, rv.LOST_HEARTBEAT, 5.0), rv.EV_TAKEOVER)  # heartbeats stopped: silent
    outs = c.spare_hello(1, "s1", 6.0, node="node-c")  # a new spare, on a healthy node
    assert to(outs, "spare:1")[-1] == {"type": rv.ASSIGN, "member": 1, "round": 0}


def test_a_member_whose_connection_its_node_reset_may_be_followed_by_a_spare_on_that_node():
    # Its agent killed (a reset or a close from its node's kernel): the node is up, and on one
    # machine (monarch-spmd run) every spare is on the member's node.
    c = _gang_on_nodes()
    c.spare_hello(0, "s0", 2.0, node="node-b")
    [takeover] = events(c.lost(1, rv.LOST_DISCONNECTED, 5.0, silent=False), rv.EV_TAKEOVER)
    assert (takeover["spare"], takeover["node"]) == (0, "node-b")


def test_a_read_that_timed_out_is_silence_and_a_reset_is_not():
    from monarch_spmd.payload import hub
    import errno
    assert errno.ETIMEDOUT in hub.TIMED_OUT and errno.ECONNRESET not in hub.TIMED_OUT and True not in hub.TIMED_OUT


def test_a_member_that_left_may_be_followed_by_a_spare_on_its_own_node_when_none_is_elsewhere():
    # A pod deleted: its agent said leave, its node is fine. Another node's spare is still preferred.
    c = _gang_on_nodes()
    c.spare_hello(0, "s0", 2.0, node="node-b")
    [takeover] = events(c.lost(1, rv.LOST_LEFT, 5.0), rv.EV_TAKEOVER)
    assert (takeover["spare"], takeover["node"]) == (0, "node-b")
    c = _gang_on_nodes()
    c.spare_hello(0, "s0", 2.0, node="node-b")
    c.spare_hello(1, "s1", 2.0, node="node-c")
    [takeover] = events(c.lost(1, rv.LOST_LEFT, 5.0), rv.EV_TAKEOVER)
    assert (takeover["spare"], takeover["node"]) == (1, "node-c")


def test_member_zero_is_never_taken_over_it_runs_the_coordinator():
    c = running_gang()
    c.spare_hello(0, "s0", 2.0)
    assert not events(c.lost(0, rv.LOST_LEFT, 3.0), rv.EV_TAKEOVER) and list(c.spares) == [0]


def test_a_spare_that_goes_is_no_longer_ready_and_a_new_incarnation_supersedes_the_old():
    c = running_gang()
    c.spare_hello(0, "old", 2.0)
    outs = c.spare_hello(0, "new", 2.5)
    assert [o.message["type"] for o in outs if o.drop] == [rv.FAIL]
    assert c.spare_lost(0, "old", 3.0) == [] and 0 in c.spares  # the superseded one's close changes nothing
    [gone] = events(c.spare_lost(0, "new", 3.0), rv.EV_SPARE)
    assert (gone["state"], gone["ready"]) == ("gone", 0)
    assert not events(c.lost(2, rv.LOST_HEARTBEAT, 4.0), rv.EV_TAKEOVER)


def test_a_spare_of_a_finished_gang_is_told_so():
    c = running_gang()
    for m in range(3):
        c.exited(m, 0, [{"rank": m, "exit_code": 0}], 3.0)
    outs = c.spare_hello(0, "s0", 4.0)
    assert to(outs, "spare:0")[-1] == {"type": rv.FINISH, "round": 0}


@pytest.mark.parametrize("hello, words", [
    ({"role": "spare", "versions": [1], "spare": rv.MAX_SPARE_INDEX + 1}, "hello.spare: '1024' is not valid"),
    ({"role": "spare", "versions": [1], "spare": "0"}, "hello.spare: '0' is not valid"),
    ({"role": "spare", "versions": [1]}, "hello.spare: 'None' is not valid"),
    ({"role": "sparrow", "versions": [1]}, "hello.role: 'sparrow' is not valid; expected one of member, observer, spare"),
])
def test_a_malformed_spare_hello_is_refused_naming_its_field(hello, words):
    with pytest.raises(rv.ProtocolError) as e:
        rv.check_hello({"type": rv.HELLO, **hello}, 3)
    assert str(e.value).startswith(words)
