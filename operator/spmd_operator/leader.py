"""Leader election on a coordination.k8s.io Lease: only one replica of the operator writes.

Where it sits: beside the controller, above :mod:`.kube`; :mod:`.handlers` starts it and gives it
two callbacks, ``on_started`` (this replica leads: resync every job, then start the job loops) and
``on_stopped`` (it lost the Lease: stop every loop at once), and installs :meth:`LeaderElector.may_write`
as the client's fence.

The algorithm and its guarantees are client-go's:

* A candidate takes the Lease when it does not exist, when nobody holds it, or when its record has
  not changed for ``lease_duration`` by the candidate's own clock (never by comparing clocks of two
  machines); every write is an update with the resourceVersion read, so of two candidates only one
  succeeds.
* The leader renews every ``retry_period``. Each try is bounded: its requests leave at once (they
  do not queue behind pod creations) and the whole try is cancelled when the renew deadline is
  reached.
* Fencing: a write is sent only while ``now < last renew + renew_deadline`` by this replica's
  clock, where "last renew" is when the last successful try BEGAN. A standby takes over no
  sooner than ``lease_duration`` after it saw that renewal, and ``renew_deadline <
  lease_duration``, so the deposed leader's fence is closed before the new leader's first write,
  even if the deposed leader was paused (SIGSTOP) or its connection stalled.
* Losing the Lease, missing the renew deadline, or an unexpected error in the election itself
  stops leading: logged, ``on_stopped`` awaited (every job loop cancelled), then the replica
  campaigns again; a new term starts with a resync of every job from the server.
* On shutdown the leader releases the Lease (empty holder), so a standby takes over at its next
  try instead of waiting for the Lease to expire.

With the defaults (10 s lease, 7 s renew deadline, 2 s retry) a standby leads within about 12 s
of the leader being killed, and within about 2 s of it shutting down cleanly.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from . import kube

logger = logging.getLogger(__name__)

LEASE_DURATION: Final = 10.0
RENEW_DEADLINE: Final = 7.0
RETRY_PERIOD: Final = 2.0
DEFAULT_LEASE_NAME: Final = "spmdjob-operator"


def lease_url(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{base}/{name}" if name else base


def _micro_time(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Timings:
    """How long a Lease lasts, how long a leader tries to renew it, how often anyone tries."""

    lease_duration: float = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                f"leader election timings: need lease duration ({self.lease_duration}s) > renew deadline "
                f"({self.renew_deadline}s) > retry period ({self.retry_period}s) > 0"
            )


class LeaderElector:
    """Campaigns for the Lease ``namespace/name`` as ``identity`` and reports gains and losses.

    Args:
        api: the API client (its fence is not applied to the election's own requests).
        namespace, name: the Lease.
        identity: this replica's name in the Lease (its pod name).
        on_started: awaited when this replica starts leading.
        on_stopped: awaited when it stops leading (lost or released the Lease, or failed).
        timings: lease duration, renew deadline, retry period.
        clock: monotonic seconds (tests may pass their own).
    """

    def __init__(self, api: kube.Kube, namespace: str, name: str, identity: str,
                 on_started: Callable[[], Awaitable[None]], on_stopped: Callable[[], Awaitable[None]],
                 timings: Timings = Timings(), clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.url = lease_url(namespace, name)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.on_started, self.on_stopped = on_started, on_stopped
        self.timings = timings
        self.clock = clock
        self.leading = False
        #: When the last successful try to take or renew the Lease began (``clock``), if any.
        self.renewed_at: float | None = None
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._task: asyncio.Task[None] | None = None

    # --- the fence ------------------------------------------------------------------------------

    def may_write(self) -> bool:
        """Whether this replica may write now: it leads, and its renew deadline has not passed."""
        return (self.leading and self.renewed_at is not None
                and self.clock() < self.renewed_at + self.timings.renew_deadline)

    # --- one try ------------------------------------------------------------------------------

    async def try_acquire_or_renew(self, timeout: float | None = None) -> bool:
        """One attempt to take or keep the Lease; True if this replica holds it now.

        Each request is bounded by ``timeout`` (default: the renew deadline) and not retried.
        """
        began = self.clock()
        budget = self.timings.renew_deadline if timeout is None else timeout

        def left() -> float:
            return max(0.05, began + budget - self.clock())

        now = dt.datetime.now(dt.timezone.utc)
        seconds = max(1, int(round(self.timings.lease_duration)))
        try:
            lease = await self.api.request("GET", self.url, timeout=left(), retries=0)
        except kube.KubeError as e:
            if e.status != 404:
                raise
            lease = None
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": seconds,
                             "acquireTime": _micro_time(now), "renewTime": _micro_time(now), "leaseTransitions": 0}}
            try:
                created = await self.api.request("POST", lease_url(self.namespace), body=body, timeout=left(), retries=0)
            except kube.KubeError as e:
                if e.status == 409:
                    return False  # another replica created it first
                raise
            self._observe(created.get("spec") or {})
            self.renewed_at = began
            return True
        spec = dict(lease.get("spec") or {})
        self._observe(spec)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or seconds)
        if holder and holder != self.identity and self.clock() < self._observed_at + duration:
            return False  # held, and renewed recently enough by our clock
        if holder != self.identity:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=seconds, renewTime=_micro_time(now))
        lease["spec"] = spec
        try:
            updated = await self.api.request("PUT", self.url, body=lease, timeout=left(), retries=0)
        except kube.KubeError as e:
            if e.status == 409:
                return False  # someone else wrote it since we read it
            raise
        self._observe(updated.get("spec") or {})
        self.renewed_at = began
        return True

    def _observe(self, spec: dict[str, Any]) -> None:
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = self.clock()

    # --- the campaign -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="leader election")

    async def run(self) -> None:
        """Campaigns forever: acquire, lead while renewing, and campaign again after a loss.

        An unexpected error (a bug, an answer that is not JSON) never ends the election silently
        while the loops go on writing: it is logged, leadership is given up, and the campaign
        starts again after a retry period.
        """
        while True:
            try:
                await self._term()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("leader election: %s failed unexpectedly; it stops leading and campaigns again",
                                 self.identity)
                await self._stop_leading("the election failed")
                await asyncio.sleep(self.timings.retry_period)

    async def _term(self) -> None:
        """One term: campaign until the Lease is ours, then renew until a renew deadline is missed."""
        t = self.timings
        while not await self._try(t.renew_deadline):
            await asyncio.sleep(t.retry_period)
        self.leading = True
        logger.info("leader election: %s leads (Lease %s/%s)", self.identity, self.namespace, self.name)
        await self.on_started()
        while True:
            await asyncio.sleep(t.retry_period)
            assert self.renewed_at is not None
            left = self.renewed_at + t.renew_deadline - self.clock()
            if left <= 0 or not await self._try(left):
                if self.clock() >= self.renewed_at + t.renew_deadline:
                    break
        await self._stop_leading(f"could not renew the Lease within {t.renew_deadline}s")

    async def _try(self, budget: float) -> bool:
        """One bounded try; False on any API failure or when ``budget`` seconds run out."""
        try:
            return await asyncio.wait_for(self.try_acquire_or_renew(budget), timeout=budget)
        except (kube.KubeError, OSError, asyncio.TimeoutError) as e:
            logger.warning("leader election: %s", e or "the try timed out")
            return False

    async def _stop_leading(self, why: str) -> None:
        if not self.leading:
            return
        self.leading = False
        logger.warning("leader election: %s stops leading: %s", self.identity, why)
        try:
            await self.on_stopped()
        except Exception:
            logger.exception("leader election: stopping the job loops failed")

    async def stop(self, release: bool = True) -> None:
        """Stops campaigning; a leader stops leading and (with ``release``) hands the Lease back."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.leading:
            await self._stop_leading("the operator is shutting down")
            if release:
                await self.release()

    async def release(self) -> None:
        """Empties the Lease's holder if this replica holds it, so a standby takes over at once."""
        try:
            lease = await self.api.request("GET", self.url, timeout=self.timings.renew_deadline, retries=0)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            now = _micro_time(dt.datetime.now(dt.timezone.utc))
            lease["spec"].update(holderIdentity="", leaseDurationSeconds=1, renewTime=now)
            await self.api.request("PUT", self.url, body=lease, timeout=self.timings.renew_deadline, retries=0)
            logger.info("leader election: %s released the Lease", self.identity)
        except (kube.KubeError, OSError, asyncio.TimeoutError) as e:
            logger.warning("leader election: could not release the Lease: %s", e)
