"""The operator's write limiter (spmd_operator.kube.FairLimiter): jobs take turns for the write
slots, and while another job writes a few at a time, none keeps more than its share of them in
flight.

Why the share: the slots a large job holds are requests at the API server, and a small job's
request waits among them there, whatever order the slots were handed out in. The pure tests drive
the limiter with a clock of their own; the last one sends real requests through the real client
(``Kube.create``) to a small HTTP server that serves one request at a time, and counts, as each of
the small job's requests arrives, how many of the large job's are at the server before it.
"""

from __future__ import annotations

import asyncio

import kopf
from aiohttp import web

from spmd_operator import kube
from tests.unit.localserver import LocalServer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_owner_alone_may_hold_every_slot():
    async def go():
        limiter = kube.FairLimiter(6, shared=2, grace=1.0, clock=Clock())
        for _ in range(6):
            await asyncio.wait_for(limiter.acquire("big"), 1)
        return limiter.holding("big"), limiter.held

    assert asyncio.run(go()) == (6, 6)


def test_a_large_job_drains_to_its_share_while_a_small_one_writes_and_fills_up_again_after():
    async def go():
        clock = Clock()
        limiter = kube.FairLimiter(6, shared=2, grace=1.0, clock=clock)
        for _ in range(6):
            await limiter.acquire("big")
        big = [asyncio.ensure_future(limiter.acquire("big")) for _ in range(10)]
        small = asyncio.ensure_future(limiter.acquire("small"))
        await asyncio.sleep(0)
        seen = {"queued": (limiter.holding("big"), small.done())}
        limiter.release("big")  # the first free slot goes to the small job, not to the big one's queue
        await asyncio.sleep(0)
        seen["first free slot"] = (limiter.holding("big"), small.done())
        for _ in range(3):  # the big job's requests end; none of its waiters gets a slot
            limiter.release("big")
        await asyncio.sleep(0)
        seen["drained"] = (limiter.holding("big"), sum(t.done() for t in big))
        limiter.release("big")  # below its share now: the next free slot is its again
        await asyncio.sleep(0)
        seen["below its share"] = (limiter.holding("big"), sum(t.done() for t in big))
        limiter.release("small")  # the small job is done, but counts as writing for a while
        await asyncio.sleep(0)
        seen["small just done"] = (limiter.holding("big"), sum(t.done() for t in big))
        clock.now += 1.5
        limiter.release("big")  # the next hand-out finds the big job alone: it may fill every slot
        await asyncio.sleep(0)
        seen["alone again"] = (limiter.holding("big"), sum(t.done() for t in big))
        for t in big:
            t.cancel()
        await asyncio.gather(*big, return_exceptions=True)
        return seen

    seen = asyncio.run(go())
    assert seen == {
        "queued": (6, False),
        "first free slot": (5, True),
        "drained": (2, 0),
        "below its share": (2, 1),  # 1 held by it, then 1 handed to its first waiter
        "small just done": (2, 1),  # holds its share; the small job released less than grace ago
        "alone again": (6, 6),
    }, seen


def test_two_large_jobs_share_every_slot_between_them():
    """Capping one large job for another that also wants many slots would leave slots idle and
    help neither: the two take turns over all of them."""
    async def go():
        limiter = kube.FairLimiter(6, shared=2, grace=1.0, clock=Clock())
        for _ in range(6):
            await limiter.acquire("one")
        waiters = [asyncio.ensure_future(limiter.acquire(o)) for o in ("one", "two") for _ in range(10)]
        await asyncio.sleep(0)
        for _ in range(6):  # every request of the first ends
            limiter.release("one")
        await asyncio.sleep(0)
        seen = (limiter.held, limiter.holding("one"), limiter.holding("two"))
        for t in waiters:
            t.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        return seen

    assert asyncio.run(go()) == (6, 3, 3)


def test_a_cancelled_waiter_leaves_no_slot_taken():
    async def go():
        limiter = kube.FairLimiter(1, clock=Clock())
        await limiter.acquire("a")
        queued = asyncio.ensure_future(limiter.acquire("b"))
        await asyncio.sleep(0)
        queued.cancel()  # cancelled while it waits
        await asyncio.gather(queued, return_exceptions=True)
        handed = asyncio.ensure_future(limiter.acquire("c"))
        await asyncio.sleep(0)
        limiter.release("a")  # the slot goes to c ...
        handed.cancel()  # ... which is cancelled before it runs: the slot comes back
        await asyncio.gather(handed, return_exceptions=True)
        after = (limiter.held, limiter.waiting(), limiter.holding("c"))
        await asyncio.wait_for(limiter.acquire("d"), 1)
        return after, limiter.holding("d")

    assert asyncio.run(go()) == ((0, 0, 0), 1)


class OneAtATime(LocalServer):
    """Serves pod creations one at a time (as a saturated API server serves a queue), 2 ms each,
    and records, for each request of namespace ``small``, how many of ``big``'s were at the
    server when it arrived."""

    def __init__(self) -> None:
        self.at_server = {"big": 0, "small": 0}
        self.big_ahead: list[int] = []
        self.big_most_after_small = 0
        self.small_done = False
        self.lock = asyncio.Lock()
        super().__init__()
        app = self.app
        app.router.add_post("/api/v1/namespaces/{ns}/pods", self.pod)

    async def pod(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        if ns == "small":
            self.big_ahead.append(self.at_server["big"])
        self.at_server[ns] += 1
        if ns == "big" and self.small_done:
            self.big_most_after_small = max(self.big_most_after_small, self.at_server["big"])
        try:
            async with self.lock:
                await asyncio.sleep(0.002)
        finally:
            self.at_server[ns] -= 1
        return web.json_response({"kind": "Pod"}, status=201)


def test_a_small_jobs_later_rounds_wait_behind_the_large_jobs_share_at_the_server_not_all_its_slots():
    limit, shared = 32, 4

    async def go():
        server = OneAtATime()
        api = kube.Kube(kopf.ConnectionInfo(server=await server.start()), limit)
        api.limiter = kube.FairLimiter(limit, shared=shared, grace=0.2)

        async def create(ns: str, i: int) -> None:
            await api.create(f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": f"p{i}"}}, keep=False,
                             owner=ns)

        big = [asyncio.ensure_future(create("big", i)) for i in range(800)]
        # Until the large job fills its slots at the server (a busy machine takes longer to get
        # there; 10 s at most, and the assertion below says if it never did).
        for _ in range(200):
            await asyncio.sleep(0.05)
            if server.at_server["big"] >= limit - 2:
                break
        busy = server.at_server["big"]
        for i in range(3):  # a first pass: Events, its status, its pods: one round after the other
            await create("small", i)
        server.small_done = True
        await asyncio.gather(*big)
        await api.close()
        await server.runner.cleanup()
        return busy, server.big_ahead, server.big_most_after_small

    busy, ahead, after = asyncio.run(go())
    print(f"large job at the server alone: {busy}; ahead of each small round: {ahead}; after: {after}")
    assert busy >= limit - 2, f"the large job alone held {busy} of {limit} slots"
    # The first round meets what the large job already had at the server; the later ones only
    # its share (and a request of its that was on its way when the small one's round began).
    assert len(ahead) == 3 and all(n <= shared + 1 for n in ahead[1:]), ahead
    assert after >= limit - 2, f"the large job did not fill its slots again after the small one ({after})"
