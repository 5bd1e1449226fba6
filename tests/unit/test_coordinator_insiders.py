"""The coordinator as its insiders meet it: connections that carry the attempt's token pass the
hello and reach every message type, and still cannot crash it, grow it without bound, make it
answer outside the protocol, or wedge it (docs/restart-in-place.md, "Trust and bounds").

Insiders are trusted by design (the token proves membership): they may supersede members, stop
rounds, fail the gang. What is checked is that the coordinator survives them: its thread lives,
its connections stay bounded, a message refused for a bad field gets a ``refused`` naming the
field and closes its own connection and nothing else, the state machine's invariants hold, every
observer's welcome fits a line, and a fresh pair of honest members still brings a round to its
end. tests/unit/test_coordinator_trust.py has the strangers (no token) and the helpers reused here.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import selectors
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from monarch_spmd.payload import coordinator
from monarch_spmd.payload import rendezvous as rv
from tests.unit.test_coordinator_trust import TOKEN, Member, Server, closed_by_peer

PHASES = (rv.JOINING, rv.RUNNING_PHASE, rv.STOPPING, rv.FINISHED, rv.FAILED)
#: Every observer event type (the EV_* constants).
EVENTS = frozenset(v for k, v in vars(rv).items() if k.startswith("EV_") and isinstance(v, str))
#: What the coordinator may send a member, a spare (after their hello).
TO_MEMBER = frozenset({rv.WELCOME, rv.GO, rv.STOP, rv.FINISH, rv.FAIL, rv.HEARTBEAT, rv.FREEZE, rv.DUMP, rv.REFUSED})
TO_SPARE = frozenset({rv.WELCOME, rv.ASSIGN, rv.FAIL, rv.FINISH, rv.HEARTBEAT, rv.REFUSED})
MEMBER_TYPES = (rv.JOIN, rv.RUNNING, rv.FAILURE, rv.EXITED, rv.LEAVE, rv.HEARTBEAT, rv.HANG, rv.FROZEN, rv.STACKS)
#: A refusal of a hello that was valid: a spare holds the member's place, or the observers are full.
ADMISSION = re.compile(r"^member \d+'s place is (taken|held) by hot spare (\d+)")
OBSERVERS_FULL = f"{rv.MAX_OBSERVERS} observers are connected already"
#: The valid spare indices insiders say hello as (the bystander spare is MAX_SPARE_INDEX).
SPARE_POOL = tuple(range(8))
#: The storm's stages, in seconds: honest rounds run among insiders that cannot supersede a
#: member (spares, observers, bad hellos); squatters hold members' places a while and say
#: everything; insiders say hello as members all the time (churn).
CALM, SQUAT, CHURN = 2.5, 3.5, 1.5
STORM_SECONDS = CALM + SQUAT + CHURN
SEED = 20240611


def generous_server() -> Server:
    """test_coordinator_trust's Server, its machine replaced (before any connection) by one whose
    policy never gives the gang up on its own (each round of the storm restarts) and whose stop
    grace is none (a superseded member's fence ends within FENCE_SECONDS, not 31.5 s)."""
    srv = Server(members=2)
    with srv.server.lock:
        old = srv.machine
        policy = dataclasses.replace(old.policy, max_restarts=10**6, member_failure_limit=10**6, stop_grace=0.0,
                                     backoff=0.0)
        machine = type(old)(old.members, old.first_round, policy, time.monotonic(), world_size=old.world_size,
                            run_id=old.run_id, wall=old.wall)
        srv.machine = srv.server.machine = srv.server.hub.machine = machine
        srv.server.hub.start()
    return srv


# --- the messages: valid ones, and one bad field each ------------------------------------------------


def _oint(rng: random.Random) -> int | None:
    return rng.choice([None, 0, 1, 7, rng.randrange(rv.MAX_INT + 1), rv.MAX_INT])


def _code(rng: random.Random) -> int | None:
    # 64 (EX_USAGE) is a permanent failure: it ends the gang, and with it the storm's coverage.
    code = rng.choice([None, 0, 1, 2, 75, 127, 137, 143, 255, rng.randrange(256)])
    return 65 if code == 64 else code


def _rc(rng: random.Random) -> int | None:
    return rng.choice([None, 0, 1, -9, -15, -255, 255, rng.randrange(-255, 256)])


def _text(rng: random.Random, limit: int) -> str | None:
    return rng.choice([None, "", "boom", "\u00e9\u2713\u0000\ud7ff", "t" * limit, "u" * (3 * limit + 7)])


def _number(rng: random.Random) -> float | int | None:
    return rng.choice([None, 0, 0.25, 3, 1e9, 1.7e308, time.time()])


def _lines(rng: random.Random, big: bool = True) -> list[str] | None:
    return rng.choice([None, [], ["step 1"], ["L" * 2000] * 40 if big else ["L" * 600] * 3, [""] * 3])


def _frame(rng: random.Random) -> list[Any]:
    return [rng.choice(["train.py", "/usr/lib/python3.11/threading.py",
                        "/venv/site-packages/torch/distributed/distributed_c10d.py"]),
            rng.randrange(0, 5000), rng.choice(["step", "all_reduce", "wait", "main"])]


def _proc_row(rng: random.Random, kind: str) -> dict[str, Any]:
    row: dict[str, Any] = {"rank": rng.choice([0, 1, 2, rng.randrange(rv.MAX_INT + 1)]), "local_rank": rng.randrange(8),
                           "pid": _oint(rng)}
    if kind == rv.EXITED:
        row.update(exit_code=_code(rng), returncode=_rc(rng), signal=rng.choice([None, "SIGKILL", "S" * 400]),
                   stopped=rng.choice([True, False, None, "yes"]), reason=_text(rng, rv.MAX_NAME))
    return row


def _stacks_row(rng: random.Random) -> dict[str, Any]:
    state = rng.choice(["waiting", "busy", "no stack"])
    row: dict[str, Any] = {"rank": rng.choice([0, 1, 2, 3, rv.MAX_INT]), "local_rank": rng.randrange(8),
                           "pid": _oint(rng), "exit_code": _code(rng), "returncode": _rc(rng),
                           "signal": rng.choice([None, "SIGABRT"]), "said": _text(rng, rv.MAX_TEXT),
                           "tail": _lines(rng, big=False), "silent": _number(rng), "state": state,
                           "operation": rng.choice(["", "all_reduce", "barrier", "o" * 128]),
                           "frames": [_frame(rng) for _ in range(rng.randrange(13))]}
    if state != "no stack" or rng.random() < 0.5:
        row["site"] = _frame(rng)
    return row


def _round(rng: random.Random, r: int) -> int:
    """Rounds past, present and future (mostly the present and the next: they reach the machine)."""
    return rng.choice([r, r, r, r + 1, r + 1, max(0, r - 1), 0, r + 2, rng.randrange(rv.MAX_INT + 1), rv.MAX_INT])


def valid_message(rng: random.Random, kind: str, r: int) -> dict[str, Any]:
    """A member's message of ``kind`` that check_member_message accepts (texts may be long: cut)."""
    m: dict[str, Any] = {"type": kind}
    if kind not in (rv.LEAVE, rv.HEARTBEAT):
        m["round"] = _round(rng, r)
    if kind in (rv.RUNNING, rv.EXITED):
        if rng.random() < 0.03:  # the most rows a member may report, compact
            m["procs"] = [{"rank": i, "local_rank": i % 8, "pid": i} for i in range(rv.MAX_PROCS)]
        else:
            m["procs"] = [_proc_row(rng, kind) for _ in range(rng.randrange(5))]
    elif kind == rv.FAILURE:
        m.update(rank=_oint(rng), local_rank=_oint(rng), pid=_oint(rng), exit_code=_code(rng), returncode=_rc(rng),
                 signal=_text(rng, rv.MAX_NAME),
                 reason=rng.choice([None, "Error", "Signal", "OOMKilled", "MemberLost", "MembershipChange", "R" * 300]),
                 message=_text(rng, rv.MAX_TEXT), tail=_lines(rng), at=_number(rng))
    elif kind == rv.LEAVE:
        m["at"] = _number(rng)
    elif kind == rv.HEARTBEAT:
        m.update(idle=_number(rng), fresh=_number(rng), rank=_oint(rng), line=_text(rng, rv.MAX_OUTPUT_LINE))
    elif kind == rv.HANG:
        m.update(rank=rng.choice([0, 1, rv.MAX_INT]), reason=rng.choice(rv.HANG_REASONS),
                 message=_text(rng, rv.MAX_TEXT), at=_number(rng))
    elif kind == rv.STACKS:
        m.update(detail=rng.choice([True, False]), ranks=[_stacks_row(rng) for _ in range(rng.randrange(6))])
        if rng.random() < 0.2:
            del m["detail"]  # true by default
    if rng.random() < 0.2:
        m["extra"] = rng.choice([None, [1, {"a": "b"}], "x" * 1000])  # fields a later version may add
    for key in [k for k, v in m.items() if v is None and rng.random() < 0.5]:
        del m[key]  # an optional field missing is as good as null
    assert len(rv.encode(m)) < rv.MAX_MEMBER_LINE, "a valid message fits a member's line"
    return m


_BAD_INT = [-1, rv.MAX_INT + 1, 1 << 62, 10**400, "7", 2.5, True, [0], {"n": 0}]
_BAD = {
    "round": _BAD_INT + [None],
    "int": _BAD_INT + [None],  # required
    "oint": _BAD_INT,
    "code": [-1, 256, 1000, "1", 1.5, True],
    "rc": [-256, 256, "x", 0.5, False],
    "str": [5, 1.5, True, ["s"], {"s": 1}],
    "num": [-1, -0.5, float("nan"), float("inf"), float("-inf"), 10**400, "3", True, [1]],
    "lines": ["one string", [1, 2], [None], {"a": 1}, 5],
    "hang_reason": ["Bored", None, 5, "noprogress"],
    "bool": ["yes", 1, None, [True]],
    "state": ["asleep", None, 3],
    "operation": [5, "o" * 129],
    "site": ["x", ["f", "1", "g"], ["f" * 600, 1, "g"], [1, 2, 3], None],
    "frames": ["x", [["f", 1]], [["f", 1, "g"]] * 13, [5]],
}
_PROC_FIELDS = {"rank": "int", "local_rank": "int", "pid": "oint"}
_EXITED_FIELDS = {**_PROC_FIELDS, "exit_code": "code", "returncode": "rc", "signal": "str", "reason": "str"}
_STACKS_FIELDS = {"rank": "int", "local_rank": "int", "pid": "oint", "exit_code": "code", "returncode": "rc",
                  "signal": "str", "said": "str", "tail": "lines", "silent": "num", "state": "state",
                  "operation": "operation", "site": "site", "frames": "frames"}
_FIELDS: dict[str, dict[str, str]] = {
    rv.JOIN: {"round": "round"},
    rv.FROZEN: {"round": "round"},
    rv.RUNNING: {"round": "round"},
    rv.EXITED: {"round": "round"},
    rv.FAILURE: {"round": "round", "rank": "oint", "local_rank": "oint", "pid": "oint", "exit_code": "code",
                 "returncode": "rc", "signal": "str", "reason": "str", "message": "str", "tail": "lines", "at": "num"},
    rv.LEAVE: {"at": "num"},
    rv.HEARTBEAT: {"idle": "num", "fresh": "num", "rank": "oint", "line": "str"},
    rv.HANG: {"round": "round", "rank": "int", "reason": "hang_reason", "message": "str", "at": "num"},
    rv.STACKS: {"round": "round", "detail": "bool"},
}


def _set(message: dict[str, Any], key: str, value: Any) -> None:
    if value is None and key in ("round", "rank", "local_rank", "reason", "state") and message.get(key) is not None:
        del message[key]  # a required field missing
    else:
        message[key] = value


def invalid_message(rng: random.Random, kind: str, r: int) -> tuple[dict[str, Any], str]:
    """A member's message of ``kind`` with exactly one bad field, and the start of the refusal's
    reason that must name it (``<type>.<field>``, ``<type>.procs[i].<field>``, ...)."""
    m = valid_message(rng, kind, r)
    m.pop("extra", None)
    rows = "procs" if kind in (rv.RUNNING, rv.EXITED) else "ranks" if kind == rv.STACKS else None
    if rows is not None and rng.random() < 0.6:
        choice = rng.randrange(10)
        if choice == 0:
            m[rows] = rng.choice(["all", {"0": {}}, 3])
            return m, f"{kind}.{rows}"
        if choice == 1:
            del m[rows]
            return m, f"{kind}.{rows}"
        if choice == 2 and rows == "procs":
            m[rows] = [{"rank": 0, "local_rank": 0}] * (rv.MAX_PROCS + 1)
            return m, f"{kind}.{rows}"
        m[rows] = list(m[rows]) or ([_stacks_row(rng)] if rows == "ranks" else [_proc_row(rng, kind)])
        i = rng.randrange(len(m[rows]))
        if choice == 3:
            m[rows][i] = rng.choice([1, "row", [0, 0], None])
            return m, f"{kind}.{rows}: expected objects"
        fields = _STACKS_FIELDS if rows == "ranks" else _EXITED_FIELDS if kind == rv.EXITED else _PROC_FIELDS
        name = rng.choice(sorted(fields))
        row = dict(m[rows][i])
        if name == "site" and row.get("state") == "no stack":
            row["state"] = "waiting"  # a waiting rank without a call site is the bad field's case too
        _set(row, name, rng.choice(_BAD[fields[name]]))
        m[rows][i] = row
        return m, f"{kind}.{rows}[{i}].{name}"
    name = rng.choice(sorted(_FIELDS[kind]))
    _set(m, name, rng.choice(_BAD[_FIELDS[kind][name]]))
    return m, f"{kind}.{name}"


def bad_line(rng: random.Random, limit: int) -> tuple[bytes, str]:
    """A line that is not a message at all: not JSON, not an object with a string type, too long."""
    choice = rng.randrange(4)
    if choice == 0:
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 100))).replace(b"\n", b"")
        return b"{not json " + junk + b"\n", "not JSON"
    if choice == 1:
        return b"[" * min(limit - 1, rng.choice([10, 100_000])) + b"\n", "not JSON"  # deeper than the parser goes
    if choice == 2:
        return rv.encode(rng.choice([[1, 2], "s", None, 5, {}, {"type": 5}, {"type": None}])), "not a message"
    return b'{"type":"hb","line":"' + b"x" * (limit + 10) + b'"}\n', f"a line longer than {limit} bytes"


# --- hellos --------------------------------------------------------------------------------------------


def member_hello(rng: random.Random, incarnation: str, member: int | None = None) -> dict[str, Any]:
    h: dict[str, Any] = {"type": rv.HELLO, "role": rv.ROLE_MEMBER, "token": TOKEN,
                         "member": rng.choice([0, 1]) if member is None else member, "incarnation": incarnation,
                         "disruptions": rng.choice([None, 0, 1, 3, rv.MAX_INT]),
                         "node": rng.choice([None, "", "node-a", "n" * rv.MAX_NAME, "m" * 600])}
    versions = rng.randrange(3)
    if versions == 0:
        h["versions"] = rng.choice([[1], [1, 2], [3, 2, 1]])
    elif versions == 1:
        h["v"] = 1
    if rng.random() < 0.3:
        h["spare"] = rng.choice([None, 0, 1, rng.choice(SPARE_POOL), rv.MAX_SPARE_INDEX])
    if rng.random() < 0.2:
        h.update(pid=rng.randrange(1 << 20), procs=8, first_rank=0, round=rng.randrange(5))  # what agents add
    return h


def spare_hello(rng: random.Random, incarnation: str) -> dict[str, Any]:
    return {"type": rv.HELLO, "versions": [1], "role": rv.ROLE_SPARE, "token": TOKEN, "spare": rng.choice(SPARE_POOL),
            "incarnation": incarnation, "node": rng.choice(["", "spare-node", "s" * 600])}


def observer_hello(rng: random.Random) -> dict[str, Any]:
    h = {"type": rv.HELLO, "versions": [1], "role": rv.ROLE_OBSERVER, "token": TOKEN}
    if rng.random() < 0.2:
        h.update(member="x", spare=-5, incarnation=[1])  # not an observer's fields: ignored
    return h


def invalid_hello(rng: random.Random, role: str, incarnation: str) -> tuple[bytes, str]:
    """A hello with the valid token and one bad field, and the start of its refusal."""
    if role == rv.ROLE_MEMBER:
        h = member_hello(rng, incarnation)
        name, values = rng.choice([("member", [2, -1, "0", True, 1.0, None, rv.MAX_INT]),
                                   ("incarnation", [5, ["x"], {"a": 1}]), ("disruptions", [-1, "lots", 2.5, 1 << 40]),
                                   ("node", [7, {}, ["n"]]), ("spare", [-1, rv.MAX_SPARE_INDEX + 1, "3", 2.5, True])])
    elif role == rv.ROLE_SPARE:
        h = spare_hello(rng, incarnation)
        name, values = rng.choice([("spare", [-1, rv.MAX_SPARE_INDEX + 1, "3", None, 2.5, True]),
                                   ("incarnation", [5, ["x"]]), ("node", [7, {}])])
    else:
        h = observer_hello(rng)
        name, values = rng.choice([("role", ["admin", None, 3, "Observer"]),
                                   ("versions", ["1", [], list(range(17)), [True], [1.0]])])
    value = rng.choice(values)
    if value is None:
        h.pop(name, None)
    else:
        h[name] = value
    h.pop("v", None)
    if name != "versions":
        h["versions"] = [1]
    special = rng.randrange(8)
    if special == 0:  # every field valid, no version spoken here
        valid = (member_hello(rng, incarnation) if role == rv.ROLE_MEMBER else spare_hello(rng, incarnation)
                 if role == rv.ROLE_SPARE else observer_hello(rng))
        valid.pop("v", None)
        return rv.encode({**valid, "versions": rng.choice([[2], [7, 8]])}), "protocol versions"
    if special == 1:
        return rv.encode({**member_hello(rng, incarnation), "pad": "p" * (rv.MAX_HELLO_LINE + 10)}), \
            f"a line longer than {rv.MAX_HELLO_LINE} bytes"
    if special == 2:
        return rv.encode({"type": rv.JOIN, "round": 0, "token": TOKEN}), "the first message must be hello"
    return rv.encode(h), f"hello.{name}"


# --- the connections ---------------------------------------------------------------------------------


class Conn:
    """One client connection and every line the coordinator sent on it."""

    def __init__(self, sock: socket.socket, label: str) -> None:
        self.sock = sock
        self.label = label
        self.partial = b""
        self.got: list[dict[str, Any]] = []
        self.closed_by_peer = False  # the coordinator closed it (EOF or a reset)
        self.closed = False  # closed here
        self.opened = time.monotonic()


class World:
    """Every client connection, read as lines arrive; what went wrong, and what was checked."""

    def __init__(self, srv: Server) -> None:
        self.srv = srv
        self.selector = selectors.DefaultSelector()
        self.handlers: dict[socket.socket, tuple[Conn, Any]] = {}
        self.problems: list[str] = []
        self.stats: Counter[str] = Counter()
        self.samples: list[tuple[str, str]] = []  # (expected, refusal) pairs checked
        self.floods: list[tuple[float, float]] = []
        self.stage = "calm"
        self.squatters: list[Any] = []

    def problem(self, text: str) -> None:
        if len(self.problems) < 200:
            self.problems.append(text)

    def add(self, conn: Conn, handler: Any) -> None:
        self.handlers[conn.sock] = (conn, handler)
        self.selector.register(conn.sock, selectors.EVENT_READ)

    def open(self) -> int:
        return len(self.handlers)

    def send(self, conn: Conn, data: bytes) -> None:
        if conn.closed:
            return
        try:
            conn.sock.sendall(data)
        except OSError:
            pass  # closed by the coordinator meanwhile (a refusal): its EOF says so

    def close(self, conn: Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.sock in self.handlers:
            del self.handlers[conn.sock]
            self.selector.unregister(conn.sock)
        conn.sock.close()

    def pump(self, timeout: float = 0.0) -> None:
        for key, _ in self.selector.select(timeout):
            entry = self.handlers.get(key.fileobj)  # type: ignore[call-overload]
            if entry is None:
                continue
            conn, handler = entry
            try:
                data = conn.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError, TimeoutError):
                continue
            except OSError:
                data = b""
            if not data:
                conn.closed_by_peer = True
                del self.handlers[conn.sock]
                self.selector.unregister(conn.sock)
                handler.on_eof(conn)
                continue
            *lines, conn.partial = (conn.partial + data).split(b"\n")
            if len(conn.partial) > rv.MAX_LINE:
                self.problem(f"{conn.label}: the coordinator sent a line longer than MAX_LINE")
            for line in lines:
                if len(line) + 1 > rv.MAX_LINE:
                    self.problem(f"{conn.label}: the coordinator sent a line of {len(line)} bytes")
                try:
                    message = json.loads(line)
                except ValueError:
                    self.problem(f"{conn.label}: the coordinator sent a line that is not JSON: {line[:80]!r}")
                    continue
                if not isinstance(message, dict) or not isinstance(message.get("type"), str):
                    self.problem(f"{conn.label}: the coordinator sent a line that is not a message: {line[:80]!r}")
                    continue
                conn.got.append(message)
                if message["type"] == rv.WELCOME and "history" in message:
                    self.observer_welcome(conn, message, len(line) + 1)
                handler.on_message(conn, message)

    def observer_welcome(self, conn: Conn, welcome: dict[str, Any], size: int) -> None:
        """Every welcome an observer gets fits one line, its history within MAX_HISTORY_BYTES."""
        self.stats["observer welcomes"] += 1
        self.stats["largest welcome"] = max(self.stats["largest welcome"], size)
        history = welcome["history"]
        if size > rv.MAX_LINE or not isinstance(history, list):
            self.problem(f"{conn.label}: a welcome of {size} bytes")
            return
        used = sum(len(rv.encode(e)) for e in history)
        if used > rv.MAX_HISTORY_BYTES:
            self.problem(f"{conn.label}: a welcome whose history takes {used} bytes")
        if welcome.get("phase") not in PHASES or not isinstance(welcome.get("round"), int):
            self.problem(f"{conn.label}: a welcome without a phase or round: {str(welcome)[:200]}")

    def in_flood(self, conn: Conn) -> bool:
        return any(start - 0.5 <= conn.opened <= end + 0.5 for start, end in self.floods)


def _judge_end(world: World, conn: Conn, *, expect: str | None, superseded: bool, may_close: bool,
               admitted_refusal: bool) -> None:
    """What a connection got, against what it said: a bad message is refused naming its field, and
    the connection ends right after; a connection that said nothing wrong is never refused nor
    closed (unless superseded, or it left)."""
    refusals = [m for m in conn.got if m["type"] == rv.REFUSED]
    for r in refusals:
        if set(r) - {"type", "reason", "versions"} or not isinstance(r.get("reason"), str):
            world.problem(f"{conn.label}: a refusal with other fields: {r}")
    if refusals and conn.got[-1] is not refusals[-1]:
        world.problem(f"{conn.label}: the coordinator sent {conn.got[-1]['type']} after a refusal")
    if len(refusals) > 1:
        world.problem(f"{conn.label}: refused {len(refusals)} times")
    if admitted_refusal:
        world.stats["hellos turned away (spare holds the place, observers full)"] += 1
        return
    if expect is not None:
        if refusals:
            reason = refusals[-1]["reason"]
            if reason.startswith(expect):
                world.stats["refusals naming the field checked"] += 1
                if len(world.samples) < 400:
                    world.samples.append((expect, reason))
            else:
                world.problem(f"{conn.label}: expected a refusal naming {expect!r}, got {reason!r}")
            if not conn.closed_by_peer:
                world.problem(f"{conn.label}: refused ({reason[:60]!r}) but not closed")
        elif superseded:
            world.stats["bad messages not reached (superseded first)"] += 1
        elif not conn.closed_by_peer:
            world.problem(f"{conn.label}: sent a bad message ({expect}) and was neither refused nor closed")
        elif not conn.got and world.in_flood(conn):
            world.stats["closed while pending in a flood"] += 1
        else:
            world.problem(f"{conn.label}: sent a bad message ({expect}) and was closed without a refusal "
                          f"(last: {conn.got[-1] if conn.got else None})")
        return
    if refusals:
        world.problem(f"{conn.label}: refused though nothing it said was wrong: {refusals[-1]['reason']!r}")
    elif conn.closed_by_peer and not (superseded or may_close):
        if not conn.got and world.in_flood(conn):
            world.stats["closed while pending in a flood"] += 1
        else:
            world.problem(f"{conn.label}: closed by the coordinator though nothing it said was wrong "
                          f"(last: {str(conn.got[-1])[:200] if conn.got else None})")
    else:
        world.stats["valid connections never refused"] += 1


def _superseded(conn: Conn) -> bool:
    return any(m["type"] == rv.FAIL and m.get("reason") == rv.LOST_SUPERSEDED for m in conn.got)


class _Incarnate(Member):
    """test_coordinator_trust's Member with an incarnation (and a spare index) of its own."""

    def __init__(self, srv: Server, member: int, incarnation: str, spare: int | None = None) -> None:
        self.incarnation, self.spare = incarnation, spare
        super().__init__(srv, member)

    def send(self, message: dict) -> None:
        if message.get("type") == rv.HELLO:
            message = {**message, "incarnation": self.incarnation,
                       **({"spare": self.spare} if self.spare is not None else {})}
        super().send(message)


class Agent:
    """A member that speaks the protocol as an agent does: joins the round it is welcomed to, starts
    on ``go``, fails (or, ``final``, exits 0), stops on ``stop``, freezes and dumps its stacks when
    asked, heartbeats, and reconnects as a new incarnation when superseded or turned away.

    ``chaos`` makes it a squatter (an insider that holds a member's place a while): once its first
    round runs, it also says random valid and invalid messages of every type for ``lifetime``
    seconds, and it does not reconnect."""

    def __init__(self, world: World, member: int, rng: random.Random, name: str, *, final: bool = False,
                 chaos: bool = False, lifetime: float = 0.0) -> None:
        self.world, self.member, self.rng, self.name = world, member, rng, name
        self.final, self.chaos = final, chaos
        self.count = 0
        self.conn: Conn | None = None
        self.verdict: dict[str, Any] | None = None
        self.reconnect_at: float | None = time.monotonic()
        self.lifetime = lifetime
        self.until = time.monotonic() + 6.0 if chaos else None  # from its first go: lifetime
        self.spare_hint: int | None = None
        self.finished = False  # a squatter that is done

    # its connection

    def connect(self, now: float) -> None:
        self.count += 1
        incarnation = f"{self.name}-{self.count}"
        link = _Incarnate(self.world.srv, self.member, incarnation, self.spare_hint)
        link.file.close()  # read here, line by line, beside every other connection
        self.spare_hint = None
        self.conn = Conn(link.sock, f"{self.name} (member {self.member}, {incarnation})")
        self.world.add(self.conn, self)
        self.welcomed, self.expect, self.doomed, self.went = False, None, False, False
        self.round, self.exit_at, self.beat_at, self.chaos_at = 0, None, now, now + self.rng.uniform(0.05, 0.3)
        self.close_at: float | None = None
        self.reconnect_at = None

    def send(self, message: dict[str, Any]) -> None:
        assert self.conn is not None
        self.world.send(self.conn, rv.encode(message))

    def on_message(self, conn: Conn, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind not in TO_MEMBER:
            self.world.problem(f"{conn.label}: a member was sent {kind!r}: {str(message)[:200]}")
            return
        if kind == rv.REFUSED:
            hint = ADMISSION.match(message.get("reason", ""))
            if hint and not self.welcomed:
                self.spare_hint = int(hint.group(2))  # come back as the spare given the place
            return
        if kind == rv.FAIL and message.get("reason") == rv.LOST_SUPERSEDED:
            return
        if kind in (rv.FINISH, rv.FAIL):
            self.verdict = message
            return
        if self.doomed or self.finished:
            return
        now = time.monotonic()
        if kind == rv.WELCOME:
            self.welcomed = True
            self.round = message["round"]
            self.send({"type": rv.JOIN, "round": self.round})
        elif kind == rv.GO:
            if self.chaos and not self.went:
                self.until = now + self.lifetime
                self.chaos_at = now + self.rng.uniform(0.05, 0.3)
            self.went = True
            self.round = message["round"]
            self.send({"type": rv.RUNNING, "round": self.round,
                       "procs": [{"rank": self.member, "local_rank": 0, "pid": 100 + self.member}]})
            self.exit_at = now + self.rng.uniform(0.05, 0.3)
        elif kind == rv.STOP:
            self.exit_at = None
            self.send({"type": rv.EXITED, "round": message["round"],
                       "procs": [{"rank": self.member, "local_rank": 0, "pid": 100 + self.member, "exit_code": None,
                                  "returncode": -15, "signal": "SIGTERM", "stopped": True}]})
            self.round = message["round"] + 1
            self.send({"type": rv.JOIN, "round": self.round})
        elif kind == rv.FREEZE:
            self.exit_at = None
            self.send({"type": rv.FROZEN, "round": message["round"]})
        elif kind == rv.DUMP:
            self.send({"type": rv.STACKS, "round": message["round"], "detail": True,
                       "ranks": [{"rank": self.member, "local_rank": 0, "pid": 100 + self.member, "state": "waiting",
                                  "operation": "all_reduce", "site": ["train.py", 10 + self.member, "step"],
                                  "frames": [["train.py", 10 + self.member, "step"]], "silent": 1.0 + self.member,
                                  "tail": ["T" * 600] * 30, "said": "stuck"}]})

    def on_eof(self, conn: Conn) -> None:
        refused = [m for m in conn.got if m["type"] == rv.REFUSED]
        turned_away = bool(refused) and not self.welcomed and bool(ADMISSION.match(refused[-1].get("reason", "")))
        _judge_end(self.world, conn, expect=self.expect, superseded=_superseded(conn), may_close=False,
                   admitted_refusal=turned_away)
        if self.chaos or self.finished:
            self.finished = True
            return
        if self.final and not turned_away:
            self.world.problem(f"{conn.label}: a final member's connection was closed: {conn.got[-3:]}")
        self.reconnect_at = time.monotonic() + (0.05 if self.final or turned_away else self.rng.uniform(0.2, 0.8))

    # its turn

    def step(self, now: float) -> None:
        if self.finished:
            return
        if self.reconnect_at is not None:
            # An honest member lets a squatter hold its place through a round or two.
            held = not self.chaos and any(s.member == self.member and not s.finished for s in self.world.squatters)
            if now >= self.reconnect_at and not held:
                self.connect(now)
            return
        conn = self.conn
        assert conn is not None
        if conn.closed_by_peer:
            return
        if self.chaos and self.close_at is not None and now >= self.close_at:
            self.end(now)  # a squatter that said leave, or whose time is up: its agent ends
            return
        if self.chaos and not self.doomed and self.until is not None and now >= self.until:
            self.end(now)
            return
        if self.doomed:
            if self.close_at is None and now - self.doomed_at > 5.0:
                self.world.problem(f"{conn.label}: said a bad message ({self.expect}) and was not closed within 5 s")
                self.end(now, judge=False)
            return
        if now >= self.beat_at:
            self.beat_at = now + 0.25
            self.send({"type": rv.HEARTBEAT, "idle": round(self.rng.uniform(0, 5), 3), "rank": self.member,
                       "line": self.rng.choice(["step 12", "loss=0.1", "w" * 700])})
        if self.exit_at is not None and now >= self.exit_at:
            self.exit_at = None
            self.exit(now)
        if self.chaos and self.went and now >= self.chaos_at:
            self.chaos_at = now + self.rng.uniform(0.05, 0.3)
            self.say_something(now)

    def exit(self, now: float) -> None:
        procs = [{"rank": self.member, "local_rank": 0, "pid": 100 + self.member}]
        if self.final:
            self.send({"type": rv.EXITED, "round": self.round,
                       "procs": [{**procs[0], "exit_code": 0, "returncode": 0, "stopped": False}]})
            return
        choice = self.rng.random()
        if choice < 0.7:  # a rank failed: its failure, with a long message and output
            self.send({"type": rv.FAILURE, "round": self.round, "rank": self.member, "local_rank": 0,
                       "pid": 100 + self.member, "exit_code": self.rng.choice([1, 3, 137]), "returncode": 1,
                       "reason": "Error", "message": "E" * 5000, "tail": [f"line {i} " + "t" * 600 for i in range(40)],
                       "at": time.time()})
        elif choice < 0.85:  # a rank hangs: the gang's stacks are taken
            self.send({"type": rv.HANG, "round": self.round, "rank": self.member, "reason": rv.REASON_NO_PROGRESS,
                       "message": "no output for 600s", "at": time.time()})
        else:  # its processes ended, one badly, without a failure first
            self.send({"type": rv.EXITED, "round": self.round,
                       "procs": [{**procs[0], "exit_code": 2, "returncode": 2, "stopped": False}]})

    def say_something(self, now: float) -> None:
        """A squatter's random message: mostly valid, sometimes with one bad field or not a message."""
        assert self.conn is not None
        kind = self.rng.choice(MEMBER_TYPES)
        r = self.world.srv.machine.round
        if self.rng.random() < 0.06:
            if self.rng.random() < 0.3:
                data, self.expect = bad_line(self.rng, rv.MAX_MEMBER_LINE)
            elif self.rng.random() < 0.1:
                data, self.expect = rv.encode({"type": self.rng.choice(["go", "welcome", "hello", "x" * 99])}), \
                    "a member may not send"
            else:
                message, self.expect = invalid_message(self.rng, kind, r)
                data = rv.encode(message)
            self.doomed, self.doomed_at = True, now
            self.world.send(self.conn, data)
            return
        message = valid_message(self.rng, kind, r)
        self.send(message)
        if kind == rv.LEAVE:
            self.doomed, self.doomed_at = True, now
            self.close_at = now + self.rng.uniform(0.0, 0.2)

    def end(self, now: float, judge: bool = True) -> None:
        """Its agent ends: closes its connection."""
        conn = self.conn
        assert conn is not None
        self.world.pump()  # what it was sent last
        if conn.closed_by_peer:
            return  # judged on its EOF
        if judge:
            _judge_end(self.world, conn, expect=self.expect if self.close_at is None else None,
                       superseded=_superseded(conn), may_close=False, admitted_refusal=False)
        self.world.close(conn)
        self.finished = self.chaos
        if not self.chaos:
            self.reconnect_at = None


class Insider:
    """A connection with the token that says hello (valid or not) as a member, a spare or an
    observer, then a random sequence of messages of its role, the last one perhaps bad."""

    def __init__(self, world: World, rng: random.Random, n: int, *, members: bool) -> None:
        self.world, self.rng = world, rng
        roll = rng.random()
        self.role = (rv.ROLE_MEMBER if roll < 0.45 else rv.ROLE_SPARE if roll < 0.65 else rv.ROLE_OBSERVER)
        if self.role == rv.ROLE_MEMBER and not members and rng.random() < 0.6:
            self.role = rv.ROLE_SPARE if rng.random() < 0.5 else rv.ROLE_OBSERVER
        self.incarnation = f"ins-{n}-" + "i" * rng.choice([0, 0, 10, 80])
        self.conn = Conn(world.srv.connect(), f"insider {n} ({self.role})")
        world.add(self.conn, self)
        self.expect: str | None = None
        self.may_close = False
        self.sent = False
        self.done = False
        self.close_at = time.monotonic() + rng.choice([0.0, 0.05, 0.2, 0.5, 1.0, 2.0])
        if rng.random() < 0.15 or (self.role == rv.ROLE_MEMBER and not members):
            data, self.expect = invalid_hello(rng, self.role, self.incarnation)
            self.sent = True
        elif self.role == rv.ROLE_MEMBER:
            data = rv.encode(member_hello(rng, self.incarnation))
        elif self.role == rv.ROLE_SPARE:
            data = rv.encode(spare_hello(rng, self.incarnation))
        else:
            data = rv.encode(observer_hello(rng))
        world.send(self.conn, data)
        self.welcomed = self.turned_away = False

    def on_message(self, conn: Conn, message: dict[str, Any]) -> None:
        kind = message["type"]
        allowed = (TO_MEMBER if self.role == rv.ROLE_MEMBER else TO_SPARE if self.role == rv.ROLE_SPARE
                   else EVENTS | {rv.REFUSED} | ({rv.WELCOME} if not self.welcomed else set()))
        if kind not in allowed:
            self.world.problem(f"{conn.label}: sent {kind!r}, not its role's: {str(message)[:200]}")
        if kind == rv.WELCOME:
            self.welcomed = True
        if kind == rv.REFUSED and not self.welcomed and self.expect is None:
            reason = message.get("reason", "")
            if ADMISSION.match(reason) and self.role == rv.ROLE_MEMBER or \
                    reason == OBSERVERS_FULL and self.role == rv.ROLE_OBSERVER:
                self.turned_away = True

    def on_eof(self, conn: Conn) -> None:
        self.judge()

    def judge(self) -> None:
        if self.done:
            return
        self.done = True
        _judge_end(self.world, self.conn, expect=self.expect, superseded=_superseded(self.conn),
                   may_close=self.may_close, admitted_refusal=self.turned_away)

    def step(self, now: float) -> bool:
        """Its turn; False once it is over."""
        if self.done:
            return False
        if self.conn.closed_by_peer:
            return False
        if not self.sent:
            if self.welcomed:
                self.say_everything(now)
            elif now - self.conn.opened > 5.0:
                self.world.problem(f"{self.conn.label}: no answer to a hello within 5 s")
                self.close()
                return False
            return True
        if now < self.close_at:
            return True
        if self.expect is not None:
            if now - self.conn.opened > 8.0:
                self.world.problem(f"{self.conn.label}: said a bad message ({self.expect}) and was not closed")
                self.close()
                return False
            return True  # it waits to be closed
        self.close()
        return False

    def close(self) -> None:
        self.world.pump()
        if not self.conn.closed_by_peer:
            self.judge()
            self.world.close(self.conn)

    def say_everything(self, now: float) -> None:
        """Its messages, sent at once: valid ones, and perhaps one bad one last."""
        rng, r = self.rng, self.world.srv.machine.round
        self.sent = True
        lines: list[bytes] = []
        departed = False
        limit = rv.MAX_HELLO_LINE if self.role == rv.ROLE_OBSERVER else rv.MAX_MEMBER_LINE
        for _ in range(rng.randrange(1, 9)):
            if self.role == rv.ROLE_OBSERVER:
                lines.append(rv.encode({"type": rv.HEARTBEAT, **rng.choice([{}, {"idle": "x"}, {"line": 5}])}))
            elif self.role == rv.ROLE_SPARE:
                if rng.random() < 0.1:
                    lines.append(rv.encode({"type": rv.LEAVE, "signal": 15}))
                    departed = self.may_close = True
                    break
                lines.append(rv.encode({"type": rv.HEARTBEAT, **rng.choice([{}, {"idle": -1}, {"rank": "x"}])}))
            else:
                kind = rng.choice(MEMBER_TYPES)
                lines.append(rv.encode(valid_message(rng, kind, r)))
                if kind == rv.LEAVE:
                    departed = True  # its connection stays open until its agent ends: now
                    self.close_at = now
        if rng.random() < 0.4 and not (departed and self.role == rv.ROLE_SPARE):
            choice = rng.random()
            if choice < 0.25:
                data, expect = bad_line(rng, limit)
            elif self.role == rv.ROLE_OBSERVER:
                data = rv.encode({"type": rng.choice(MEMBER_TYPES[:5] + ("leave", "hello")), "round": r})
                expect = "an observer may send only hb"
            elif self.role == rv.ROLE_SPARE:
                data = rv.encode({"type": rng.choice(MEMBER_TYPES[:4] + (rv.HANG, "hello", "assign")), "round": r})
                expect = "a spare may send only hb and leave"
            elif choice < 0.35:
                kind = rng.choice(["go", "welcome", "hello", "stop", "fail", "assign", "", "x" * 99])
                data = rv.encode({"type": kind, "round": r})
                expect = "a member may not send"
            else:
                message, expect = invalid_message(rng, rng.choice(MEMBER_TYPES), r)
                data = rv.encode(message)
            if departed and not expect.startswith(("not JSON", "not a message", "a line longer")):
                expect = None  # a member that left is not read any more, but its lines are still split
            lines.append(data)
            self.expect = expect
            if expect is not None:
                self.close_at = now + 5.0
        self.world.send(self.conn, b"".join(lines))
        self.world.stats["insider messages"] += len(lines)


def _snapshot(srv: Server) -> dict[str, Any]:
    """The state machine's invariants, read under the server's lock."""
    with srv.server.lock:
        m = srv.machine
        history = sum(len(rv.encode(e)) for e in m.history)
        return {"phase": m.phase, "round": m.round, "disruptions": m.disruptions, "history": history,
                "history_events": len(m.history), "accounted": getattr(m, "history_bytes", history),
                "compacted": getattr(m, "history_compacted", 0), "dropped": getattr(m, "history_dropped", 0),
                "conns": len(srv.server.conns), "alive": srv.server.thread.is_alive()}


def _check_invariants(s: dict[str, Any]) -> None:
    assert s["alive"], "the coordinator's thread died"
    assert s["phase"] in PHASES, s
    assert isinstance(s["round"], int) and s["round"] >= 0, s
    assert 0 <= s["disruptions"] <= s["round"], s
    assert s["history"] <= rv.MAX_HISTORY_BYTES, s
    assert s["accounted"] == s["history"], f"the history's byte count drifted from its events: {s}"


def _run(world: World, seconds: float, agents: list[Agent], until: Callable[[], bool] = lambda: False) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        world.pump(0.01)
        now = time.monotonic()
        for a in agents:
            a.step(now)


class Bystander:
    """An observer (or a spare) that says only what it may, reads everything, and must stay
    connected through the storm: a bad message closes its own connection and nothing else."""

    def __init__(self, world: World, role: str) -> None:
        self.world, self.role = world, role
        self.conn = Conn(world.srv.connect(), f"bystander {role}")
        world.add(self.conn, self)
        hello = {"type": rv.HELLO, "versions": [1], "role": role, "token": TOKEN}
        if role == rv.ROLE_SPARE:
            hello.update(spare=rv.MAX_SPARE_INDEX, incarnation="bystander", node="spare-node")
        world.send(self.conn, rv.encode(hello))
        self.beat_at = 0.0
        self.events: Counter[str] = Counter()

    def on_message(self, conn: Conn, message: dict[str, Any]) -> None:
        kind = message["type"]
        self.events[kind] += 1
        allowed = TO_SPARE - {rv.REFUSED} if self.role == rv.ROLE_SPARE else EVENTS | {rv.WELCOME}
        if kind not in allowed:
            self.world.problem(f"{conn.label}: sent {kind!r}: {str(message)[:200]}")

    def on_eof(self, conn: Conn) -> None:
        self.world.problem(f"{conn.label}: closed by the coordinator (last: {str(conn.got[-1:])[:300]})")

    def step(self, now: float) -> None:
        if now >= self.beat_at and not self.conn.closed_by_peer:
            self.beat_at = now + 0.3
            self.world.send(self.conn, rv.encode({"type": rv.HEARTBEAT}))


def test_fuzz_insiders_with_the_token_never_crash_grow_or_wedge_the_coordinator(capsys):
    """Hundreds of insider connections (the valid token) say hello as members, spares and
    observers, valid and not, then random sequences of every message type with valid and invalid
    fields, while two honest members run rounds and squatters hold members' places a while; then
    a fresh pair of honest members must still bring a round to its end."""
    rng = random.Random(SEED)
    srv = generous_server()
    world = World(srv)
    bound = rv.MAX_PENDING + 2 + len(SPARE_POOL) + 1 + rv.MAX_OBSERVERS + 8
    insiders: list[Insider] = []
    squatters: list[Agent] = []
    silent: list[tuple[Conn, float]] = []
    phases: Counter[str] = Counter()
    peak_conns = peak_client = 0
    try:
        observer = Bystander(world, rv.ROLE_OBSERVER)
        spare = Bystander(world, rv.ROLE_SPARE)
        honest = [Agent(world, m, random.Random(SEED + m), f"honest-{m}") for m in (0, 1)]
        _run(world, 0.3, honest)
        began = time.monotonic()
        n = 0
        next_insider = began
        next_squatter: float | None = None
        next_flood = began + 1.0
        world.squatters = squatters
        while (now := time.monotonic()) < began + STORM_SECONDS:
            world.pump(0.002)
            now = time.monotonic()
            t = now - began
            world.stage = "calm" if t < CALM else "squat" if t < CALM + SQUAT else "churn"
            for a in honest + squatters:
                a.step(now)
            observer.step(now)
            spare.step(now)
            if now >= next_insider and world.open() < 150:
                next_insider = now + rng.expovariate(90.0)
                n += 1
                try:
                    insiders.append(Insider(world, rng, n, members=world.stage == "churn"))
                except OSError as e:
                    world.problem(f"insider {n} could not connect: {e}")
            if world.stage != "squat" or squatters:
                next_squatter = None
            elif next_squatter is None:
                next_squatter = now + rng.uniform(0.3, 0.8)  # the honest member is back meanwhile
            elif now >= next_squatter:
                squatters.append(Agent(world, rng.choice([0, 1]), rng, f"squatter-{n}", chaos=True,
                                       lifetime=rng.uniform(1.5, 3.0)))
                world.stats["squatters"] += 1
            if now >= next_flood:
                # Connections that never say hello (or not all of it), beyond MAX_PENDING.
                next_flood = now + 3.0
                world.floods.append((now, now + 1.0))
                for i in range(rv.MAX_PENDING + 48):
                    conn = Conn(srv.connect(), f"silent {i}")
                    world.add(conn, _Silent(world))
                    if i % 3 == 0:
                        world.send(conn, b'{"type":"hello","role":"obs')
                    silent.append((conn, now + 1.0))
            insiders = [i for i in insiders if i.step(now)]
            squatters[:] = [s for s in squatters if not s.finished]
            for conn, until in silent:
                if now >= until:
                    world.close(conn)
            silent = [(c, u) for c, u in silent if not c.closed]
            phases[srv.machine.phase] += 1
            peak_conns = max(peak_conns, len(srv.server.conns))
            peak_client = max(peak_client, world.open())
            assert srv.server.thread.is_alive(), f"the coordinator's thread died after {n} insiders"
        # The storm ends: the bad ones are closed, the rest end as their agents would.
        for conn, _ in silent:
            world.close(conn)
        settle = time.monotonic() + 6.0
        while (insiders or squatters) and time.monotonic() < settle:
            world.pump(0.01)
            now = time.monotonic()
            for i in insiders:
                if i.expect is None:
                    i.close_at = min(i.close_at, now)
            insiders = [i for i in insiders if i.step(now)]
            for s in squatters:
                if s.until is not None:
                    s.until = min(s.until, now)
                s.step(now)
            squatters[:] = [s for s in squatters if not s.finished]
            for a in honest:
                a.step(now)
            observer.step(now)
        assert not insiders and not squatters, "insiders that said a bad message were not closed"
        settled = time.monotonic()
        snap = _snapshot(srv)
        _check_invariants(snap)
        assert not observer.conn.closed_by_peer and not spare.conn.closed_by_peer, world.problems[:5]
        # The storm's honest members end; then a fresh observer gets a welcome that fits a line.
        for a in honest:
            a.finished = True
            if a.conn is not None:
                world.close(a.conn)
        world.close(spare.conn)
        late = Bystander(world, rv.ROLE_OBSERVER)
        _run(world, 2.0, [], until=lambda: bool(late.conn.got))
        assert late.conn.got and late.conn.got[0]["type"] == rv.WELCOME, late.conn.got[:1]
        # A fresh pair of honest members still brings a round to its end: finish, or a fail verdict.
        final = [Agent(world, m, random.Random(SEED + 10 + m), f"final-{m}", final=True) for m in (0, 1)]
        _run(world, 20.0, final + [observer], until=lambda: all(a.verdict is not None for a in final))
        verdicts = [a.verdict for a in final]
        ended = time.monotonic()
        with srv.server.lock:
            state = (srv.machine.phase, srv.machine.round, dict(srv.machine.incarnations),
                     dict(getattr(srv.machine, "assigned", {})), dict(getattr(srv.machine, "departing", {})))
        assert all(v is not None for v in verdicts), f"no verdict for the fresh pair: {state} {world.problems[:5]}"
        assert {v["type"] for v in verdicts} <= {rv.FINISH, rv.FAIL} and len({v["type"] for v in verdicts}) == 1
        if verdicts[0]["type"] == rv.FINISH:
            assert srv.machine.phase == rv.FINISHED
        end = _snapshot(srv)
        _check_invariants(end)
        # What was checked, and that it was enough to mean something.
        stats = dict(world.stats)
        print(f"seconds: storm={STORM_SECONDS} settle={settled - began - STORM_SECONDS:.1f} "
              f"final={ended - settled:.1f} insiders={n} phases={dict(phases)} peak_conns={peak_conns} "
              f"peak_client={peak_client} bound={bound} storm_end={snap} end={end} verdict={verdicts[0]['type']} "
              f"stats={stats} observer_events={dict(observer.events)}")
        assert not world.problems, "\n".join(world.problems[:30])
        assert peak_conns <= bound, f"{peak_conns} connections at once (bound {bound})"
        assert peak_client > bound, "the storm never held more connections than the bound"
        assert n >= 200 and world.stats["insider messages"] >= 500, (n, stats)
        assert world.stats["refusals naming the field checked"] >= 100, stats
        assert world.stats["valid connections never refused"] >= 50, stats
        assert world.stats["observer welcomes"] >= 20, stats
        assert snap["round"] >= 3 and phases[rv.RUNNING_PHASE] and phases[rv.STOPPING], (snap, phases)
        assert snap["history"] > rv.MAX_HISTORY_BYTES // 4, "the storm's failures filled the history toward its bound"
        # A sample of the refusals: each names the field (type.field, type.rows[i].field) it refused.
        named = [(e, r) for e, r in world.samples if "." in e]
        assert len(named) >= 30, named
        for e, r in named:
            assert r.startswith(e) and (" " in e or r[len(e):len(e) + 1] in (":", "[")), (e, r)
        out = capsys.readouterr()
        assert "coordinator: closed a connection after" not in out.err, out.err[-3000:]
    finally:
        for conn, _ in silent:
            world.close(conn)
        for conn, _ in list(world.handlers.values()):
            world.close(conn)
        srv.stop()


class _Silent:
    """A connection that never says a whole hello: it is told nothing, and closed in time."""

    def __init__(self, world: World) -> None:
        self.world = world

    def on_message(self, conn: Conn, message: dict[str, Any]) -> None:
        self.world.problem(f"{conn.label}: a connection that never said hello was sent {str(message)[:200]}")

    def on_eof(self, conn: Conn) -> None:
        self.world.stats["silent connections closed by the coordinator"] += 1


# --- the table: one valid and one invalid message of each type ------------------------------------------

_ROW = {"rank": 1, "local_rank": 0, "pid": 101}
TABLE = [
    (rv.JOIN, {"round": 0}, ("round", "lots"), "join.round"),
    (rv.RUNNING, {"round": 0, "procs": [_ROW]}, ("procs", [{**_ROW, "pid": -1}]), "running.procs[0].pid"),
    (rv.FAILURE, {"round": 0, "rank": 1, "local_rank": 0, "pid": 101, "exit_code": 1, "returncode": 1,
                  "signal": None, "reason": "Error", "message": "boom", "tail": ["line"], "at": 1.5},
     ("exit_code", 256), "failure.exit_code"),
    (rv.EXITED, {"round": 0, "procs": [{**_ROW, "exit_code": 0, "returncode": 0, "stopped": False}]},
     ("procs", [{**_ROW, "exit_code": 300}]), "exited.procs[0].exit_code"),
    (rv.LEAVE, {"at": 1.5}, ("at", -1), "leave.at"),
    (rv.HEARTBEAT, {"idle": 0.5, "rank": 1, "line": "step"}, ("idle", "soon"), "hb.idle"),
    (rv.HANG, {"round": 0, "rank": 1, "reason": rv.REASON_NO_PROGRESS, "message": "silent", "at": 1.5},
     ("reason", "Bored"), "hang.reason"),
    (rv.FROZEN, {"round": 0}, ("round", -1), "frozen.round"),
    (rv.STACKS, {"round": 0, "detail": True, "ranks": [{**_ROW, "state": "waiting", "operation": "all_reduce",
                                                         "site": ["train.py", 10, "step"],
                                                         "frames": [["train.py", 10, "step"]], "silent": 1.0}]},
     ("ranks", [{**_ROW, "state": "asleep"}]), "stacks.ranks[0].state"),
]


def test_the_table_covers_every_member_message_type():
    assert sorted(kind for kind, *_ in TABLE) == sorted(MEMBER_TYPES)


@pytest.mark.parametrize("kind, valid, bad, field", TABLE, ids=[row[0] for row in TABLE])
def test_each_member_message_type_has_a_valid_example_and_a_bad_field_named_in_its_refusal(kind, valid, bad, field):
    assert rv.check_member_message({"type": kind, **valid})["type"] == kind
    with pytest.raises(rv.ProtocolError, match=f"^{re.escape(field)}: "):
        rv.check_member_message({"type": kind, **valid, bad[0]: bad[1]})


def _within(member: Member, kind: str, seconds: float) -> dict[str, Any] | None:
    """The first ``kind`` message ``member`` gets within ``seconds`` (heartbeats do not extend it)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        member.sock.settimeout(left)
        try:
            line = member.file.readline()
        except TimeoutError:
            return None
        if not line:
            return None
        if (message := json.loads(line))["type"] == kind:
            return message
    return None


def _read(sock: socket.socket, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Every line ``sock`` gets until the coordinator closes it (or ``timeout``)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    except OSError:
        pass
    return [json.loads(line) for line in data.split(b"\n") if line.strip()]


def test_over_a_real_socket_each_valid_example_is_accepted_and_each_bad_field_refused_by_name():
    """Per type, on a member's connection: the valid example, then a sentinel bad message whose
    refusal proves the example was accepted; on another: the bad field, refused naming it, and
    the connection closed. A member that left is not read any more: its example is checked by the
    observers' ``lost`` event (reason Left)."""
    srv = Server(members=2)
    watcher = srv.connect()
    watcher.sendall(rv.encode({"type": rv.HELLO, "versions": [1], "role": rv.ROLE_OBSERVER, "token": TOKEN}))
    watch = watcher.makefile("rb")
    watcher.settimeout(10)
    assert json.loads(watch.readline())["type"] == rv.WELCOME
    keep = Member(srv, 0)  # the gang's member 0, undisturbed throughout
    try:
        assert keep.expect(rv.WELCOME)["round"] == 0
        for i, (kind, valid, bad, field) in enumerate(TABLE):
            good = _Incarnate(srv, 1, f"table-{i}-good")
            assert good.expect(rv.WELCOME)["type"] == rv.WELCOME
            good.send({"type": kind, **valid})
            if kind == rv.LEAVE:
                # Earlier rows' member 1 was lost otherwise (Disconnected, Superseded): this one left.
                while not ((event := json.loads(watch.readline()))["type"] == rv.EV_LOST and event["member"] == 1
                           and event["reason"] == rv.LOST_LEFT):
                    pass
            else:
                good.sock.sendall(rv.encode({"type": rv.FROZEN, "round": "sentinel"}))
                got = _read(good.sock)
                refused = [m for m in got if m["type"] == rv.REFUSED]
                assert len(refused) == 1 and refused[0]["reason"].startswith("frozen.round: 'sentinel'"), (kind, got)
                assert got[-1] is refused[0], "closed right after its refusal"
            good.close()
            wrong = _Incarnate(srv, 1, f"table-{i}-bad")
            assert wrong.expect(rv.WELCOME)["type"] == rv.WELCOME
            wrong.send({"type": kind, **valid, bad[0]: bad[1]})
            got = _read(wrong.sock)
            refused = [m for m in got if m["type"] == rv.REFUSED]
            assert len(refused) == 1 and refused[0]["reason"].startswith(f"{field}: "), (kind, got)
            assert got[-1] is refused[0], "closed right after its refusal"
            wrong.close()
        # Observers and spares may say only their few messages.
        for role, extra, reason in ((rv.ROLE_OBSERVER, {}, "an observer may send only hb"),
                                    (rv.ROLE_SPARE, {"spare": 3, "incarnation": "s"},
                                     "a spare may send only hb and leave")):
            with srv.connect() as s:
                s.sendall(rv.encode({"type": rv.HELLO, "versions": [1], "role": role, "token": TOKEN, **extra})
                          + rv.encode({"type": rv.HEARTBEAT}) + rv.encode({"type": rv.JOIN, "round": 0}))
                got = _read(s)
            assert [m["type"] for m in got if m["type"] in (rv.WELCOME, rv.REFUSED)] == [rv.WELCOME, rv.REFUSED], got
            assert got[-1]["reason"].startswith(reason), got
        keep.send({"type": rv.HEARTBEAT})
        assert srv.server.thread.is_alive()
        with srv.server.lock:
            assert srv.machine.incarnations.get(0) == "inc-0", "member 0 was never disturbed"
    finally:
        keep.close()
        watch.close()
        watcher.close()
        srv.stop()


# --- what the storm found, each kept ------------------------------------------------------------------


def test_a_huge_integer_in_a_number_field_is_refused_naming_the_field(capsys):
    srv = Server(members=2)
    try:
        m = _Incarnate(srv, 1, "huge")
        assert m.expect(rv.WELCOME)["type"] == rv.WELCOME
        m.sock.sendall(b'{"type":"hb","idle":1' + b"0" * 400 + b"}\n")
        got = _read(m.sock)
        m.close()
        assert srv.server.thread.is_alive()
        assert "coordinator: closed a connection after" not in capsys.readouterr().err
        assert got and got[-1]["type"] == rv.REFUSED and got[-1]["reason"].startswith("hb.idle: "), got
    finally:
        srv.stop()


def test_a_member_refused_for_a_line_that_is_not_a_message_is_lost_as_any_member_closed_so():
    srv = Server(members=2)
    members = [_Incarnate(srv, 0, "m0"), _Incarnate(srv, 1, "m1")]
    try:
        for m in members:
            assert m.expect(rv.WELCOME)["round"] == 0
            m.send({"type": rv.JOIN, "round": 0})
        for m in members:
            m.expect(rv.GO)
        members[1].sock.sendall(b"not json\n")
        got = _read(members[1].sock)
        assert got and got[-1]["type"] == rv.REFUSED and got[-1]["reason"].startswith("not JSON")
        # As with a bad field (test_coordinator_trust): member 1 is lost, member 0 is told to stop.
        assert _within(members[0], rv.STOP, 1.0) is not None, "member 1 is still live: the round waits for it"
    finally:
        for m in members:
            m.close()
        srv.stop()


def test_a_departing_member_refused_for_a_line_that_is_not_a_message_has_ended():
    srv = Server(members=2)
    m = _Incarnate(srv, 1, "leaving")
    try:
        assert m.expect(rv.WELCOME)["type"] == rv.WELCOME
        m.send({"type": rv.LEAVE})
        m.sock.sendall(b"not json\n")
        got = _read(m.sock)
        assert got and got[-1]["type"] == rv.REFUSED and got[-1]["reason"].startswith("not JSON")
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            with srv.server.lock:
                if not srv.machine.departing:
                    break
            time.sleep(0.05)
        with srv.server.lock:
            assert not srv.machine.departing, "its connection ended: none of its processes runs any more"
    finally:
        m.close()
        srv.stop()


def test_a_hello_and_a_long_member_line_in_one_read_are_both_taken():
    """The hello's limit (MAX_HELLO_LINE) holds until the hello is handled; a member's line after
    it in the same read (a failure with its tail) is held to the member's limit."""
    srv = Server(members=2)
    m = _Incarnate(srv, 1, "one-read")
    try:
        m.sock.close()
        sock = srv.connect()
        hello = {"type": rv.HELLO, "versions": [1], "role": rv.ROLE_MEMBER, "member": 1, "token": TOKEN,
                 "incarnation": "one-read-2", "node": "node-a"}
        long = {"type": rv.HEARTBEAT, "idle": 1.0, "rank": 1, "line": "x" * rv.MAX_OUTPUT_LINE,
                "pad": "y" * (2 * rv.MAX_HELLO_LINE)}
        sock.sendall(rv.encode(hello) + rv.encode(long))
        sock.settimeout(5.0)
        first = json.loads(sock.makefile("rb").readline())
        assert first["type"] == rv.WELCOME, first
        assert _within_sock(sock, rv.REFUSED, 0.5) is None, "the long line after the hello was refused"
        with srv.server.lock:
            assert srv.machine.incarnations.get(1) == "one-read-2"
        sock.close()
    finally:
        srv.stop()


def _within_sock(sock: socket.socket, kind: str, seconds: float) -> dict[str, Any] | None:
    sock.settimeout(seconds)
    try:
        for line in sock.makefile("rb"):
            if (message := json.loads(line))["type"] == kind:
                return message
    except (TimeoutError, OSError):
        return None
    return None


def test_the_messages_before_a_bad_line_are_had_before_its_refusal():
    buffer = rv.LineBuffer(limit=64)
    got = []
    with pytest.raises(rv.ProtocolError, match="not JSON"):
        for message in buffer.messages(b'{"type":"join","round":0}\nnot json\n{"type":"hb"}\n'):
            got.append(message["type"])
    assert got == ["join"]
    buffer = rv.LineBuffer(limit=64)
    lines = buffer.messages(b'{"type":"hello"}\n{"type":"hb","pad":"' + b"z" * 100 + b'"}\n')
    assert next(lines)["type"] == "hello"
    buffer.limit = 4096  # what a hello does
    assert next(lines)["type"] == "hb"


def test_a_member_superseded_by_its_new_pod_is_not_also_given_to_a_spare():
    """A new incarnation of member 1 supersedes the old: the place is the new pod's, and the ready
    spare stays ready (given it, it would be turned away as the member later, or supersede the
    new pod and restart the gang once more)."""
    c = coordinator.Coordinator(2, 0, coordinator.Policy(max_restarts=3, backoff=0.0), 0.0, world_size=2)
    c.hello(0, "a", 0.0)
    c.hello(1, "b", 0.0)
    c.spare_hello(0, "s", 0.0)
    out = c.hello(1, "b2", 1.0)
    assert not [o for o in out if o.message.get("type") == rv.ASSIGN], out
    assert c.spares and not c.assigned and c.admits(1, None) is None
    assert c.incarnations[1] == "b2"


def test_a_hello_repeating_the_incarnation_closes_the_older_connection():
    """One connection per member: the same agent's hello again (a stale connection of its) leaves
    the older one closed, never a second open connection feeding the coordinator."""
    srv = Server(members=2)
    first = _Incarnate(srv, 1, "same")
    try:
        assert first.expect(rv.WELCOME)["type"] == rv.WELCOME
        second = _Incarnate(srv, 1, "same")
        assert second.expect(rv.WELCOME)["type"] == rv.WELCOME
        assert closed_by_peer(first.sock, 5.0), "the older connection is still open"
        with srv.server.lock:
            assert srv.machine.incarnations.get(1) == "same" and 1 in srv.machine.live()
        second.close()
    finally:
        first.close()
        srv.stop()
