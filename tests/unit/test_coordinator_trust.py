"""The coordinator as a stranger meets it: only a hello with the attempt's token gets in, every field
of every message is checked, a bad message closes its own connection and nothing else, and every
buffer and count is bounded (docs/restart-in-place.md, "Trust and bounds").

The pure checks are tables; the server runs on real loopback sockets in this process, its members
speaking the protocol over their own connections (the same :class:`agent.CoordinatorServer` rank
0's agent runs). tests/lib/test_agent.py has strangers against real worker processes.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time

import pytest

from monarch_spmd.payload import agent, coordinator
from monarch_spmd.payload import rendezvous as rv

TOKEN = rv.new_token()


# --- the pure checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("hello, field", [
    ({"role": "member", "member": "1"}, "hello.member"),
    ({"role": "member", "member": True}, "hello.member"),
    ({"role": "member", "member": 4}, "hello.member"),
    ({"role": "member", "member": -1}, "hello.member"),
    ({"role": "member", "member": 1, "disruptions": "lots"}, "hello.disruptions"),
    ({"role": "member", "member": 1, "disruptions": -3}, "hello.disruptions"),
    ({"role": "member", "member": 1, "incarnation": ["x"]}, "hello.incarnation"),
    ({"role": "member", "member": 1, "node": 7}, "hello.node"),
    ({"role": "admin"}, "hello.role"),
    ({"role": "observer", "versions": "1"}, "hello.versions"),
    ({"role": "observer", "versions": list(range(100))}, "hello.versions"),
])
def test_a_hello_with_a_field_of_the_wrong_type_or_out_of_range_is_refused_naming_it(hello, field):
    with pytest.raises(rv.ProtocolError, match=f"^{field}"):
        rv.check_hello({"type": "hello", "versions": [1], **hello}, members=4)


@pytest.mark.parametrize("message, field", [
    ({"type": "join", "round": "lots"}, "join.round"),
    ({"type": "join", "round": 1.5}, "join.round"),
    ({"type": "join"}, "join.round"),
    ({"type": "join", "round": 1 << 40}, "join.round"),
    ({"type": "running", "round": 0, "procs": "all"}, "running.procs"),
    ({"type": "running", "round": 0, "procs": [{"rank": "0", "local_rank": 0}]}, r"running.procs\[0\].rank"),
    ({"type": "running", "round": 0, "procs": [{"rank": 0}] * (rv.MAX_PROCS + 1)}, "running.procs"),
    ({"type": "failure", "round": 0, "exit_code": 999}, "failure.exit_code"),
    ({"type": "failure", "round": 0, "tail": "one string"}, "failure.tail"),
    ({"type": "failure", "round": 0, "message": {"a": 1}}, "failure.message"),
    ({"type": "failure", "round": 0, "at": float("nan")}, "failure.at"),
    ({"type": "exited", "round": 0, "procs": [{"rank": 0, "local_rank": 0, "returncode": "x"}]}, r"exited.procs\[0\].returncode"),
    ({"type": "hb", "idle": -1}, "hb.idle"),
    ({"type": "hb", "idle": "soon"}, "hb.idle"),
    ({"type": "welcome"}, "a member may not send 'welcome'"),
    ({"type": "fail", "round": 0}, "a member may not send 'fail'"),
])
def test_a_member_message_with_a_bad_field_is_refused_naming_it(message, field):
    with pytest.raises(rv.ProtocolError, match=f"^{field}"):
        rv.check_member_message(message)


def test_long_texts_and_tails_are_cut_not_refused():
    checked = rv.check_member_message({"type": "failure", "round": 2, "rank": 1, "exit_code": 3,
                                       "message": "m" * 100_000, "tail": ["x" * 20_000] * 50, "at": 1.0})
    assert len(checked["message"]) == rv.MAX_TEXT and checked["message"].endswith("characters cut]")
    assert len(checked["tail"]) == rv.TAIL_LINES and all(len(line) == rv.MAX_OUTPUT_LINE for line in checked["tail"])
    assert len(rv.encode(checked)) < 16 * 1024
    beat = rv.check_member_message({"type": "hb", "idle": 3, "rank": 0, "line": "y" * 5000})
    assert len(beat["line"]) == rv.MAX_OUTPUT_LINE


def test_the_token_is_compared_whole_and_no_token_means_no_check():
    assert rv.token_matches(TOKEN, TOKEN)
    assert not rv.token_matches(TOKEN, TOKEN[:-1]) and not rv.token_matches(TOKEN, None)
    assert not rv.token_matches(TOKEN, 12) and not rv.token_matches(TOKEN, "")
    assert rv.token_matches("", None) and rv.token_matches("", "anything")
    assert len(rv.new_token()) == 43 and rv.new_token() != rv.new_token()


def test_a_members_disruptions_can_never_exceed_the_rounds_there_were():
    c = coordinator.Coordinator(2, 3, coordinator.Policy(max_restarts=0), now=0.0, world_size=2, run_id="job")
    c.start()
    c.hello(0, "a", 0.0, disruptions=10**9)
    c.hello(1, "b", 0.0, disruptions=1)
    assert c.disruptions == 3, "at most the round: restarts keep counting against maxRestarts"


def _fail_with_long_output(c: coordinator.Coordinator, now: float) -> None:
    r = c.round
    for m in range(c.members):
        if m not in c.incarnations:
            c.hello(m, f"inc-{m}", now)
        c.join(m, r, now)
    for m in range(c.members):
        c.running(m, r, [{"rank": m, "local_rank": 0, "pid": 10 + m}], now)
    info = rv.check_member_message({"type": "failure", "round": r, "rank": 1, "exit_code": 3, "reason": "Error",
                                    "message": "E" * 50_000, "tail": ["L" * 20_000] * 50, "at": now})
    c.failure(1, r, info, now)
    for m in range(c.members):
        c.exited(m, r, [{"rank": m, "exit_code": 3 if m == 1 else 143, "stopped": m != 1}], now)
        c.join(m, r + 1, now)


def test_a_long_history_of_long_failures_still_fits_one_welcome_line_with_the_newest_whole():
    c = coordinator.Coordinator(2, 0, coordinator.Policy(max_restarts=10_000, backoff=0.0, member_failure_limit=10**6), now=0.0,
                       world_size=2, run_id="job", wall=lambda: 1000.0)
    c.start()
    for i in range(300):
        _fail_with_long_output(c, float(i))
    welcome = rv.encode(c.observer_welcome())
    assert len(welcome) < rv.MAX_LINE, len(welcome)
    assert c.history_bytes <= rv.MAX_HISTORY_BYTES
    history = c.observer_welcome()["history"]
    newest = [e for e in history if e["type"] == rv.EV_RESTART][-1]
    assert newest["next_round"] == 300 and newest["tail"] and not newest.get("compacted"), "the newest keeps its output"
    assert history[0].get("compacted") or c.history_dropped, "the oldest gave way"
    assert rv.LineBuffer().feed(welcome)[0]["type"] == rv.WELCOME, "an observer reads it"


# --- the server, on real sockets ---------------------------------------------------------------------


class Server:
    """A coordinator server of ``members`` with the attempt's token, on a loopback port."""

    def __init__(self, members: int = 2, token: str = TOKEN) -> None:
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.machine = coordinator.Coordinator(members, 0, coordinator.Policy(max_restarts=3, backoff=0.0), time.monotonic(),
                                      world_size=members, run_id="job-uid", wall=time.time)
        self.server = agent.CoordinatorServer(sock, self.machine, token)
        self.server.start()

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return s

    def stop(self) -> None:
        self.server.stop()


class Member:
    """A member speaking the protocol over its own connection: hello, join, running, exited."""

    def __init__(self, server: Server, member: int, token: str = TOKEN) -> None:
        self.sock = server.connect()
        self.file = self.sock.makefile("rb")
        self.member = member
        self.send({"type": "hello", "versions": [1], "role": "member", "member": member, "token": token,
                   "incarnation": f"inc-{member}", "node": "node-a"})

    def send(self, message: dict) -> None:
        self.sock.sendall(rv.encode(message))

    def expect(self, kind: str, timeout: float = 10.0) -> dict:
        self.sock.settimeout(timeout)
        while True:
            line = self.file.readline()
            if not line:
                raise AssertionError(f"connection closed while waiting for {kind}")
            message = json.loads(line)
            if message["type"] == kind:
                return message
            if message["type"] == rv.REFUSED:
                raise AssertionError(f"refused: {message}")

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def answer(sock: socket.socket, timeout: float = 10.0) -> dict | None:
    """The first line the coordinator sends on ``sock``, or None when it closes it without one."""
    sock.settimeout(timeout)
    line = sock.makefile("rb").readline()
    return json.loads(line) if line else None


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the coordinator closes ``sock`` within ``timeout`` (reads until EOF, discarding)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


def running_round(server: Server, members: list[Member], r: int = 0) -> None:
    for m in members:
        m.expect(rv.WELCOME)
        m.send({"type": "join", "round": r})
    for m in members:
        m.expect(rv.GO)
        m.send({"type": "running", "round": r, "procs": [{"rank": m.member, "local_rank": 0, "pid": 100 + m.member}]})


def test_without_the_token_a_stranger_reads_nothing_and_claims_no_member():
    srv = Server()
    members = [Member(srv, 0), Member(srv, 1)]
    try:
        running_round(srv, members)
        for hello in ({"role": "observer"}, {"role": "member", "member": 1, "incarnation": "evil"},
                      {"role": "observer", "token": TOKEN[:-1] + ("A" if TOKEN[-1] != "A" else "B")},
                      {"role": "member", "member": 1, "token": None}):
            with srv.connect() as s:
                s.sendall(rv.encode({"type": "hello", "versions": [1], **hello}))
                reply = answer(s)
            assert reply is not None and reply["type"] == rv.REFUSED and "wrong token" in reply["reason"]
            assert set(reply) == {"type", "reason", "versions"}, "a refusal says nothing of the job"
        assert srv.machine.incarnations == {0: "inc-0", 1: "inc-1"}, "member 1 is still the real one"
        assert srv.machine.phase == rv.RUNNING_PHASE and srv.machine.round == 0 and not srv.machine.failures
        with srv.connect() as s:  # the real operator's hello
            s.sendall(rv.encode({"type": "hello", "versions": [1], "role": "observer", "token": TOKEN}))
            welcome = answer(s)
        assert welcome["type"] == rv.WELCOME and welcome["run_id"] == "job-uid"
    finally:
        for m in members:
            m.close()
        srv.stop()


def test_a_connection_that_never_says_hello_is_closed_within_the_hello_timeout():
    srv = Server()
    try:
        with srv.connect() as silent, srv.connect() as partial:
            partial.sendall(b'{"type":"hel')  # a hello that never ends
            began = time.monotonic()
            assert closed_by_peer(silent, rv.HELLO_TIMEOUT + 5)
            assert closed_by_peer(partial, rv.HELLO_TIMEOUT + 5)
            assert time.monotonic() - began < rv.HELLO_TIMEOUT + 5
    finally:
        srv.stop()


def test_an_oversized_hello_is_refused_at_its_limit():
    srv = Server()
    try:
        with srv.connect() as s:
            s.sendall(b'{"type":"hello","role":"observer","pad":"' + b"x" * (rv.MAX_HELLO_LINE + 10))
            reply = answer(s)
        assert reply["type"] == rv.REFUSED and f"longer than {rv.MAX_HELLO_LINE}" in reply["reason"]
    finally:
        srv.stop()


def test_connections_that_have_not_said_hello_are_bounded():
    srv = Server()
    socks = []
    try:
        for _ in range(rv.MAX_PENDING + 20):
            socks.append(srv.connect())
        member = Member(srv, 0)  # a member's hello comes at once: the flood does not keep it out
        assert member.expect(rv.WELCOME)["round"] == 0
        assert all(closed_by_peer(s, 10) for s in socks[:21]), "the oldest silent connections went first"
        with srv.server.lock:
            pending = sum(1 for c in list(srv.server.conns.values()) if c.role is None)
        assert pending <= rv.MAX_PENDING
        member.close()
    finally:
        for s in socks:
            s.close()
        srv.stop()


def test_a_bad_message_from_a_member_closes_only_its_own_connection_and_the_coordinator_goes_on():
    srv = Server(members=2)
    members = [Member(srv, 0), Member(srv, 1)]
    try:
        running_round(srv, members)
        members[1].send({"type": "join", "round": "lots"})
        reply = json.loads(members[1].file.readline())
        assert reply["type"] == rv.REFUSED and reply["reason"].startswith("join.round")
        assert closed_by_peer(members[1].sock, 5)
        # The coordinator's thread lives: member 1 is lost (a round failure) and member 0 is told to stop.
        assert members[0].expect(rv.STOP)["round"] == 0
        assert srv.server.thread.is_alive()
        again = Member(srv, 1)
        assert again.expect(rv.WELCOME)["round"] == 1
        again.close()
    finally:
        for m in members:
            m.close()
        srv.stop()


def test_an_observer_that_never_reads_is_dropped_and_the_gang_is_not_held_up():
    srv = Server(members=1)
    member = Member(srv, 0)
    slow = srv.connect()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        running_round(srv, [member])
        slow.sendall(rv.encode({"type": "hello", "versions": [1], "role": "observer", "token": TOKEN}))
        deadline = time.monotonic() + 60
        beat = {"type": "hb", "idle": 0.5, "rank": 0, "line": "z" * 400}
        sent = 0
        # Progress events carry a line each; the member's heartbeats feed them. Until the slow
        # observer is dropped, its waiting bytes never pass the bound.
        while srv.server.observers and time.monotonic() < deadline:
            for _ in range(50):
                member.send(beat)
            with srv.server.lock:
                for _ in range(200):
                    srv.server._apply([rv.Out(rv.OBSERVERS, {"type": "progress", "seq": 0, "line": "p" * 500})])
                    sent += 1
                waiting = sum(len(c.handle.out) for c in srv.server.conns.values())
            assert waiting <= rv.MAX_OUTBOX + 64 * 1024
        assert not srv.server.observers, f"the slow observer was dropped ({sent} events)"
        assert srv.server.thread.is_alive() and srv.machine.phase == rv.RUNNING_PHASE
    finally:
        slow.close()
        member.close()
        srv.stop()


def _garbage(rng: random.Random) -> bytes:
    """One line an adversary might send: malformed, oversized, wrong types, wrong order, no token."""
    choice = rng.randrange(12)
    if choice == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))).replace(b"\n", b"") + b"\n"
    if choice == 1:
        return b"x" * rng.choice((10, 5000, 70_000)) + b"\n"
    if choice == 2:
        return b'{"type":' + b"[" * 1000 + b"\n"
    if choice == 3:
        return json.dumps(rng.choice([[], 1, "s", None, {"type": 5}])).encode() + b"\n"
    fields = {"type": rng.choice(["hello", "join", "running", "failure", "exited", "leave", "hb", "welcome", "go",
                                  "fail", "stop", "x" * 100]),
              "role": rng.choice(["member", "observer", None, 3, "admin"]),
              "member": rng.choice([0, 1, -1, 2, 10**12, "1", None, True, 1.5]),
              "round": rng.choice([0, 1, -5, 10**30, "lots", None, [0]]),
              "token": rng.choice(["", "x" * 43, None, 7, TOKEN[:10]]),
              "versions": rng.choice([[1], [9], "1", None, list(range(50))]),
              "disruptions": rng.choice(["lots", 10**9, -1, None, 2.5]),
              "procs": rng.choice([[], "all", [{"rank": "x"}], [1] * 10, None]),
              "exit_code": rng.choice([64, -1, 1000, "64", None]),
              "tail": rng.choice([["a" * 30_000] * 3, "tail", None, [1, 2]]),
              "idle": rng.choice([float("inf"), -1, "x", 3, None])}
    keep = rng.sample(sorted(fields), rng.randrange(1, len(fields) + 1))
    text = json.dumps({k: fields[k] for k in keep}, default=str)
    return text.encode() + b"\n"


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_fuzz_ten_thousand_hostile_messages_while_a_real_round_runs():
    """10,000 random, malformed and oversized messages from strangers on hundreds of connections,
    some of which never read, while two members run a round, heartbeat and finish it."""
    srv = Server(members=2)
    members = [Member(srv, 0), Member(srv, 1)]
    rng = random.Random(34)
    sent = 0
    stop = threading.Event()
    beats: list[int] = []

    def heartbeat() -> None:
        while not stop.is_set():
            for m in members:
                m.send({"type": "hb", "idle": 0.1, "rank": m.member, "line": "step"})
            beats.append(1)
            stop.wait(0.2)

    try:
        running_round(srv, members)
        pulse = threading.Thread(target=heartbeat, daemon=True)
        pulse.start()
        base = _rss_kib()
        peak_conns = 0
        while sent < 10_000:
            conns = []
            for _ in range(rng.randrange(1, 8)):
                try:
                    conns.append(srv.connect())
                except OSError:
                    continue
            for s in conns:
                lines = b"".join(_garbage(rng) for _ in range(rng.randrange(1, 10)))
                sent += lines.count(b"\n")
                try:
                    s.sendall(lines)
                except OSError:
                    pass
            peak_conns = max(peak_conns, len(srv.server.conns))
            for s in conns[: len(conns) // 2]:  # the rest linger unread until the hello timeout closes them
                s.close()
            assert srv.server.thread.is_alive(), f"the coordinator's thread died after {sent} messages"
        assert peak_conns <= rv.MAX_PENDING + 2 + rv.MAX_OBSERVERS
        assert srv.machine.incarnations == {0: "inc-0", 1: "inc-1"} and srv.machine.phase == rv.RUNNING_PHASE
        assert srv.machine.round == 0 and not srv.machine.failures, "no stranger moved the round"
        stop.set()
        pulse.join(5)
        for m in members:  # the round ends as it would have
            m.send({"type": "exited", "round": 0, "procs": [{"rank": m.member, "local_rank": 0, "pid": 1,
                                                             "exit_code": 0, "returncode": 0, "stopped": False}]})
        for m in members:
            assert m.expect(rv.FINISH)["round"] == 0
        assert srv.machine.phase == rv.FINISHED and beats
        grown = _rss_kib() - base
        assert grown < 64 * 1024, f"the process grew {grown} KiB over {sent} hostile messages"
    finally:
        stop.set()
        for m in members:
            m.close()
        srv.stop()
