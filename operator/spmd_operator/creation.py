"""Creating a job's children: each once, remembered until the informers show it, a taken name checked.

Owns the POSTs of the children a pass's plan asks for: the attempt's Service, PodGroup and Kueue
Workload, the job's NetworkPolicy (with ``--network-policy``) and, through :mod:`.payloads`, the
namespace's payload ConfigMap, concurrently; then the pods, many at a time, each built only when
its request may go, all of an attempt carrying one agent token. What this replica created is
remembered (:attr:`.jobloop.JobLoop.created`) until the informers show it, or for
CREATED_MEMORY_SECONDS, so a second pass before the watches catch up POSTs nothing twice. A 409 is
checked: ours (created by an earlier pass, or another process) is fine; a stranger's is an error,
or for a pod a NameTaken Event (never adopted, never counted). A refusal (400, 403, 422) goes to
the next pass (:class:`.errors.Refused`). Pods are created with field validation Strict
(:meth:`.kube.Kube.create`): a field of the template the Pod API does not know is such a refusal (400),
which fails the job with InvalidSpec naming the field, instead of a pod without it.

Where it sits: a part of the controller (:mod:`.controller` calls it in the order its pass
writes: the children while the status goes, the pods after it); above :mod:`.builders` (the
bodies), :mod:`.kube` (writes), :mod:`.events` (NameTaken), :mod:`.payloads`, :mod:`.errors`
and :mod:`.jobloop`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Final

from monarch_spmd import policy
from monarch_spmd.payload import rendezvous

from . import builders, events, informer, kube, lifecycle, names, replicagroups
from .errors import Refused, raise_first, refusal_of
from .jobloop import JobLoop
from .metrics import Metrics
from .names import JobRef
from .payloads import Payloads

#: How long a child this operator created is trusted to exist before the informer shows it
#: (counted from the server's answer). A deletion the watch shows ends it at once, so one
#: deleted before the informer ever showed it is created again without waiting this long.
CREATED_MEMORY_SECONDS: Final = 30.0


class Creator:
    """Creates the children of every job's plan.

    Args:
        api: the API client.
        payloads: the payload ConfigMaps (created through it; the pods mount its current one).
        recorder: where a NameTaken Event goes.
        metrics: where pod creations are counted.
        isolation: each job gets a NetworkPolicy letting in only its own pods and the operator
            (:func:`builders.build_network_policy`): the operator pods' (namespace, labels), the
            namespace None when the operator does not run in a pod; None: no NetworkPolicy.
    """

    def __init__(self, api: kube.Kube, payloads: Payloads, recorder: events.EventRecorder, metrics: Metrics, *,
                 isolation: tuple[str | None, Mapping[str, str]] | None) -> None:
        self.api = api
        self.payloads = payloads
        self.events = recorder
        self.metrics = metrics
        self.isolation = isolation

    @staticmethod
    def shown(loop: JobLoop, o: lifecycle.Observed, informers: Iterable[informer.Informer[Any]]) -> None:
        """Forgets the creations the watches show (they need no memory of having been created),
        and those they saw deleted since (they may be created again at once)."""
        if not loop.created:
            return
        for child in (*o.pods, *o.spares, *o.services, *o.podgroups):
            loop.created.pop(child.name, None)
        for name, when in list(loop.created.items()):
            if any((inf.deleted_at(loop.key, name) or 0.0) > when for inf in informers):
                del loop.created[name]

    async def children(self, loop: JobLoop, o: lifecycle.Observed, plan: lifecycle.Plan,
                       group_api: tuple[str, str, str] | None) -> list[Any]:
        """The plan's ConfigMap, Service, PodGroup and Workload, concurrently; each one's result
        or exception."""
        job, spec, ns = o.job, o.spec, o.job.namespace
        self._forget_old_creations(loop)
        writes: list[Awaitable[Any]] = []
        if plan.configmap:
            writes.append(self.payloads.ensure(ns))
        if plan.service is not None:
            writes.append(self._ensure(loop, kube.services_url(ns), builders.build_service(job, spec, plan.service), job))
        if plan.podgroup is not None and group_api is not None:
            writes.append(self._ensure(loop, kube.custom_url(*group_api, ns), builders.build_podgroup(job, spec, plan.podgroup), job))
        if plan.workload:
            writes.append(self._ensure(loop, kube.custom_url(*builders.KUEUE_WORKLOAD, ns), builders.build_workload(job, spec), job))
        if self.isolation is not None and (plan.create or plan.replace or plan.spares):
            # Before the pods (they wait for these writes): no pod of the job runs unisolated. One
            # per job, so a later attempt's creation finds it (409, checked to be the job's own).
            isolation = builders.build_network_policy(job, spec, *self.isolation)
            if isolation is not None:
                replicagroups.dress_network_policy(isolation, loop.body)
                writes.append(self._ensure(loop, kube.custom_url(*builders.NETWORK_POLICY_API, ns), isolation, job))
        if writes or plan.create or plan.replace or plan.spares:
            loop.rejection = None  # tried again: the next pass sees only what this one is refused
        return await asyncio.gather(*writes, return_exceptions=True)

    @staticmethod
    def _forget_old_creations(loop: JobLoop) -> None:
        clock = asyncio.get_running_loop().time()
        loop.created = {n: t for n, t in loop.created.items() if clock - t < CREATED_MEMORY_SECONDS}

    async def _ensure(self, loop: JobLoop, collection: str, body: dict[str, Any], job: JobRef) -> dict[str, Any] | None:
        """Creates a child unless this loop did within CREATED_MEMORY_SECONDS.

        Returns:
            None if it was created now or remembered; if its name was taken, the holder's
            metadata once it is known to be ours (a stranger's is an error).
        """
        name = body["metadata"]["name"]
        when = loop.created.get(name)
        if when is not None and asyncio.get_running_loop().time() - when < CREATED_MEMORY_SECONDS:
            return None
        try:
            created = await self.api.create(collection, body, keep=False, owner=loop.key) is not None
        except kube.KubeError as e:
            refusal = refusal_of(e, body)
            if refusal is not None:
                raise Refused(refusal) from e
            raise
        existing = None
        if not created:
            existing = await self.api.get(f"{collection}/{name}", metadata=True)
            if existing is not None and names.owner_uid(existing) != job.uid:
                raise kube.KubeError(409, f"{body['kind']} {name} exists and belongs to another object; "
                                     "delete it so the job can create its own", path=collection)
        loop.created[name] = asyncio.get_running_loop().time()
        return existing

    @staticmethod
    def _attempt_token(loop: JobLoop, spec: Any, restart: int, pods: Iterable[lifecycle.PodInfo]) -> str | None:
        """The agent token of attempt ``restart``'s pods: the one its pods already carry (created
        by this process or an earlier one), else a new one; None without restart in place."""
        if policy.agent_port(spec) is None:
            return None
        for old in [r for r in loop.tokens if r < restart]:
            del loop.tokens[old]
        carried = next((p.agent_token for p in pods if p.restart == restart and p.agent_token), None)
        if carried is not None:
            loop.tokens[restart] = carried
        return loop.tokens.setdefault(restart, rendezvous.new_token())

    async def pods(self, loop: JobLoop, job: JobRef, spec: Any, plan: lifecycle.Plan, flavors: list[dict[str, Any]],
                   pods: Iterable[lifecycle.PodInfo] = ()) -> lifecycle.Refusal | None:
        """Creates the plan's pods concurrently.

        Returns:
            The API server's refusal of the lowest-ranked pod it refused (400, 403, 422), else None.
        """
        ns = job.namespace
        # (index, replacement) of the gang's pods; (-1 - k, 0) of hot spare k (spares.tend).
        wanted = [(r, 0) for r in plan.create] + list(plan.replace) + [(-1 - k, 0) for k in plan.spares]

        def name_of(rank: int, replacement: int) -> str:
            if rank < 0:
                return names.spare_pod_name(job, plan.spare_restart, -1 - rank)
            return names.pod_name(job, plan.restart, rank, replacement)

        ranks = [(r, n) for r, n in wanted if name_of(r, n) not in loop.created]
        # A pod is built only when its request may go: thousands of pod bodies never sit in memory
        # at once, and the server's answer (the pod again) is not decoded.
        gate = asyncio.Semaphore(self.api.concurrency)
        token = self._attempt_token(loop, spec, plan.restart, pods) if ranks else None
        spare_token = (self._attempt_token(loop, spec, plan.spare_restart, pods)
                       if any(r < 0 for r, _ in ranks) else None)

        grouped = replicagroups.group_of(loop.body) is not None

        async def create(rank: int, replacement: int) -> Any:
            async with gate:
                if rank < 0:
                    pod = builders.build_spare_pod(job, spec, -1 - rank, plan.spare_restart,
                                                   disruptions=plan.disruptions, payload=self.payloads.name,
                                                   token=spare_token, avoid_nodes=plan.avoid_nodes)
                else:
                    pod = builders.build_pod(job, spec, rank, plan.restart, replacement=replacement,
                                             restart_count=plan.replace_round if replacement else None,
                                             disruptions=plan.disruptions, payload=self.payloads.name, token=token,
                                             avoid_nodes=plan.avoid_nodes)
                replicagroups.dress_pod(pod, loop.body)
                builders.place_on_flavors(pod, flavors)
                created = await self.api.create(kube.pods_url(ns), pod, keep=False, owner=loop.key)
                if grouped:  # a replica group's pod: its hostname must resolve in the other groups
                    await self._ensure(loop, kube.services_url(ns),
                                       replicagroups.build_host_service(job, pod), job)
                return created

        results = await asyncio.gather(*(create(r, n) for r, n in ranks), return_exceptions=True)
        # Remembered from the answers, not from when the pass began: under load a pod's request
        # may wait its turn among other jobs' writes for longer than the memory lasts.
        clock = asyncio.get_running_loop().time()
        taken: list[str] = []
        refused: lifecycle.Refusal | None = None
        for i, ((rank, replacement), result) in enumerate(zip(ranks, results)):
            name = name_of(rank, replacement)
            refusal = refusal_of(result, {"kind": "Pod", "metadata": {"name": name}}, max(rank, 0))
            if refusal is not None:
                refused = refused or refusal
                results[i] = None  # said in the next pass, not raised
                continue
            if result is None:
                taken.append(name)
            if not isinstance(result, BaseException):
                loop.created[name] = clock
                if result is not None:
                    self.metrics.pods_created.inc()
                    if replacement:
                        self.metrics.pods_replaced.inc()
        if taken:
            await self._check_taken(loop, job, taken)
        raise_first(results)
        return refused

    async def _check_taken(self, loop: JobLoop, job: JobRef, taken: list[str]) -> None:
        """Pods whose names were taken: ours (created by an earlier pass) or, rarely, a stranger's."""
        existing = await asyncio.gather(*(self.api.get(kube.pods_url(job.namespace, n), metadata=True) for n in taken))
        strangers = [n for n, body in zip(taken, existing) if body is not None and names.owner_uid(body) != job.uid]
        new = [n for n in strangers if n not in loop.foreign_reported]
        if new:
            loop.foreign_reported.update(new)
            await self.events.record(loop.body, [lifecycle.Event(
                lifecycle.EVENT_WARNING, "NameTaken",
                f"{len(new)} pod name(s) are held by objects this job does not own (e.g. {new[0]}); "
                "they are not counted; the job waits until they are gone")])
        for n in strangers:
            loop.created.pop(n, None)
