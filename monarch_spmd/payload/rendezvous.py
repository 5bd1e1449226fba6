"""The restart-in-place protocol: its messages, the back-off rule and the coordinator's state machine.

Where it sits: in the payload (standard library only, shipped into pods), above :mod:`.failures`
and below :mod:`.agent`, which owns the sockets and the processes and feeds this module's
:class:`Coordinator` what it receives. Nothing here does I/O or reads a clock: every method takes
``now`` (a monotonic time) and returns what to send, so the whole protocol is unit-tested from
tables (tests/unit/test_rendezvous.py). docs/restart-in-place.md is the protocol's reference: the
rounds, the barrier, the failure cases and the observer events, field by field.

In short: member m (one agent, one pod) says ``hello``, then ``join`` for round r once every
process of its earlier rounds is gone; the coordinator sends ``go`` r when every member has
joined r and the round's back-off has passed. A ``failure`` makes the coordinator send ``stop``
r to all; each member stops its processes, reports ``exited`` and joins r+1; once every live
member has, the coordinator judges the root cause (the earliest failure of r) and sends either
nothing more (round r+1 is open: ``go`` follows) or ``fail``. When every member's processes
exited 0, ``finish``. Observers get ``welcome`` (state and history) and then every event.
"""

from __future__ import annotations

import hmac
import json
import math
import secrets
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from . import failures, stacks
from .names import EX_TEMPFAIL

#: The protocol's version: fields and event types may be added within it, never changed.
VERSION: Final = 1
VERSIONS: Final = (VERSION,)
#: The longest line either side accepts.
MAX_LINE: Final = 1 << 20

# --- message types ------------------------------------------------------------------------------
HELLO: Final = "hello"
WELCOME: Final = "welcome"
REFUSED: Final = "refused"
JOIN: Final = "join"
GO: Final = "go"
RUNNING: Final = "running"
FAILURE: Final = "failure"
EXITED: Final = "exited"
STOP: Final = "stop"
FINISH: Final = "finish"
FAIL: Final = "fail"
LEAVE: Final = "leave"
HEARTBEAT: Final = "hb"
HANG: Final = "hang"
FREEZE: Final = "freeze"
FROZEN: Final = "frozen"
DUMP: Final = "dump"
STACKS: Final = "stacks"
ASSIGN: Final = "assign"

ROLE_MEMBER: Final = "member"
ROLE_OBSERVER: Final = "observer"
ROLE_SPARE: Final = "spare"
ROLES: Final = (ROLE_MEMBER, ROLE_OBSERVER, ROLE_SPARE)

# --- observer events (docs/restart-in-place.md, "The observer protocol") --------------------------
EV_ROUND: Final = "round"
EV_JOINED: Final = "joined"
EV_STARTED: Final = "started"
EV_RUNNING: Final = "running"
EV_ALL_RUNNING: Final = "all_running"
EV_FAILURE: Final = "failure"
EV_LOST: Final = "lost"
EV_EXITED: Final = "exited"
EV_RESTART: Final = "restart"
EV_PROGRESS: Final = "progress"
EV_HANG: Final = "hang"
EV_SPARE: Final = "spare"
EV_TAKEOVER: Final = "takeover"
EV_RESIZE: Final = "resize"
EV_SUCCEEDED: Final = "succeeded"
EV_FAILED: Final = "failed"
#: Events kept in the history a (re)connecting observer receives.
HISTORY_EVENTS: Final = frozenset({EV_ROUND, EV_STARTED, EV_ALL_RUNNING, EV_HANG, EV_FAILURE, EV_LOST, EV_TAKEOVER,
                                   EV_RESIZE, EV_RESTART, EV_SUCCEEDED, EV_FAILED})
HISTORY_LIMIT: Final = 5000
#: The newest history events always kept whole (with their output lines), whatever their size.
HISTORY_WHOLE: Final = 12

# --- phases -------------------------------------------------------------------------------------
JOINING: Final = "joining"
RUNNING_PHASE: Final = "running"
STOPPING: Final = "stopping"
FINISHED: Final = "finished"
FAILED: Final = "failed"

# --- reasons ------------------------------------------------------------------------------------
REASON_ERROR: Final = "Error"
REASON_SIGNAL: Final = "Signal"
REASON_OOM: Final = "OOMKilled"
REASON_WATCHDOG: Final = "WatchdogTimeout"
REASON_NO_PROGRESS: Final = "NoProgress"
REASON_MEMBER_LOST: Final = "MemberLost"
REASON_ROUND_TIMEOUT: Final = "RoundTimeout"
REASON_REPEATED: Final = "RepeatedFailure"
REASON_COORDINATOR_LOST: Final = "CoordinatorLost"
REASON_COORDINATOR_UNREACHABLE: Final = "CoordinatorUnreachable"
#: An elastic gang restarts to take in a member that is ready (torchrun: "membership changes do
#: not count as retries"): a disruption, never counted against maxRestarts, no back-off.
REASON_MEMBERSHIP: Final = "MembershipChange"
#: Why a member is lost (the ``reason`` of a ``lost`` event).
LOST_LEFT: Final = "Left"
LOST_DISCONNECTED: Final = "Disconnected"
LOST_HEARTBEAT: Final = "HeartbeatTimeout"
LOST_SUPERSEDED: Final = "Superseded"
LOST_NOT_STOPPED: Final = "NotStopped"

#: Seconds between heartbeats, each way; a peer silent for HEARTBEAT_TIMEOUT is lost (an agent
#: alive but stuck). A peer whose node is gone (frozen, partitioned, powered off) is noticed
#: sooner by the kernel: within USER_TIMEOUT_MS of its last acknowledgement while heartbeats are
#: in flight, or by keepalive (probes after KEEPALIVE_IDLE seconds of silence, every
#: KEEPALIVE_INTERVAL, KEEPALIVE_COUNT times, ~7 s) on a quiet connection. The kernel answers
#: for a process that is merely starved of CPU (a node starting a thousand interpreters), which
#: application heartbeats cannot tell from a dead one.
HEARTBEAT_INTERVAL: Final = 1.0
HEARTBEAT_TIMEOUT: Final = 60.0
KEEPALIVE_IDLE: Final = 2
KEEPALIVE_INTERVAL: Final = 1
KEEPALIVE_COUNT: Final = 5
#: Keepalive probes are not sent while data waits to be acknowledged, and with heartbeats every
#: second each way there always is some towards a peer whose node froze: TCP_USER_TIMEOUT closes
#: a connection whose sent data stays unacknowledged this long (milliseconds). The peer's kernel
#: acknowledges whatever its processes' CPU load, so a starved agent is never taken for a lost one.
USER_TIMEOUT_MS: Final = 8000
#: The TCP options every protocol connection gets (by their names in :mod:`socket`; the level is
#: IPPROTO_TCP), with SO_KEEPALIVE on.
TCP_OPTIONS: Final = (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                      ("TCP_KEEPCNT", KEEPALIVE_COUNT), ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS))
#: Seconds the coordinator waits, after ``freeze``, for every live member's ``frozen`` before it
#: sends ``dump`` anyway (a member that has not frozen its ranks by then shows what it can).
FREEZE_SECONDS: Final = 5.0
#: Seconds it waits, after ``dump``, for every live member's ``stacks`` before it judges with the
#: stacks it has (a member's ranks have 10 s to write theirs, :data:`.hangs.CAPTURE_SECONDS`).
STACKS_SECONDS: Final = 20.0
#: Seconds a member that said ``hang`` waits for ``freeze`` before it takes its own ranks' stacks
#: and judges them alone (a coordinator that does not answer).
HANG_WAIT_SECONDS: Final = 15.0
#: The reasons a ``hang`` may give.
HANG_REASONS: Final = (REASON_NO_PROGRESS, REASON_WATCHDOG)
#: Seconds an agent cut off from its coordinator gives its processes between SIGTERM and SIGKILL
#: (its fence; the stop grace is for restarts its coordinator asked for): a member that lost its
#: coordinator cannot know whether the gang went on without it, and must not run beside it.
FENCE_GRACE: Final = 1.0
#: Seconds, after a member is lost without a word (its connection ended, broke or fell silent),
#: before the next round may start: the agent, if it runs at all, fences itself within its loop's
#: turn and FENCE_GRACE of noticing (a node cut off notices when its traffic is back).
FENCE_SECONDS: Final = FENCE_GRACE + 0.5
#: Seconds, beyond the stop grace, that a member that said ``leave`` (its pod deleted: its
#: processes got SIGTERM, the kubelet's SIGKILL follows after the grace) may take to end before
#: the next round starts without its word (its agent's end is the word).
LEAVE_MARGIN: Final = 5.0
#: The coordinator's own silence (its server's loop did not turn for this long: its node was
#: frozen, or it starved; it turns every 0.1 s otherwise). A round it stops within STALL_WINDOW
#: after one is stopped with the fence (``stop`` with ``fence``: every agent ends its processes
#: within FENCE_GRACE): the gang may have been recreated without it meanwhile.
STALL_SECONDS: Final = 3.0
STALL_WINDOW: Final = 2.0
#: A silence of its own this long (the node controller's grace: a node that stopped reporting
#: for 40 s is marked NotReady, its pods not ready, and the operator takes them for lost) makes
#: the coordinator give its gang up when it runs again (Coordinator.stalled): a shorter one
#: cannot have had it recreated that way.
STALL_GIVE_UP: Final = 40.0
#: Seconds a spare given a member's place (``assign``) has to say hello as that member; then the
#: place is free again (for another spare, or the operator's new pod), not stranded until the
#: round's join timeout.
ASSIGN_SECONDS: Final = 10.0
#: Seconds between ``progress`` events while a round runs.
PROGRESS_EVERY: Final = 5.0
#: How many lines of a failed rank's output travel with its failure.
TAIL_LINES: Final = 20

# --- the defaults of the policy inputs (docs/restart-in-place.md, the inputs table) --------------
DEFAULT_BACKOFF: Final = 10.0
DEFAULT_MAX_BACKOFF: Final = 300.0
DEFAULT_BACKOFF_RESET: Final = 300.0
DEFAULT_JOIN_TIMEOUT: Final = 120.0
DEFAULT_MEMBER_FAILURE_LIMIT: Final = 3
#: An elastic gang's round, once its minimum of members joined, waits this long for the others
#: before it starts smaller (torchrun's last call, 30 s there).
DEFAULT_ELASTIC_WAIT: Final = 10.0


# --- bounds (docs/restart-in-place.md, "Trust and bounds") ------------------------------------------
#: The longest line a connection may send before it has authenticated (its ``hello``).
MAX_HELLO_LINE: Final = 4096
#: The longest line a member may send (a failure with its tail is the largest).
MAX_MEMBER_LINE: Final = 256 * 1024
#: Seconds a new connection has to send a valid ``hello`` before it is closed.
HELLO_TIMEOUT: Final = 5.0
#: Connections that have not said ``hello`` yet, at most; more are closed as they come.
MAX_PENDING: Final = 64
#: Observers at once, at most; one more is refused.
MAX_OBSERVERS: Final = 16
#: Bytes waiting to be sent to one connection, at most: an observer that reads slower than the
#: events come is dropped (it reconnects and gets a welcome), never buffered without limit.
MAX_OUTBOX: Final = 2 * 1024 * 1024
#: A message's or reason's text, in characters, at most (longer is cut).
MAX_TEXT: Final = 2048
#: One output line carried by a failure (tail), a heartbeat or a progress event, in characters.
MAX_OUTPUT_LINE: Final = 512
#: The history a welcome carries, in bytes of JSON at most: the oldest events lose their output
#: first, then go.
MAX_HISTORY_BYTES: Final = 512 * 1024
#: Rows of a running or exited message (processes per member), at most.
MAX_PROCS: Final = 4096
#: The largest spare index a hello may carry (the spec allows far fewer spares per job,
#: spec.MAX_SPARES; a spare made after others were used gets a new index).
MAX_SPARE_INDEX: Final = 1023
#: The largest round, rank, pid or member id accepted.
MAX_INT: Final = (1 << 31) - 1
#: A node name, incarnation, reason or signal name, in characters, at most.
MAX_NAME: Final = 253


class ProtocolError(ValueError):
    """A line that is not a protocol message (not JSON, no type, too long, a field of the wrong
    type or out of range)."""


def cut(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters: its start and a note of how much was cut."""
    if len(text) <= limit:
        return text
    note = f" ... [{len(text) - limit} characters cut]"
    return text[:max(0, limit - len(note))] + note


def cut_lines(lines: Iterable[str], count: int = TAIL_LINES, limit: int = MAX_OUTPUT_LINE) -> list[str]:
    """The last ``count`` lines, each cut to ``limit`` characters."""
    return [cut(str(line), limit) for line in list(lines)[-count:]]


def _int(message: Mapping[str, Any], key: str, lo: int, hi: int, *, optional: bool = False) -> int | None:
    value = message.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ProtocolError(f"{message.get('type')}.{key}: {str(value)[:40]!r} is not valid; expected an integer "
                            f"{lo}..{hi}{' or null' if optional else ''}")
    return value


def _str(message: Mapping[str, Any], key: str, limit: int, *, optional: bool = True) -> str | None:
    value = message.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"{message.get('type')}.{key}: expected a string, got {type(value).__name__}")
    return cut(value, limit)


def _number(message: Mapping[str, Any], key: str) -> float | None:
    value = message.get(key)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ProtocolError(f"{message.get('type')}.{key}: {str(value)[:40]!r} is not valid; expected a "
                            "non-negative number or null")
    return float(value)


def _lines(message: Mapping[str, Any], key: str) -> list[str]:
    value = message.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(line, str) for line in value):
        raise ProtocolError(f"{message.get('type')}.{key}: expected a list of strings")
    return cut_lines(value)


def _proc_row(message: Mapping[str, Any], index: int, row: Any) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise ProtocolError(f"{message.get('type')}.procs: expected objects, got {type(row).__name__}")
    kind = message.get("type")
    row = {**row, "type": f"{kind}.procs[{index}]"}  # how a bad field of the row is named
    out: dict[str, Any] = {"rank": _int(row, "rank", 0, MAX_INT), "local_rank": _int(row, "local_rank", 0, MAX_INT),
                           "pid": _int(row, "pid", 0, MAX_INT, optional=True)}
    if kind == EXITED:
        out.update(exit_code=_int(row, "exit_code", 0, 255, optional=True),
                   returncode=_int(row, "returncode", -255, 255, optional=True),
                   signal=_str(row, "signal", MAX_NAME), stopped=bool(row.get("stopped") is True))
        reason = _str(row, "reason", MAX_NAME)
        if reason is not None:
            out["reason"] = reason
    return out


def _stacks_row(index: int, row: Any) -> dict[str, Any]:
    """One rank of a ``stacks`` message, checked: its process (as an ``exited`` row), what the
    detector said of it, its last lines, its silence and its state (:func:`.stacks.from_row`)."""
    if not isinstance(row, Mapping):
        raise ProtocolError(f"stacks.ranks: expected objects, got {type(row).__name__}")
    named = {**row, "type": f"stacks.ranks[{index}]"}
    out: dict[str, Any] = {"rank": _int(named, "rank", 0, MAX_INT), "local_rank": _int(named, "local_rank", 0, MAX_INT),
                           "pid": _int(named, "pid", 0, MAX_INT, optional=True),
                           "exit_code": _int(named, "exit_code", 0, 255, optional=True),
                           "returncode": _int(named, "returncode", -255, 255, optional=True),
                           "signal": _str(named, "signal", MAX_NAME), "said": _str(named, "said", MAX_TEXT) or "",
                           "tail": _lines(named, "tail"), "silent": _number(named, "silent") or 0.0}
    try:
        out["state"] = stacks.from_row(out["rank"], row)
    except ValueError as e:
        raise ProtocolError(f"stacks.ranks[{index}].{e}") from None
    return out


def check_hello(message: Mapping[str, Any], members: int) -> dict[str, Any]:
    """A ``hello``'s fields, checked (types, ranges, sizes); raises :class:`ProtocolError`."""
    versions = message.get("versions")
    if versions is None:
        versions = [message.get("v", VERSION)]
    if not isinstance(versions, list) or not 1 <= len(versions) <= 16 \
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in versions):
        raise ProtocolError("hello.versions: expected a list of 1..16 integers")
    role = message.get("role")
    if role not in ROLES:
        raise ProtocolError(f"hello.role: {str(role)[:40]!r} is not valid; expected one of {', '.join(ROLES)}")
    out: dict[str, Any] = {"role": role, "versions": versions, "token": _str(message, "token", 256) or ""}
    if role == ROLE_MEMBER:
        if members < 1:
            raise ProtocolError("hello: this coordinator has no members")
        out.update(member=_int(message, "member", 0, members - 1),
                   incarnation=_str(message, "incarnation", 64) or "",
                   disruptions=_int(message, "disruptions", 0, MAX_INT, optional=True) or 0,
                   node=_str(message, "node", MAX_NAME) or "",
                   spare=_int(message, "spare", 0, MAX_SPARE_INDEX, optional=True))
    elif role == ROLE_SPARE:
        out.update(spare=_int(message, "spare", 0, MAX_SPARE_INDEX), incarnation=_str(message, "incarnation", 64) or "",
                   node=_str(message, "node", MAX_NAME) or "")
    return out


def check_member_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A member's message after ``hello``, checked and cut to the bounds; raises
    :class:`ProtocolError` for an unknown type, a field of the wrong type or out of range."""
    kind = message.get("type")
    if kind == HEARTBEAT:
        return {"type": kind, "idle": _number(message, "idle"), "rank": _int(message, "rank", 0, MAX_INT, optional=True),
                "line": _str(message, "line", MAX_OUTPUT_LINE) or ""}
    if kind == LEAVE:
        return {"type": kind, "at": _number(message, "at")}
    if kind not in (JOIN, RUNNING, FAILURE, EXITED, HANG, FROZEN, STACKS):
        raise ProtocolError(f"a member may not send {str(kind)[:40]!r}")
    out: dict[str, Any] = {"type": kind, "round": _int(message, "round", 0, MAX_INT)}
    if kind == HANG:
        reason = message.get("reason")
        if reason not in HANG_REASONS:
            raise ProtocolError(f"hang.reason: {str(reason)[:40]!r} is not valid; expected one of "
                                f"{', '.join(HANG_REASONS)}")
        out.update(rank=_int(message, "rank", 0, MAX_INT), reason=reason,
                   message=_str(message, "message", MAX_TEXT) or "", at=_number(message, "at"))
    elif kind == STACKS:
        ranks = message.get("ranks")
        if not isinstance(ranks, list) or len(ranks) > MAX_PROCS:
            raise ProtocolError(f"stacks.ranks: expected a list of at most {MAX_PROCS} objects")
        detail = message.get("detail", True)
        if not isinstance(detail, bool):
            raise ProtocolError("stacks.detail: expected true or false")
        out.update(detail=detail, ranks=[_stacks_row(i, row) for i, row in enumerate(ranks)])
    if kind in (RUNNING, EXITED):
        procs = message.get("procs")
        if not isinstance(procs, list) or len(procs) > MAX_PROCS:
            raise ProtocolError(f"{kind}.procs: expected a list of at most {MAX_PROCS} objects")
        out["procs"] = [_proc_row(message, i, row) for i, row in enumerate(procs)]
    elif kind == FAILURE:
        at = _number(message, "at")
        out.update(rank=_int(message, "rank", 0, MAX_INT, optional=True),
                   local_rank=_int(message, "local_rank", 0, MAX_INT, optional=True),
                   pid=_int(message, "pid", 0, MAX_INT, optional=True),
                   exit_code=_int(message, "exit_code", 0, 255, optional=True),
                   returncode=_int(message, "returncode", -255, 255, optional=True),
                   signal=_str(message, "signal", MAX_NAME), reason=_str(message, "reason", MAX_NAME),
                   message=_str(message, "message", MAX_TEXT), tail=_lines(message, "tail"), at=at)
    return out


def _event_size(event: Mapping[str, Any]) -> int:
    return len(encode(event))


def encode(message: Mapping[str, Any]) -> bytes:
    """One message as its line: compact JSON and ``\\n``."""
    return json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"


class LineBuffer:
    """Turns the bytes of a connection into messages, one per complete line."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self.limit = limit
        self.partial = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """The messages completed by ``data``.

        Raises:
            ProtocolError: for a line that is not a JSON object with a string ``type``, or one
                longer than the limit.
        """
        *lines, self.partial = (self.partial + data).split(b"\n")
        if len(self.partial) > self.limit:
            raise ProtocolError(f"a line longer than {self.limit} bytes")
        out = []
        for line in lines:
            if len(line) > self.limit:
                raise ProtocolError(f"a line longer than {self.limit} bytes")
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser goes
                raise ProtocolError(f"not JSON: {line[:80]!r} ({e})") from None
            if not isinstance(message, dict) or not isinstance(message.get("type"), str):
                raise ProtocolError(f"not a message (an object with a string type): {line[:80]!r}")
            out.append(message)
        return out


def backoff_seconds(consecutive: int, initial: float, maximum: float) -> float:
    """The wait before the ``consecutive``-th restart in a row (1 = the first after a healthy
    stretch): none for the first, then ``initial`` doubling for each further one, at most
    ``maximum``."""
    if consecutive <= 1 or initial <= 0:
        return 0.0
    return float(min(maximum, initial * 2 ** (consecutive - 2)))


def quorum_reached(joined: Collection[int], members: int) -> bool:
    """Whether every member 0..members-1 joined: a round closes at once (an elastic gang's round
    may also close on fewer, :meth:`Coordinator._maybe_go`)."""
    return all(m in joined for m in range(members))


def group_of(member: int, participants: Sequence[int]) -> tuple[int, int] | None:
    """Member ``member``'s place in an elastic gang's round of ``participants`` (its ``go``'s
    members): (GROUP_RANK, GROUP_WORLD_SIZE), the members numbered densely in member order, as
    torchrun's rendezvous numbers its sorted participants. None: the member is not in the round."""
    if member not in participants:
        return None
    return sorted(participants).index(member), len(participants)


@dataclass(frozen=True)
class Policy:
    """What the coordinator decides a failure with (the worker's MONARCH_SPMD_* policy inputs).

    Attributes:
        max_restarts: restarts counted against the limit (spec.restartPolicy.maxRestarts).
        disruptions: restarts so far that do not count (the operator's disruptions).
        permanent_exit_codes, retryable_exit_codes, permanent_reasons: spec.restartPolicy's.
        backoff, max_backoff, backoff_reset: the back-off rule (:func:`backoff_seconds`); a round
            that ran ``backoff_reset`` seconds before it failed starts the count again.
        join_timeout: seconds a round may stay open after its back-off (or members may take to
            stop) before the gang is given up in place (RoundTimeout: exit 75, recreate).
        member_failure_limit: restarts in place in a row caused by one member before the gang
            is recreated instead (RepeatedFailure).
        min_members: an elastic gang's minimum (torchrun's --nnodes MIN): a round may start with
            this many members once ``elastic_wait`` passed without the others; 0: every member
            (a fixed size).
        elastic_wait: see ``min_members``.
        stop_grace: the pods' grace (terminationGracePeriodSeconds): how long a member that left
            may take to end its processes.
    """

    max_restarts: int = 0
    disruptions: int = 0
    permanent_exit_codes: tuple[int, ...] = ()
    retryable_exit_codes: tuple[int, ...] = ()
    permanent_reasons: tuple[str, ...] = ()
    backoff: float = DEFAULT_BACKOFF
    max_backoff: float = DEFAULT_MAX_BACKOFF
    backoff_reset: float = DEFAULT_BACKOFF_RESET
    join_timeout: float = DEFAULT_JOIN_TIMEOUT
    member_failure_limit: int = DEFAULT_MEMBER_FAILURE_LIMIT
    min_members: int = 0
    elastic_wait: float = DEFAULT_ELASTIC_WAIT
    stop_grace: float = 30.0

    def is_permanent(self, exit_code: int | None, reason: str | None) -> bool:
        return failures.is_permanent(exit_code, reason, permanent_reasons=self.permanent_reasons,
                                     permanent_exit_codes=self.permanent_exit_codes,
                                     retryable_exit_codes=self.retryable_exit_codes)


#: Where an output goes: a member id, every member with a live connection, or the observers.
ALL: Final = "all"
OBSERVERS: Final = "observers"


@dataclass(frozen=True)
class Out:
    """One thing the coordinator wants done: send ``message`` to ``to`` (a member id, ALL or
    OBSERVERS), or with ``drop`` close member ``to``'s superseded connection."""

    to: int | str
    message: Mapping[str, Any]
    drop: bool = False


#: A process failure that came at most this long before a disruption of its round (a member
#: lost, a takeover, a member joining an elastic gang), or any time after it, is taken for that
#: disruption's consequence: the peers' collectives break when a member's processes go, a moment
#: before the member's loss reaches the coordinator (the ranks die first, then the agent's leave
#: or its connection's end), and clocks of nodes differ a little.
CONSEQUENCE_SECONDS: Final = 1.0


@dataclass
class _Failure:
    member: int
    info: dict[str, Any]
    received: int  # the order the coordinator saw it in

    @property
    def key(self) -> tuple[float, int]:
        at = self.info.get("at")
        return (float(at) if isinstance(at, (int, float)) else float("inf"), self.received)

    @property
    def disruption(self) -> bool:
        """Not a process of the program failing: a member lost, or a member joining (a grow)."""
        return self.info.get("reason") in (REASON_MEMBER_LOST, REASON_MEMBERSHIP)


def root_cause(failures: Sequence[_Failure]) -> _Failure:
    """A round's root cause, THE rule of what a restart is charged to: the earliest process
    failure that came more than CONSEQUENCE_SECONDS before every disruption of the round, else
    the earliest disruption (its consequences are not the program's failures); in a round
    without disruptions, the earliest failure."""
    disruptions = [f for f in failures if f.disruption]
    crashes = [f for f in failures if not f.disruption]
    if not disruptions:
        return min(crashes, key=lambda f: f.key)
    first = min(disruptions, key=lambda f: f.key)
    independent = [f for f in crashes if f.key[0] < first.key[0] - CONSEQUENCE_SECONDS]
    return min(independent, key=lambda f: f.key) if independent else first


@dataclass
class _Capture:
    """A hang being captured across the gang: who asked, who has frozen and reported."""

    member: int
    rank: int
    reason: str
    message: str
    at: float | None
    deadline: float
    dumping: bool = False
    detail: bool = True
    frozen: set[int] = field(default_factory=set)
    reported: set[int] = field(default_factory=set)
    rows: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # rank: (member, row)


@dataclass
class Coordinator:
    """The coordinator's state: one gang of ``members`` agents, from round ``first_round`` on.

    Feed it what the members say (:meth:`hello`, :meth:`join`, :meth:`running`, :meth:`failure`,
    :meth:`exited`, :meth:`lost`, :meth:`heartbeat`) and call :meth:`tick` now and then; each
    returns the :class:`Out` list to carry out, in order. ``wall`` stamps events with Unix time.
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
        self.disruptions = self.policy.disruptions
        self.incarnations: dict[int, str] = {}
        self.nodes: dict[int, str] = {}
        self.seen: set[int] = set()
        self.replacements: set[int] = set()
        self.joined: set[int] = set()
        self.next_joined: set[int] = set()
        self.running_members: set[int] = set()
        self.done: set[int] = set()
        self.failures: list[_Failure] = []
        self.received = 0
        self.seq = 0
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_LIMIT)
        self.history_bytes = 0
        self.history_compacted = 0
        self.history_dropped = 0
        self.go_at = self.now
        self.deadline: float | None = None  # the first round has none (see start)
        self.stop_deadline: float | None = None
        self.first_failure_at: float | None = None
        self.all_running_at: float | None = None
        self.consecutive = 0
        self.streak_member: int | None = None
        self.streak = 0
        self.idle: dict[int, tuple[float, int | None, str]] = {}
        self.last_progress_event = self.now
        self.outcome: dict[str, Any] | None = None
        self._cause: dict[str, Any] | None = None
        #: A hang whose stacks are being taken on every member (None: none).
        self.capture: _Capture | None = None
        #: Hot spares connected and not yet given a member's place: index -> (incarnation, node).
        self.spares: dict[int, tuple[str, str]] = {}
        #: Members whose place a spare took, whose loss is not counted against maxRestarts.
        self.taken_over: set[int] = set()
        #: Members whose place a spare was given and who have not said hello as it yet:
        #: member -> (spare, until when it may).
        self.assigned: dict[int, tuple[int, float]] = {}
        #: Members held by a spare that arrived: member -> (spare, its incarnation as the member).
        #: A pod created for the same loss is turned away while that agent runs (see :meth:`admits`).
        self.spare_held: dict[int, tuple[int, str]] = {}
        self.takeovers = 0
        #: The least members a round starts with (the whole gang unless elastic).
        self.min_members = self.members if not 0 < self.policy.min_members < self.members else self.policy.min_members
        #: The members of the round that runs (or ran last): every member unless elastic.
        self.round_members: set[int] = set(range(self.members))
        #: Members ready for the next round while a smaller elastic round runs (it grows).
        self.waiting: set[int] = set()
        #: When an open elastic round had its minimum joined (its wait for the others runs).
        self.quorum_at: float | None = None
        #: Agents lost whose processes may still run, (member, incarnation) -> until when: the
        #: next round starts only once each is gone (:meth:`departed`) or its time is up.
        self.departing: dict[tuple[int, str], float] = {}
        #: When the coordinator last came back from a silence of STALL_SECONDS (None: never).
        self.stalled_at: float | None = None
        #: Observers connected now; when the last one's connection broke (not closed by it).
        self.observers = 0
        self.observer_broke_at: float | None = None
        #: When an observer's heartbeat last came (None: none ever: an observer of an earlier
        #: version, or none connected).
        self.observer_beat_at: float | None = None
        #: When a member other than 0 was last lost by silence or a broken connection.
        self.member_silent_at: float | None = None

    def _clock(self, now: float) -> None:
        self.now = max(self.now, now)

    def stalled(self, now: float, seconds: float = STALL_SECONDS) -> list[Out]:
        """The coordinator itself was not running for ``seconds`` (at least STALL_SECONDS) until
        ``now``: its node froze, or it starved. What it stops next is stopped with the fence; a
        stall of STALL_GIVE_UP or more gives the gang up (fallback): the operator, which saw its
        node stop reporting, may have recreated it elsewhere meanwhile."""
        self._clock(now)
        self.stalled_at = now
        if seconds >= STALL_GIVE_UP and self.phase not in (FINISHED, FAILED):
            return self._fail(None, exit_code=EX_TEMPFAIL, reason=REASON_COORDINATOR_LOST, fallback=True,
                              message=f"the coordinator was stopped for {seconds:.0f}s (its node froze or starved): "
                                      "its gang may have been recreated meanwhile; the gang must be recreated")
        return []

    @property
    def elastic(self) -> bool:
        """Whether a round may start with fewer than every member."""
        return self.min_members < self.members

    # --- events -------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Out:
        self.seq += 1
        event = {"type": kind, "seq": self.seq, "time": self.wall(), "round": fields.pop("round", self.round), **fields}
        if kind in HISTORY_EVENTS:
            self._remember(event)
        return Out(OBSERVERS, event)

    def _remember(self, event: dict[str, Any]) -> None:
        """Keeps ``event`` in the history, within MAX_HISTORY_BYTES, so a welcome always fits a
        line: the oldest events first lose their output lines and long texts (``compacted``), the
        newest HISTORY_WHOLE never; then the oldest go (``history_dropped`` counts them)."""
        if len(self.history) == self.history.maxlen:
            self._forget_oldest()
        self.history.append(event)
        self.history_bytes += _event_size(event)
        while self.history_bytes > MAX_HISTORY_BYTES and len(self.history) > 1:
            i = self.history_compacted  # compacted events are always the oldest ones
            if i < len(self.history) - HISTORY_WHOLE:
                old = self.history[i]
                small = {k: v for k, v in old.items() if k not in ("tail", "cause")}
                if isinstance(old.get("cause"), Mapping):
                    small["cause"] = {k: v for k, v in old["cause"].items() if k != "tail"}
                if isinstance(small.get("message"), str):
                    small["message"] = cut(small["message"], 200)
                small["compacted"] = True
                self.history_bytes += _event_size(small) - _event_size(old)
                self.history[i] = small
                self.history_compacted += 1
            else:
                self._forget_oldest()

    def _forget_oldest(self) -> None:
        self.history_bytes -= _event_size(self.history.popleft())
        self.history_compacted = max(0, self.history_compacted - 1)
        self.history_dropped += 1

    def observer_joined(self, now: float | None = None) -> list[Out]:
        """An observer (the operator, the local runner) said hello: a round held while the
        coordinator looked cut off (:meth:`isolated`) may start."""
        if now is not None:
            self._clock(now)
        self.observers += 1
        self.observer_broke_at = None
        return self._maybe_go()

    def observer_beat(self, now: float) -> list[Out]:
        """An observer's heartbeat (observers of this version send one every HEARTBEAT_INTERVAL):
        the operator still hears this coordinator; a round held for it may start."""
        self._clock(now)
        self.observer_beat_at = now
        return self._maybe_go()

    def observer_left(self, broken: bool, now: float) -> list[Out]:
        """An observer's connection ended; ``broken``: by an error or silence, not closed by it."""
        self._clock(now)
        self.observers = max(0, self.observers - 1)
        if broken:
            self.observer_broke_at = now
        if self.phase == STOPPING and self.unseen():
            return [Out(ALL, self._stop_message())]  # out of sight while stopping: within the fence
        return []

    def isolated(self) -> bool:
        """Whether this coordinator may be the one cut off from the cluster: it lost a member by
        silence, and no observer (the operator) has been heard since (its heartbeat). Its node
        may then be the one partitioned, and the operator, hearing it no more, recreating the
        gang elsewhere: it starts no round (an elastic gang would shrink to the members beside
        it) and stops what runs within the fence, until an observer is heard again."""
        if self.member_silent_at is None:
            return False
        if self.observers and self.observer_beat_at is None:
            return False  # an observer of an earlier version, which sends nothing: it is there
        return self.observer_beat_at is None or self.observer_beat_at <= self.member_silent_at

    def observer_welcome(self) -> dict[str, Any]:
        """The ``welcome`` an observer gets: the state now and the history."""
        return {"type": WELCOME, "v": VERSION, "run_id": self.run_id, "members": self.members,
                "world_size": self.world_size, "first_round": self.first_round, "round": self.round,
                "phase": self.phase, "max_restarts": self.policy.max_restarts, "disruptions": self.disruptions,
                "time": self.wall(), "seq": self.seq, "history": list(self.history),
                "history_dropped": self.history_dropped, "spares": len(self.spares),
                **({"min_members": self.min_members, "round_members": sorted(self.round_members)} if self.elastic else {})}

    def start(self) -> list[Out]:
        """The first round's ``round`` event (call once). The first round has no deadline: its
        pods may wait for the scheduler, which the operator bounds (schedulingTimeoutSeconds)."""
        return [self._event(EV_ROUND, restart_count=self.round, members=self.members, backoff_seconds=0.0,
                            cause=None)]

    # --- members ------------------------------------------------------------------------------

    def live(self) -> set[int]:
        return set(self.incarnations)

    def _in_round(self) -> set[int]:
        """The live members of the round that runs (an elastic gang's waiting ones are not)."""
        return self.live() & self.round_members

    def hello(self, member: int, incarnation: str, now: float, *, disruptions: int = 0,
              node: str = "", spare: int | None = None) -> list[Out]:
        """A member's agent connected (a new incarnation supersedes an older one); ``spare``: the
        hot spare it was (see :meth:`admits`)."""
        self._clock(now)
        out: list[Out] = []
        pending = self.assigned.get(member)
        if pending is not None and spare == pending[0]:
            del self.assigned[member]  # the spare arrived in its place
            self.spare_held[member] = (spare, incarnation)
        elif spare is None:
            self.spare_held.pop(member, None)
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

    def _grow(self, member: int) -> list[Out]:
        """Member ``member`` is ready while a smaller elastic round runs without it: every member
        restarts in a round with it (torchrun's agents restart their workers when a node waits)."""
        if member in self.waiting:
            return []
        self.waiting.add(member)
        size = len(self.round_members)
        message = f"member {member} is ready: the gang grows from {size} to {size + len(self.waiting)} members"
        self.received += 1
        self.failures.append(_Failure(member, {"rank": None, "exit_code": None, "reason": REASON_MEMBERSHIP,
                                               "message": message, "tail": [], "at": self.wall(), "grow": True},
                                      self.received))
        out = [self._event(EV_RESIZE, member=member, size=size, next_size=size + len(self.waiting),
                           node=self.nodes.get(member, ""), message=message)]
        return out + self._stop()

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
        self.failures.append(_Failure(member, info, self.received))
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

    def _stop_message(self) -> dict[str, Any]:
        stop: dict[str, Any] = {"type": STOP, "round": self.round}
        if self.unseen():
            # Just back from a silence of its own, or out of the operator's sight: the gang may be
            # going on elsewhere, so nothing of this round may linger (every agent ends its
            # processes within the fence).
            stop["fence"] = True
        return stop

    def unseen(self) -> bool:
        """Whether the gang may have been recreated without this coordinator knowing: it is back
        from a silence of its own (STALL_WINDOW), looks cut off (:meth:`isolated`), or the
        operator's observer connection broke and none is back. What it stops then, it stops
        within the fence (a checkpoint a rank writes on SIGTERM is cut short while the operator
        is out of sight, the price of never running beside a new gang)."""
        return ((self.stalled_at is not None and self.now - self.stalled_at <= STALL_WINDOW) or self.isolated()
                or (self.observers == 0 and self.observer_broke_at is not None))

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

    def lost(self, member: int, reason: str, now: float, *, at: float | None = None,
             heard: float | None = None) -> list[Out]:
        """Member ``member``'s agent is gone: it left, its connection closed, or it fell silent.

        When it went, for telling its consequences from the program's failures (:func:`root_cause`):
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
        self.departing[(member, incarnation)] = now + self._fence(reason)
        out = [self._event(EV_LOST, member=member, reason=reason, node=self.nodes.get(member, ""))]
        if reason in (LOST_DISCONNECTED, LOST_HEARTBEAT) and member != 0:
            self.member_silent_at = now
        takeover = self._take_over(member)
        out.extend(takeover)
        gone = f"member {member}'s agent is gone ({reason})"
        if takeover:
            gone += "; a hot spare takes its place"
        if member in self.waiting or (self.phase in (RUNNING_PHASE, STOPPING) and member not in self.round_members):
            self.waiting.discard(member)  # not in the round that runs: nothing of it stops
            self.next_joined.discard(member)
            return out + self._maybe_decide()
        if self.phase == JOINING:
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
                self.failures.append(_Failure(member, {"reason": REASON_MEMBER_LOST, "exit_code": None,
                                                       "rank": None, "at": at, "message": gone,
                                                       "takeover": bool(takeover)}, self.received))
            out.extend(self._maybe_decide())
        return out

    def _fence(self, reason: str) -> float:
        """How long a lost member's processes may still run: a member that left (its pod is being
        deleted) until the kubelet's SIGKILL; one superseded until its own stop grace; one that
        went without a word until it fences itself (FENCE_SECONDS)."""
        if reason == LOST_LEFT:
            return self.policy.stop_grace + LEAVE_MARGIN
        if reason == LOST_SUPERSEDED:
            return self.policy.stop_grace + FENCE_SECONDS
        return FENCE_SECONDS

    def departed(self, member: int, incarnation: str, now: float) -> list[Out]:
        """A lost member's agent has ended (its connection's end after it left): none of its
        processes runs any more."""
        self._clock(now)
        self.departing.pop((member, incarnation), None)
        return self._maybe_go()

    def _fenced(self) -> bool:
        """Whether no lost member's process may still run (the next round may start)."""
        for key, until in list(self.departing.items()):
            if self.now >= until:
                del self.departing[key]
        return not self.departing

    # --- hot spares ----------------------------------------------------------------------------

    def spare_hello(self, spare: int, incarnation: str, now: float, *, node: str = "") -> list[Out]:
        """A spare's agent connected (a new incarnation supersedes an older one): it waits, warm,
        for a lost member's place. A member lost while no spare was ready gets this one at once."""
        self._clock(now)
        old = self.spares.get(spare)
        out: list[Out] = []
        if old is not None and old[0] != incarnation:
            out.append(Out(f"{ROLE_SPARE}:{spare}", {"type": FAIL, "reason": LOST_SUPERSEDED}, drop=True))
        self.spares[spare] = (incarnation, cut(node, MAX_NAME))
        out.append(Out(f"{ROLE_SPARE}:{spare}", {"type": WELCOME, "v": VERSION, "round": self.round, "phase": self.phase}))
        out.append(self._event(EV_SPARE, spare=spare, node=self.spares[spare][1], state="ready", ready=len(self.spares)))
        if self.phase in (FINISHED, FAILED):
            out.append(Out(f"{ROLE_SPARE}:{spare}", {"type": FINISH, "round": self.round}))
            return out
        waiting = [m for m in range(1, self.members) if m in self.seen and m not in self.incarnations
                   and m not in self.taken_over]
        if waiting:
            out.extend(self._take_over(waiting[0]))
        return out

    def spare_lost(self, spare: int, incarnation: str | None, now: float) -> list[Out]:
        """A waiting spare's connection closed (its pod is gone): it is no longer ready."""
        self._clock(now)
        if spare not in self.spares or (incarnation is not None and self.spares[spare][0] != incarnation):
            return []
        _, node = self.spares.pop(spare)
        return [self._event(EV_SPARE, spare=spare, node=node, state="gone", ready=len(self.spares))]

    def _take_over(self, member: int) -> list[Out]:
        """Member ``member`` is lost: the lowest ready spare takes its place (``assign``), and joins
        the next round as that member. Member 0 runs the coordinator: its loss ends the gang."""
        if member == 0 or not self.spares or self.phase in (FINISHED, FAILED):
            return []
        spare = min(self.spares)
        _, node = self.spares.pop(spare)
        self.taken_over.add(member)
        self.assigned[member] = (spare, self.now + ASSIGN_SECONDS)
        self.takeovers += 1
        return [Out(f"{ROLE_SPARE}:{spare}", {"type": ASSIGN, "member": member, "round": self.round}),
                self._event(EV_TAKEOVER, member=member, spare=spare, node=node, ready=len(self.spares),
                            takeovers=self.takeovers)]

    def admits(self, member: int, spare: int | None) -> str | None:
        """Why a member's hello is refused, or None: while a spare given member ``member``'s place
        is on its way or holds it, a pod of that member that is not that spare (a replacement
        created for the same loss) is turned away: it would supersede the spare and restart the
        gang once more for nothing."""
        if self.phase in (FINISHED, FAILED):
            return None
        pending = self.assigned.get(member)
        if pending is not None and spare != pending[0]:
            return f"member {member}'s place is taken by hot spare {pending[0]}"
        held = self.spare_held.get(member)
        if spare is None and held is not None and self.incarnations.get(member) == held[1]:
            return f"member {member}'s place is held by hot spare {held[0]}, whose agent runs"
        return None

    def _assignments(self) -> list[Out]:
        """Spares that did not say hello as the member they were given within ASSIGN_SECONDS (the
        spare's pod went, its connection was cut): the place is free again, for another spare."""
        out: list[Out] = []
        for member, (spare, until) in sorted(self.assigned.items()):
            if self.now < until or member in self.incarnations:
                continue
            del self.assigned[member]
            self.taken_over.discard(member)
            out.append(self._event(EV_TAKEOVER, member=member, spare=spare, state="failed", ready=len(self.spares),
                                   takeovers=self.takeovers,
                                   message=f"hot spare {spare} did not take member {member}'s place within "
                                           f"{ASSIGN_SECONDS:g}s"))
            out.extend(self._take_over(member))
        return out

    def heartbeat(self, member: int, now: float, *, idle: float | None = None, rank: int | None = None,
                  line: str = "") -> list[Out]:
        """A member's heartbeat: ``idle`` is the seconds since its stalest rank's last output."""
        self._clock(now)
        if idle is not None and member in self.incarnations:
            self.idle[member] = (float(idle), rank, line)
        return []

    # --- a hang: every rank's stack, on every member, then the rule over the gang ------------------

    def hang(self, member: int, round_: int, info: Mapping[str, Any], now: float) -> list[Out]:
        """A member's rank hangs (``info``: rank, reason, message, at): every member freezes its
        ranks (``freeze``); the first hang of a round only."""
        self._clock(now)
        if (round_ != self.round or self.phase != RUNNING_PHASE or member not in self.incarnations
                or self.capture is not None):
            return []
        self.capture = _Capture(member, int(info["rank"]), str(info["reason"]), str(info.get("message") or ""),
                                info.get("at"), now + FREEZE_SECONDS)
        return [Out(ALL, {"type": FREEZE, "round": self.round, "reason": self.capture.reason}),
                self._event(EV_HANG, member=member, node=self.nodes.get(member, ""), rank=self.capture.rank,
                            reason=self.capture.reason, message=cut(self.capture.message, MAX_TEXT))]

    def frozen(self, member: int, round_: int, now: float) -> list[Out]:
        """Member ``member`` has stopped its ranks: once every live member has, ``dump``."""
        self._clock(now)
        capture = self.capture
        if capture is None or capture.dumping or round_ != self.round or member not in self.incarnations:
            return []
        capture.frozen.add(member)
        return self._dump() if capture.frozen >= self._in_round() else []

    def _dump(self) -> list[Out]:
        assert self.capture is not None
        self.capture.dumping = True
        self.capture.deadline = self.now + STACKS_SECONDS
        return [Out(ALL, {"type": DUMP, "round": self.round})]

    def stacks(self, member: int, round_: int, ranks: list[dict[str, Any]], detail: bool, now: float) -> list[Out]:
        """Member ``member``'s ranks' states after the dump: once every live member's are in, the
        rule over all of them names the rank the round's failure is (:meth:`_judge`)."""
        self._clock(now)
        capture = self.capture
        if capture is None or round_ != self.round or member not in self.incarnations or member in capture.reported:
            return []
        capture.reported.add(member)
        capture.detail = capture.detail and detail
        for row in ranks:
            capture.rows[row["rank"]] = (member, row)
        return self._judge() if capture.dumping and capture.reported >= self._in_round() else []

    def _judge(self) -> list[Out]:
        """The rule (:func:`.stacks.judge`) over every rank reported; the named rank's failure
        stops the round as any failure does. Undecided, it names the rank whose hang was seen."""
        capture = self.capture
        assert capture is not None
        self.capture = None
        states = {rank: row["state"] for rank, (_, row) in capture.rows.items()}
        states.setdefault(capture.rank, stacks.RankState(capture.rank, stacks.NO_STACK))
        order = sorted(states, key=lambda r: (-capture.rows[r][1]["silent"] if r in capture.rows else 0.0, r))
        why = "went silent first" if capture.reason == REASON_NO_PROGRESS else "whose watchdog timer expired"
        verdict = stacks.judge(states, order, capture.rank, why, detail=capture.detail)
        member, row = capture.rows.get(verdict.rank, (capture.member, {}))
        own = row.get("said") or (capture.message if verdict.rank == capture.rank else f"rank {verdict.rank}")
        info = {"rank": verdict.rank, "local_rank": row.get("local_rank"), "pid": row.get("pid"),
                "exit_code": row.get("exit_code"), "returncode": row.get("returncode"), "signal": row.get("signal"),
                "reason": capture.reason, "message": stacks.failure_message(verdict, own, capture.detail),
                "tail": row.get("tail") or [], "at": capture.at}
        return self._record_failure(member, info)

    # --- time ---------------------------------------------------------------------------------

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
                                              f"{self.policy.join_timeout:g}s: member(s) {_ranges(missing)} never joined"))
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

    # --- the barrier and the decision ---------------------------------------------------------

    def _maybe_go(self) -> list[Out]:
        if self.phase != JOINING or self.now < self.go_at:
            return []
        if not quorum_reached(self.joined, self.members):
            # An elastic round: member 0 (the coordinator's own) and at least the minimum joined,
            # then ELASTIC_WAIT for the rest (torchrun's last call); the wait starts again if it
            # falls below the minimum.
            if not self.elastic or 0 not in self.joined or len(self.joined) < self.min_members:
                self.quorum_at = None
                return []
            if self.quorum_at is None:
                self.quorum_at = self.now
            if self.now < self.quorum_at + self.policy.elastic_wait:
                return []
        if not self._fenced() or self.isolated():
            return []  # a lost member's processes may still run; or this coordinator is cut off
        self.quorum_at = None
        before = self.round_members
        self.round_members = set(self.joined)
        self.waiting = set()
        self.phase = RUNNING_PHASE
        self.running_members = set()
        self.done = set()
        self.failures = []
        self.all_running_at = None
        self.last_progress_event = self.now
        self.capture = None
        if not self.elastic:
            return [Out(ALL, {"type": GO, "round": self.round}), self._event(EV_STARTED, members=self.members)]
        members = sorted(self.round_members)
        out = [Out(ALL, {"type": GO, "round": self.round, "members": members}),
               self._event(EV_STARTED, members=len(members), round_members=members, max_members=self.members,
                           world_size=self.world_size // self.members * len(members) if self.world_size else None)]
        if self.round_members != before:
            out.append(self._event(EV_RESIZE, size=len(members), round_members=members, before=len(before),
                                   message=f"round {self.round} runs {len(members)} of {self.members} members "
                                           f"(at least {self.min_members}): {_ranges(members)}"))
        return out

    def _maybe_decide(self) -> list[Out]:
        if self.phase == STOPPING and self.live() <= self.next_joined:
            return self._decide()
        return []

    def _decide(self) -> list[Out]:
        root = root_cause(self.failures)
        info = root.info
        disruption = root.disruption
        if disruption:
            # A member lost (its pod deleted, evicted, its node gone; a spare took its place or
            # not), or one that joined: not the program's failure, and what broke in its round
            # because of it is not either (root_cause). The operator, which sees why a pod went,
            # may still charge a loss to the program (a container OOM-killed): its count rules.
            self.disruptions += 1
        code = info.get("exit_code")
        reason = info.get("reason") or REASON_ERROR
        healthy = (self.all_running_at is not None and self.first_failure_at is not None
                   and self.first_failure_at - self.all_running_at >= self.policy.backoff_reset)
        if healthy:
            self.consecutive = 0
            self.streak, self.streak_member = 0, None
        counted = self.round - self.disruptions
        cause = {"rank": info.get("rank"), "member": root.member, "exit_code": code, "reason": reason,
                 "message": info.get("message"), "tail": info.get("tail") or [], "disruption": disruption}
        backoff = 0.0
        if not disruption:
            if self.policy.is_permanent(code, reason):
                return self._fail(root, exit_code=code, reason=reason, permanent=True)
            if counted >= self.policy.max_restarts:
                return self._fail(root, exit_code=code, reason=reason, exhausted=True)
            self.streak = self.streak + 1 if self.streak_member == root.member else 1
            self.streak_member = root.member
            if self.streak >= self.policy.member_failure_limit:
                return self._fail(root, exit_code=EX_TEMPFAIL, reason=REASON_REPEATED, fallback=True,
                                  message=f"member {root.member} caused {self.streak} restarts in place in a row; "
                                          f"the gang is recreated on fresh pods")
            # Only the program's failures back off (a crash loop); a disruption restarts at once.
            self.consecutive += 1
            backoff = backoff_seconds(self.consecutive, self.policy.backoff, self.policy.max_backoff)
        out = [self._event(EV_RESTART, next_round=self.round + 1, **cause,
                           counted=counted + 1, max_restarts=self.policy.max_restarts, backoff_seconds=backoff)]
        self._cause = {"round": self.round, **cause}
        self.round += 1
        self.phase = JOINING
        self.joined = set(self.next_joined) & self.live()
        self.next_joined = set()
        self.go_at = self.now + backoff
        self.deadline = self.go_at + self.policy.join_timeout
        out.append(self._event(EV_ROUND, restart_count=self.round, members=self.members, backoff_seconds=backoff,
                               cause=self._cause))
        for member in sorted(self.joined):
            out.append(self._joined(member))
        return out + self._maybe_go()

    def _fail(self, root: _Failure | None, *, exit_code: int | None, reason: str, permanent: bool = False,
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
                        "fallback": fallback, "counted": self.round - self.disruptions,
                        "max_restarts": self.policy.max_restarts}
        event = {k: v for k, v in self.outcome.items() if k != "type"}
        return [Out(ALL, self.outcome), self._event(EV_FAILED, **event)]


def _ranges(values: Iterable[int]) -> str:
    """``0..3,7`` for [0, 1, 2, 3, 7]."""
    out: list[str] = []
    items = sorted(values)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}..{items[j]}")
        i = j + 1
    return ",".join(out) or "none"


def parse_codes(text: str, name: str) -> tuple[int, ...]:
    """A comma-separated list of exit codes 1..255 (a policy input); ValueError names ``name``."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            code = int(part)
        except ValueError:
            raise ValueError(f"{name}: {part!r} is not an exit code; expected integers 1..255, comma-separated") from None
        if not 1 <= code <= 255:
            raise ValueError(f"{name}: {code} is out of range; expected integers 1..255, comma-separated")
        out.append(code)
    return tuple(dict.fromkeys(out))


def parse_reasons(text: str) -> tuple[str, ...]:
    """A comma-separated list of reasons (a policy input)."""
    return tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))


def token_matches(expected: str, given: object) -> bool:
    """Whether a ``hello``'s token proves membership of this attempt: equal to the coordinator's,
    compared in constant time; every hello passes where the coordinator has no token (a gang
    created before tokens, or a local run that set none)."""
    if not expected:
        return True
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


def new_token() -> str:
    """A fresh proof of membership for one attempt: 256 random bits, URL-safe (43 characters)."""
    return secrets.token_urlsafe(32)
