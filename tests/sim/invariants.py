"""The invariants of failure handling (docs/restart-in-place.md, "Invariants"), as checks of a simulated run.

Checked after every step (:func:`every_step`), on every status write (:func:`on_status`) and at
the end of a run (:func:`at_end`). Each raises :class:`~.core.Violation` naming the invariant.

1. counting: a disruption (a lost pod or node, an eviction, a takeover, a membership change) and
   what follows from it in its round never count: restarts counted (status.restarts -
   status.disruptions, and the coordinator's own) never exceed the rank failures injected.
2. no failure from disruptions: a job fails only on a permanent failure, or when the counted
   failures injected exceed maxRestarts.
3. one process per rank, one round at a time: no two processes of one rank run at once, and
   every rank process running belongs to one round; a process on a node that was frozen runs at
   most FENCE_SECONDS after its node thaws (it was stopped there, it runs again with the rest of
   its node, and its agent, cut off, ends it).
4. no needless recreation: a gang whose members are all live is never given up (the
   coordinator's fallback) nor recreated by the operator, unless one member failed again and
   again (RepeatedFailure).
5. liveness: after the last fault the job trains again (every rank of one round running, the
   phase Running) within :func:`bound`, or it ended (Succeeded, or Failed by rule 2).
6. agreement: once it trains again, the operator's status says what the coordinator says:
   restarts, disruptions, spares ready, an elastic round's members.
7. bounded pods: the pods a job creates are bounded by its size and the faults it met; none is
   created alone for a member whose place a hot spare holds, and no spare's name is used twice.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from monarch_spmd.payload import rendezvous
from spmd_operator import lifecycle

from .core import Violation

if TYPE_CHECKING:
    from .sim import Sim

#: The longest a rank process may run after its node's traffic comes back (a thaw, a partition
#: healed) while its round is over: its kubelet's word (a pod deleted meanwhile), its agent's
#: loop's turn and the fence (rendezvous.FENCE_SECONDS).
FENCE_SECONDS = rendezvous.FENCE_SECONDS + 1.0


#: The node controller's grace (a node silent this long is NotReady; the operator may then have
#: recreated a gang whose coordinator was on it): a coordinator back from a stall this long gives
#: its gang up, and that is no needless recreation.
NODE_MONITOR_GRACE = 40.0


def bound(sim: Sim) -> float:
    """Seconds after the last fault within which the job trains again (or ends)."""
    s = sim.schedule
    backoff = 4 * s["backoff"] if sim.real_failures >= 2 else 0.0
    return 60.0 + s["grace"] + backoff + (s.get("elastic_wait") or 0.0)


def _running(sim: Sim) -> list[Any]:
    return [r for r in sim.cluster.ranks if r.alive]


def every_step(sim: Sim) -> None:
    now = sim.world.now
    active = []
    for rank in _running(sim):
        node = rank.node
        if node.cut:
            continue  # stopped, or cut off: it reaches nothing of the gang
        if node.back_at is not None and now - node.back_at <= FENCE_SECONDS:
            continue  # back from a freeze or a partition: its agent ends what it ran within the fence
        active.append(rank)
    by_rank: dict[int, Any] = {}
    for rank in active:
        if rank.rank in by_rank:
            other = by_rank[rank.rank]
            raise Violation(f"invariant 3 (one process per rank): rank {rank.rank} runs twice: pid {other.pid} "
                            f"(round {other.round}, {other.node.name}) and pid {rank.pid} (round {rank.round}, "
                            f"{rank.node.name})")
        by_rank[rank.rank] = rank
    rounds = sorted({r.epoch for r in active})
    if len(rounds) > 1:
        raise Violation(f"invariant 3 (one round at a time): processes of (gang, round) {rounds} run at once: "
                        + ", ".join(f"rank {r.rank} g{r.gang}r{r.round} on {r.node.name}" for r in active))
    _counting(sim)
    _failed(sim)
    _fallbacks(sim)


def _counting(sim: Sim) -> None:
    st = sim.operator.status
    counted = int(st.get("restarts") or 0) - int(st.get("disruptions") or 0)
    if counted > sim.real_failures:
        raise Violation(f"invariant 1 (counting): the status counts {counted} restarts (restarts "
                        f"{st.get('restarts')}, disruptions {st.get('disruptions')}) for {sim.real_failures} rank "
                        "failures")
    for worker in sim.coordinators:
        if worker.hub is None or worker.exit_code is not None:
            continue
        m = worker.hub.machine
        if m.round - m.disruptions > sim.real_failures:
            raise Violation(f"invariant 1 (counting): the coordinator of {worker.pod.name} counts "
                            f"{m.round - m.disruptions} restarts (round {m.round}, disruptions {m.disruptions}) for "
                            f"{sim.real_failures} rank failures")


def _failed(sim: Sim) -> None:
    st = sim.operator.status
    if st.get("phase") != "Failed":
        return
    if sim.permanent or sim.real_failures > sim.schedule["max_restarts"]:
        return
    failure = st.get("failure") or {}
    raise Violation(f"invariant 2 (no failure from disruptions): the job failed ({failure.get('reason')}: "
                    f"{str(failure.get('message'))[:300]}) after {sim.real_failures} rank failures with maxRestarts "
                    f"{sim.schedule['max_restarts']} and no permanent one")


def _live(worker: Any) -> bool:
    """A member's agent that runs, reaches its coordinator and is not ending, in a pod that shows
    Running, is not being deleted and whose node is not cut off."""
    pod = worker.pod
    return (worker.exit_code is None and worker.alive and worker.role == "agent" and worker.ending is None
            and worker.link is not None and not worker.link_closed and not pod.deleting
            and pod.node is not None and not pod.node.cut and pod.phase == "Running")


def _fallbacks(sim: Sim) -> None:
    for worker in sim.coordinators:
        m = worker.hub.machine if worker.hub is not None else None
        if m is None or id(m) in sim.checked_fallbacks or m.phase != rendezvous.FAILED or m.outcome is None:
            continue
        sim.checked_fallbacks.add(id(m))
        outcome = m.outcome
        if not outcome.get("fallback") or outcome.get("reason") == rendezvous.REASON_REPEATED:
            continue
        stall = re.search(r"was stopped for (\d+)s", str(outcome.get("message")))
        if stall and int(stall[1]) >= NODE_MONITOR_GRACE:
            continue  # back from a silence as long as a node's NotReady grace: it may have been recreated
        members = _gang_workers(sim, worker)
        if len(members) == m.members and all(_live(w) for w in members.values()):
            raise Violation(f"invariant 4 (no needless recreation): the coordinator of {worker.pod.name} gave the "
                            f"gang up ({outcome.get('reason')}: {outcome.get('message')}) while every member was live")


def _gang_workers(sim: Sim, coordinator: Any) -> dict[int, Any]:
    """The agents of the coordinator's gang, by member (the newest pod of each index)."""
    gang = coordinator.pod.info().restart
    out: dict[int, Any] = {}
    best: dict[int, int] = {}
    for pod in sim.cluster.pods.values():
        info = pod.info()
        if info is None or info.spare is not None or info.restart != gang:
            continue
        m = info.rank // sim.schedule["procs"]
        if m not in best or info.replacement > best[m]:
            best[m] = info.replacement
            out[m] = pod.worker
    return {m: w for m, w in out.items() if w is not None}


def _beside_spares(sim: Sim, plan: lifecycle.Plan) -> None:
    """Invariant 7: no pod is created alone for a member whose place a hot spare holds (its agent
    live, said hello as that member to the gang's running coordinator): such a pod is turned away,
    and was one pod more than the fault asked for."""
    if not plan.replace:
        return
    for w in sim.coordinators:
        if w.hub is None or w.exit_code is not None or w.pod.removed:
            continue
        m = w.hub.machine
        holders = {p.name: p for p in sim.cluster.pods.values()}
        for index, n in plan.replace:
            pod = holders.get(m.pods.get(index, ""))
            info = pod.info() if pod is not None else None
            if (info is not None and info.spare is not None and pod.worker is not None and _live(pod.worker)
                    and info.restart == w.pod.info().restart):
                raise Violation(f"invariant 7 (bounded pods): the operator creates replacement {n} of member "
                                f"{index} alone while hot spare pod {pod.name} holds its place")


def on_status(sim: Sim, before: dict[str, Any], after: dict[str, Any], plan: lifecycle.Plan) -> None:
    """Invariant 4 on the operator's side: a gang recreated while every member was live; and a
    new attempt never waits for a pod on a node judged lost. Invariant 7: no pod beside a spare."""
    _beside_spares(sim, plan)
    waiting = next((c for c in after.get("conditions") or [] if c.get("type") == "Restarting"
                    and c.get("reason") == "WaitingForOldPods"), None)
    was = next((c for c in before.get("conditions") or [] if c.get("type") == "Restarting"), {})
    if waiting is not None and waiting.get("message") != was.get("message"):
        # A node judged lost, with when: the pods that were on it then hold nothing up; one created
        # there later (the node answered again) is waited for as any other.
        lost = {e.get("node"): lifecycle.model.parse_time(e.get("time")) for e in after.get("lostNodes") or []}
        failure = after.get("failure") or {}
        if failure.get("reason") == "NodeLost":
            lost[failure.get("node")] = None
        attempt = after.get("restarts")
        old = [p.info() for p in sim.cluster.pods.values()]
        # Hot spares of older attempts count: the new attempt waits for them too (a spare assigned
        # a place before its SIGTERM came runs that member's ranks).
        # So do the pods of this attempt being deleted (a member's pod whose place a spare took).
        old = [i for i in old if i is not None and (i.restart != attempt or i.deleting)
               and i.phase not in ("Succeeded", "Failed")]

        def there_when_lost(i: Any) -> bool:
            if i.node not in lost:
                return False
            at, created = lost[i.node], lifecycle.model.parse_time(i.created)
            return at is None or created is None or created < at

        elsewhere = [i for i in old if not there_when_lost(i)]
        found = re.fullmatch(r"waiting for (\d+) pods of the previous attempt .*podReplacementPolicy\)",
                             str(waiting.get("message")))
        if found and int(found.group(1)) > len(elsewhere):
            held = [i.name for i in old if there_when_lost(i)]
            raise Violation(f"invariant 5 (liveness): attempt {attempt} waits for pods on nodes judged lost "
                            f"({', '.join(held)}): {waiting.get('message')}")
    restarting = next((c for c in after.get("conditions") or [] if c.get("type") == "Restarting"), {})
    if restarting.get("reason") != "GangRestart" or before.get("restarts") == after.get("restarts"):
        return
    failure = after.get("failure") or {}
    if failure.get("reason") == rendezvous.REASON_REPEATED or failure.get("permanent"):
        return
    gang = before.get("gangRestart", before.get("restarts", 0)) or 0
    workers = {}
    for pod in sim.cluster.pods.values():
        info = pod.info()
        if info is not None and info.spare is None and info.restart == gang and pod.worker is not None:
            m = info.rank // sim.schedule["procs"]
            if m not in workers or info.replacement > workers[m][0]:
                workers[m] = (info.replacement, pod.worker)
    members = sim.schedule["pods"]
    if len(workers) == members and all(_live(w) for _, w in workers.values()):
        raise Violation(f"invariant 4 (no needless recreation): the operator recreates the gang (attempt "
                        f"{after.get('restarts')}: {failure.get('reason')}: {str(failure.get('message'))[:200]}) while "
                        "every member is live")


def at_end(sim: Sim) -> None:
    st = sim.operator.status
    phase = st.get("phase")
    s = sim.schedule
    created_bound = (s["pods"] + s.get("spares", 0)) * (2 + 2 * len(s["faults"]))
    for fault in s["faults"]:
        if fault["kind"] == "spares_crash":  # each spare slot: the back-off's 10 s doubling to 300 s
            d = float(fault.get("duration") or 30.0)
            created_bound += s.get("spares", 0) * (2 + math.ceil(math.log2(1 + d / 10)) + int(d / 300))
    if sim.cluster.reused:
        raise Violation(f"invariant 7 (bounded pods): spare pod names used twice in one run: "
                        f"{sim.cluster.reused} (a spare's name stands for one pod: its Events, logs and "
                        "status.failure.pod would mean two)")
    if sim.cluster.created > created_bound:
        raise Violation(f"invariant 7 (bounded pods): {sim.cluster.created} pods created (bound {created_bound})")
    if phase in ("Succeeded", "Failed"):
        return
    if any(p.node is not None and p.node.frozen and not p.started for p in sim.cluster.pods.values()):
        return  # a pod bound to a node that froze before it started: the cluster never runs it (the
        #        job's bound is spec.scheduling.timeoutSeconds, the user's choice)
    active = [r for r in _running(sim) if not r.node.frozen]
    rounds = sorted({r.epoch for r in active})
    want = s["pods"] * s["procs"]
    least = (s.get("min") or s["pods"]) * s["procs"]
    if phase != "Running" or len(rounds) != 1 or not least <= len(active) <= want:
        raise Violation(f"invariant 5 (liveness): {bound(sim):.0f}s after the last fault the job is {phase} "
                        f"({st.get('reason')}: {str(st.get('message'))[:300]}) with {len(active)} rank(s) running "
                        f"in round(s) {rounds}")
    if _disagreement(sim) is None:
        return
    # The operator hears the coordinator's events through its observer and writes them at its next
    # pass: a spare that connected a moment ago is said a moment later. Agreement is what holds
    # once it had the time of a few passes.
    sim.world.run_until(sim.world.now + AGREE_SECONDS, lambda: _disagreement(sim) is None)
    found = _disagreement(sim)
    if found is not None:
        raise Violation(found)


#: How long the operator's status may lag what its coordinator says (a few passes).
AGREE_SECONDS = 3.0


def _disagreement(sim: Sim) -> str | None:
    """Invariant 6's words when the operator's status and the running coordinator disagree."""
    st = sim.operator.status
    s = sim.schedule
    coordinator = next((w for w in sim.coordinators if w.hub is not None and w.exit_code is None
                        and not w.pod.removed and w.pod.info().restart == (st.get("gangRestart", st.get("restarts")))),
                       None)
    if coordinator is None or st.get("phase") != "Running":
        return None
    m = coordinator.hub.machine
    if m.phase != rendezvous.RUNNING_PHASE:
        return None
    said = {"restarts": int(st.get("restarts") or 0), "disruptions": int(st.get("disruptions") or 0)}
    heard = {"restarts": m.round, "disruptions": m.disruptions}
    if s.get("spares"):
        said["spares ready"] = int((st.get("spares") or {}).get("ready") or 0)
        heard["spares ready"] = len(m.spares)
    if s.get("min") is not None:
        said["members"] = list((st.get("size") or {}).get("members") or [])
        heard["members"] = sorted(m.round_members)
    if said != heard:
        return f"invariant 6 (agreement): the status says {said}, the coordinator {heard}"
    return None
