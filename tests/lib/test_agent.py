"""Restart in place with real workers, as pods run them: one worker process per "pod", started by
hand with the inputs the operator gives pods, real sockets to the coordinator in rank 0's worker,
real training processes (gloo). What the operator will do (replace one pod, recreate the gang) is
done here by hand, and an observer reads the coordinator's events as the operator will.

docs/restart-in-place.md is what these tests hold the code to."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time

from monarch_spmd.payload import agent, rendezvous

from .conftest import alive, free_port, wait_dead, worker_cmd, worker_inputs

PROGRAMS = "tests.programs"


class Events:
    """An observer of a coordinator: every message, in order, and a way to wait for one."""

    def __init__(self, port: int, token: str = "") -> None:
        self.messages: list[dict] = []
        self.cond = threading.Condition()
        self.observer = agent.Observer("127.0.0.1", port, self._on, retry_until=time.monotonic() + 60, token=token)
        self.observer.start()

    def _on(self, message: dict) -> None:
        with self.cond:
            # A gang can be running before the first connection: the observer hands over the
            # job-level events sent before it (the welcome's history) first, each once.
            self.messages.append(message)
            self.cond.notify_all()

    def of(self, kind: str) -> list[dict]:
        with self.cond:
            return [m for m in self.messages if m["type"] == kind]

    def wait(self, kind: str, count: int = 1, timeout: float = 120.0, **fields) -> dict:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [m for m in self.messages if m["type"] == kind and all(m.get(k) == v for k, v in fields.items())]
                if len(found) >= count:
                    return found[count - 1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {count} {kind} event(s) with {fields}; got {self.messages}")
                self.cond.wait(min(left, 0.2))

    def close(self) -> None:
        self.observer.stop()


class Gang:
    """Worker processes started as pods: ``pods`` of them for ``mesh``, sharing one coordinator."""

    def __init__(self, spawn, mesh: str, argv: list[str], layout: str = "PerProc", **extra: str) -> None:
        self.spawn = spawn
        self.mesh = mesh
        self.argv = argv
        self.layout = layout
        self.master_port = free_port()
        self.agent_port = free_port()
        while self.agent_port == self.master_port:
            self.agent_port = free_port()
        # Every pod of an attempt carries its agent token, as the operator builds them.
        self.token = rendezvous.new_token()
        self.extra = {"MONARCH_SPMD_STOP_GRACE": "3", "MONARCH_SPMD_BACKOFF_SECONDS": "0",
                      "MONARCH_SPMD_AGENT_TOKEN": self.token, **extra}
        sizes = [int(d.split("=")[1]) for d in mesh.split(",")]
        self.pods = sizes[0] if layout == "PerHost" or len(sizes) == 1 else sizes[0] * sizes[1]
        self.workers: dict[int, object] = {}

    def coords(self, index: int) -> str:
        sizes = [int(d.split("=")[1]) for d in self.mesh.split(",")]
        if self.layout == "PerHost":
            return str(index) if len(sizes) > 1 else ""
        out, r = [], index
        for size in reversed(sizes):
            r, c = divmod(r, size)
            out.append(str(c))
        return ",".join(reversed(out))

    def start(self, index: int, **extra: str):
        env = worker_inputs(self.mesh, self.coords(index), self.master_port, MONARCH_SPMD_AGENT_PORT=str(self.agent_port),
                            MONARCH_SPMD_POD_LAYOUT=self.layout, **{**self.extra, **extra})
        self.workers[index] = self.spawn(worker_cmd(*self.argv), env=env)
        return self.workers[index]

    def start_all(self) -> Gang:
        for i in range(self.pods):
            self.start(i)
        return self

    def stop_all(self) -> None:
        """Ends every worker still running (SIGTERM to its process group) and waits until they are gone."""
        for w in self.workers.values():
            if w.proc.poll() is None:
                os.killpg(w.proc.pid, signal.SIGTERM)
        wait_dead({w.proc.pid for w in self.workers.values()}, 30)

    def observed(self) -> Events:
        """Starts the gang with an observer connected before any member but the coordinator's
        runs: a gang that fails at once ends its coordinator, so an observer that connected only
        after that would hear nothing. Returns the observer (welcomed)."""
        self.start(0)
        events = Events(self.agent_port, self.token)
        events.wait(rendezvous.WELCOME, timeout=60)
        for i in range(1, self.pods):
            self.start(i)
        return events


def pids_of(text: str, pattern: str) -> set[int]:
    return {int(p) for p in re.findall(pattern, text)}


def test_a_failed_rank_restarts_the_gang_in_place_and_training_resumes_over_gloo(spawn, tmp_path):
    gang = Gang(spawn, "hosts=2,gpus=2", ["-m", f"{PROGRAMS}.resume_training", "--checkpoint-dir", str(tmp_path),
                                         "--steps", "4", "--fail-rank", "3", "--fail-step", "2"],
                layout="PerHost", MONARCH_SPMD_MAX_RESTARTS="2")
    events = gang.observed()
    try:
        codes = [w.finish(180) for w in gang.workers.values()]
        text = "".join(w.text for w in gang.workers.values())
        assert codes == [0, 0], text
        # Every rank started twice, in the same two worker processes ("pods"), and resumed from its checkpoint.
        for rank in range(4):
            assert re.search(rf"\[rank {rank}\] resume_training rank {rank} pid \d+ restart 0 from step 0", text), text
            assert re.search(rf"\[rank {rank}\] resume_training rank {rank} pid \d+ restart 1 from step 2", text), text
            assert f"[rank {rank}] resume_training rank {rank} done at step 4 (restart 1, all_reduce sum ok)" in text
        assert text.count("monarch-spmd worker: ranks ") == 2, "each worker started once: the restart was in place"
        assert "monarch-spmd worker: restart 1: starting ranks 2..3 again (TORCHELASTIC_RESTART_COUNT=1)" in text
        # The observer saw what the operator will turn into one status patch, one Event and a metric.
        failure = events.wait(rendezvous.EV_FAILURE)
        assert (failure["round"], failure["rank"], failure["member"], failure["exit_code"], failure["reason"]) == (0, 3, 1, 3, "Error")
        assert failure["message"] == "rank 3 exited with code 3 (local rank 1)", "named as the verdict line names it"
        assert "failing at step 2" in failure["tail"][-1]
        restart = events.wait(rendezvous.EV_RESTART)
        assert (restart["next_round"], restart["rank"], restart["counted"], restart["max_restarts"]) == (1, 3, 1, 2)
        again = events.wait(rendezvous.EV_ALL_RUNNING, round=1)
        assert 0 <= again["seconds_since_failure"] < 60
        events.wait(rendezvous.EV_SUCCEEDED)
        stopped = {row["rank"]: row for e in events.of(rendezvous.EV_EXITED) if e["round"] == 0 for row in e["procs"]}
        assert stopped[3]["exit_code"] == 3 and not stopped[3]["stopped"]
        assert all(stopped[r]["stopped"] for r in (0, 1, 2)), stopped
    finally:
        events.close()


def test_no_process_of_a_new_round_starts_before_every_old_one_is_gone(spawn, tmp_path):
    # Rank 0 takes 2 s to stop (it "checkpoints" on SIGTERM); rank 1 fails at once. The new rank 1
    # must not start before the old rank 0 has exited, though its own worker was ready long before.
    log = tmp_path / "times"
    gang = Gang(spawn, "hosts=2", ["-m", f"{PROGRAMS}.barrier_probe", "--log", str(log)],
                MONARCH_SPMD_MAX_RESTARTS="1").start_all()
    codes = [w.finish(120) for w in gang.workers.values()]
    assert codes == [0, 0], "".join(w.text for w in gang.workers.values())
    records = [json.loads(line) for line in log.read_text().splitlines()]
    old_exits = [r["t"] for r in records if r["event"] == "exit" and r["restart"] == 0]
    new_starts = [r["t"] for r in records if r["event"] == "start" and r["restart"] == 1]
    assert len(old_exits) == 2 and len(new_starts) == 2, records
    assert min(new_starts) > max(old_exits), records


def test_a_lost_worker_is_replaced_alone_and_the_others_wait_for_it(spawn, tmp_path):
    gang = Gang(spawn, "hosts=3", ["-m", f"{PROGRAMS}.resume_training", "--checkpoint-dir", str(tmp_path),
                                   "--steps", "40", "--step-seconds", "0.25"],
                MONARCH_SPMD_MAX_RESTARTS="2")
    events = gang.observed()
    try:
        events.wait(rendezvous.EV_ALL_RUNNING, round=0)
        first = {i: w.proc.pid for i, w in gang.workers.items()}
        os.kill(first[2], signal.SIGKILL)  # the "pod" of rank 2 is lost
        lost = events.wait(rendezvous.EV_LOST)
        assert (lost["member"], lost["reason"]) == (2, "Disconnected")
        restart = events.wait(rendezvous.EV_RESTART)
        assert (restart["reason"], restart["next_round"]) == ("MemberLost", 1)
        time.sleep(1.0)
        assert not events.of(rendezvous.EV_STARTED)[1:], "round 1 waits for the replacement"
        replacement = gang.start(2, MONARCH_SPMD_RESTART_COUNT="1")
        joined = events.wait(rendezvous.EV_JOINED, member=2, round=1)
        assert joined["replacement"] is True
        events.wait(rendezvous.EV_ALL_RUNNING, round=1)
        assert [gang.workers[i].finish(180) for i in (0, 1)] == [0, 0]
        assert replacement.finish(60) == 0
        text = "".join(w.text for w in gang.workers.values())
        assert all(alive(first[i]) is False for i in (0, 1)), "they exited at the end"
        for rank in range(3):
            assert f"resume_training rank {rank} done at step 40 (restart 1, all_reduce sum ok)" in text, text
        assert "restart 1: starting rank 0 again" in gang.workers[0].text  # the same worker process, in place
    finally:
        events.close()


def test_the_worker_as_pid_1_reaps_every_orphan_of_ten_restarts_in_place(spawn):
    """The worker is its container's PID 1 (here: of a PID namespace of its own, as a container's
    is). Ten restarts in place of a rank that leaves DataLoader workers, a multiprocessing child
    and a subprocess behind each time: every one of them is reaped, no zombie is left."""
    port = free_port()
    env = worker_inputs("hosts=1", "0", MONARCH_SPMD_AGENT_PORT=str(port), MONARCH_SPMD_MAX_RESTARTS="10",
                        MONARCH_SPMD_BACKOFF_SECONDS="0", MONARCH_SPMD_MEMBER_FAILURE_LIMIT="100",
                        MONARCH_SPMD_STOP_GRACE="3", MONARCH_SPMD_AGENT_TOKEN=rendezvous.new_token())
    proc = spawn(["unshare", "--pid", "--fork", "--mount-proc",
                  *worker_cmd("-m", f"{PROGRAMS}.leave_orphans", "--restarts", "10")], env=env)
    code = proc.finish(300)
    text = proc.text
    assert code == 0, text
    left = re.findall(r"leave_orphans restart (\d+): left 4 pids", text)
    assert [int(r) for r in left] == list(range(10)), text
    final = re.search(r"leave_orphans restart 10: zombies (\d+) others (\[.*\])", text)
    assert final is not None, text
    assert (final.group(1), final.group(2)) == ("0", "[]"), f"left behind in the pod: {final.group(0)}"


def test_losing_the_coordinator_stops_every_worker_with_75(spawn, tmp_path):
    gang = Gang(spawn, "hosts=3", ["-m", f"{PROGRAMS}.resume_training", "--checkpoint-dir", str(tmp_path),
                                   "--steps", "400", "--step-seconds", "0.25", "--grandchild"]).start_all()
    for w in gang.workers.values():
        w.wait_for(r"resume_training rank \d grandchild pid")
    rank0 = int(re.search(r"resume_training rank 0 pid (\d+)", gang.workers[0].text).group(1))
    os.kill(gang.workers[0].proc.pid, signal.SIGKILL)  # the rank-0 "pod" is lost
    try:
        assert [gang.workers[i].finish(60) for i in (1, 2)] == [75, 75]
        text = gang.workers[1].text + gang.workers[2].text
        assert "lost the coordinator at 127.0.0.1" in text and "(CoordinatorLost); the gang must be recreated" in text
        # Every worker, rank and grandchild of the other pods is gone, and rank 0 died with its worker
        # (in a pod, the container's end takes rank 0's own children with it).
        pids = pids_of(gang.workers[1].text + gang.workers[2].text, r"(?:pid|grandchild pid) (\d+)") | {rank0}
        assert len(pids) == 7, pids
        assert wait_dead(pids, 15) == set() and not any(_running(p) for p in pids)
    finally:
        try:
            os.killpg(rank0, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_round_that_never_closes_falls_back_to_recreating_the_gang(spawn, tmp_path):
    gang = Gang(spawn, "hosts=2", ["-m", f"{PROGRAMS}.fail_once", "--rank", "9", "--sleep", "600", "--no-rendezvous"],
                MONARCH_SPMD_MAX_RESTARTS="3", MONARCH_SPMD_JOIN_TIMEOUT="3")
    events = gang.observed()
    try:
        events.wait(rendezvous.EV_ALL_RUNNING)
        os.kill(gang.workers[1].proc.pid, signal.SIGKILL)  # lost, and nobody replaces it
        assert gang.workers[0].finish(60) == 75
        failed = events.wait(rendezvous.EV_FAILED)
        assert (failed["reason"], failed["fallback"], failed["round"]) == ("RoundTimeout", True, 1)
        assert "member(s) 1 never joined" in failed["message"]
        assert "the gang must be recreated: RoundTimeout" in gang.workers[0].text
    finally:
        events.close()


def test_the_same_pod_failing_in_place_again_and_again_recreates_the_gang(spawn):
    gang = Gang(spawn, "hosts=2", ["-m", f"{PROGRAMS}.fail_once", "--rank", "1", "--always", "--no-rendezvous"],
                MONARCH_SPMD_MAX_RESTARTS="10", MONARCH_SPMD_MEMBER_FAILURE_LIMIT="2")
    events = gang.observed()
    try:
        assert [w.finish(120) for w in gang.workers.values()] == [75, 75]
        failed = events.wait(rendezvous.EV_FAILED)
        assert (failed["reason"], failed["member"], failed["fallback"], failed["round"]) == ("RepeatedFailure", 1, True, 1)
        assert len(events.of(rendezvous.EV_RESTART)) == 1
    finally:
        events.close()


def test_the_watchdog_kills_a_hung_rank_and_the_gang_restarts(spawn):
    gang = Gang(spawn, "nodes=1,procs=2", ["-m", f"{PROGRAMS}.watchdog_hang", "--timeout", "2", "--hang-rank", "1"],
                layout="PerHost", MONARCH_SPMD_MAX_RESTARTS="1", TORCHELASTIC_ENABLE_FILE_TIMER="1")
    events = gang.observed()
    try:
        assert gang.workers[0].finish(120) == 0, gang.workers[0].text
        failure = events.wait(rendezvous.EV_FAILURE)
        # Its stack is taken with the gang's before it ends (SIGABRT), not lost to the timer's SIGKILL.
        assert (failure["rank"], failure["reason"], failure["signal"]) == (1, "WatchdogTimeout", "SIGABRT")
        assert "watchdog timer 'step1' of rank 1" in failure["message"]
        assert "its stack taken with the gang's before it ends (instead of SIGKILL)" in failure["message"]
        text = gang.workers[0].text
        assert "[rank 1] watchdog_hang rank 1 done (restart 1)" in text
        timer_file = re.search(r"timer (\S+)", text).group(1)
        assert not os.path.exists(timer_file), "the pipe is removed with the agent"
    finally:
        events.close()


def test_a_rank_without_output_for_the_progress_timeout_fails_the_round(spawn):
    gang = Gang(spawn, "hosts=2", ["-m", f"{PROGRAMS}.hang", "--rank", "1", "--seconds", "4"],
                MONARCH_SPMD_MAX_RESTARTS="1", MONARCH_SPMD_PROGRESS_TIMEOUT="2")
    events = gang.observed()
    try:
        assert [w.finish(120) for w in gang.workers.values()] == [0, 0]
        failure = events.wait(rendezvous.EV_FAILURE)
        assert (failure["rank"], failure["reason"]) == (1, "NoProgress")
        # Judged for the gang: once rank 0 stopped writing too (it ends after 4 s), for 2 s.
        assert re.search(r"rank 1 wrote nothing for \d+s \(progress timeout 2s\)", failure["message"]), failure
        assert "last line: hang rank 1: about to hang" in failure["message"]
        progress = events.of(rendezvous.EV_PROGRESS)
        assert all(p["seconds_since_progress"] >= 0 for p in progress)
        assert "hang rank 1 done (restart 1)" in gang.workers[1].text
    finally:
        events.close()


def test_the_observer_protocol_welcome_history_and_refusals(spawn, tmp_path):
    gang = Gang(spawn, "hosts=2", ["-m", f"{PROGRAMS}.fail_once", "--rank", "1", "--sleep", "5"],
                MONARCH_SPMD_MAX_RESTARTS="1")
    first = gang.observed()
    try:
        first.wait(rendezvous.EV_ALL_RUNNING, round=1)
        late = Events(gang.agent_port, gang.token)  # an operator that (re)connects after the restart
        welcome = late.wait(rendezvous.WELCOME)
        assert (welcome["v"], welcome["members"], welcome["world_size"], welcome["round"], welcome["first_round"]) == (1, 2, 2, 1, 0)
        history = late.messages[:late.messages.index(welcome)]  # the welcome's history, handed over first
        kinds = [e["type"] for e in history]
        assert kinds[:4] == ["round", "started", "all_running", "failure"] and "restart" in kinds
        assert [e["seq"] for e in history] == sorted(e["seq"] for e in history)
        assert "history" not in welcome
        late.close()
        token = gang.token
        for hello, reason in (({"type": "hello", "role": "observer", "versions": [9], "token": token}, "versions [9]"),
                              ({"type": "join", "round": 0}, "the first message must be hello"),
                              ({"type": "hello", "role": "member", "member": 0, "versions": [1]}, "wrong token"),
                              ({"type": "hello", "role": "member", "member": 7, "versions": [1], "token": token},
                               "hello.member: '7' is not valid; expected an integer 0..1"),
                              (b"garbage\n", "not JSON")):
            with socket.create_connection(("127.0.0.1", gang.agent_port), timeout=10) as s:
                s.sendall(hello if isinstance(hello, bytes) else rendezvous.encode(hello))
                answer = json.loads(s.makefile().readline())
            assert answer["type"] == "refused" and reason in answer["reason"] and answer["versions"] == [1]
        assert [w.finish(120) for w in gang.workers.values()] == [0, 0]
        welcomed = next(i for i, m in enumerate(first.messages) if m["type"] == rendezvous.WELCOME)
        seqs = [first.messages[welcomed]["seq"], *(m["seq"] for m in first.messages[welcomed + 1:])]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "events come in order, without gaps"
    finally:
        first.close()


def test_without_a_coordinator_the_first_failure_ends_the_worker_as_before(spawn):
    env = worker_inputs("hosts=2", "1", MONARCH_SPMD_MAX_RESTARTS="3")
    proc = spawn(worker_cmd("-m", f"{PROGRAMS}.fail_once", "--rank", "1", "--no-rendezvous"), env=env)
    assert proc.finish(60) == 3
    assert "restart 1" not in proc.text


def _stranger_says(port: int, *lines: bytes, read: bool = True) -> dict | None:
    """What a stranger (any process that can reach the port, no token) gets for ``lines``."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"".join(lines))
        if not read:
            return None
        line = s.makefile("rb").readline()
        return json.loads(line) if line else None


def test_a_stranger_without_the_token_can_neither_read_nor_drive_a_running_gang(spawn):
    """Every move that drove a gang from another namespace before tokens, against real workers over
    gloo: the gang trains on, restarts nothing, and the stranger reads not one line of output."""
    gang = Gang(spawn, "hosts=2", ["-m", f"{PROGRAMS}.train_steps", "--steps", "30", "--step-seconds", "0.2"],
                MONARCH_SPMD_MAX_RESTARTS="0")
    events = gang.observed()
    try:
        events.wait(rendezvous.EV_ALL_RUNNING, round=0)
        silent = socket.create_connection(("127.0.0.1", gang.agent_port), timeout=30)
        said = []
        for lines in (
            [b'{"type":"hello","role":"observer","versions":[1]}\n'],
            [b'{"type":"hello","role":"member","member":1,"versions":[1],"incarnation":"evil"}\n',
             b'{"type":"failure","round":0,"rank":1,"exit_code":64,"message":"injected by a stranger"}\n'],
            [b'{"type":"hello","role":"member","member":0,"versions":[1],"disruptions":"lots"}\n'],
            [b'{"type":"hello","role":"member","member":1,"versions":[1],"disruptions":1000000000,"token":"guess"}\n'],
            [b'{"type":"hello","role":"observer","versions":[1],"token":"' + b"A" * 43 + b'"}\n'],
            [b"\x00\xff" * 40000 + b"\n"],
        ):
            said.append(_stranger_says(gang.agent_port, *lines))
        for answer in said:
            assert answer is not None and answer["type"] == "refused", said
            assert "history" not in answer and "train_steps" not in json.dumps(answer)
        silent.settimeout(rendezvous.HELLO_TIMEOUT + 10)
        assert silent.recv(100) == b"", "a connection that never says hello is closed"
        silent.close()
        codes = [w.finish(180) for w in gang.workers.values()]
        text = "".join(w.text for w in gang.workers.values())
        assert codes == [0, 0], text
        assert "train_steps rank 1 done restart 0" in text
        done = events.wait(rendezvous.EV_SUCCEEDED)
        assert not events.of(rendezvous.EV_RESTART) and not events.of(rendezvous.EV_FAILURE), events.messages
        lost = [e for e in events.of(rendezvous.EV_LOST) if e["seq"] < done["seq"]]
        assert not lost, f"no member was superseded or lost while the gang ran: {lost}"
        assert "evil" not in json.dumps(events.messages)
    finally:
        events.close()
