"""Bad nodes: a node on which the job's ranks fail again and again is kept off.

Where it sits: a policy of :mod:`spmd_operator.lifecycle`, run after the others in every pass of a
valid job (:func:`tend`), before :mod:`.spares`. :mod:`.inplace` (a restart in place recorded) and
:mod:`.failure` (a gang recreated) report each **counted** rank failure (not a disruption: a pod
deleted, evicted or lost with its node, a member lost, a takeover never counts) with its node
(:func:`record`); this module keeps the count and decides. Pure, like every policy.

* **Counted per node** in ``status.badNodes``: per node the times of its counted failures within
  BAD_NODE_WINDOW_SECONDS (older ones are dropped), at most MAX_TIMES per node and MAX_NODES
  nodes (those failing last kept).
* **Bad at BAD_NODE_FAILURES** within the window (an XID, an NCCL error on one GPU: the program's
  own non-zero exits on one node): one Warning Event NodeAvoided naming the node and its
  failures, the entry marked ``avoided: true``, and every pod the job creates afterwards (a
  replacement, the next attempt's gang, a spare) keeps off it by the required node affinity
  lostNodes uses (:meth:`.status.Pass.avoid_nodes`).
* **The pods there are left alone**: a gang restarting in place keeps its pods (a member that
  fails on every node, a bug of the program, must not turn restarts in place into recreations);
  the node is kept off by the pods created next: a lost pod's replacement, a recreated gang
  (RepeatedFailure), a spare.
* **Never unschedulable on its own account**: a pod the scheduler reports unschedulable while it
  keeps off a bad node lifts that node's avoidance (``avoided: false``, one Warning Event
  NodeAvoidanceLifted, status.message says so): the pod is deleted and created again without it
  (:func:`.gang.kept_off_needlessly`). A node lifted stays lifted until its failures age below
  the threshold; a node avoided stops being so at the latest BAD_NODE_WINDOW_SECONDS after its
  third-last failure.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from monarch_spmd.spec import JobSpec

from .model import EVENT_WARNING, PENDING, RESTARTING, RUNNING, format_time
from .status import BAD_NODE_FAILURES, BAD_NODE_WINDOW_SECONDS, MAX_TIMES, Failure, Pass, bad_node_entries

MAX_NODES: Final = 32
REASON_NODE_AVOIDED: Final = "NodeAvoided"
REASON_AVOIDANCE_LIFTED: Final = "NodeAvoidanceLifted"


def record(p: Pass, failure: Failure, at: dt.datetime) -> None:
    """A failure of the job's ranks that counts against maxRestarts (never a disruption) on its node."""
    if failure.disruption or not failure.node:
        return
    p.node_failures.append((failure.node, at))


def tend(p: Pass) -> None:
    """Counts this pass's failures per node, marks and avoids bad nodes (see the module's text)."""
    if not isinstance(p.o.spec, JobSpec):
        return
    active = p.new.get("phase") in (PENDING, RUNNING, RESTARTING)
    if not p.node_failures and (not p.new.get("badNodes") or not active):
        return  # (a finished job's status is left as it is)
    found = bad_node_entries(p.new, p.now)
    for node, at in p.node_failures:
        e = found.setdefault(node, {"node": node, "times": []})
        e["times"] = sorted([*e["times"], format_time(at)])[-MAX_TIMES:]
    fresh: list[str] = []
    for node, e in found.items():
        e["failures"] = len(e["times"])
        if e["failures"] < BAD_NODE_FAILURES:
            e.pop("avoided", None)
            e.pop("since", None)
        elif "avoided" not in e:
            e.update(avoided=True, since=format_time(p.now))
            fresh.append(node)
    keep_off = {n for n, e in found.items() if e.get("avoided") is True}
    for node in sorted(fresh):
        e = found[node]
        message = (f"node {node}: {e['failures']} failures of this job's ranks within "
                   f"{int(BAD_NODE_WINDOW_SECONDS // 60)} minutes (the last {e['times'][-1]}; at most "
                   f"{BAD_NODE_FAILURES} allowed): the job's new pods keep off it")
        p.event(EVENT_WARNING, REASON_NODE_AVOIDED, message[:1024])
    if active:
        _lift(p, found, keep_off)
    # The bad first, then the latest to fail; the rest dropped beyond MAX_NODES.
    kept = sorted(found.values(), key=lambda e: e["times"][-1], reverse=True)
    kept = sorted(kept, key=lambda e: "avoided" not in e)[:MAX_NODES]
    if kept:
        p.new["badNodes"] = [{k: e[k] for k in ("node", "failures", "times", "avoided", "since") if k in e}
                             for e in sorted(kept, key=lambda e: e["node"])]
    else:
        p.new.pop("badNodes", None)


def _lift(p: Pass, found: dict[str, dict[str, Any]], keep_off: set[str]) -> None:
    """A pod the scheduler cannot place while it keeps off bad nodes lifts their avoidance."""
    stuck = [pod for pod in (*p.o.pods, *p.o.spares) if pod.phase == PENDING and pod.unschedulable
             and not pod.deleting and pod.node is None and set(pod.avoids) & keep_off]
    if not stuck:
        return
    lifted = sorted(set().union(*(set(pod.avoids) & keep_off for pod in stuck)))
    for node in lifted:
        found[node]["avoided"] = False
    # Deleted now and created again without the affinity (as gang.kept_off_needlessly would next pass).
    p.delete_pods.extend(pod.name for pod in stuck if pod.name not in p.delete_pods)
    p.event(EVENT_WARNING, REASON_AVOIDANCE_LIFTED,
            (f"pod {stuck[0].name} cannot be scheduled while it keeps off bad node(s) {', '.join(lifted)} "
             f"({stuck[0].unschedulable}): they are no longer avoided for this job; the pod is created again "
             "without it")[:1024])
    p.requeue.append(0.5)
