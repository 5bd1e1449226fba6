"""The restart-in-place protocol: its messages, their checks and encoding, and its constants.

Where it sits: in the payload (standard library only, shipped into pods), above :mod:`.failures`
and below everything that speaks the protocol: the coordinator's state machine
(:mod:`.coordinator`, with what it counts in :mod:`.counting`), the hub and server that carry
its messages, a member's state machine (:mod:`.member`) and its link. Nothing here does I/O or
reads a clock. docs/restart-in-place.md is the protocol's reference: the rounds, the barrier, the
failure cases and the observer events, field by field.

In short: member m (one agent, one pod) says ``hello``, then ``join`` for round r once every
process of its earlier rounds is gone; the coordinator sends ``go`` r when every member has
joined r and the round's back-off has passed. A ``failure`` makes the coordinator send ``stop``
r to all; each member stops its processes, reports ``exited`` and joins r+1; once every live
member has, the coordinator judges the root cause and sends either nothing more (round r+1 is
open: ``go`` follows) or ``fail``. When every member's processes exited 0, ``finish``. Observers
get ``welcome`` (state and history) and then every event.
"""


from __future__ import annotations

import hmac
import json
import math
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from . import stacks

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
#: Seconds without an observer's heartbeat (or, before any came, since the coordinator started)
#: after which it is out of the operator's sight: its node may be cut off and the gang recreated
#: elsewhere, though nothing of its own broke (every member beside it, no observer connected yet).
#: The operator's observer beats every HEARTBEAT_INTERVAL and reconnects within seconds.
OBSERVER_SIGHT: Final = 10.0
#: A silence of its own this long (the node controller's grace: a node that stopped reporting
#: for 40 s is marked NotReady, its pods not ready, and the operator takes them for lost) makes
#: the coordinator give its gang up when it runs again (:meth:`.coordinator.Coordinator.stalled`): a shorter one
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
    try:  # an integer too large for a float is no number either
        good = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    except OverflowError:
        good = False
    if not good:
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
                   pod=_str(message, "pod", MAX_NAME) or "",
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
                "line": _str(message, "line", MAX_OUTPUT_LINE) or "", "fresh": _number(message, "fresh")}
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
        """The messages completed by ``data`` (see :meth:`messages`)."""
        return list(self.messages(data))

    def messages(self, data: bytes) -> Iterator[dict[str, Any]]:
        """The messages completed by ``data``, one at a time: each line is held to the limit as it
        comes, so a limit a message changes (a hello raises it) holds for the lines after it, and
        the messages before a bad line are had before its error.

        Raises:
            ProtocolError: for a line that is not a JSON object with a string ``type``, or one
                longer than the limit.
        """
        *lines, self.partial = (self.partial + data).split(b"\n")
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
            yield message
        if len(self.partial) > self.limit:
            raise ProtocolError(f"a line longer than {self.limit} bytes")


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


def ranges(values: Iterable[int]) -> str:
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
