"""The status side of a pass: conditions, the merge patch, and the accumulator the policies share.

Where it sits: above :mod:`.model`, below every policy module. A :class:`Pass` starts from the
observed status and collects what the policies decide (status fields, conditions, pod and child
writes, Events, timers); :meth:`Pass.plan` turns it into one :class:`~.model.Plan`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from monarch_spmd import policy
from monarch_spmd.payload import contract
from monarch_spmd.spec import JobSpec

from .. import names
from .model import (
    CONDITION_TYPES,
    EVENT_WARNING,
    FAILED,
    PENDING,
    REASON_NODE_LOST,
    RESTARTING,
    RUNNING,
    Event,
    Observed,
    Plan,
    PodInfo,
    format_time,
    parse_time,
)

#: How much of a failure's message is kept in status.failure.message.
MESSAGE_LINES = 20
MESSAGE_CHARS = 2048
#: The last line every agent writes on a failure (payload.agent.failure_line): the root cause's
#: rank, its exit code, the round and the outcome (docs/restart-in-place.md).
VERDICT_LINE: Final = re.compile(
    r"^monarch-spmd worker: rank (\d+) exited with code (\d+)(?: \(local rank \d+\))? in restart (\d+); (.*)$")

#: How long a node judged lost is remembered (status.lostNodes): its pods hold no new attempt up
#: and new pods keep off it (the node controller marks an unreachable node NotReady within 40 s;
#: its pods are deleted after 5 minutes).
LOST_NODE_SECONDS: Final = 600.0

#: Counted rank failures (not disruptions) on one node within BAD_NODE_WINDOW_SECONDS that make
#: it bad for the job: its new pods keep off it (status.badNodes, lifecycle.badnodes).
BAD_NODE_FAILURES: Final = 3
#: How long a counted failure counts toward its node's (one hour).
BAD_NODE_WINDOW_SECONDS: Final = 3600.0
#: At most this many failure times are kept per node in status.badNodes.
MAX_TIMES: Final = 10

#: The most of a failure's last line that its one-line description keeps.
DESCRIBED_LINE: Final = 300


def bad_node_entries(status: Mapping[str, Any], now: dt.datetime) -> dict[str, dict[str, Any]]:
    """status.badNodes by node, each with only its failure times within BAD_NODE_WINDOW_SECONDS."""
    out: dict[str, dict[str, Any]] = {}
    for entry in status.get("badNodes") or []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("node"), str):
            continue
        times = []
        for t in entry.get("times") or []:
            at = parse_time(t)
            if at is not None and (now - at).total_seconds() < BAD_NODE_WINDOW_SECONDS:
                times.append(format_time(at))
        if times:
            out[entry["node"]] = {**entry, "times": sorted(times)[-MAX_TIMES:]}
    return out


def avoided_bad_nodes(status: Mapping[str, Any], now: dt.datetime) -> set[str]:
    """The bad nodes the job's new pods keep off: BAD_NODE_FAILURES within the window, not lifted."""
    return {node for node, e in bad_node_entries(status, now).items()
            if len(e["times"]) >= BAD_NODE_FAILURES and e.get("avoided") is not False}


def lifted_note(status: Mapping[str, Any], now: dt.datetime) -> str:
    """What status.message adds while bad nodes are not kept off (their avoidance lifted: a pod
    could not be placed otherwise)."""
    nodes = sorted(n for n, e in bad_node_entries(status, now).items()
                   if len(e["times"]) >= BAD_NODE_FAILURES and e.get("avoided") is False)
    if not nodes:
        return ""
    return (f"; bad node(s) {', '.join(nodes)} not kept off (status.badNodes): keeping off them left a pod "
            "with no node")


def clip(line: str, limit: int) -> str:
    """``line`` cut to at most ``limit`` characters, at the last ``; `` or `` < `` (a stack
    excerpt's frames) in its second half when there is one, so no word or frame is cut in two;
    `` ...`` marks the cut."""
    if len(line) <= limit:
        return line
    head = line[:limit - 4]
    at = max(head.rfind("; "), head.rfind(" < "))
    return (head[:at] if at >= limit // 2 else head) + " ..."


@dataclass(frozen=True)
class Failure:
    """One failed rank of the current attempt."""

    rank: int
    pod: str
    node: str | None
    exit_code: int | None
    reason: str
    message: str | None
    permanent: bool
    disruption: bool
    lost: bool
    order: tuple[int, str, int]

    def describe(self) -> str:
        """One line: the rank, its pod and node, the exit code, the reason and the message's last
        line that says more than the worker's own verdict line (which repeats the rank and code)."""
        what = f"exited {self.exit_code}" if self.exit_code is not None else "was lost"
        where = f" on node {self.node}" if self.node else ""
        text = f"rank {self.rank} (pod {self.pod}{where}) {what}: {self.reason}"
        lines = [line for line in (self.message or "").strip().splitlines() if line.strip()]
        telling = [line for line in lines if not VERDICT_LINE.match(line)]
        if telling or lines:
            text += f": {clip((telling or lines)[-1], DESCRIBED_LINE)}"
        return text

    def as_status(self, restart: int, now: dt.datetime) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "pod": self.pod,
            "reason": self.reason,
            "restart": restart,
            "permanent": self.permanent,
            "disruption": self.disruption,
            "time": format_time(now),
        }
        if self.node:
            out["node"] = self.node
        if self.exit_code is not None:
            out["exitCode"] = self.exit_code
        message = tail(self.message)
        if message:
            out["message"] = message
        return out


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: dt.datetime,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """Returns ``conditions`` with condition ``type_`` set; lastTransitionTime moves only when the status does."""
    out = [dict(c) for c in conditions]
    for c in out:
        if c.get("type") == type_:
            if c.get("status") != status:
                c["lastTransitionTime"] = format_time(now)
            c.update(status=status, reason=reason, message=message)
            if generation is not None:
                c["observedGeneration"] = generation
            break
    else:
        c = {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": format_time(now)}
        if generation is not None:
            c["observedGeneration"] = generation
        out.append(c)
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(c.get("type", ""), len(order)))


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``; empty when equal."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value or key not in old:
            patch[key] = value
    return patch


def tail(message: str | None) -> str | None:
    """The last MESSAGE_LINES lines (at most MESSAGE_CHARS characters) of a message."""
    if not message:
        return None
    text = "\n".join(message.rstrip().splitlines()[-MESSAGE_LINES:])
    return text[-MESSAGE_CHARS:]


class Pass:
    """One reconcile pass: the observed state, and what the policies decided so far.

    Attributes:
        o: what the pass observed.
        spec: the parsed spec (only valid once admission passed).
        phase: the phase the pass started in (None for a new job).
        restart: the current attempt (``status.restarts``); restarts in place raise it.
        gang: the attempt the current gang of pods was created for (``status.gangRestart``, or
            ``restart`` when absent): their restart label, their master Service.
        new: the desired status, edited by the policies.
    """

    def __init__(self, o: Observed) -> None:
        self.o = o
        self.now = o.now
        self.old: dict[str, Any] = dict(o.status)
        self.new: dict[str, Any] = dict(o.status)
        self.phase: str | None = o.status.get("phase")
        self.restart = int(o.status.get("restarts") or 0)
        gang = o.status.get("gangRestart")
        self.gang = gang if isinstance(gang, int) and not isinstance(gang, bool) and 0 <= gang <= self.restart else self.restart
        self.spec: JobSpec = o.spec  # type: ignore[assignment]  # checked by admission first
        self.events: list[Event] = []
        self.delete_pods: list[str] = []
        self.delete_services: list[str] = []
        self.configmap = False
        self.service: int | None = None
        self.podgroup: int | None = None
        self.delete_podgroups: list[str] = []
        self.workload = False
        self.finish_workload = False
        self.release_workload = False
        self.create: list[int] = []
        self.create_restart: int | None = None
        self.replace: list[tuple[int, int]] = []
        self.replace_round = 0
        self.delete_job = False
        self.requeue: list[float] = []
        self.pods_lost = False
        self.spares: list[int] = []
        self.spare_restart = 0
        self.adopt: list[tuple[str, int, int]] = []
        #: Nodes judged lost in this pass (a member's agent fell silent while its pod showed
        #: Running): remembered in status.lostNodes (:meth:`plan`).
        self.lost_nodes: set[str] = set()
        #: Counted rank failures of this pass (not disruptions), by node and when: counted per
        #: node in status.badNodes (lifecycle.badnodes).
        self.node_failures: list[tuple[str, dt.datetime]] = []
        self._current: tuple[int, dict[int, PodInfo]] | None = None

    # --- views of the observed pods --------------------------------------------------------

    @property
    def pods_per_attempt(self) -> int:
        """How many pods one attempt has (one per proc, or one per host in PerHost)."""
        return policy.pods_per_attempt(self.spec)

    @property
    def procs_per_pod(self) -> int:
        return policy.procs_per_pod(self.spec)

    def member_of(self, pod: PodInfo) -> int | None:
        """THE rule of which member of the current gang a pod is: member m is every pod of the
        gang whose rank label is m's first rank (the gang's own pod, the pods created alone in its
        place, a hot spare adopted as it); the newest listed is m's pod now (:meth:`current`).
        None: a pod of another gang, a spare not adopted, a rank outside the mesh."""
        per = self.procs_per_pod
        if pod.restart != self.gang or not 0 <= pod.rank < self.pods_per_attempt * per or pod.rank % per:
            return None
        return pod.rank // per

    def member_pods(self, member: int) -> list[PodInfo]:
        """Every pod that was member ``member`` of the current gang, still listed or deleted lately,
        by replacement number (a listed pod before a gone one of the same number)."""
        return sorted((g for g in (*self.o.pods, *self.o.gone) if self.member_of(g) == member),
                      key=lambda g: g.replacement)

    def index_of_rank(self, rank: int) -> int:
        """The index of the pod that runs ``rank``."""
        return rank // self.procs_per_pod

    def describe(self, index: int) -> str:
        """``rank 3``, or ``pod 1 (ranks 4..7)`` in PerHost."""
        n = self.procs_per_pod
        return f"rank {index}" if n == 1 else f"pod {index} (ranks {index * n}..{index * n + n - 1})"

    @property
    def in_place(self) -> bool:
        """Whether the gang restarts in place (restartPolicy.mode InPlace, not Monarch mode)."""
        return policy.restarts_in_place(self.spec)

    @property
    def in_place_round(self) -> bool:
        """A restart in place was recorded since the gang's pods were created (restarts > gang)."""
        return self.in_place and self.restart > self.gang

    @property
    def elastic(self) -> bool:
        """The job's rounds may run with fewer pods (mesh[0].minSize, restart in place)."""
        return self.in_place and self.spec.min_members is not None

    def current(self) -> dict[int, PodInfo]:
        """The pods of the current gang, by index: of each index the newest (a pod replaced alone
        during a restart in place gives way to its replacement). Worked out once per gang."""
        if self._current is None or self._current[0] != self.gang:
            pods: dict[int, PodInfo] = {}
            for p in self.o.pods:
                i = self.member_of(p)
                if i is not None and (i not in pods or p.replacement > pods[i].replacement):
                    pods[i] = p
            self._current = (self.gang, pods)
        return dict(self._current[1])

    def next_replacement(self, index: int) -> int:
        """The replacement number a new pod of ``index`` in the current gang gets: above every pod of
        that index seen (still there, or deleted recently), so its name is never one in use."""
        return max((p.replacement for p in self.member_pods(index)), default=0) + 1

    def stale(self) -> list[PodInfo]:
        """Pods of other attempts (older ones, or ranks outside the mesh)."""
        current = {id(p) for p in self.current().values()}
        return [p for p in self.o.pods if id(p) not in current]

    # --- decisions ------------------------------------------------------------------------

    @property
    def conditions(self) -> list[dict[str, Any]]:
        return list(self.new.get("conditions") or [])

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        self.new["conditions"] = set_condition(self.conditions, type_, status, reason, message, self.now, self.o.generation)

    def clear(self, type_: str, reason: str, message: str) -> None:
        """Sets ``type_`` to False, but only if it is present (absent means never true)."""
        if any(c.get("type") == type_ for c in self.conditions):
            self.condition(type_, "False", reason, message)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def stop(self, pods: Iterable[PodInfo]) -> None:
        """Deletes the given pods unless they finished or are being deleted already."""
        self.delete_pods.extend(p.name for p in pods if not p.finished and not p.deleting)

    def counts(self, current: Mapping[int, PodInfo]) -> None:
        """The procs of the current attempt whose pod runs, succeeded, failed."""
        per = self.procs_per_pod
        self.new["running"] = per * sum(1 for p in current.values() if p.phase == RUNNING and not p.deleting)
        self.new["succeeded"] = per * sum(1 for p in current.values() if p.phase == "Succeeded")
        self.new["failed"] = per * sum(1 for p in current.values() if p.phase == FAILED)

    def fail(self, reason: str, message: str, *, failure: dict[str, Any] | None = None, stop: bool = True) -> None:
        """The job fails: phase Failed, condition, Event, and every unfinished pod stopped (not
        with ``stop`` False: the pods are ending by themselves, their logs kept)."""
        if failure is not None:
            self.new["failure"] = failure
        self.new["phase"] = FAILED
        self.new["completionTime"] = format_time(self.now)
        self.condition(FAILED, "True", reason, message)
        self.clear(RUNNING, reason, "the job failed")
        self.clear(RESTARTING, reason, "the job failed")
        self.event(EVENT_WARNING, reason, message)
        if stop:
            self.stop(self.o.pods)

    def failure_record(self, reason: str, message: str) -> dict[str, Any]:
        """A ``status.failure`` for a job-level failure (no rank): invalid spec, deadline."""
        return {"reason": reason, "message": message, "restart": self.restart, "permanent": True,
                "time": format_time(self.now)}

    def create_pods(self, indices: Iterable[int], restart: int) -> None:
        self.create.extend(indices)
        self.create_restart = restart

    def replace_pod(self, index: int, replacement: int, round_: int) -> None:
        """Restart in place: creates pod ``index`` of the current gang alone, as its
        ``replacement``-th replacement, joining round ``round_``."""
        self.replace.append((index, replacement))
        self.replace_round = round_

    def summarize(self) -> None:
        """status.reason and status.message: the condition that explains the phase, in one line."""
        phase = self.new.get("phase")
        conditions = {c.get("type"): c for c in self.new.get("conditions") or []}
        explain = {FAILED: FAILED, "Succeeded": "Succeeded", "Suspended": "Suspended",
                   RESTARTING: RESTARTING}.get(phase or "", RUNNING)
        chosen = conditions.get(explain) or conditions.get("Created")
        if chosen is not None:
            self.new["reason"] = chosen.get("reason", "")
            message = chosen.get("message") or ""
            if phase in (PENDING, RUNNING, RESTARTING) and self.new.get("badNodes"):
                message += lifted_note(self.new, self.now)
            self.new["message"] = message[:MESSAGE_CHARS]

    def remembered_lost_nodes(self) -> dict[str, str]:
        """Nodes judged lost under this job within LOST_NODE_SECONDS, with when (RFC 3339): the
        pods of older attempts there never hold the next one up (they answer nobody; their
        agents fenced themselves), and the pods created keep off them."""
        out: dict[str, str] = {}
        for entry in self.new.get("lostNodes") or []:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("node"), str):
                continue
            at = parse_time(entry.get("time"))
            if at is not None and (self.now - at).total_seconds() < LOST_NODE_SECONDS:
                out[entry["node"]] = str(entry["time"])
        for node in self.lost_nodes:  # judged lost (again) now: the pods there now were there
            out[node] = format_time(self.now)
        return out

    def plan(self) -> Plan:
        lost = self.remembered_lost_nodes()
        if lost or self.new.get("lostNodes"):
            self.new["lostNodes"] = [{"node": n, "time": t} for n, t in sorted(lost.items())] or None
            if self.new["lostNodes"] is None:
                del self.new["lostNodes"]
        self.summarize()
        generation = self.o.generation
        if generation is not None:
            self.new["observedGeneration"] = generation
            # Every condition was evaluated against this generation, whether it changed or not.
            if self.new.get("conditions"):
                self.new["conditions"] = [
                    {**c, "observedGeneration": generation} for c in self.new["conditions"]
                ]
        restart = self.create_restart if self.create_restart is not None else self.new_gang()
        return Plan(
            status=merge_patch(self.old, self.new),
            delete_pods=tuple(dict.fromkeys(self.delete_pods)),
            delete_services=tuple(dict.fromkeys(self.delete_services)),
            configmap=self.configmap,
            service=self.service,
            podgroup=self.podgroup,
            delete_podgroups=tuple(dict.fromkeys(self.delete_podgroups)),
            workload=self.workload,
            finish_workload=self.finish_workload,
            release_workload=self.release_workload,
            create=tuple(dict.fromkeys(self.create)),
            restart=restart,
            events=tuple(self.events),
            delete_job=self.delete_job,
            requeue_after=min(self.requeue) if self.requeue else None,
            pods_lost=self.pods_lost,
            replace=tuple(dict.fromkeys(self.replace)),
            replace_round=self.replace_round,
            disruptions=int(self.new.get("disruptions") or 0),
            # An elastic job's pod replaced alone may go back to its node when that node returns
            # (the gang grows back then); a recreated gang and spares keep off a lost node.
            # Bad nodes (status.badNodes) are kept off by every pod created, an elastic one's too.
            avoid_nodes=(self.avoid_nodes() if self.create or self.spares or (self.replace and not self.elastic)
                         else tuple(sorted(avoided_bad_nodes(self.new, self.now))) if self.replace else ()),
            spares=tuple(dict.fromkeys(self.spares)),
            spare_restart=self.spare_restart,
            adopt=tuple(dict.fromkeys(self.adopt)),
        )

    def avoid_nodes(self) -> tuple[str, ...]:
        """For the pods created: the nodes judged lost lately (:meth:`remembered_lost_nodes`, and
        the current failure's, reason NodeLost) that still hold a pod of the job its kubelet never
        ended (the scheduler would think such a node Ready for up to 40 s). A lost node whose pods
        ended is answering again: no need to keep off it. And the nodes bad for the job
        (status.badNodes: its ranks failed there again and again), unless lifted."""
        failure = self.new.get("failure") or {}
        lost = set(self.remembered_lost_nodes())
        if failure.get("reason") == REASON_NODE_LOST and failure.get("node"):
            lost.add(str(failure["node"]))
        silent = {p.node for p in (*self.o.pods, *self.o.spares) if p.node and not p.finished}
        return tuple(sorted((lost & silent) | avoided_bad_nodes(self.new, self.now)))

    def new_gang(self) -> int:
        """The attempt of the gang the status this pass writes names (gangRestart, else restarts)."""
        gang = self.new.get("gangRestart")
        if isinstance(gang, int) and not isinstance(gang, bool):
            return gang
        return int(self.new.get("restarts") or self.restart)


def record_basics(p: Pass) -> None:
    """The descriptive status fields every pass of a valid job keeps up to date."""
    p.new.update(
        mesh=contract.format_mesh(p.spec.mesh_pairs),
        procs=p.spec.world_size,
        restarts=p.restart,
        masterAddr=names.master_addr(p.o.job, p.gang),
    )
