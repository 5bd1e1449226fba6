"""The restart-in-place protocol's pure parts (monarch_spmd.payload.rendezvous): the coordinator's
state machine driven by hand, message framing, the back-off rule and the quorum. The same machine
runs behind real sockets in tests/lib/test_agent.py."""

from __future__ import annotations

import json

import pytest

from monarch_spmd.payload import counting, elastic
from monarch_spmd.payload import rendezvous as rv
from monarch_spmd.payload.coordinator import Coordinator, Policy
from monarch_spmd.payload.rendezvous import ALL, OBSERVERS

from .coordinators import Observed


def machine(members: int = 3, first_round: int = 0, **policy) -> Coordinator:
    c = Observed(members, first_round, Policy(**{"max_restarts": 3, "backoff": 0.0, **policy}), now=0.0,
                    world_size=members, run_id="job", wall=lambda: 1000.0)
    c.start()
    return c


def sent(outs, to=ALL):
    return [o.message for o in outs if o.to == to]


def events(outs, kind=None):
    return [o.message for o in outs if o.to == OBSERVERS and (kind is None or o.message["type"] == kind)]


def start_round(c: Coordinator, now: float = 1.0) -> list:
    outs = []
    for m in range(c.members):
        if m not in c.incarnations:
            outs += c.hello(m, f"inc-{m}", now)
    for m in range(c.members):
        outs += c.join(m, c.round, now)
    return outs


def run_all(c: Coordinator, now: float = 2.0) -> list:
    outs = []
    for m in range(c.members):
        outs += c.running(m, c.round, [{"rank": m, "local_rank": 0, "pid": 100 + m}], now)
    return outs


def fail(c: Coordinator, member: int, code: int = 3, now: float = 3.0, at: float | None = None, reason: str = "Error"):
    return c.failure(member, c.round, {"rank": member, "local_rank": 0, "pid": 100 + member, "exit_code": code,
                                       "returncode": code, "reason": reason, "message": f"rank {member} failed",
                                       "tail": ["Traceback", "ValueError: boom"], "at": now if at is None else at}, now)


def stop_all(c: Coordinator, now: float = 4.0, failed: int | None = None) -> list:
    outs = []
    r = c.round
    for m in sorted(c.live()):
        outs += c.exited(m, r, [{"rank": m, "exit_code": 3 if m == failed else 143, "stopped": m != failed}], now)
        outs += c.join(m, r + 1, now)
    return outs


def test_go_is_sent_only_when_every_member_joined_the_round():
    c = machine()
    outs = []
    for m in range(3):
        outs += c.hello(m, f"i{m}", 1.0)
    welcome = [o.message for o in outs if o.message["type"] == rv.WELCOME]
    assert [w["round"] for w in welcome] == [0, 0, 0]
    assert sent(c.join(0, 0, 1.0)) == [] and sent(c.join(1, 0, 1.0)) == []
    assert sent(c.join(1, 0, 1.0)) == []  # joining twice changes nothing
    outs = c.join(2, 0, 1.5)
    assert sent(outs) == [{"type": rv.GO, "round": 0}]
    assert events(outs, rv.EV_STARTED)[0]["members"] == 3 and c.phase == rv.RUNNING_PHASE


def test_a_join_for_another_round_is_ignored():
    c = machine(first_round=2)
    for m in range(3):
        c.hello(m, f"i{m}", 1.0)
    assert c.join(0, 1, 1.0) == [] and c.join(0, 3, 1.0) == [] and c.joined == set()


def test_a_failure_stops_everyone_and_the_restart_is_decided_once_all_stopped():
    c = machine()
    start_round(c)
    all_running = events(run_all(c), rv.EV_ALL_RUNNING)
    assert all_running and all_running[0]["seconds_since_failure"] is None
    outs = fail(c, 1)
    assert sent(outs) == [{"type": rv.STOP, "round": 0}] and c.phase == rv.STOPPING
    failure = events(outs, rv.EV_FAILURE)[0]
    assert (failure["rank"], failure["exit_code"], failure["reason"], failure["tail"][-1]) == (1, 3, "Error", "ValueError: boom")
    outs = c.exited(0, 0, [{"rank": 0, "exit_code": 143, "stopped": True}], 4.0) + c.join(0, 1, 4.0)
    assert not events(outs, rv.EV_RESTART), "no decision before every member stopped"
    outs = stop_all(c, 4.5, failed=1)
    restart = events(outs, rv.EV_RESTART)[0]
    assert (restart["round"], restart["next_round"], restart["rank"], restart["exit_code"]) == (0, 1, 1, 3)
    assert (restart["counted"], restart["max_restarts"], restart["backoff_seconds"]) == (1, 3, 0.0)
    assert sent(outs) == [{"type": rv.GO, "round": 1}]  # every member joined round 1 already
    assert events(outs, rv.EV_ROUND)[0]["restart_count"] == 1
    outs = run_all(c, 5.0)
    assert events(outs, rv.EV_ALL_RUNNING)[0]["seconds_since_failure"] == pytest.approx(2.0)


def test_the_root_cause_is_the_earliest_failure_not_the_first_report():
    c = machine(permanent_exit_codes=(7,))
    start_round(c)
    run_all(c)
    fail(c, 0, code=1, now=3.0, at=50.2)  # a rank whose gloo peer died, reported first
    fail(c, 2, code=7, now=3.1, at=50.0)  # the real cause, a permanent code, reported later
    outs = stop_all(c, 4.0)
    failed = events(outs, rv.EV_FAILED)[0]
    assert (failed["rank"], failed["exit_code"], failed["permanent"], failed["exhausted"]) == (2, 7, True, False)
    assert sent(outs)[0]["type"] == rv.FAIL and sent(outs)[0]["exit_code"] == 7


@pytest.mark.parametrize(("code", "reason", "policy", "permanent"), [
    (64, "Error", {}, True),
    (75, "Error", {}, False),
    (1, "Error", {"retryable_exit_codes": (2,)}, True),
    (2, "Error", {"retryable_exit_codes": (2,)}, False),
    (137, "OOMKilled", {"permanent_reasons": ("OOMKilled",)}, True),
    (137, "WatchdogTimeout", {}, False),
    (137, "NoProgress", {}, False),
])
def test_permanent_failures_follow_the_one_rule(code, reason, policy, permanent):
    c = machine(**policy)
    start_round(c)
    run_all(c)
    fail(c, 1, code=code, reason=reason)
    outs = stop_all(c, failed=1)
    assert bool(events(outs, rv.EV_FAILED)) == permanent
    assert bool(events(outs, rv.EV_RESTART)) == (not permanent)


def test_restarts_are_counted_against_the_limit_minus_disruptions():
    c = machine(max_restarts=1, disruptions=0)
    start_round(c)
    run_all(c)
    fail(c, 0)
    assert events(stop_all(c, failed=0), rv.EV_RESTART)
    run_all(c, 5.0)
    fail(c, 1, now=6.0)
    outs = stop_all(c, 7.0, failed=1)
    failed = events(outs, rv.EV_FAILED)[0]
    assert failed["exhausted"] and (failed["counted"], failed["round"], failed["exit_code"]) == (1, 1, 3)
    # The same history, but one earlier restart was a disruption the operator told a pod about.
    c = machine(max_restarts=1, first_round=1, disruptions=1)
    start_round(c)
    run_all(c)
    fail(c, 1)
    assert events(stop_all(c, failed=1), rv.EV_RESTART)[0]["counted"] == 1


def test_a_member_failing_again_and_again_recreates_the_gang():
    c = machine(max_restarts=10, member_failure_limit=3)
    t = 1.0
    start_round(c, t)
    outcomes = []
    for _ in range(3):
        run_all(c, t + 1)
        fail(c, 2, now=t + 2)
        outs = stop_all(c, t + 3, failed=2)
        outcomes.append([e["type"] for e in events(outs) if e["type"] in (rv.EV_RESTART, rv.EV_FAILED)])
        t += 10
    assert outcomes == [[rv.EV_RESTART], [rv.EV_RESTART], [rv.EV_FAILED]]
    failed = c.outcome
    assert (failed["fallback"], failed["exit_code"], failed["reason"], failed["member"]) == (True, 75, "RepeatedFailure", 2)


def test_the_streak_counts_one_member_in_a_row():
    c = machine(max_restarts=10, member_failure_limit=2)
    start_round(c)
    for member in (1, 2, 1):
        run_all(c)
        fail(c, member)
        assert events(stop_all(c, failed=member), rv.EV_RESTART)


def test_back_off_grows_for_restarts_in_a_row_and_resets_after_a_healthy_stretch():
    assert [counting.backoff_seconds(k, 10, 300) for k in (1, 2, 3, 4, 5, 6, 7)] == [0, 10, 20, 40, 80, 160, 300]
    assert counting.backoff_seconds(5, 0, 300) == 0
    c = machine(max_restarts=10, backoff=10.0, max_backoff=300.0, backoff_reset=100.0, member_failure_limit=99)
    start_round(c, 0.0)
    waits = []
    t = 0.0
    for ran in (1.0, 1.0, 1.0, 200.0, 1.0):
        run_all(c, t)
        fail(c, 0, now=t + ran)
        outs = stop_all(c, t + ran + 0.5, failed=0)
        waits.append(events(outs, rv.EV_RESTART)[0]["backoff_seconds"])
        t += ran + 0.5
        assert sent(outs) == [] or waits[-1] == 0  # go waits for the back-off
        outs = c.tick(t + waits[-1] - 0.01) if waits[-1] else []
        assert not sent(outs)
        outs = c.tick(t + waits[-1])
        assert waits[-1] == 0 or sent(outs) == [{"type": rv.GO, "round": c.round}]
        t += waits[-1]
    assert waits == [0.0, 10.0, 20.0, 0.0, 10.0]


def test_when_every_member_succeeds_the_job_finishes():
    c = machine()
    start_round(c)
    run_all(c)
    outs = []
    for m in range(3):
        outs += c.exited(m, 0, [{"rank": m, "exit_code": 0, "stopped": False}], 5.0)
    assert sent(outs) == [{"type": rv.FINISH, "round": 0, "members": [0, 1, 2]}] and events(outs, rv.EV_SUCCEEDED)
    assert c.phase == rv.FINISHED
    # A pod that comes late (a replacement) hears the verdict at once.
    c.lost(1, rv.LOST_LEFT, 6.0)
    late = c.hello(1, "new", 6.0)
    assert [o.message["type"] for o in late if o.to == 1] == [rv.WELCOME, rv.FINISH]


def test_a_member_that_succeeded_waits_and_restarts_with_the_others_when_one_fails_later():
    c = machine()
    start_round(c)
    run_all(c)
    assert sent(c.exited(0, 0, [{"rank": 0, "exit_code": 0, "stopped": False}], 3.0)) == []
    fail(c, 2, now=4.0)
    outs = stop_all(c, 5.0, failed=2)
    assert events(outs, rv.EV_RESTART) and sent(outs) == [{"type": rv.GO, "round": 1}]


def test_an_exit_reported_without_a_failure_is_one():
    c = machine()
    start_round(c)
    run_all(c)
    outs = c.exited(1, 0, [{"rank": 1, "exit_code": 9, "stopped": False}], 3.0)
    assert sent(outs) == [{"type": rv.STOP, "round": 0}] and events(outs, rv.EV_FAILURE)[0]["rank"] == 1


def test_a_lost_member_stops_the_round_and_its_replacement_joins_the_next():
    c = machine()
    start_round(c)
    run_all(c)
    outs = c.lost(2, rv.LOST_HEARTBEAT, 3.0)
    assert events(outs, rv.EV_LOST)[0]["reason"] == rv.LOST_HEARTBEAT
    assert events(outs, rv.EV_FAILURE)[0]["reason"] == rv.REASON_MEMBER_LOST
    assert sent(outs) == [{"type": rv.STOP, "round": 0}]
    outs = stop_all(c, 4.0)
    restart = events(outs, rv.EV_RESTART)[0]
    assert restart["reason"] == rv.REASON_MEMBER_LOST and restart["next_round"] == 1
    assert sent(outs) == [] and c.phase == rv.JOINING  # waits for member 2
    outs = c.hello(2, "replacement", 20.0)
    welcome = [o.message for o in outs if o.to == 2][0]
    assert (welcome["round"], welcome["replacement"]) == (1, True)
    outs = c.join(2, 1, 21.0)
    assert events(outs, rv.EV_JOINED)[0]["replacement"] is True
    assert sent(outs) == [{"type": rv.GO, "round": 1}]


def test_a_replacement_that_comes_while_the_others_stop_joins_the_next_round():
    c = machine()
    start_round(c)
    run_all(c)
    c.lost(2, rv.LOST_LEFT, 3.0)
    c.hello(2, "new", 3.5)  # the operator was quick
    assert [o.message["round"] for o in c.hello(2, "new", 3.5) if o.message["type"] == rv.WELCOME] == [1]
    outs = stop_all(c, 4.0)  # members 0 and 1 report, and 2 (new) joins round 1 too
    assert sent(outs) == [], "the member that left may still be ending its processes"
    outs = c.departed(2, "inc-2", 4.5)  # its agent ended: none of its processes runs
    assert sent(outs) == [{"type": rv.GO, "round": 1}]


def test_the_next_round_waits_for_a_departed_members_processes_within_a_bound():
    # A member that left (its pod deleted) ends its processes within its pod's grace: the next
    # round starts when its agent ends, or at the latest after the grace and LEAVE_MARGIN.
    c = machine(stop_grace=10.0)
    start_round(c)
    run_all(c)
    c.lost(2, rv.LOST_LEFT, 3.0)
    c.hello(2, "new", 3.5)
    assert sent(stop_all(c, 4.0)) == []
    assert sent(c.tick(3.0 + 10.0 + rv.LEAVE_MARGIN - 0.1)) == []
    assert sent(c.tick(3.0 + 10.0 + rv.LEAVE_MARGIN)) == [{"type": rv.GO, "round": 1}]
    # One lost without a word (its connection broke) is waited for only its own fence.
    c = machine()
    start_round(c)
    run_all(c)
    c.lost(2, rv.LOST_DISCONNECTED, 3.0)
    c.hello(2, "new", 3.5)
    assert sent(stop_all(c, 4.0)) == []
    assert sent(c.tick(3.0 + rv.FENCE_SECONDS)) == [{"type": rv.GO, "round": 1}]


def test_a_new_incarnation_supersedes_the_old_one():
    c = machine()
    start_round(c)
    run_all(c)
    outs = c.hello(1, "second", 3.0)
    dropped = [o for o in outs if o.drop]
    assert dropped and dropped[0].message["type"] == rv.FAIL and dropped[0].message["exit_code"] == 75
    assert events(outs, rv.EV_LOST)[0]["reason"] == rv.LOST_SUPERSEDED
    assert sent(outs) == [{"type": rv.STOP, "round": 0}]


def test_a_round_that_does_not_close_in_time_recreates_the_gang():
    c = machine(join_timeout=30.0)
    start_round(c)
    run_all(c)
    c.lost(1, rv.LOST_DISCONNECTED, 3.0)
    stop_all(c, 4.0)  # opens round 1 at t=4, without member 1
    assert c.tick(33.9) == []
    outs = c.tick(34.0)
    failed = events(outs, rv.EV_FAILED)[0]
    assert (failed["reason"], failed["fallback"], failed["exit_code"]) == ("RoundTimeout", True, 75)
    assert "member(s) 1 never joined" in failed["message"]
    assert sent(outs)[0]["type"] == rv.FAIL


def test_the_first_round_waits_for_its_pods_without_a_deadline():
    c = machine(join_timeout=5.0)
    c.hello(0, "a", 1.0)
    c.join(0, 0, 1.0)
    assert c.tick(10_000.0) == [] and c.phase == rv.JOINING


def test_members_that_do_not_stop_are_dropped_and_the_decision_is_taken():
    c = machine(join_timeout=10.0)
    start_round(c)
    run_all(c)
    fail(c, 0, now=3.0)
    c.exited(0, 0, [{"rank": 0, "exit_code": 3, "stopped": False}], 3.5)
    c.join(0, 1, 3.5)
    outs = c.tick(13.0)
    assert [e["member"] for e in events(outs, rv.EV_LOST)] == [1, 2]
    assert events(outs, rv.EV_RESTART)


def test_progress_events_name_the_stalest_rank():
    c = machine()
    start_round(c)
    run_all(c, 2.0)
    c.heartbeat(0, 3.0, idle=1.0, rank=0, line="step 9")
    c.heartbeat(1, 3.0, idle=42.5, rank=1, line="step 3")
    assert events(c.tick(5.9)) == []  # every 5 s from the go (t=1)
    progress = events(c.tick(6.0), rv.EV_PROGRESS)[0]
    assert (progress["seconds_since_progress"], progress["rank"], progress["line"]) == (42.5, 1, "step 3")


def test_events_are_numbered_without_gaps_and_the_history_is_what_observers_need():
    c = machine()
    start_round(c)
    run_all(c)
    fail(c, 1)
    stop_all(c, failed=1)
    welcome = c.observer_welcome()
    seqs = [e["seq"] for e in welcome["history"]]
    assert seqs == sorted(seqs) and welcome["seq"] >= seqs[-1]
    kinds = [e["type"] for e in welcome["history"]]
    assert kinds == [rv.EV_ROUND, rv.EV_STARTED, rv.EV_ALL_RUNNING, rv.EV_FAILURE, rv.EV_RESTART, rv.EV_ROUND,
                     rv.EV_STARTED]
    assert (welcome["round"], welcome["phase"], welcome["members"], welcome["v"]) == (1, rv.RUNNING_PHASE, 3, 1)
    json.dumps(welcome)  # all of it travels as JSON


def test_line_framing():
    buf = rv.LineBuffer(limit=64)
    assert buf.feed(b'{"type":"a"}\n{"ty') == [{"type": "a"}]
    assert buf.feed(b'pe":"b","x":1}\n\n') == [{"type": "b", "x": 1}]
    assert rv.encode({"type": "go", "round": 2}) == b'{"type":"go","round":2}\n'
    for bad in (b"not json\n", b"[1]\n", b'{"no":"type"}\n', b"x" * 65):
        with pytest.raises(rv.ProtocolError):
            rv.LineBuffer(limit=64).feed(bad)


def test_the_quorum_is_every_member_today():
    assert elastic.quorum_reached({0, 1, 2}, 3) and not elastic.quorum_reached({0, 2}, 3) and elastic.quorum_reached({0, 1, 5}, 2)


def test_policy_lists_parse_naming_the_variable():
    assert rv.parse_codes(" 3, 4,3 ", "X") == (3, 4) and rv.parse_codes("", "X") == ()
    assert rv.parse_reasons("OOMKilled, Evicted,") == ("OOMKilled", "Evicted")
    with pytest.raises(ValueError, match="^X: 0 is out of range"):
        rv.parse_codes("0", "X")
