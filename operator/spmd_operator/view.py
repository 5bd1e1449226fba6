"""What the controller sees: the informers of the jobs' children, and the snapshot a pass reads.

Owns the labelled informers of the jobs' pods and Services (and, started the first time a job
needs one, of the optional APIs: Volcano's or coscheduling's PodGroups, Kueue's Workloads), their
start and stop, and :meth:`View.observed`: what one pass of a job sees, built from the caches
without a request and without opening anything (a job's observer connection is tended by the pass
afterwards, :mod:`.observers`). The payload ConfigMaps' informer is :mod:`.payloads`'; this view
reads it too.

* Never act on an unsynced view: a snapshot is made only when every informer the pass reads
  (pods, Services, ConfigMaps, and the job's Workloads or PodGroups) has listed since its watch
  last broke; until then the job waits and writes nothing. An optional API that is forbidden or
  not installed affects only the jobs that name it (:attr:`.lifecycle.Observed.unavailable`).
* Ownership: only children whose controller owner reference is the job's uid count. A namesake's
  leftovers (still terminating, or orphaned by ``kubectl delete --cascade=orphan``) are neither
  adopted nor blamed; their names never collide with ours (the uid is in every child's name).

Where it sits: a part of the controller (:mod:`.controller` makes it, hands it what a change or a
re-list wakes, and starts and stops it); above :mod:`.informer`, :mod:`.lifecycle`,
:mod:`.payloads` (whether a namespace's payload exists) and :mod:`.jobloop`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any, Final

from monarch_spmd.spec import SCHEDULING_KUEUE, SpecError, parse_stored

from . import builders, informer, kube, lifecycle
from .jobloop import JobKey, JobLoop
from .names import JobRef
from .payloads import Payloads

#: Chart values that grant the RBAC rules of each optional API (helm/monarch-spmd/values.yaml).
CHART_VALUES: Final = {"workloads": "gangScheduling.kueue.enabled",
                       "scheduling.volcano.sh": "gangScheduling.volcano.enabled",
                       "scheduling.x-k8s.io": "gangScheduling.coscheduling.enabled"}


class View:
    """The informers a pass reads, and the snapshot it reads from them.

    Args:
        api: the API client.
        jobs: the controller's jobs (read, never changed here): the deleted objects of those it
            still knows are kept a while (:meth:`.informer.Informer.gone`).
        payloads: the payload ConfigMaps (its informer is read with these).
        namespaces: the namespaces watched (None: all).
        on_change: called with the job keys whose children changed.
        on_synced: called when an informer has listed (again).
    """

    def __init__(self, api: kube.Kube, jobs: Mapping[JobKey, JobLoop], payloads: Payloads, *,
                 namespaces: list[str] | None, on_change: Callable[[set[JobKey]], None],
                 on_synced: Callable[[], None]) -> None:
        self.api = api
        self.jobs = jobs
        self.payloads = payloads
        self.namespaces = namespaces
        self.on_change = on_change
        self.on_synced = on_synced
        self.pods: informer.Informer[lifecycle.PodInfo] = self._informer(kube.pods_url, lifecycle.pod_info, "pods")
        # Services are summarized from their metadata (lifecycle.child_info), so that is all their
        # informer asks for.
        self.services: informer.Informer[lifecycle.ChildInfo] = self._informer(
            kube.services_url, lifecycle.child_info, "services", metadata=True)
        self.informers: list[informer.Informer[Any]] = [self.pods, self.services, payloads.configmaps]
        #: Informers of optional APIs (PodGroups, Kueue Workloads), started when a job first needs one.
        self.optional: dict[tuple[str, str, str], informer.Informer[Any]] = {}

    async def start(self) -> None:
        """Starts the informers and waits for their first lists."""
        for inf in self.informers:
            inf.start()
        await asyncio.gather(*(inf.ready.wait() for inf in self.informers))

    async def stop(self) -> None:
        for inf in self.informers:
            await inf.stop()

    def _informer(self, collection: Any, summarize: Any, name: str, *, metadata: bool = False) -> informer.Informer[Any]:
        return informer.Informer(self.api, collection, summarize, namespaces=self.namespaces, on_change=self.on_change,
                                 name=name, on_synced=self.on_synced, keep=lambda key: key in self.jobs,
                                 metadata=metadata)

    def optional_informer(self, api: tuple[str, str, str], summarize: Any) -> informer.Informer[Any]:
        """The informer of an optional API (its CRD may not even exist), started on first use."""
        inf = self.optional.get(api)
        if inf is None:
            group, version, plural = api
            inf = self.optional[api] = self._informer(lambda ns, a=api: kube.custom_url(*a, ns), summarize,
                                                      f"{plural}.{group}")
            self.informers.append(inf)
            inf.start()
        return inf

    def job_informers(self) -> list[informer.Informer[Any]]:
        """The informers whose groups are jobs (the payload ConfigMaps' are not)."""
        return [self.pods, self.services, *self.optional.values()]

    @staticmethod
    def _unavailable(inf: informer.Informer[Any], api: tuple[str, str, str], provider: str) -> tuple[str, str] | None:
        """Why an optional API cannot be used, naming the RBAC rule or CRD and the chart value."""
        error = inf.failure
        if error is None:
            return None
        group, version, plural = api
        value = CHART_VALUES.get(plural if group.startswith("kueue") else group, "")
        if error.status == 403:
            return ("SchedulingForbidden",
                    f"spec.scheduling.provider {provider} needs {plural}.{group} (list, watch, create), which the "
                    f"operator's RBAC does not grant: install the chart with {value}=true (or add the rule to its "
                    f"ClusterRole); no pods are created until then")
        return ("SchedulingAPIMissing",
                f"spec.scheduling.provider {provider} needs the API {plural}.{group}/{version}, which this cluster "
                f"does not serve (no CustomResourceDefinition): install {provider}, or choose another provider; "
                "no pods are created until then")

    def observed(self, loop: JobLoop, now: dt.datetime | None = None) -> lifecycle.Observed | None:
        """What a pass of ``loop`` sees: its job and the children it owns; None while an informer
        the pass needs has not listed (since its watch last broke): nothing is decided then.

        Opens and closes nothing: what the job's observer connection heard (``coordinator``) is
        added by the pass's own step, :meth:`.observers.Observers.tend`. (An optional API's
        informer is started the first time a job needs it.)"""
        if any(not inf.synced for inf in self.informers[:3]):
            return None
        body = loop.body
        meta = body.get("metadata") or {}
        job = JobRef.from_body(body)
        outdated: tuple[SpecError, ...] = ()
        try:
            spec, outdated = parse_stored(body.get("spec") or {})
        except SpecError as e:
            spec = e
        configmap = lifecycle.CONFIGMAP_CURRENT if self.payloads.present(job.namespace) else lifecycle.CONFIGMAP_MISSING
        podgroups: tuple[lifecycle.ChildInfo, ...] = ()
        workload = None
        unavailable = None
        if not isinstance(spec, SpecError):
            provider = spec.scheduling_provider
            group_api = builders.PODGROUP_APIS.get(provider)
            if group_api is not None:
                inf = self.optional_informer(group_api, lifecycle.child_info)
                unavailable = self._unavailable(inf, group_api, provider)
                if unavailable is None and not inf.synced:
                    return None
                podgroups = tuple(inf.get(job.key, job.uid))
            if provider == SCHEDULING_KUEUE:
                inf = self.optional_informer(builders.KUEUE_WORKLOAD, lifecycle.workload_info)
                unavailable = self._unavailable(inf, builders.KUEUE_WORKLOAD, provider)
                if unavailable is None and not inf.synced:
                    return None
                found = inf.get(job.key, job.uid)
                workload = found[0] if found else None
        owned = tuple(self.pods.get(job.key, job.uid))
        pods = tuple(p for p in owned if p.spare is None)
        return lifecycle.Observed(
            job=job,
            generation=meta.get("generation"),
            spec=spec,
            status=body.get("status") or {},
            pods=pods,
            spares=tuple(p for p in owned if p.spare is not None),
            creating=frozenset(loop.created) - {p.name for p in owned},
            gone=tuple(p for p in self.pods.gone(job.key, job.uid) if p.spare is None),
            services=tuple(self.services.get(job.key, job.uid)),
            configmap=configmap,
            podgroups=podgroups,
            workload=workload,
            rejection=loop.rejection,
            outdated=outdated,
            unavailable=unavailable,
            now=now or dt.datetime.now(dt.timezone.utc),
        )
