"""docs/what-counts.md, walked: every row of its table is driven through the code that decides it.

Each row's "counted" column (**yes**, **no** or **fails the job**) must be what the code does:
the coordinator's (monarch_spmd.payload.coordinator.Coordinator, driven by hand: its ``restart``
event's ``disruption`` and ``counted``, or its ``failed`` event) and the operator's (one pass of
the lifecycle: ``status.restarts``, ``status.disruptions``, the phase and the Failed condition).
Every reason the code can put in status.failure.reason must have a row. Pure logic, no cluster.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from monarch_spmd import policy
from monarch_spmd.payload import failures as payload_failures
from monarch_spmd.payload import rendezvous as rv
from monarch_spmd.payload.coordinator import Coordinator, Policy
from monarch_spmd.payload.rendezvous import OBSERVERS
from spmd_operator import lifecycle, names
from spmd_operator.lifecycle import CoordinatorView, PodInfo, admission, deadline, inplace, model
from spmd_operator.lifecycle import failure as op_failure

from .coordinators import Observed
from .lifecycle.helpers import JOB, NOW, apply, cond, gang, pod, pod_name, run, spec, status
from .test_gang_capture import busy, row, waiting

PAGE = Path(__file__).resolve().parents[2] / "docs" / "what-counts.md"
T = NOW.timestamp()
YES, NO, FAILS = "yes", "no", "fails the job"

# --- the table ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    line: int
    codes: tuple[str, ...]
    event: str
    counted: str


def table() -> list[Row]:
    rows = []
    lines = PAGE.read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| `status.failure.reason` |"))
    for n, line in enumerate(lines[head + 2:], start=head + 3):
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"what-counts.md:{n}: {len(cells)} cells"
        word = re.match(r"\*\*(yes|no|fails the job)\*\*", cells[3])
        assert word, f"what-counts.md:{n}: the counted column must start with **yes**, **no** or **fails the job**"
        codes = tuple(re.findall(r"`([A-Za-z]+)`", cells[0]))
        rows.append(Row(n, codes, cells[1], word[1]))
    return rows


ROWS = table()

# --- the coordinator, by hand ---------------------------------------------------------------------


def gang_of(members=3, **policy_) -> Coordinator:
    """A coordinator whose members all run round 0 (one rank each)."""
    c = Observed(members, 0, Policy(**{"max_restarts": 3, "backoff": 0.0, **policy_}), now=0.0, world_size=members,
                 run_id="job", wall=lambda: 1000.0)
    c.start()
    for m in range(members):
        c.hello(m, f"inc-{m}", 1.0)
    for m in range(members):
        c.join(m, 0, 1.0)
    for m in range(members):
        c.running(m, 0, [{"rank": m, "local_rank": 0, "pid": 100 + m}], 2.0)
    return c


def history(c: Coordinator, kind: str) -> list[dict]:
    return [e for e in c.history if e["type"] == kind]


def finish_round(c: Coordinator, now: float, skip=()) -> None:
    """Every live member of the round but ``skip`` stops its ranks and joins the next round."""
    for m in sorted(c.live()):
        if m in skip:
            continue
        if m in c.round_members:
            c.exited(m, c.round, [{"rank": m, "exit_code": 143, "stopped": True}], now)
        c.join(m, c.round + 1, now)


def outcome_of(c: Coordinator) -> str:
    """What the coordinator made of the round it stopped last: its restart or its verdict."""
    failed = history(c, rv.EV_FAILED)
    if failed:
        f = failed[-1]
        if f["permanent"]:
            return FAILS
        if f["exhausted"] or f["reason"] == rv.REASON_REPEATED:
            return YES  # given up: counted (RepeatedFailure: the recreation is the operator's restart)
        return NO
    restart = history(c, rv.EV_RESTART)[-1]
    return NO if restart["disruption"] else YES


def rank_fails(c: Coordinator, member: int, info: dict, now: float = 5.0) -> dict:
    c.failure(member, c.round, {"rank": member, "local_rank": 0, "pid": 100 + member, "at": 1000.0, **info}, now)
    finish_round(c, now + 0.5)
    events = history(c, rv.EV_RESTART) + history(c, rv.EV_FAILED)
    return events[-1]


def coordinator_rank(info: dict, **policy_) -> str:
    c = gang_of(**policy_)
    event = rank_fails(c, 1, info)
    assert event["reason"] == info["reason"], event
    if event["type"] == rv.EV_RESTART:
        assert event["counted"] == (0 if event["disruption"] else 1), event
    return outcome_of(c)


# --- the operator, one pass -----------------------------------------------------------------------


def judged(before: dict, plan, reason: str | None = None) -> str:
    """What one lifecycle pass made of a failure: counted, a disruption, or the job failed."""
    new = apply(before, plan)
    if reason is not None:
        assert (new.get("failure") or {}).get("reason") == reason, new.get("failure")
    if new["phase"] == "Failed":
        why = cond(new, "Failed")["reason"]
        return YES if why == "RestartLimitExceeded" else FAILS
    gained = int(new.get("disruptions") or 0) - int(before.get("disruptions") or 0)
    restarted = int(new.get("restarts") or 0) - int(before.get("restarts") or 0)
    assert restarted >= 0 and gained >= 0, new
    if gained:
        return NO
    return YES if restarted else NO


def recreate(**restart) -> object:
    return spec(restartPolicy={"mode": "RecreatePods", "maxRestarts": 1, **restart})


def recreate_pod(failed: PodInfo, reason: str | None, **restart) -> str:
    st = status("Running")
    pods = gang("Running")
    pods[failed.rank] = failed
    return judged(st, run(s=recreate(**restart), st=st, pods=pods), reason)


def view(*, round_=1, phase="joining", restarts=(), lost=(), takeovers=(), final=None, started=(),
         all_running=()) -> CoordinatorView:
    return CoordinatorView(pod=names.pod_name(JOB, 0, 0), connected=True, round=round_, phase=phase,
                           restarts=tuple(restarts), lost=tuple(lost), takeovers=tuple(takeovers), final=final,
                           started=tuple(started),
                           all_running=tuple({"type": "all_running", "round": r, "seconds_since_failure": 1.0}
                                             for r in all_running))


def restart_event(reason="Error", member=1, code=1, next_round=1, received=T - 5, **kw) -> dict:
    return {"type": "restart", "seq": 10 + next_round, "time": T - 6, "round": next_round - 1,
            "next_round": next_round, "rank": None if code is None else member, "member": member, "exit_code": code,
            "reason": reason, "message": kw.pop("message", "x"), "tail": [], "counted": next_round,
            "max_restarts": 3, "backoff_seconds": 0.0, "received": received, **kw}


def lost_member(failed: PodInfo | None, reason: str | None, s=None, **event) -> str:
    """In place: the coordinator restarted for member 1's loss; the pod says why (or nothing)."""
    st = status("Running")
    pods = gang("Running")
    if failed is not None:
        pods[1] = failed
    restart = restart_event(rv.REASON_MEMBER_LOST, code=None, received=T - 3, **event)
    s = s or spec(restartPolicy={"maxRestarts": 1})
    return judged(st, run(s=s, st=st, pods=pods, coordinator=view(restarts=[restart])), reason)


# --- each row's check: what the code does with the row's event ------------------------------------


def retryable(codes: tuple[str, ...]) -> set[str]:
    return {coordinator_rank({"exit_code": 1, "returncode": 1, "reason": "Error"}),
            coordinator_rank({"exit_code": 75, "returncode": 75, "reason": "Error"}),
            recreate_pod(pod(1, "Failed", exit_code=1, reason="Error"), "Error"),
            recreate_pod(pod(1, "Failed", exit_code=75, reason="Error", message="boom"), "Error")}


def permanent(codes: tuple[str, ...]) -> set[str]:
    return {coordinator_rank({"exit_code": 3, "reason": "Error"}, permanent_exit_codes=(3,)),
            coordinator_rank({"exit_code": 64, "reason": "Error"}),
            coordinator_rank({"exit_code": 5, "reason": "Error"}, retryable_exit_codes=(1,)),
            coordinator_rank({"exit_code": 137, "reason": "OOMKilled"}, permanent_reasons=("OOMKilled",)),
            recreate_pod(pod(1, "Failed", exit_code=3, reason="Error"), "Error", permanentExitCodes=[3]),
            recreate_pod(pod(1, "Failed", exit_code=64, reason="Error"), "Error"),
            recreate_pod(pod(1, "Failed", exit_code=137, reason="OOMKilled"), "OOMKilled",
                         permanentReasons=["OOMKilled"])}


def signal(codes: tuple[str, ...]) -> set[str]:
    return {coordinator_rank({"exit_code": 137, "returncode": -9, "signal": "SIGKILL", "reason": "Signal"})}


def oom(codes: tuple[str, ...]) -> set[str]:
    container = pod(1, "Failed", exit_code=137, reason="OOMKilled", finished_at="2026-01-01T11:59:58Z")
    return {coordinator_rank({"exit_code": 137, "returncode": -9, "reason": "OOMKilled"}),
            recreate_pod(container, "OOMKilled"),
            lost_member(container, "OOMKilled")}  # the whole container: its member lost, charged


def hang(codes: tuple[str, ...]) -> set[str]:
    out = set()
    for reason in codes:
        c = gang_of()
        c.hang(1, 0, {"rank": 1, "reason": reason, "message": "rank 1 wrote nothing for 10s", "at": 1005.0}, 10.0)
        for m in range(3):
            c.frozen(m, 0, 10.5)
        c.stacks(0, 0, [row(waiting(0), 12.0)], True, 11.0)
        c.stacks(2, 0, [row(waiting(2), 12.0)], True, 11.0)
        c.stacks(1, 0, [row(busy(1), 15.0)], True, 11.0)
        finish_round(c, 12.0)
        [restart] = history(c, rv.EV_RESTART)
        assert restart["reason"] == reason and restart["rank"] == 1
        out.add(outcome_of(c))
    return out


def repeated(codes: tuple[str, ...]) -> set[str]:
    c = gang_of(max_restarts=10)
    for i in range(rv.DEFAULT_MEMBER_FAILURE_LIMIT):
        rank_fails(c, 1, {"exit_code": 1, "reason": "Error"}, now=5.0 + 10 * i)
        c.tick(6.0 + 10 * i + rv.FENCE_SECONDS)
        for m in range(3):
            c.running(m, c.round, [{"rank": m}], 7.0 + 10 * i)
    [failed] = history(c, rv.EV_FAILED)
    assert (failed["reason"], failed["fallback"], failed["exit_code"]) == (rv.REASON_REPEATED, True, 75)
    # The operator recreates the gang on that verdict: one restart, counted.
    final = {**failed, "type": "failed", "received": T - 30}
    st = status("Running", restarts=failed["round"], gangRestart=0)
    pods = [dataclasses.replace(p, phase="Failed", exit_code=75, finished_at="2026-01-01T11:59:40Z")
            for p in gang("Running", restart=0)]
    plan = run(s=spec(restartPolicy={"maxRestarts": 10}), st=st, pods=pods,
               coordinator=view(round_=failed["round"], phase="failed", final=final))
    return {outcome_of(c), judged(st, plan, rv.REASON_REPEATED)}


def gave_up(codes: tuple[str, ...]) -> set[str]:
    out = set()
    for why in codes:
        message = f"monarch-spmd worker: it went ({why}); the gang must be recreated"
        out.add(recreate_pod(pod(1, "Failed", exit_code=75, reason="Error", message=message), why))
    # The coordinator's own: a round that never came together is given up, not judged.
    c = gang_of()
    c.lost(2, rv.LOST_LEFT, 5.0)
    finish_round(c, 5.5)
    c.tick(5.5 + 60 + rv.DEFAULT_JOIN_TIMEOUT)
    [failed] = history(c, rv.EV_FAILED)
    assert (failed["reason"], failed["fallback"]) == (rv.REASON_ROUND_TIMEOUT, True)
    return out


def deleted(codes: tuple[str, ...]) -> set[str]:
    c = gang_of(max_restarts=0)
    c.lost(1, rv.LOST_LEFT, 5.0)  # its agent's leave: the pod's SIGTERM
    finish_round(c, 5.5)
    return {outcome_of(c),
            recreate_pod(dataclasses.replace(pod(1), deleting=True), "PodDeleted"),
            lost_member(dataclasses.replace(pod(1), deleting=True), "PodDeleted")}


def disrupted(codes: tuple[str, ...]) -> set[str]:
    out = set()
    for reason in codes:
        for phase in ("Running", "Failed"):
            taken = pod(1, phase, reason=reason, message="taken away", disrupted=True, deleting=True)
            out.add(recreate_pod(taken, reason))
            out.add(lost_member(taken, reason))
    return out


def without_disruption_target(codes: tuple[str, ...]) -> set[str]:
    out = set()
    for reason in codes:
        gone = pod(1, "Failed", exit_code=143, reason=reason, message="The node was low on resource: memory.")
        out.add(recreate_pod(gone, reason))
        assert lost_member(gone, reason) == NO, "the coordinator's word: not counted (inplace.charged)"
    return out


def missing(codes: tuple[str, ...]) -> set[str]:
    st = status("Running")
    pods = gang("Running")
    del pods[1]
    return {judged(st, run(s=recreate(), st=st, pods=pods), "PodMissing")}


def node_lost(codes: tuple[str, ...]) -> set[str]:
    out = disrupted(tuple(c for c in codes if c != model.REASON_NODE_LOST))
    silent = {"type": "lost", "seq": 9, "time": T - 6, "round": 0, "member": 1, "reason": rv.LOST_DISCONNECTED,
              "node": "node-1", "received": T - 6}
    st = status("Running")
    restart = restart_event(rv.REASON_MEMBER_LOST, code=None, received=T - 6)
    plan = run(s=spec(restartPolicy={"maxRestarts": 0}), st=st, pods=gang("Running"),
               coordinator=view(restarts=[restart], lost=[silent]))
    out.add(judged(st, plan, model.REASON_NODE_LOST))
    return out


def member_lost(codes: tuple[str, ...]) -> set[str]:
    c = gang_of(max_restarts=0)
    c.spare_hello(0, "s0", 2.0, node="node-s")
    c.lost(2, rv.LOST_HEARTBEAT, 5.0)
    assert history(c, rv.EV_TAKEOVER)
    finish_round(c, 6.0, skip={2})
    c.hello(2, "spare-as-2", 6.1)
    c.join(2, 1, 6.2)
    [restart] = history(c, rv.EV_RESTART)
    assert restart["reason"] == rv.REASON_MEMBER_LOST
    # The operator: a loss whose pod says nothing, and one a spare took over.
    takeover = {"type": "takeover", "seq": 12, "round": 0, "member": 1, "spare": 0, "node": "node-s", "state": "ok"}
    st = status("Running")
    restart = restart_event(rv.REASON_MEMBER_LOST, code=None, received=T - 3)
    plan = run(s=spec(restartPolicy={"maxRestarts": 0}, spares=1), st=st, pods=gang("Running"),
               coordinator=view(restarts=[restart], takeovers=[takeover]))
    return {outcome_of(c), lost_member(None, rv.REASON_MEMBER_LOST), judged(st, plan, rv.REASON_MEMBER_LOST)}


def spare_before(codes: tuple[str, ...]) -> set[str]:
    c = gang_of(max_restarts=0)
    c.spare_hello(0, "s0", 2.0)
    c.spare_lost(0, "s0", 3.0)
    c.tick(4.0)
    assert c.phase == rv.RUNNING_PHASE and not history(c, rv.EV_FAILURE)
    return {NO if not history(c, rv.EV_RESTART) and c.count.counted(c.round) == 0 else YES}


def spare_after(codes: tuple[str, ...]) -> set[str]:
    c = gang_of(max_restarts=0)
    c.spare_hello(0, "s0", 2.0, node="node-s")
    c.lost(2, rv.LOST_LEFT, 5.0)
    finish_round(c, 6.0, skip={2})
    c.hello(2, "spare-as-2", 6.1)
    c.join(2, 1, 6.2)
    c.tick(5.0 + 30.0 + rv.LEAVE_MARGIN + 1)  # the lost pod's grace: its processes are gone
    assert c.phase == rv.RUNNING_PHASE and c.round == 1
    for m in range(3):
        c.running(m, 1, [{"rank": m}], 50.0)
    c.lost(2, rv.LOST_LEFT, 52.0)  # the spare, now member 2, is deleted in its turn
    finish_round(c, 52.5, skip={2})
    assert [r["reason"] for r in history(c, rv.EV_RESTART)] == [rv.REASON_MEMBER_LOST] * 2
    # Its own container failing is charged, as any member's.
    assert inplace.charged(PodInfo(name="s", rank=2, restart=0, phase="Failed", exit_code=137, reason="OOMKilled"))
    return {outcome_of(c)}


def elastic_gang() -> Coordinator:
    return gang_of(members=3, max_restarts=0, min_members=2, elastic_wait=2.0)


ELASTIC = {"mesh": [{"name": "nodes", "size": 4, "minSize": 2}, {"name": "procs", "size": 1}],
           "podLayout": "PerHost", "restartPolicy": {"maxRestarts": 0}}


def shrink(c: Coordinator) -> str:
    c.lost(2, rv.LOST_LEFT, 5.0)
    finish_round(c, 5.5)
    c.tick(5.5 + rv.LEAVE_MARGIN + 31.0)
    c.tick(5.5 + rv.LEAVE_MARGIN + 40.0)
    assert c.phase == rv.RUNNING_PHASE and c.round_members == {0, 1}, (c.phase, c.round_members)
    return outcome_of(c)


def grow(c: Coordinator) -> str:
    now = 60.0
    for m in (0, 1):
        c.running(m, c.round, [{"rank": m}], now)
    c.hello(2, "new-2", now + 1)
    c.join(2, c.round + 1, now + 2)
    finish_round(c, now + 3, skip={2})
    restart = history(c, rv.EV_RESTART)[-1]
    assert restart["reason"] == rv.REASON_MEMBERSHIP
    return outcome_of(c)


def operator_grow() -> str:
    grow_event = {"type": "restart", "seq": 20, "time": T - 2, "round": 1, "next_round": 2, "rank": None,
                  "member": 2, "exit_code": None, "reason": rv.REASON_MEMBERSHIP, "message": "grows", "tail": [],
                  "counted": 0, "max_restarts": 0, "backoff_seconds": 0.0, "received": T - 2}
    st = status("Running", restarts=1, disruptions=1, gangRestart=0, mesh="nodes=4,procs=1")
    coordinator = view(round_=2, restarts=[restart_event(rv.REASON_MEMBER_LOST, member=2, code=None), grow_event],
                       all_running=[1])
    return judged(st, run(s=spec(**ELASTIC), st=st, pods=gang("Running"), coordinator=coordinator))


def elastic_shrink(codes: tuple[str, ...]) -> set[str]:
    s = spec(**ELASTIC)
    return {shrink(elastic_gang()),
            lost_member(dataclasses.replace(pod(1), deleting=True), "PodDeleted", s=s)}


def elastic_grow(codes: tuple[str, ...]) -> set[str]:
    c = elastic_gang()
    shrink(c)
    return {grow(c), operator_grow()}


def elastic_delete(codes: tuple[str, ...]) -> set[str]:
    c = elastic_gang()
    return {shrink(c), grow(c), *elastic_shrink(codes), operator_grow()}


def operator_restarted(codes: tuple[str, ...]) -> set[str]:
    # Restart 1 was recorded before the operator went; the new one hears the coordinator's history.
    st = status("Restarting", restarts=1, gangRestart=0)
    plan = run(st=st, pods=gang("Running"), coordinator=view(restarts=[restart_event()], round_=1))
    assert not plan.events
    return {judged(st, plan)}


def kueue(codes: tuple[str, ...]) -> set[str]:
    s = spec(scheduling={"provider": "Kueue", "queue": "team-a"}, restartPolicy={"maxRestarts": 0})
    st = status("Running", restarts=1)
    evicted = lifecycle.WorkloadInfo(name="w", evicted="Preempted", message="preempted", reserved=True)
    plan = run(s=s, st=st, pods=gang("Running", restart=1), workload=evicted)
    new = apply(st, plan)
    assert new["phase"] == "Suspended" and cond(new, "Suspended")["reason"] == "Evicted"
    assert ("Warning", "Evicted") in [(e.type, e.reason) for e in plan.events]
    return {judged(st, plan)}


def start_failure(codes: tuple[str, ...]) -> set[str]:
    out = set()
    for reason in codes:
        st = status("Pending", startFailures={pod_name(1): {"reason": reason, "since": "2026-01-01T11:50:00Z"}})
        pods = gang("Pending")
        pods[1] = pod(1, "Pending", reason=reason, message="cannot start")
        if reason in policy.FATAL_REASONS:
            st = status("Pending")
        out.add(judged(st, run(s=spec(restartPolicy={"maxRestarts": 1}), st=st, pods=pods), reason))
    return out


def scheduling_timeout(codes: tuple[str, ...]) -> set[str]:
    st = status("Pending")
    pods = gang("Pending")
    pods[1] = pod(1, "Pending", unschedulable="0/3 nodes are available", created="2026-01-01T11:00:00Z")
    return {judged(st, run(s=spec(scheduling={"timeoutSeconds": 60}), st=st, pods=pods), "SchedulingTimeout")}


def monarch_host(codes: tuple[str, ...]) -> set[str]:
    from .lifecycle.test_monarch_mode import host, monarch
    st = status("Running")
    pods = [host(0), dataclasses.replace(host(1, "Succeeded"), exit_code=0, reason="Completed")]
    return {judged(st, run(s=monarch(), st=st, pods=pods), model.REASON_MONARCH_HOST_EXITED)}


def job_level(codes: tuple[str, ...]) -> set[str]:
    from monarch_spmd.spec import SpecError
    st = status("Running")
    late = judged(st, run(s=spec(activeDeadlineSeconds=60), st=st, pods=gang("Running")), deadline.REASON)
    invalid = judged({}, run(s=SpecError("spec.mesh", "bad"), st=None), admission.REASON)
    return {late, invalid}


#: Each row's check, by a phrase of its event column.
CHECKS: dict[str, Callable[[tuple[str, ...]], set[str]]] = {
    "a rank exits with a retryable code": retryable,
    "a rank exits with a permanent code": permanent,
    "a rank killed by a signal": signal,
    "a rank OOM-killed": oom,
    "a hang": hang,
    "the same member caused": repeated,
    "the agents exit 75": gave_up,
    "a pod deleted before it finished": deleted,
    "evicted through the Eviction API": disrupted,
    "evicted by the kubelet": disrupted,
    "the same without DisruptionTarget": without_disruption_target,
    "preempted by a pod of higher priority": disrupted,
    "a pod gone without a word": missing,
    "a node lost": node_lost,
    "taken over by a hot spare": member_lost,
    "a spare lost before it took a place": spare_before,
    "a spare lost after it took a place": spare_after,
    "an elastic shrink": elastic_shrink,
    "an elastic grow": elastic_grow,
    "a deliberate `kubectl delete pod` of an elastic job": elastic_delete,
    "the operator restarted": operator_restarted,
    "Kueue preempts or evicts the whole job": kueue,
    "a container that cannot start for 300 s": start_failure,
    "a missing ConfigMap or Secret": start_failure,
    "not scheduled within": scheduling_timeout,
    "Monarch mode": monarch_host,
    "`activeDeadlineSeconds` passed": job_level,
}


def check_of(r: Row) -> Callable[[tuple[str, ...]], set[str]]:
    found = [phrase for phrase in CHECKS if phrase in r.event]
    assert len(found) == 1, f"what-counts.md:{r.line}: no single check for {r.event!r} (found {found})"
    return CHECKS[found[0]]


@pytest.mark.parametrize("r", ROWS, ids=lambda r: f"line{r.line}")
def test_each_row_is_what_the_code_counts(r):
    seen = check_of(r)(r.codes)
    assert seen == {r.counted}, f"what-counts.md:{r.line} ({r.event}) says {r.counted!r}; the code: {sorted(seen)}"


def test_every_check_has_its_row_and_the_table_is_long_enough():
    used = [phrase for phrase in CHECKS if any(phrase in r.event for r in ROWS)]
    assert used == list(CHECKS), f"checks without a row: {sorted(set(CHECKS) - set(used))}"
    assert len(ROWS) >= 25


def _reasons(module) -> set[str]:
    return {v for k, v in vars(module).items() if k.startswith("REASON") and isinstance(v, str)}


def test_every_reason_the_code_can_put_in_status_failure_has_a_row():
    listed = {code for r in ROWS for code in r.codes}
    reasons = (_reasons(rv) | _reasons(model) | {inplace.REASON_MEMBER_LOST, deadline.REASON, admission.REASON}
               | set(payload_failures.DISRUPTION_REASONS) | set(policy.FATAL_REASONS)
               | set(policy.START_FAILURE_REASONS) | set(op_failure.GAVE_UP_DISRUPTIONS) | set(rv.HANG_REASONS))
    assert reasons - listed == set(), f"reasons without a row in docs/what-counts.md: {sorted(reasons - listed)}"


def test_the_pages_that_said_what_counts_link_the_table():
    root = PAGE.parents[1]
    for page in ("README.md", "docs/spmdjob.md", "docs/restart-in-place.md", "docs/torchrun.md"):
        text = (root / page).read_text()
        assert "what-counts.md" in text, f"{page} must link docs/what-counts.md"

