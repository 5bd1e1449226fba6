"""The coordinator: the state machine of one gang's rounds, run by member 0's agent.

What it does, a concern per module, each a part of :class:`Coordinator` a reader can hold alone:

* rounds (here): members say hello and join; a round starts (``go``) when they have; a failure
  stops it (``stop``); once every live member stopped, the round's failures are judged and the
  next round opens, or the gang fails (``fail``); ``finish`` when every process exited 0;
* what counts (:mod:`.counting`): the root cause and what follows from it, the one rule;
* the fence (:mod:`.fence`): no round starts while a lost member's processes may run, or while
  the coordinator may be the one cut off;
* hot spares (:mod:`.takeover`), elastic sizes (:mod:`.elastic`), the hang capture
  (:mod:`.capture`), and the events observers see (:mod:`.history`).

Nothing here does I/O or reads a clock: every method takes ``now`` (a monotonic time) and returns
what to send (:class:`.rendezvous.Out`), so the protocol is tested from tables
(tests/unit/test_rendezvous.py) and in a simulation of every fault (tests/sim). The words: a
**gang** is the pods of one attempt and their coordinator; a **member** is one place in it (one
agent at a time: the gang's pod, a pod created alone in its place, or a spare that took it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .capture import Capturing
from .counting import Count, Failure, Policy
from .elastic import Elastic
from .fence import Fencing
from .history import History
from .names import EX_TEMPFAIL
from .rendezvous import (ALL, EV_ALL_RUNNING, EV_EXITED, EV_FAILED, EV_FAILURE, EV_JOINED, EV_LOST, EV_PROGRESS,
                         EV_RESTART, EV_ROUND, EV_RUNNING, EV_SUCCEEDED, FAIL, FAILED, FINISH, FINISHED, JOINING,
                         LOST_DISCONNECTED, LOST_HEARTBEAT, LOST_NOT_STOPPED, LOST_SUPERSEDED, MAX_NAME, MAX_TEXT,
                         PROGRESS_EVERY, REASON_ERROR, REASON_MEMBER_LOST, REASON_ROUND_TIMEOUT, RUNNING_PHASE,
                         STOPPING, VERSION, WELCOME, Out, cut, cut_lines, ranges)
from .takeover import Takeovers

__all__ = ["Coordinator", "Policy"]


@dataclass
class Coordinator(History, Fencing, Takeovers, Elastic, Capturing):
    """The coordinator's state: one gang of ``members`` agents, from round ``first_round`` on.

    Feed it what the members say (:meth:`hello`, :meth:`join`, :meth:`running`, :meth:`failure`,
    :meth:`exited`, :meth:`lost`, :meth:`heartbeat`, and the spares', observers' and capture's
    messages of its parts) and call :meth:`tick` now and then; each returns the :class:`Out` list
    to carry out, in order. ``wall`` stamps events with Unix time.
    """

    members: int
    first_round: int
    policy: Policy
    now: float
    world_size: int = 0
    run_id: str = ""
    wall: Callable[[], float] = field(default=lambda: 0.0)

    def __post_init__(self) -> None:
        self.round = self.first_round
        self.phase = JOINING
        #: What is counted (:mod:`.counting`): disruptions, the back-off's count, a member's streak.
        self.count = Count(self.policy, disruptions=self.policy.disruptions)
        self.incarnations: dict[int, str] = {}
        self.nodes: dict[int, str] = {}
        #: Each member's pod, as its agent's hello named it ("": not named).
        self.pods: dict[int, str] = {}
        self.seen: set[int] = set()
        self.replacements: set[int] = set()
        self.joined: set[int] = set()
        self.next_joined: set[int] = set()
        self.running_members: set[int] = set()
        self.done: set[int] = set()
        self.failures: list[Failure] = []
        self.received = 0
        self.go_at = self.now
        self.deadline: float | None = None  # the first round has none (see start)
        self.stop_deadline: float | None = None
        self.first_failure_at: float | None = None
        self.all_running_at: float | None = None
        self.idle: dict[int, tuple[float, int | None, str]] = {}
        #: When each member's ranks last wrote output, the newest of them (its heartbeat's ``fresh``):
        #: the gang makes progress while any rank does (:meth:`since_output`).
        self.output_at: dict[int, float] = {}
        self.last_progress_event = self.now
        self.outcome: dict[str, Any] | None = None
        self._cause: dict[str, Any] | None = None
        self._init_history()
        self._init_fencing()
        self._init_takeovers()
        self._init_elastic()
        self._init_capturing()

    @property
    def disruptions(self) -> int:
        """Restarts so far that were disruptions (never counted against maxRestarts)."""
        return self.count.disruptions

    @disruptions.setter
    def disruptions(self, value: int) -> None:
        self.count.disruptions = value

    def _clock(self, now: float) -> None:
        self.now = max(self.now, now)

    def start(self) -> list[Out]:
        """The first round's ``round`` event (call once). The first round has no deadline: its
        pods may wait for the scheduler, which the operator bounds (schedulingTimeoutSeconds)."""
        return [self._event(EV_ROUND, restart_count=self.round, members=self.members, backoff_seconds=0.0,
                            cause=None)]

    def live(self) -> set[int]:
        return set(self.incarnations)

    def _in_round(self) -> set[int]:
        """The live members of the round that runs (an elastic gang's waiting ones are not)."""
        return self.live() & self.round_members

    def hello(self, member: int, incarnation: str, now: float, *, disruptions: int = 0,
              node: str = "", pod: str = "", spare: int | None = None) -> list[Out]:
        """A member's agent connected (a new incarnation supersedes an older one), on ``node`` in
        ``pod``; ``spare``: the hot spare it was (see :meth:`admits`)."""
        self._clock(now)
        out: list[Out] = []
        self._arrived(member, incarnation, spare)
        if member in self.incarnations and self.incarnations[member] != incarnation:
            out.append(Out(member, {"type": FAIL, "round": self.round, "reason": LOST_SUPERSEDED,
                                    "exit_code": EX_TEMPFAIL, "fallback": True}, drop=True))
            out.extend(self.lost(member, LOST_SUPERSEDED, now))
        replacement = member in self.seen
        if replacement:
            self.replacements.add(member)
        self.taken_over.discard(member)  # a spare that took its place (or a replacement): its own from now on
        self.seen.add(member)
        self.incarnations[member] = incarnation
        self.nodes[member] = cut(node, MAX_NAME)
        self.pods[member] = cut(pod, MAX_NAME)
        # A member's count of disruptions is never more than the rounds there were (a larger one
        # would stop restarts from counting against maxRestarts).
        self.disruptions = max(self.disruptions, min(max(0, disruptions), self.round))
        # The round a member joins: the open one, or the next while this one runs or stops.
        join_round = self.round if self.phase in (JOINING, FINISHED, FAILED) else self.round + 1
        out.append(Out(member, {"type": WELCOME, "v": VERSION, "round": join_round, "phase": self.phase,
                                "replacement": replacement}))
        if self.phase == FINISHED:
            out.append(Out(member, self._finish()))
        elif self.phase == FAILED and self.outcome is not None:
            out.append(Out(member, self.outcome))
        return out

    def join(self, member: int, round_: int, now: float) -> list[Out]:
        """Member ``member`` has no process left and is ready for round ``round_``."""
        self._clock(now)
        if member not in self.incarnations:
            return []
        if self.phase == JOINING and round_ == self.round:
            if member in self.joined:
                return []
            self.joined.add(member)
            out = [self._joined(member)]
            return out + self._maybe_go()
        if self.phase == STOPPING and round_ == self.round + 1:
            self.next_joined.add(member)
            return self._maybe_decide()
        if self.phase == RUNNING_PHASE and round_ == self.round + 1 and member not in self.round_members:
            return self._grow(member)
        return []

    def _joined(self, member: int) -> Out:
        replacement = member in self.replacements
        self.replacements.discard(member)
        return self._event(EV_JOINED, member=member, incarnation=self.incarnations[member], replacement=replacement,
                           node=self.nodes.get(member, ""))

    def running(self, member: int, round_: int, procs: list[dict[str, Any]], now: float) -> list[Out]:
        """Member ``member`` started its processes of ``round_``."""
        self._clock(now)
        if round_ != self.round or self.phase != RUNNING_PHASE or member not in self.incarnations:
            return []
        self.running_members.add(member)
        out = [self._event(EV_RUNNING, member=member, procs=procs)]
        if self.running_members >= self.round_members and self.all_running_at is None:
            self.all_running_at = now
            since = None if self.first_failure_at is None else round(now - self.first_failure_at, 6)
            out.append(self._event(EV_ALL_RUNNING, seconds_since_failure=since))
        return out

    def failure(self, member: int, round_: int, info: Mapping[str, Any], now: float) -> list[Out]:
        """A process of member ``member`` failed in ``round_`` (info: rank, exit code, reason ...)."""
        self._clock(now)
        if (round_ != self.round or self.phase not in (RUNNING_PHASE, STOPPING) or member not in self.incarnations
                or member not in self.round_members):
            return []
        if any(f.member == member for f in self.failures):
            return []  # one failure per member and round
        return self._record_failure(member, dict(info))

    def _record_failure(self, member: int, info: dict[str, Any]) -> list[Out]:
        if not isinstance(info.get("at"), (int, float)) or isinstance(info.get("at"), bool):
            info["at"] = self.wall()  # an exit not reported as a failure first: when it was heard
        if isinstance(info.get("message"), str):
            info["message"] = cut(info["message"], MAX_TEXT)
        if isinstance(info.get("tail"), list):
            info["tail"] = cut_lines(info["tail"])
        self.received += 1
        self.failures.append(Failure(member, info, self.received))
        fields = {k: info.get(k) for k in ("rank", "local_rank", "pid", "exit_code", "returncode", "signal",
                                           "reason", "message", "tail", "at")}
        out = [self._event(EV_FAILURE, member=member, node=self.nodes.get(member, ""), **fields)]
        if self.phase == RUNNING_PHASE:
            out.extend(self._stop())
        return out

    def _stop(self) -> list[Out]:
        self.phase = STOPPING
        self.capture = None
        self.first_failure_at = self.now
        self.stop_deadline = self.now + self.policy.join_timeout
        self.next_joined = self.waiting & self.live()  # they joined the next round already
        return [Out(ALL, self._stop_message())]

    def exited(self, member: int, round_: int, procs: list[dict[str, Any]], now: float) -> list[Out]:
        """Every process of member ``member`` in ``round_`` is gone (one row per process)."""
        self._clock(now)
        if round_ != self.round or member not in self.incarnations:
            return []
        out = [self._event(EV_EXITED, member=member, procs=procs)]
        if self.phase != RUNNING_PHASE or member not in self.round_members:
            return out  # an elastic gang's member outside the round has nothing of it to end
        # An exit the member did not report as a failure first is one; a process it stopped on its
        # own (for a hang's stacks) is one too unless the gang's capture is under way.
        bad = [p for p in procs if p.get("exit_code") and (not p.get("stopped") or self.capture is None)]
        if bad:
            p = bad[0]
            out.extend(self._record_failure(member, {**p, "reason": p.get("reason") or REASON_ERROR}))
            return out
        if self.capture is not None:
            return out  # its ranks ended for their stacks: the verdict follows
        self.done.add(member)
        if self.done >= self.round_members:
            self.phase = FINISHED
            out.append(Out(ALL, self._finish()))
            out.append(self._event(EV_SUCCEEDED))
        return out

    def _finish(self) -> dict[str, Any]:
        """``finish``: every member's processes of the round exited 0; it names the round's
        members (an elastic round may have had fewer than the gang: the others are no part of it)."""
        return {"type": FINISH, "round": self.round, "members": sorted(self.round_members)}

    def finished_its_part(self, member: int) -> bool:
        """Whether ``member``'s processes of the running round all exited 0 and it said so: it has
        nothing left to do in the round, and its agent's going (cut off from this coordinator, it
        ended) stops nothing and calls no spare: the round finishes when the others' have."""
        return self.phase == RUNNING_PHASE and member in self.done and member in self.round_members

    def lost(self, member: int, reason: str, now: float, *, at: float | None = None,
             heard: float | None = None, silent: bool | None = None) -> list[Out]:
        """Member ``member``'s agent is gone: it left, its connection closed, or it fell silent.

        When it went, for telling its consequences from the program's failures (:func:`.counting.root_cause`):
        ``at``, the member's own word (Unix time: when its ``leave``'s signal came), else ``heard``
        (monotonic, when it was last heard: its processes went no earlier), else now.
        """
        self._clock(now)
        if member not in self.incarnations:
            return []
        if at is None:
            at = self.wall() - max(0.0, now - heard) if heard is not None else self.wall()
        incarnation = self.incarnations.pop(member)
        self.idle.pop(member, None)
        self.output_at.pop(member, None)
        self.departing[(member, incarnation)] = now + self._fence(reason)
        out = [self._event(EV_LOST, member=member, reason=reason, node=self.nodes.get(member, ""),
                           pod=self.pods.get(member, ""))]
        if reason in (LOST_DISCONNECTED, LOST_HEARTBEAT) and member != 0:
            self.member_silent_at = now
        if self.finished_its_part(member):
            return out
        # A member superseded has its new incarnation: no spare takes its place.
        takeover = [] if reason == LOST_SUPERSEDED else self._take_over(
            member, silent if silent is not None else reason == LOST_HEARTBEAT)
        out.extend(takeover)
        gone = f"member {member}'s agent is gone ({reason})"
        if takeover:
            gone += "; a hot spare takes its place"
        if self._outside_round(member):
            self.waiting.discard(member)  # not in the round that runs: nothing of it stops
            self.next_joined.discard(member)
            return out + self._maybe_decide()
        if self.phase == JOINING:
            self.waiting.discard(member)
            self.joined.discard(member)
            if len(self.joined) < self.min_members or 0 not in self.joined:
                self.quorum_at = None  # below the minimum: an elastic round's wait starts again
        elif self.phase == RUNNING_PHASE:
            self.running_members.discard(member)
            self.done.discard(member)
            out.extend(self._record_failure(member, {"rank": None, "local_rank": None, "pid": None,
                                                     "exit_code": None, "returncode": None, "signal": None,
                                                     "reason": REASON_MEMBER_LOST, "message": gone,
                                                     "tail": [], "at": at, "takeover": bool(takeover)}))
        elif self.phase == STOPPING:
            self.next_joined.discard(member)
            if not any(f.member == member for f in self.failures):
                self.received += 1
                self.failures.append(Failure(member, {"reason": REASON_MEMBER_LOST, "exit_code": None,
                                                       "rank": None, "at": at, "message": gone,
                                                       "takeover": bool(takeover)}, self.received))
            out.extend(self._maybe_decide())
        return out

    def _outside_round(self, member: int) -> bool:
        """Whether ``member`` is no part of the round that runs or stops: an elastic gang's member
        waiting for the next one, or one the round was started without. An open round holds
        whoever joined it, a member that waited for it too (``waiting`` is emptied only at ``go``)."""
        if self.phase == JOINING:
            return False
        return member in self.waiting or (self.phase in (RUNNING_PHASE, STOPPING) and member not in self.round_members)

    def heartbeat(self, member: int, now: float, *, idle: float | None = None, rank: int | None = None,
                  line: str = "", fresh: float | None = None) -> list[Out]:
        """A member's heartbeat: ``idle`` is the seconds since its stalest rank's last output,
        ``fresh`` since its freshest's."""
        self._clock(now)
        if idle is not None and member in self.incarnations:
            self.idle[member] = (float(idle), rank, line)
        if fresh is not None and member in self.incarnations:
            self.output_at[member] = now - float(fresh)
        return []

    def since_output(self, now: float) -> float | None:
        """Seconds since any rank of the running round last wrote output, as the members' latest
        heartbeats tell it (None: not running, or no member said). A gang makes progress while
        any of its ranks does: most scripts print on rank 0 only, and the others, silent, are not
        hung while their collectives complete."""
        live = [at for m, at in self.output_at.items() if m in self.round_members]
        if self.phase != RUNNING_PHASE or not live:
            return None
        return max(0.0, now - max(live))

    def tick(self, now: float) -> list[Out]:
        """Deadlines: the back-off's end, a round that does not close, members that do not stop."""
        self._clock(now)
        out: list[Out] = self._assignments()
        if self.phase == JOINING:
            out.extend(self._maybe_go())
            if self.phase == JOINING and self.deadline is not None and now >= self.deadline:
                missing = sorted(set(range(self.members)) - self.joined)
                out.extend(self._fail(None, exit_code=EX_TEMPFAIL, reason=REASON_ROUND_TIMEOUT, fallback=True,
                                      message=f"round {self.round} did not close within "
                                              f"{self.policy.join_timeout:g}s: member(s) {ranges(missing)} never joined"))
        elif self.phase == STOPPING and self.stop_deadline is not None and now >= self.stop_deadline:
            for member in sorted(self.live() - self.next_joined):
                out.extend(self.lost(member, LOST_NOT_STOPPED, now))
            if self.phase == STOPPING:
                out.extend(self._decide())
        elif self.phase == RUNNING_PHASE and self.capture is not None:
            if now >= self.capture.deadline:
                out.extend(self._judge() if self.capture.dumping else self._dump())
        elif self.phase == RUNNING_PHASE and now - self.last_progress_event >= PROGRESS_EVERY and self.idle:
            self.last_progress_event = now
            member, (idle, rank, line) = max(self.idle.items(), key=lambda kv: kv[1][0])
            out.append(self._event(EV_PROGRESS, seconds_since_progress=round(idle, 3), rank=rank, line=line))
        return out

    def _maybe_go(self) -> list[Out]:
        """The open round starts once its members joined (:meth:`_quorum`), its back-off passed,
        no lost member's process may still run and the coordinator is in sight (:mod:`.fence`)."""
        if self.phase != JOINING or self.now < self.go_at or not self._quorum():
            return []
        if not self._fenced() or self.isolated():
            return []  # a lost member's processes may still run; or this coordinator is cut off
        self.phase = RUNNING_PHASE
        self.running_members = set()
        self.done = set()
        self.failures = []
        self.all_running_at = None
        self.last_progress_event = self.now
        self.capture = None
        return self._go()

    def _maybe_decide(self) -> list[Out]:
        if self.phase == STOPPING and self.live() <= self.next_joined:
            return self._decide()
        return []

    def _decide(self) -> list[Out]:
        """Every live member stopped: what the round's failures come to (:meth:`.counting.Count.decide`),
        then the next round, or ``fail``."""
        healthy = (self.all_running_at is not None and self.first_failure_at is not None
                   and self.first_failure_at - self.all_running_at >= self.policy.backoff_reset)
        decision = self.count.decide(self.round, self.failures, healthy=healthy)
        if decision.give_up is not None:
            return self._fail(decision.root, **decision.give_up)
        cause = decision.cause
        out = [self._event(EV_RESTART, next_round=self.round + 1, **cause, counted=decision.counted + 1,
                           max_restarts=self.policy.max_restarts, backoff_seconds=decision.backoff)]
        self._cause = {"round": self.round, **cause}
        self.round += 1
        self.phase = JOINING
        self.joined = set(self.next_joined) & self.live()
        self.next_joined = set()
        self.go_at = self.now + decision.backoff
        self.deadline = self.go_at + self.policy.join_timeout
        out.append(self._event(EV_ROUND, restart_count=self.round, members=self.members,
                               backoff_seconds=decision.backoff, cause=self._cause))
        for member in sorted(self.joined):
            out.append(self._joined(member))
        return out + self._maybe_go()

    def _fail(self, root: Failure | None, *, exit_code: int | None, reason: str, permanent: bool = False,
              exhausted: bool = False, fallback: bool = False, message: str | None = None) -> list[Out]:
        info = root.info if root is not None else {}
        code = exit_code if exit_code is not None else EX_TEMPFAIL
        if code is None or not 1 <= int(code) <= 255:
            code = EX_TEMPFAIL
        self.phase = FAILED
        self.outcome = {"type": FAIL, "round": self.round, "rank": info.get("rank"),
                        "member": root.member if root is not None else None, "exit_code": code,
                        "rank_exit_code": info.get("exit_code"),
                        "reason": reason, "message": message or info.get("message"), "tail": info.get("tail") or [],
                        "local_rank": info.get("local_rank"), "pid": info.get("pid"),
                        "returncode": info.get("returncode"), "signal": info.get("signal"),
                        "permanent": permanent, "exhausted": exhausted,
                        "fallback": fallback, "counted": self.count.counted(self.round),
                        "max_restarts": self.policy.max_restarts}
        event = {k: v for k, v in self.outcome.items() if k != "type"}
        return [Out(ALL, self.outcome), self._event(EV_FAILED, **event)]
