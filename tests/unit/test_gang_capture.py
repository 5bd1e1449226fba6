"""A hang judged over the whole gang (monarch_spmd.payload.rendezvous, member): ``hang``, then
``freeze`` to every member, ``dump`` once all have frozen, and the rule over every member's
``stacks``. The coordinator is driven by hand here; tests/lib/test_hang_blame.py runs it with real
agents and ranks spread over several members."""

from __future__ import annotations

import pytest

from monarch_spmd.payload import member as mb
from monarch_spmd.payload import rendezvous as rv
from monarch_spmd.payload import stacks
from monarch_spmd.payload.coordinator import Coordinator, Policy
from monarch_spmd.payload.rendezvous import ALL, OBSERVERS

from .coordinators import Observed

USER = "/job/train.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def running_gang(members: int = 3, max_restarts: int = 0) -> Coordinator:
    """A coordinator whose ``members`` members all run round 0 (one rank each)."""
    c = Observed(members, 0, Policy(max_restarts=max_restarts, backoff=0.0), now=0.0, world_size=members,
                    run_id="job", wall=lambda: 1000.0)
    c.start()
    for m in range(members):
        c.hello(m, f"inc-{m}", 1.0)
    for m in range(members):
        c.join(m, 0, 1.0)
    for m in range(members):
        c.running(m, 0, [{"rank": m, "local_rank": 0, "pid": 100 + m}], 2.0)
    return c


def waiting(rank: int, line: int = 30) -> dict:
    site = stacks.Frame(USER, line, "main")
    return {"rank": rank, "state": stacks.RankState(rank, stacks.WAITING, site, "all_reduce",
                                                     (stacks.Frame(TORCH, 3913, "all_reduce"), site))}


def busy(rank: int) -> dict:
    site = stacks.Frame(USER, 12, "load")
    return {"rank": rank, "state": stacks.RankState(rank, stacks.BUSY, site, "", (site,))}


def row(state: dict, silent: float, said: str = "") -> dict:
    rank = state["rank"]
    return {"rank": rank, "local_rank": 0, "pid": 100 + rank, "exit_code": 134, "returncode": -6,
            "signal": "SIGABRT", "said": said or f"rank {rank} wrote nothing for {silent:.0f}s",
            "tail": [f"rank {rank} step 2"], "silent": silent, **state}


def dumping_gang(member: int, rank: int) -> Coordinator:
    """A gang whose member ``member`` saw rank ``rank`` hang, every member frozen: ``dump`` sent."""
    c = running_gang()
    hang(c, member, rank)
    for m in range(3):
        c.frozen(m, 0, 10.5)
    return c


def to(outs, who=ALL):
    return [o.message for o in outs if o.to == who]


def hang(c: Coordinator, member: int, rank: int, now: float = 10.0, reason: str = rv.REASON_NO_PROGRESS):
    return c.hang(member, 0, {"rank": rank, "reason": reason, "message": f"rank {rank} wrote nothing for 10s",
                              "at": 1005.0}, now)


def test_a_hang_freezes_every_member_and_dumps_only_when_all_have_frozen():
    c = running_gang()
    outs = hang(c, 0, 0)
    assert to(outs) == [{"type": rv.FREEZE, "round": 0, "reason": rv.REASON_NO_PROGRESS}]
    [event] = to(outs, OBSERVERS)
    assert event["type"] == rv.EV_HANG and event["rank"] == 0 and event["member"] == 0
    assert hang(c, 2, 2, 10.1) == []  # a second hang of the round changes nothing
    assert c.frozen(0, 0, 10.2) == [] and c.frozen(1, 0, 10.2) == []
    assert c.frozen(1, 0, 10.2) == []  # twice is once
    assert to(c.frozen(2, 0, 10.3)) == [{"type": rv.DUMP, "round": 0}]
    assert c.phase == rv.RUNNING_PHASE


def test_the_rank_that_is_not_waiting_is_named_though_another_members_rank_went_silent_first():
    c = dumping_gang(0, 0)
    assert c.stacks(0, 0, [row(waiting(0), 15.2)], True, 11.0) == []
    assert c.stacks(2, 0, [row(waiting(2), 15.0)], True, 11.0) == []
    outs = c.stacks(1, 0, [row(busy(1), 14.9, said="rank 1 wrote nothing for 15s; last line: step 2")], True, 11.0)
    [failure] = [o.message for o in outs if o.message["type"] == rv.EV_FAILURE]
    assert failure["rank"] == 1 and failure["member"] == 1 and failure["reason"] == rv.REASON_NO_PROGRESS
    assert failure["exit_code"] == 134 and failure["signal"] == "SIGABRT" and failure["tail"] == ["rank 1 step 2"]
    assert failure["message"].startswith("rank 1 is not in a collective (at train.py:12 in load); ranks 0, 2 wait "
                                         "in all_reduce (at train.py:30 in main); rank 1 wrote nothing for 15s")
    assert "innermost frames of rank 1: train.py:12 in load" in failure["message"]
    assert failure["at"] == 1005.0
    assert to(outs) == [{"type": rv.STOP, "round": 0}] and c.phase == rv.STOPPING and c.capture is None


def test_a_rank_at_another_call_site_is_named_and_without_detail_no_call_site_is_said():
    c = dumping_gang(2, 2)
    c.stacks(0, 0, [row(waiting(0), 12.0)], False, 11.0)
    c.stacks(1, 0, [row(waiting(1, line=44), 11.0)], False, 11.0)
    outs = c.stacks(2, 0, [row(waiting(2), 13.0)], False, 11.0)
    [failure] = [o.message for o in outs if o.message["type"] == rv.EV_FAILURE]
    assert failure["rank"] == 1
    assert failure["message"].startswith("rank 1 waits in all_reduce, apart from its peers; ranks 0, 2 wait in all_reduce")
    assert "train.py" not in failure["message"]


def test_undecided_it_names_the_rank_whose_hang_was_seen_with_the_detectors_words():
    c = dumping_gang(2, 2)
    for m in range(3):
        outs = c.stacks(m, 0, [row(waiting(m), 12.0 + m, said=f"rank {m} said")], True, 11.0)
    [failure] = [o.message for o in outs if o.message["type"] == rv.EV_FAILURE]
    assert failure["rank"] == 2 and failure["member"] == 2
    assert failure["message"].startswith("rank 2 said; no rule named a culprit (every rank seen waits at one call "
                                         "site); rank 2 went silent first, the likely one")


def test_a_member_that_never_freezes_is_dumped_without_and_one_that_never_reports_is_judged_without():
    c = running_gang()
    hang(c, 0, 0, now=10.0)
    c.frozen(0, 0, 10.1)
    c.frozen(1, 0, 10.1)
    assert to(c.tick(14.9)) == []
    assert to(c.tick(10.0 + rv.FREEZE_SECONDS)) == [{"type": rv.DUMP, "round": 0}]
    c.stacks(0, 0, [row(waiting(0), 15.0)], True, 16.0)
    c.stacks(1, 0, [row(busy(1), 14.0)], True, 16.0)
    assert to(c.tick(15.0 + rv.STACKS_SECONDS - 0.1)) == []
    outs = c.tick(15.0 + rv.STACKS_SECONDS)
    [failure] = [o.message for o in outs if o.message["type"] == rv.EV_FAILURE]
    assert failure["rank"] == 1 and to(outs) == [{"type": rv.STOP, "round": 0}]


def test_a_real_failure_or_a_lost_member_during_the_capture_calls_it_off():
    c = running_gang()
    hang(c, 0, 0)
    outs = c.failure(1, 0, {"rank": 1, "local_rank": 0, "pid": 101, "exit_code": 1, "returncode": 1,
                            "reason": "Error", "message": "boom", "tail": [], "at": 1004.0}, 10.2)
    assert to(outs) == [{"type": rv.STOP, "round": 0}] and c.capture is None
    assert c.frozen(0, 0, 10.3) == [] and c.stacks(0, 0, [row(waiting(0), 1.0)], True, 10.4) == []
    c2 = running_gang()
    hang(c2, 0, 0)
    outs = c2.lost(2, rv.LOST_HEARTBEAT, 10.2)
    assert to(outs) == [{"type": rv.STOP, "round": 0}] and c2.capture is None


def test_members_whose_ranks_ended_for_their_stacks_do_not_finish_the_round():
    c = dumping_gang(0, 0)
    for m in range(3):
        outs = c.exited(m, 0, [{"rank": m, "exit_code": 134, "stopped": True}], 11.0)
        assert not [o for o in outs if o.message["type"] in (rv.FINISH, rv.EV_SUCCEEDED)]
    assert c.phase == rv.RUNNING_PHASE and c.done == set()


def test_a_hang_is_taken_only_in_a_running_round_of_a_live_member():
    c = running_gang()
    assert c.hang(0, 1, {"rank": 0, "reason": rv.REASON_NO_PROGRESS}, 10.0) == []  # another round
    c.lost(2, rv.LOST_LEFT, 9.0)  # the round stops
    assert c.hang(0, 0, {"rank": 0, "reason": rv.REASON_NO_PROGRESS}, 10.0) == []
    assert c.capture is None


# --- the wire ----------------------------------------------------------------------------------------


def wire(rank_state: dict, **extra) -> dict:
    r = row(rank_state, 3.0)
    return {**{k: v for k, v in r.items() if k != "state"}, **stacks.to_row(r["state"]), **extra}


def test_a_stacks_message_round_trips_its_states():
    message = {"type": rv.STACKS, "round": 0, "detail": True, "ranks": [wire(waiting(0)), wire(busy(1))]}
    checked = rv.check_member_message(message)
    assert [r["state"] for r in checked["ranks"]] == [waiting(0)["state"], busy(1)["state"]]
    assert checked["ranks"][0]["silent"] == 3.0 and checked["ranks"][1]["said"] == "rank 1 wrote nothing for 3s"


@pytest.mark.parametrize("bad, words", [
    ({"state": "asleep"}, "stacks.ranks[0].state: 'asleep' is not valid; expected one of waiting, busy, no stack"),
    ({"site": ["a.py", "x", "f"]}, "stacks.ranks[0].site: expected [file"),
    ({"site": None}, "stacks.ranks[0].site: a rank in state waiting has a call site"),
    ({"frames": [["a.py", 1, "f"]] * (stacks.ROW_FRAMES + 1)}, "stacks.ranks[0].frames: expected a list of at most"),
    ({"frames": [["x" * (stacks.ROW_FILE + 1), 1, "f"]]}, "stacks.ranks[0].frames[0]: expected [file"),
    ({"silent": -1}, "stacks.ranks[0].silent: '-1' is not valid"),
    ({"said": 7}, "stacks.ranks[0].said: expected a string"),
    ({"rank": "one"}, "stacks.ranks[0].rank: 'one' is not valid"),
])
def test_a_malformed_stacks_row_is_refused_naming_its_field(bad, words):
    message = {"type": rv.STACKS, "round": 0, "ranks": [wire(waiting(0), **bad)]}
    with pytest.raises(rv.ProtocolError) as e:
        rv.check_member_message(message)
    assert str(e.value).startswith(words)


@pytest.mark.parametrize("message, words", [
    ({"type": rv.HANG, "round": 0, "rank": 1, "reason": "Bored"}, "hang.reason: 'Bored' is not valid"),
    ({"type": rv.HANG, "round": 0, "reason": rv.REASON_NO_PROGRESS}, "hang.rank: 'None' is not valid"),
    ({"type": rv.STACKS, "round": 0, "ranks": {}}, "stacks.ranks: expected a list"),
    ({"type": rv.STACKS, "round": 0, "ranks": [None] * (rv.MAX_PROCS + 1)}, "stacks.ranks: expected a list"),
    ({"type": rv.STACKS, "round": 0, "ranks": [], "detail": "yes"}, "stacks.detail: expected true or false"),
    ({"type": rv.FROZEN}, "frozen.round: 'None' is not valid"),
])
def test_malformed_hang_messages_are_refused(message, words):
    with pytest.raises(rv.ProtocolError) as e:
        rv.check_member_message(message)
    assert str(e.value).startswith(words)


# --- the member's side -----------------------------------------------------------------------------


def test_a_running_or_waiting_member_freezes_and_dumps_for_its_round_only():
    m = mb.Member()
    m.on_message({"type": rv.WELCOME, "round": 0}, procs_running=False)
    m.on_message({"type": rv.GO, "round": 0}, procs_running=False)
    assert m.on_message({"type": rv.FREEZE, "round": 1, "reason": "NoProgress"}, procs_running=True) == []
    [do] = m.on_message({"type": rv.FREEZE, "round": 0, "reason": "NoProgress"}, procs_running=True)
    assert (do.what, do.round, do.reason) == (mb.FREEZE, 0, "NoProgress")
    m.on_round_ended([{"rank": 0, "exit_code": 134, "stopped": True}])
    assert m.phase == mb.WAITING
    [do] = m.on_message({"type": rv.DUMP, "round": 0}, procs_running=False)
    assert do.what == mb.DUMP
    joining = mb.Member()
    assert joining.on_message({"type": rv.FREEZE, "round": 0}, procs_running=False) == []
