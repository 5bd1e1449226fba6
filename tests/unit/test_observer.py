"""The operator's observer connection (spmd_operator.observer) and what the controller does with it:
a real coordinator (payload.agent.CoordinatorServer, the one rank 0's agent runs) on a real socket,
driven through a restart in place as its members would drive it; the controller against the
in-memory API of test_controller, with the job's rank-0 pod pointing at that coordinator."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from monarch_spmd.payload import agent, coordinator, counting, rendezvous
from monarch_spmd.spec import parse_job_spec
from spmd_operator import builders, controller, kube, lifecycle, names, observer

from .lifecycle.helpers import BASE, JOB, cond
from .test_controller import FILES, FakeApi, job_body, make, sync_informers


#: The agent token of the stand-in gang's attempt (its pods carry it, its coordinator asks for it).
TOKEN = "t0k3n-of-the-attempt-0123456789abcdefghijk"


class Coordinator:
    """A coordinator as rank 0's agent runs it, its members driven by hand (no member sockets)."""

    def __init__(self, members: int = 2, max_restarts: int = 3, first_round: int = 0, run_id: str = JOB.uid,
                 token: str = TOKEN) -> None:
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        machine = coordinator.Coordinator(members, first_round, counting.Policy(max_restarts=max_restarts, backoff=0.0),
                                         time.monotonic(), world_size=members, run_id=run_id, wall=time.time)
        self.server = agent.CoordinatorServer(sock, machine, token)
        self.server.start()
        self.members = members

    def act(self, method: str, *args, **kwargs) -> None:
        with self.server.lock:
            fn = getattr(self.server.machine, method)
            self.server._apply(fn(*args, time.monotonic(), **kwargs) if method != "hello" else
                               fn(*args[:2], time.monotonic(), **kwargs))

    def start_round(self, r: int) -> None:
        if r == self.server.machine.first_round:
            for m in range(self.members):
                self.act("hello", m, f"inc-{m}")
            for m in range(self.members):
                self.act("join", m, r)
        for m in range(self.members):
            self.act("running", m, r, [{"rank": m, "local_rank": 0, "pid": 1000 + m}])

    def fail(self, r: int, member: int, code: int = 3) -> None:
        self.act("failure", member, r, {"rank": member, "local_rank": 0, "pid": 1000 + member, "exit_code": code,
                                        "returncode": code, "signal": None, "reason": "Error",
                                        "message": f"rank {member} exited with code {code}",
                                        "tail": ["RuntimeError: boom"], "at": time.time()})
        for m in range(self.members):
            self.act("exited", m, r, [{"rank": m, "exit_code": code if m == member else 143, "stopped": m != member}])
        for m in range(self.members):
            self.act("join", m, r + 1)

    def stop(self) -> None:
        self.server.stop()


def counted_connections(monkeypatch) -> list[int]:
    """A list that grows by one with each connection the observer opens."""
    tries: list[int] = []
    connect = asyncio.open_connection

    async def counted(*args, **kwargs):
        tries.append(1)
        return await connect(*args, **kwargs)

    monkeypatch.setattr(observer.asyncio, "open_connection", counted)
    return tries


async def until(check, timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what}")
        await asyncio.sleep(0.02)


def test_the_observer_hears_the_history_then_every_event_and_wakes_the_loop():
    gang = Coordinator()
    gang.start_round(0)
    gang.fail(0, member=1)  # a restart in place before the observer connects: in welcome's history

    async def scenario():
        woken = asyncio.Event()
        o = observer.Observer(("pod-0", "uid-0"), "127.0.0.1", gang.port, woken.set, token=TOKEN)
        o.start()
        await until(lambda: o.view().connected, what="welcome")
        v = o.view()
        assert woken.is_set()
        assert [e["next_round"] for e in v.restarts] == [1]
        assert v.restarts[0]["rank"] == 1 and v.restarts[0]["tail"] == ["RuntimeError: boom"]
        assert (v.round, v.phase) == (1, "running"), "backoff 0: round 1 started at once"
        assert v.round_started(1) and v.running_round(0) is not None and v.running_round(1) is None
        woken.clear()
        gang.start_round(1)  # live events now
        await until(lambda: o.view().running_round(1) is not None, what="all_running of round 1")
        assert woken.is_set()
        gang.fail(1, member=0, code=4)
        await until(lambda: len(o.view().restarts) == 2, what="the second restart")
        assert o.view().restarts[1]["exit_code"] == 4
        o.stop()
        assert not o.view().connected and len(o.view().restarts) == 2, "what was heard is kept"

    try:
        asyncio.run(scenario())
    finally:
        gang.stop()


def test_a_lost_connection_is_opened_again_and_welcome_brings_back_what_was_missed(monkeypatch):
    monkeypatch.setattr(observer, "RECONNECT_SECONDS", (0.05,))
    gang = Coordinator()
    gang.start_round(0)

    async def scenario():
        o = observer.Observer(("pod-0", "uid-0"), "127.0.0.1", gang.port, lambda: None, token=TOKEN)
        o.start()
        await until(lambda: o.view().connected, what="welcome")
        first_received = None
        # Drop the observer's connection from the coordinator's side (as a restart of its pod's
        # network would), and restart the gang in place while it is down.
        with gang.server.lock:
            for conn in list(gang.server.observers):
                gang.server._close(conn)
        await until(lambda: not o.view().connected or o.view().restarts, what="the drop noticed")
        gang.fail(0, member=1)
        await until(lambda: o.view().connected and o.view().restarts, what="reconnected with the history")
        first_received = o.view().restarts[0]["received"]
        with gang.server.lock:
            for conn in list(gang.server.observers):
                gang.server._close(conn)
        await asyncio.sleep(0.3)
        await until(lambda: o.view().connected, what="reconnected again")
        assert [e["next_round"] for e in o.view().restarts] == [1], "replayed, not doubled"
        assert o.view().restarts[0]["received"] == first_received, "when it was first heard is kept"
        o.stop()

    try:
        asyncio.run(scenario())
    finally:
        gang.stop()


def test_a_gap_in_the_events_or_a_refusal_closes_the_connection(monkeypatch):
    monkeypatch.setattr(observer, "RECONNECT_SECONDS", (0.05,))
    lines = [
        [{"type": "welcome", "v": 1, "round": 0, "phase": "running", "seq": 3, "history": []},
         {"type": "restart", "seq": 5, "round": 0, "next_round": 1}],  # seq 4 is missing
        [{"type": "refused", "reason": "protocol versions [1] are not spoken here", "versions": [2]}],
    ]
    served: list[int] = []

    async def serve(reader, writer):
        await reader.readline()
        batch = lines[min(len(served), len(lines) - 1)]
        served.append(1)
        for message in batch:
            writer.write(rendezvous.encode(message))
        await writer.drain()
        await asyncio.sleep(0.5)
        writer.close()

    async def scenario():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        o = observer.Observer(("pod-0", "uid-0"), "127.0.0.1", port, lambda: None)
        o.start()
        await until(lambda: o.error and "lines were lost" in o.error, what="the gap")
        assert o.view().restarts == (), "an event after a gap is not taken"
        await until(lambda: o.error and "refused" in o.error, what="the refusal")
        assert not o.view().connected
        o.stop()
        server.close()

    asyncio.run(scenario())


def test_an_address_that_does_not_answer_is_tried_again_with_back_off(monkeypatch):
    monkeypatch.setattr(observer, "RECONNECT_SECONDS", (0.05, 0.1))
    port = socket.create_server(("127.0.0.1", 0))
    closed = port.getsockname()[1]
    port.close()

    async def scenario():
        o = observer.Observer(("pod-0", "uid-0"), "127.0.0.1", closed, lambda: None)
        o.start()
        await until(lambda: o.error is not None, what="a refused connection")
        assert o.running and not o.view().connected and not o.view().heard
        o.stop()
        assert not o.running

    asyncio.run(scenario())


def test_the_same_failure_again_does_not_wake_the_jobs_loop(monkeypatch):
    """A coordinator that cannot be reached (a NetworkPolicy, a simulated node) is tried again
    every 30 s for as long as the gang runs: only a change of what is heard may cost a pass."""
    monkeypatch.setattr(observer, "RECONNECT_SECONDS", (0.02,))
    port = socket.create_server(("127.0.0.1", 0))
    closed = port.getsockname()[1]
    port.close()
    tries, wakes = counted_connections(monkeypatch), []

    async def scenario():
        o = observer.Observer(("pod-0", "uid-0"), "127.0.0.1", closed, lambda: wakes.append(1))
        o.start()
        await until(lambda: len(tries) >= 5, what="five refused connections")
        o.stop()
        return o.error

    assert "ConnectionRefused" in asyncio.run(scenario())
    assert len(wakes) == 1, f"{len(tries)} refusals woke the loop {len(wakes)} times"


def test_a_coordinator_of_another_run_is_not_listened_to_and_trouble_is_a_warning_naming_the_job(monkeypatch, caplog):
    """A reused pod IP (another job's rank 0 now lives there) answers with another run id: its
    events never reach this job; what keeps the observer out is logged at WARNING, once."""
    monkeypatch.setattr(observer, "RECONNECT_SECONDS", (0.02,))
    other = Coordinator(run_id="uid-of-another-job")
    other.start_round(0)
    other.fail(0, member=1)
    tries = counted_connections(monkeypatch)

    async def scenario():
        o = observer.Observer(("pod-0", "uid-0"), "127.0.0.1", other.port, lambda: None, token=TOKEN,
                              run_id=JOB.uid, job="ns/hello")
        o.start()
        await until(lambda: o.error and "another run's" in o.error, what="the run id refused")
        await until(lambda: len(tries) >= 6, what="more tries")
        v = o.view()
        o.stop()
        return v

    with caplog.at_level("WARNING", logger="spmd_operator.observer"):
        v = asyncio.run(scenario())
    other.stop()
    assert not v.heard and v.restarts == () and not v.connected, "nothing of the other job's gang was taken"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "SPMDJob ns/hello" in warnings[0] and "uid-of-another-job" in warnings[0], warnings


def test_a_wrong_token_is_refused_and_said_at_warning(monkeypatch, caplog):
    monkeypatch.setattr(observer, "RECONNECT_SECONDS", (0.02,))
    gang = Coordinator()

    async def scenario():
        o = observer.Observer(("pod-0", "uid-0"), "127.0.0.1", gang.port, lambda: None, token="not-" + TOKEN,
                              run_id=JOB.uid, job="ns/hello")
        o.start()
        await until(lambda: o.error and "wrong token" in o.error, what="the refusal")
        await until(lambda: any(r.levelname == "WARNING" for r in caplog.records), what="the warning")
        o.stop()

    with caplog.at_level("WARNING", logger="spmd_operator.observer"):
        asyncio.run(scenario())
    gang.stop()


def test_an_observers_memory_is_bounded_over_a_month_of_events():
    """A synthetic month of a gang that restarts in place now and then: a progress event every 5 s
    (518,400) and 2,000 restarts; what the observer keeps stays within its bounds."""
    o = observer.Observer(("pod-0", "uid-0"), "127.0.0.1", 1, lambda: None, run_id=JOB.uid)
    o._welcome({"type": "welcome", "run_id": JOB.uid, "round": 0, "phase": "running", "seq": 0, "history": []})
    seq, r = 0, 0
    for i in range(518_400):
        seq += 1
        if i % 259 == 0:
            r += 1
            for kind in ("restart", "round", "started", "all_running"):
                o._apply({"type": kind, "seq": seq, "round": r, "next_round": r}, float(i))
                seq += 1
        o._apply({"type": "progress", "seq": seq, "round": r, "seconds_since_progress": 1.0, "line": "step"}, float(i))
    assert r == 2002
    assert all(len(events) <= observer.EVENTS_KEPT for events in o.events.values())
    assert o.view().restarts[-1]["next_round"] == r and o.view().round_started(r), "the newest are kept"


def test_spares_ready_come_from_the_welcome_and_then_from_each_spare_and_takeover_event():
    """A spare that said hello before the operator connected is counted from the welcome (its
    ``spare`` event is not in the history); later events move the count; takeovers are kept."""
    o = observer.Observer(("pod-0", "uid-0"), "127.0.0.1", 1, lambda: None, run_id=JOB.uid)
    o._welcome({"type": "welcome", "run_id": JOB.uid, "round": 0, "phase": "running", "seq": 0, "history": [],
                "spares": 2})
    assert o.view().spares_ready == 2
    o._apply({"type": "takeover", "seq": 1, "round": 0, "member": 1, "spare": 0, "ready": 1}, 1.0)
    o._apply({"type": "spare", "seq": 2, "round": 1, "spare": 2, "state": "ready", "ready": 2}, 2.0)
    view = o.view()
    assert view.spares_ready == 2 and view.taken_over() == {1: view.takeovers[0]}


# --- the controller --------------------------------------------------------------------------------


def rank_zero_pods(api, gang_port: int, *, phase: str = "Running") -> None:
    """The gang's two pods in the stand-in API, running, rank 0's agent at 127.0.0.1:gang_port."""
    s = parse_job_spec(BASE, require_image=True)
    for r in range(4):
        pod = builders.build_pod(JOB, s, r, 0, token=TOKEN)
        pod["metadata"]["uid"] = f"pod-uid-{r}"
        for c in pod["spec"]["containers"]:
            for port in c.get("ports") or []:
                if port["name"] == names.AGENT_PORT_NAME:
                    port["containerPort"] = gang_port
        pod["status"] = {"phase": phase, "podIP": "127.0.0.1",
                         "containerStatuses": [{"name": "trainer", "state": {"running": {}}}]}
        api.objects[(kube.pods_url("ns"), pod["metadata"]["name"])] = pod
    service = builders.build_service(JOB, s, 0)
    api.objects[(kube.services_url("ns"), service["metadata"]["name"])] = service
    configmap = builders.build_worker_configmap("ns", FILES)
    api.objects[(kube.configmaps_url("ns"), configmap["metadata"]["name"])] = configmap


def running_job() -> dict:
    body = job_body()
    body["status"] = {"phase": "Running", "restarts": 0, "mesh": "hosts=2,gpus=2", "procs": 4, "running": 4,
                      "succeeded": 0, "failed": 0, "masterAddr": names.master_addr(JOB, 0), "observedGeneration": 1,
                      "startTime": "2026-01-01T11:00:00Z", "reason": "AllProcsRunning", "message": "x",
                      "conditions": [{"type": "Running", "status": "True", "reason": "AllProcsRunning", "message": "x",
                                      "lastTransitionTime": "2026-01-01T11:00:00Z", "observedGeneration": 1}]}
    return body


def test_the_controller_writes_one_patch_and_one_event_per_restart_in_place_and_touches_no_pod(monkeypatch):
    monkeypatch.setattr(controller, "COALESCE_SECONDS", 0.0)
    gang = Coordinator(members=4)
    api = FakeApi(running_job())
    rank_zero_pods(api, gang.port)
    c, loop = make(api)
    sync_informers(c, api)
    gang.start_round(0)

    async def scenario():
        c.active = True
        c._start_loop(loop)
        await until(lambda: loop.observer is not None and loop.observer.view().connected, what="the observer")
        before = len(api.calls)
        gang.fail(0, member=2)
        await until(lambda: (api.job["status"].get("restarts") == 1), what="the restart recorded")
        st = api.job["status"]
        assert (st["phase"], st["gangRestart"], st["failure"]["rank"], st["failure"]["exitCode"]) == ("Restarting", 0, 2, 3)
        gang.start_round(1)
        await until(lambda: api.job["status"].get("phase") == "Running", what="Running again")
        assert "in place" in cond(api.job["status"], "Running")["message"]
        writes = [(verb, path.rsplit("/", 1)[-1]) for verb, path, _ in api.calls[before:] if verb != "get"]
        assert writes == [("create", "events"), ("patch", "status"), ("create", "events"), ("patch", "status")], writes
        assert api.events()[-2:] == [("Warning", "Restarting"), ("Normal", "Running")]
        text = c.metrics.registry.get_sample_value
        assert text("spmdjob_gang_restarts_total", {"cause": "failure"}) == 1
        assert text("spmdjob_in_place_restarts_total", {"cause": "failure"}) == 1
        assert text("spmdjob_observers", {"state": "connected"}) == 1
        await c.deactivate()
        assert loop.observer is None, "leadership lost: the observer is closed with the loop"

    try:
        asyncio.run(scenario())
    finally:
        gang.stop()


def test_a_lost_pod_is_created_again_alone_with_the_gangs_master_and_the_open_round(monkeypatch):
    monkeypatch.setattr(controller, "COALESCE_SECONDS", 0.0)
    gang = Coordinator(members=4)
    api = FakeApi(running_job())
    rank_zero_pods(api, gang.port)
    lost = names.pod_name(JOB, 0, 3)
    c, loop = make(api)
    gang.start_round(0)

    async def scenario():
        sync_informers(c, api)
        c.active = True
        c._start_loop(loop)
        await until(lambda: loop.observer is not None and loop.observer.view().connected, what="the observer")
        # Pod 3 is deleted: its agent leaves, its pod ends Failed (SIGTERM), the others restart.
        pod = api.objects[(kube.pods_url("ns"), lost)]
        pod["status"] = {"phase": "Failed", "podIP": "127.0.0.1", "containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}]}
        gang.act("lost", 3, rendezvous.LOST_LEFT)
        for m in range(3):
            gang.act("exited", m, 0, [{"rank": m, "exit_code": 143, "stopped": True}])
            gang.act("join", m, 1)
        c.view.pods._put(pod, {JOB.key})
        loop.wake.set()
        replacement = names.pod_name(JOB, 0, 3, 1)
        await until(lambda: replacement in api.posted("pods"), what="the replacement")
        body = api.objects[(kube.pods_url("ns"), replacement)]
        env = {e["name"]: e.get("value") for e in body["spec"]["containers"][0]["env"]}
        assert env["MONARCH_SPMD_MASTER_ADDR"] == names.master_addr(JOB, 0)
        assert env["MONARCH_SPMD_RESTART_COUNT"] == "1"
        assert env["MONARCH_SPMD_AGENT_TOKEN"] == TOKEN, "the replacement proves it belongs to the attempt"
        assert body["metadata"]["labels"][names.LABEL_REPLACEMENT] == "1"
        await until(lambda: api.job["status"].get("restarts") == 1, what="the restart recorded")
        assert api.job["status"]["failure"]["pod"] == lost
        assert [n for n in api.posted("pods")] == [replacement], "only the lost pod is created"
        assert c.metrics.registry.get_sample_value("spmdjob_pods_replaced_total") == 1
        await c.deactivate()

    try:
        asyncio.run(scenario())
    finally:
        gang.stop()


def test_the_observer_is_closed_when_the_job_ends_or_its_gang_restarts_pods(monkeypatch):
    gang = Coordinator(members=4)
    api = FakeApi(running_job())
    rank_zero_pods(api, gang.port)
    c, loop = make(api)
    sync_informers(c, api)

    async def scenario():
        await c.reconcile_once(loop)
        first = loop.observer
        assert first is not None and first.running
        api.job["spec"]["restartPolicy"] = {"mode": "RecreatePods"}
        loop.body = json.loads(json.dumps(api.job))
        await c.reconcile_once(loop)
        assert loop.observer is None and not first.running
        await c.deactivate()

    try:
        asyncio.run(scenario())
    finally:
        gang.stop()


@pytest.mark.parametrize("phase", ["Succeeded", "Failed", "Suspended"])
def test_no_observer_for_a_job_that_is_not_active(phase):
    api = FakeApi(running_job())
    api.job["status"]["phase"] = phase
    rank_zero_pods(api, 1)
    c, loop = make(api)
    sync_informers(c, api)
    asyncio.run(c.reconcile_once(loop))
    assert loop.observer is None


def test_each_attempt_gets_a_token_of_its_own_and_a_resumed_attempt_keeps_the_one_its_pods_carry():
    api = FakeApi(running_job())
    c, loop = make(api)
    spec = parse_job_spec(BASE, require_image=True)
    first = c.creator._attempt_token(loop, spec, 0, [])
    assert first and c.creator._attempt_token(loop, spec, 0, []) == first, "one token for every pod of the attempt"
    second = c.creator._attempt_token(loop, spec, 1, [])
    assert second != first and 0 not in loop.tokens, "a new attempt: a new token; the old one is forgotten"
    # Another operator process (after a restart or failover) that finds pods of the attempt takes
    # their token, so the pods it still creates join the same coordinator.
    other, loop2 = make(FakeApi(running_job()))
    pod = builders.build_pod(JOB, spec, 0, 1, token=second)
    info = lifecycle.pod_info(pod)
    assert info.agent_token == second and second not in repr(info)
    assert other.creator._attempt_token(loop2, spec, 1, [info]) == second
    recreate = parse_job_spec({**BASE, "restartPolicy": {"mode": "RecreatePods"}}, require_image=True)
    assert c.creator._attempt_token(loop, recreate, 2, []) is None
    assert "MONARCH_SPMD_AGENT_TOKEN" not in json.dumps(builders.build_pod(JOB, recreate, 0, 0, token="x" * 43))
