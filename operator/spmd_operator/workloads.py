"""The controller's writes to Kueue's Workloads: a job's end and an evicted gang's release.

Owns what the operator tells Kueue about a job it admitted (spec.scheduling.provider kueue): the
conditions it sets on the job's Workload status (Finished when the job ended, so Kueue frees the
quota; QuotaReserved, Admitted and Requeued after an eviction once every pod is gone, so the job
queues again), and the ResourceFlavors the job was admitted on, read when its pods are made. The
Workload itself is created like any other child of the job, by the controller's pass.

Where it sits: a part of the controller (:mod:`.controller` calls it when a plan says
``finish_workload``, ``release_workload`` or creates pods of an admitted job); above
:mod:`.kube` (writes), :mod:`.builders` (the API's names) and :mod:`.lifecycle` (the observed
Workload). No background work: each call is one pass's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Final

from . import builders, kube, lifecycle

logger = logging.getLogger(__name__)

#: Tries of a conditional update of a Kueue Workload that keeps meeting a newer version.
WORKLOAD_CONFLICT_RETRIES: Final = 5


class Workloads:
    """Writes the Workload conditions of jobs Kueue admits.

    Args:
        api: the API client.
    """

    def __init__(self, api: kube.Kube) -> None:
        self.api = api

    async def conditions(self, o: lifecycle.Observed, conditions: Mapping[str, tuple[str, str, str]],
                         extra: Mapping[str, Any] | None = None) -> None:
        """Sets conditions (type -> status, reason, message) on the job's Workload status.

        The Workload is Kueue's object too: the patch carries the resourceVersion read, so a
        condition Kueue wrote in between is never overwritten (409 Conflict: read again, retry).
        """
        assert o.workload is not None
        now = lifecycle.format_time(o.now)
        url = kube.custom_url(*builders.KUEUE_WORKLOAD, o.job.namespace, o.workload.name)
        for attempt in range(WORKLOAD_CONFLICT_RETRIES):
            body = await self.api.get(url)
            if body is None:
                return
            kept = [c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") not in conditions]
            new = [{"type": t, "status": st, "reason": r, "message": m, "lastTransitionTime": now}
                   for t, (st, r, m) in conditions.items()]
            version = (body.get("metadata") or {}).get("resourceVersion")
            try:
                await self.api.patch(f"{url}/status", {"metadata": {"resourceVersion": version},
                                                       "status": {"conditions": kept + new, **(extra or {})}},
                                     owner=(o.job.namespace, o.job.name))
                return
            except kube.KubeError as e:
                if e.status != 409 or attempt == WORKLOAD_CONFLICT_RETRIES - 1:
                    raise
                logger.info("Workload %s/%s changed while it was being updated; reading it again",
                            o.job.namespace, o.workload.name)

    async def finish(self, o: lifecycle.Observed) -> None:
        """Tells Kueue the job ended (condition Finished on the Workload), so it frees the quota."""
        succeeded = o.status.get("phase") == lifecycle.SUCCEEDED
        outcome = "Succeeded" if succeeded else "Failed"
        await self.conditions(o, {"Finished": ("True", outcome, f"the SPMDJob {outcome.lower()}")})

    async def release(self, o: lifecycle.Observed) -> None:
        """After an eviction, once every pod is gone: the quota goes back to Kueue, the job queues again."""
        assert o.workload is not None
        requeue = "True" if o.workload.evicted in ("Preempted", "NodeFailures") else "False"
        await self.conditions(o, {
            "QuotaReserved": ("False", "Pending", "the gang's pods were stopped"),
            "Admitted": ("False", "NoReservation", "the gang's pods were stopped"),
            "Requeued": (requeue, o.workload.evicted or "Evicted", "the gang's pods were stopped"),
        }, extra={"admission": None})

    async def flavors(self, o: lifecycle.Observed) -> list[dict[str, Any]]:
        """The ResourceFlavors Kueue admitted the job on (cluster-scoped; read when pods are made)."""
        if o.workload is None:
            return []
        group, version, plural = builders.KUEUE_FLAVORS
        found = await asyncio.gather(*(self.api.get(f"/apis/{group}/{version}/{plural}/{name}") for name in o.workload.flavors))
        return [f for f in found if f is not None]
