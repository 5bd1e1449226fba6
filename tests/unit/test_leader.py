"""Leader election (spmd_operator.leader) with client-go's guarantees, through the real client
(spmd_operator.kube.Kube) against a small in-process HTTP server that serves a Lease the way the
API server does (resourceVersion preconditions) and records every other write.

What is checked: a renew does not queue behind the writes of jobs, and gives up at its deadline
when the server does not answer; no write leaves after the renew deadline by this replica's clock
(a paused process included); an unexpected error in the election stops leading and is logged.
"""

from __future__ import annotations

import asyncio
import logging
import time

import kopf
import pytest
from aiohttp import web

from spmd_operator import kube, leader
from tests.unit.localserver import LocalServer

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
TIMINGS = leader.Timings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.2)


class LeaseServer(LocalServer):
    """A Lease with resourceVersion preconditions; ``stall`` makes GETs hang; ``garbage`` answers
    a GET with a body that is not JSON; every pod POST is recorded with its time."""

    def __init__(self) -> None:
        self.lease: dict | None = None
        self.version = 0
        self.stall = False
        self.garbage = False
        self.writes: list[float] = []
        self.pod_delay = 0.0
        super().__init__()
        app = self.app
        app.router.add_get(f"{LEASE}/{{name}}", self.get)
        app.router.add_post(LEASE, self.post)
        app.router.add_put(f"{LEASE}/{{name}}", self.put)
        app.router.add_post("/api/v1/namespaces/ns/pods", self.pod)

    async def get(self, request: web.Request) -> web.Response:
        if self.stall:
            await asyncio.sleep(2.0)  # far past the try's budget
        if self.garbage:
            return web.Response(text="<html>a proxy's error page</html>", content_type="application/json")
        if self.lease is None:
            return web.json_response({"kind": "Status", "reason": "NotFound", "message": "not found"}, status=404)
        return web.json_response(self.lease)

    async def post(self, request: web.Request) -> web.Response:
        if self.lease is not None:
            return web.json_response({"kind": "Status", "reason": "AlreadyExists", "message": "exists"}, status=409)
        return web.json_response(self._store(await request.json()), status=201)

    async def put(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.lease is None or body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            return web.json_response({"kind": "Status", "reason": "Conflict", "message": "modified"}, status=409)
        return web.json_response(self._store(body))

    def _store(self, body: dict) -> dict:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.lease = body
        return body

    async def pod(self, request: web.Request) -> web.Response:
        self.writes.append(time.monotonic())
        await asyncio.sleep(self.pod_delay)
        return web.json_response(await request.json(), status=201)


async def client(server: LeaseServer, concurrency: int = 2) -> kube.Kube:
    return kube.Kube(kopf.ConnectionInfo(server=await server.start()), concurrency)


def elector(api: kube.Kube, events: list[str], **kwargs) -> leader.LeaderElector:
    async def started() -> None:
        events.append("started")

    async def stopped() -> None:
        events.append("stopped")

    e = leader.LeaderElector(api, "ns", "lease", "me", started, stopped, TIMINGS, **kwargs)
    api.may_write = e.may_write
    return e


def test_a_renew_does_not_queue_behind_the_writes_of_jobs():
    async def go():
        server = LeaseServer()
        api = await client(server, concurrency=2)
        for _ in range(2):  # every write slot taken, as by a job creating thousands of pods
            await api.limiter.acquire(("ns", "big"))
        e = elector(api, [])
        took = time.monotonic()
        assert await asyncio.wait_for(e.try_acquire_or_renew(), timeout=5)
        took = time.monotonic() - took
        await api.close()
        await server.runner.cleanup()
        return took

    assert asyncio.run(go()) < TIMINGS.renew_deadline


def test_a_renew_the_server_does_not_answer_gives_up_at_its_deadline():
    async def go():
        server = LeaseServer()
        api = await client(server)
        e = elector(api, [])
        assert await e._try(TIMINGS.renew_deadline)
        server.stall = True
        began = time.monotonic()
        renewed = await asyncio.wait_for(e._try(0.5), timeout=10)
        took = time.monotonic() - began
        await api.close()
        await server.runner.cleanup()
        return renewed, took

    renewed, took = asyncio.run(go())
    assert renewed is False and took < 1.5, f"the try took {took:.1f}s"


def test_no_write_leaves_after_the_renew_deadline_by_our_own_clock():
    now = [100.0]

    async def go():
        server = LeaseServer()
        api = await client(server)
        e = elector(api, [], clock=lambda: now[0])
        assert await e.try_acquire_or_renew()
        e.leading = True
        await api.create("/api/v1/namespaces/ns/pods", {"metadata": {"name": "a"}})
        now[0] += TIMINGS.renew_deadline  # no renew since: the Lease may be someone else's soon
        with pytest.raises(kube.Fenced):
            await api.create("/api/v1/namespaces/ns/pods", {"metadata": {"name": "b"}})
        with pytest.raises(kube.Fenced):
            await api.delete("/api/v1/namespaces/ns/pods/a")
        writes = len(server.writes)
        await api.close()
        await server.runner.cleanup()
        return writes

    assert asyncio.run(go()) == 1, "only the write made while the Lease was provably ours"


def test_a_paused_leader_stops_leading_before_its_next_write():
    async def go():
        server = LeaseServer()
        api = await client(server)
        events: list[str] = []
        e = elector(api, events)
        e.start()
        for _ in range(50):
            await asyncio.sleep(0.05)
            if e.leading:
                break
        assert e.leading and e.may_write()
        time.sleep(TIMINGS.lease_duration)  # the whole process stops, as under SIGSTOP
        fenced_at_once = not e.may_write()
        await asyncio.sleep(TIMINGS.retry_period * 2)
        await e.stop(release=False)
        await api.close()
        await server.runner.cleanup()
        return fenced_at_once, events

    fenced_at_once, events = asyncio.run(go())
    assert fenced_at_once, "the fence closed by the clock alone, before any request"
    assert events[:2] == ["started", "stopped"], "the term ended; the loops were stopped"


def test_an_unexpected_error_in_the_election_stops_leading_and_is_logged(caplog):
    async def go():
        server = LeaseServer()
        api = await client(server)
        events: list[str] = []
        e = elector(api, events)
        e.start()
        for _ in range(50):
            await asyncio.sleep(0.05)
            if e.leading:
                break
        server.garbage = True  # the next renew reads a body that is not JSON: ValueError
        for _ in range(50):
            await asyncio.sleep(0.05)
            if not e.leading:
                break
        alive = e._task is not None and not e._task.done()
        leading, may_write = e.leading, e.may_write()
        await e.stop(release=False)
        await api.close()
        await server.runner.cleanup()
        return events, alive, leading, may_write

    with caplog.at_level(logging.INFO, logger="spmd_operator.leader"):
        events, alive, leading, may_write = asyncio.run(go())
    assert events[:2] == ["started", "stopped"]
    assert not leading and not may_write
    assert alive, "the election goes on campaigning"
    assert any("failed unexpectedly" in r.getMessage() for r in caplog.records)


def test_a_write_that_waited_for_a_connection_past_the_deadline_is_not_sent():
    now = [100.0]

    async def go():
        server = LeaseServer()
        server.pod_delay = 0.5
        api = await client(server, concurrency=1)  # a connection pool of 17
        e = elector(api, [], clock=lambda: now[0])
        assert await e.try_acquire_or_renew()
        e.leading = True
        pods = "/api/v1/namespaces/ns/pods"
        busy = [asyncio.create_task(api.request("POST", pods, body={"metadata": {"name": f"b{i}"}}, fenced=True))
                for i in range(17)]
        await asyncio.sleep(0.1)  # every connection is taken by a slow write
        late = asyncio.create_task(api.request("POST", pods, body={"metadata": {"name": "late"}}, fenced=True))
        await asyncio.sleep(0.1)  # it passed the first check and waits for a connection
        now[0] += TIMINGS.renew_deadline  # meanwhile the process was paused past its deadline
        await asyncio.gather(*busy)
        with pytest.raises(kube.Fenced):
            await late
        writes = len(server.writes)
        await api.close()
        await server.runner.cleanup()
        return writes

    assert asyncio.run(go()) == 17, "the write that waited was checked again before it went out"


def test_a_write_whose_body_waits_for_the_loop_past_the_deadline_is_not_sent(monkeypatch):
    """aiohttp buffers the headers and writes the body in a task of its own: a pause between the
    two (the process stopped right after send()) must not let the request out afterwards."""
    import aiohttp

    now = [100.0]
    original = aiohttp.ClientRequest.send

    async def send_then_pause(self, conn):
        response = await original(self, conn)
        if self.method == "POST" and self.url.path.endswith("/pods"):
            now[0] += TIMINGS.renew_deadline  # stopped here, past the deadline
        return response

    monkeypatch.setattr(aiohttp.ClientRequest, "send", send_then_pause)

    async def go():
        server = LeaseServer()
        api = await client(server)
        e = elector(api, [], clock=lambda: now[0])
        assert await e.try_acquire_or_renew()
        e.leading = True
        with pytest.raises(kube.Fenced):
            await asyncio.wait_for(api.request("POST", "/api/v1/namespaces/ns/pods",
                                               body={"metadata": {"name": "x"}}, fenced=True), timeout=5)
        writes = len(server.writes)
        await api.close()
        await server.runner.cleanup()
        return writes

    assert asyncio.run(go()) == 0


def test_a_renew_gets_through_while_watches_hold_every_connection_a_request_could_use():
    """Watches have a pool of their own: 40 open watches (held by a server that never answers
    them) leave the requests' pool, and the Lease's own client, free."""
    async def go():
        server = LeaseServer()
        hang = asyncio.Event()

        async def held(request):
            await hang.wait()
            return web.Response(text="")

        server.app.router.add_get("/api/v1/namespaces/{ns}/pods", held)
        api = await client(server, concurrency=2)  # a pool of 18 for requests
        watches = [asyncio.create_task(_drain(api.watch(f"/api/v1/namespaces/ns{i}/pods", resource_version="1")))
                   for i in range(40)]
        await asyncio.sleep(0)
        e = elector(api.twin(), [])
        took = time.monotonic()
        assert await asyncio.wait_for(e.try_acquire_or_renew(), timeout=5)
        took = time.monotonic() - took
        assert await asyncio.wait_for(api.request("GET", e.url), timeout=5), "and a request of the jobs' pool"
        hang.set()
        for w in watches:
            w.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await e.api.close()
        await api.close()
        await server.runner.cleanup()
        return took

    assert asyncio.run(go()) < TIMINGS.renew_deadline


async def _drain(stream):
    async for _ in stream:
        pass


def test_a_leader_whose_loops_stay_stopped_fails_its_liveness_probe():
    from spmd_operator import handlers

    now = [0.0]
    health = handlers.LeaderHealth(clock=lambda: now[0])
    assert health.check(leading=False, active=False) == "standby"
    assert health.check(leading=True, active=True) == "leader"
    assert health.check(leading=True, active=False).startswith("leader"), "taking the Lease, starting the loops"
    now[0] = handlers.STUCK_LEADER_SECONDS - 1
    health.check(leading=True, active=False)
    now[0] = handlers.STUCK_LEADER_SECONDS + 1
    with pytest.raises(RuntimeError, match="held the Lease for 16s with its job loops stopped"):
        health.check(leading=True, active=False)
    assert health.check(leading=True, active=True) == "leader", "its loops running again: healthy again"
    now[0] += 100
    assert health.check(leading=True, active=False).startswith("leader"), "a new stretch starts the clock again"
