"""Leader election on a coordination.k8s.io Lease: only one replica of the operator writes.

Where it sits: beside the controller, above :mod:`.kube`; :mod:`.handlers` starts it and gives it
two callbacks, ``on_started`` (this replica leads: start the job loops) and ``on_stopped`` (it
lost the Lease: stop every loop at once).

The algorithm is client-go's: a candidate takes the Lease when it does not exist, when nobody
holds it, or when its record has not changed for ``lease_duration`` by the candidate's own clock
(never by comparing clocks of two machines); every write is an update with the resourceVersion
read, so of two candidates only one succeeds. The leader renews every ``retry_period``; when it
could not renew for ``renew_deadline`` (shorter than ``lease_duration``, so it stops before any
standby may take over) it stops leading. On shutdown the leader releases the Lease (empty
holder), so a standby takes over at its next try instead of waiting for the Lease to expire.

With the defaults (10 s lease, 7 s renew deadline, 2 s retry) a standby leads within about 12 s
of the leader being killed, and within about 2 s of it shutting down cleanly.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
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
        api: the API client.
        namespace, name: the Lease.
        identity: this replica's name in the Lease (its pod name).
        on_started: awaited when this replica starts leading.
        on_stopped: awaited when it stops leading (lost or released the Lease).
        timings: lease duration, renew deadline, retry period.
    """

    def __init__(self, api: kube.Kube, namespace: str, name: str, identity: str,
                 on_started: Callable[[], Awaitable[None]], on_stopped: Callable[[], Awaitable[None]],
                 timings: Timings = Timings()) -> None:
        self.api = api
        self.url = lease_url(namespace, name)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.on_started, self.on_stopped = on_started, on_stopped
        self.timings = timings
        self.leading = False
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._task: asyncio.Task[None] | None = None

    # --- one try ------------------------------------------------------------------------------

    def _clock(self) -> float:
        return asyncio.get_running_loop().time()

    async def try_acquire_or_renew(self) -> bool:
        """One attempt to take or keep the Lease; True if this replica holds it now."""
        now = dt.datetime.now(dt.timezone.utc)
        seconds = max(1, int(round(self.timings.lease_duration)))
        lease = await self.api.get(self.url)
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": seconds,
                             "acquireTime": _micro_time(now), "renewTime": _micro_time(now), "leaseTransitions": 0}}
            created = await self.api.create(lease_url(self.namespace), body)
            if created is None:
                return False  # another replica created it first
            self._observe(created.get("spec") or {})
            return True
        spec = dict(lease.get("spec") or {})
        self._observe(spec)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or seconds)
        if holder and holder != self.identity and self._clock() < self._observed_at + duration:
            return False  # held, and renewed recently enough by our clock
        if holder != self.identity:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=seconds, renewTime=_micro_time(now))
        lease["spec"] = spec
        try:
            updated = await self.api.replace(self.url, lease)
        except kube.KubeError as e:
            if e.status == 409:
                return False  # someone else wrote it since we read it
            raise
        self._observe(updated.get("spec") or {})
        return True

    def _observe(self, spec: dict[str, Any]) -> None:
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = self._clock()

    # --- the campaign -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="leader election")

    async def run(self) -> None:
        """Campaigns forever: acquire, lead while renewing, and campaign again after a loss."""
        t = self.timings
        while True:
            while not await self._try():
                await asyncio.sleep(t.retry_period)
            self.leading = True
            logger.info("leader election: %s leads (Lease %s/%s)", self.identity, self.namespace, self.name)
            await self.on_started()
            renewed = self._clock()
            while True:
                await asyncio.sleep(t.retry_period)
                if await self._try():
                    renewed = self._clock()
                elif self._clock() - renewed >= t.renew_deadline:
                    break
            self.leading = False
            logger.warning("leader election: %s could not renew the Lease for %ss; it stops leading",
                           self.identity, t.renew_deadline)
            await self.on_stopped()

    async def _try(self) -> bool:
        try:
            return await self.try_acquire_or_renew()
        except (kube.KubeError, OSError, asyncio.TimeoutError) as e:
            logger.warning("leader election: %s", e)
            return False

    async def stop(self, release: bool = True) -> None:
        """Stops campaigning; a leader stops leading and (with ``release``) hands the Lease back."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.leading:
            self.leading = False
            await self.on_stopped()
            if release:
                await self.release()

    async def release(self) -> None:
        """Empties the Lease's holder if this replica holds it, so a standby takes over at once."""
        try:
            lease = await self.api.get(self.url)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            now = _micro_time(dt.datetime.now(dt.timezone.utc))
            lease["spec"].update(holderIdentity="", leaseDurationSeconds=1, renewTime=now)
            await self.api.replace(self.url, lease)
            logger.info("leader election: %s released the Lease", self.identity)
        except (kube.KubeError, OSError, asyncio.TimeoutError) as e:
            logger.warning("leader election: could not release the Lease: %s", e)
