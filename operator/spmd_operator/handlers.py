"""The kopf wiring of the SPMDJob operator: SPMDJob events in, the controller does the rest.

Where it sits: the top of ``spmd_operator`` (only ``__main__`` is above it). kopf watches the
SPMDJobs (listing, re-listing and reconnecting as kopf does), serves the health endpoint and runs
the operator's lifetime (startup, cleanup, signals); every decision and write belongs to
:class:`spmd_operator.controller.Controller`, which watches the jobs' children itself with plain
labelled informers (:mod:`spmd_operator.informer`) rather than kopf's per-object pipeline.
Run it with ``python -m spmd_operator`` or ``kopf run -m spmd_operator.handlers --standalone -A``.

No finalizers and no kopf annotations are put on SPMDJobs (only an event handler is used), so
deleting a job never waits for the operator; children go by garbage collection.

Credentials: one login handler (:func:`login`, kopf's own minimal logins plus exec credential
plugins, see :func:`spmd_operator.kube.login`) serves both kopf's watch of SPMDJobs and the
controller's client, so neither needs a client library's object models.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import time
from typing import Any, Final

import kopf

from . import builders, controller, kube, leader, memory, names
from .metrics import Metrics

#: The operator's handlers, in a plain :class:`kopf.OperatorRegistry`: kopf's default registry
#: (its "smart" one, made on first use) looks for the kubernetes, kubernetes_asyncio and pykube
#: client libraries, importing each whole, to offer their logins as fallbacks; the operator has
#: its own login (:func:`login`) and uses none of them. Made the default here, so that ``kopf run
#: -m spmd_operator.handlers`` finds the handlers too; ``__main__`` passes it to ``kopf.run``.
REGISTRY: Final = kopf.OperatorRegistry()
kopf.set_default_registry(REGISTRY)


class _QuietEventHandlers(logging.Filter):
    """Drops kopf's "Handler 'job_event' succeeded." lines: one per job event is noise at scale."""

    _HANDLERS: Final = ("job_event",)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        message = record.getMessage()
        return not any(message == f"Handler {h!r} succeeded." for h in self._HANDLERS)


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """The kopf settings the operator relies on (also applied under ``kopf run``)."""
    objects_logger = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietEventHandlers) for f in objects_logger.filters):
        objects_logger.addFilter(_QuietEventHandlers())
    # The controller posts the Events of transitions itself; kopf's handler logs stay logs.
    settings.posting.enabled = False
    # Nothing of kopf's goes into status (the schema would prune it); keep it in annotations.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=names.GROUP)
    # Watches end on the server side before proxies cut them; the client gives a little more.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 30


@kopf.on.login()
def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """kopf's credentials: the service account, else the kubeconfig (exec plugins included)."""
    return kube.login(settings)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Applies the settings, logs in, serves the metrics, starts the informers and (when this
    replica leads, or leader election is off) the job loops."""
    configure_settings(settings)
    ctl_ref: list[controller.Controller] = []
    metrics = Metrics(lambda: [loop.body for loop in ctl_ref[0].jobs.values()] if ctl_ref else [],
                      lambda: ctl_ref[0].cache_sizes() if ctl_ref else {})
    election: dict[str, Any] | None = getattr(memo, "leader_election", None)
    identity = election["identity"] if election else os.environ.get("POD_NAME") or socket.gethostname()
    api = await kube.Kube.connect(concurrency=int(getattr(memo, "concurrency", kube.DEFAULT_CONCURRENCY)),
                                  observe=metrics.request, user_agent=f"{kube.USER_AGENT}/{identity}",
                                  settings=settings)
    ctl = controller.Controller(
        api, builders.worker_files(),
        namespaces=getattr(memo, "namespaces", None) or None,
        resync_seconds=float(getattr(memo, "resync_seconds", controller.DEFAULT_RESYNC_SECONDS)),
        check_seconds=float(getattr(memo, "check_seconds", controller.DEFAULT_CHECK_SECONDS)),
        payload_grace_seconds=float(getattr(memo, "payload_grace_seconds", controller.DEFAULT_PAYLOAD_GRACE_SECONDS)),
        metrics=metrics,
        recycle=memory.RecyclePolicy(float(getattr(memo, "memory_recycle_factor", memory.DEFAULT_FACTOR)),
                                     int(getattr(memo, "memory_recycle_min_mib", memory.DEFAULT_MIN_EXCESS_MIB)) * memory.MIB),
        isolation=getattr(memo, "isolation", None),
    )
    metrics.recycles.set(memory.recycles())
    ctl_ref.append(ctl)
    memo.controller = ctl
    port = int(getattr(memo, "metrics_port", 0) or 0)
    if port:
        metrics.serve(port)
    if election is not None:
        async def started() -> None:
            ctl.activate()

        # The Lease has a client of its own: its renewals never wait behind the jobs' requests.
        elector = memo.elector = leader.LeaderElector(
            api.twin(user_agent=f"{kube.USER_AGENT}/{identity}/lease"), election["namespace"], election["name"],
            election["identity"],
            on_started=started, on_stopped=ctl.deactivate, timings=election["timings"])
        api.may_write = elector.may_write  # the fence: no write unless the Lease is provably ours
    await ctl.start(activate=election is None)
    if election is not None:
        memo.elector.start()


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """On SIGTERM: stops every job loop (each pass is idempotent, so an abandoned write is
    repeated by the next leader), hands the Lease back, stops the informers and logs out."""
    elector = getattr(memo, "elector", None)
    ctl = getattr(memo, "controller", None)
    if ctl is not None:
        await ctl.deactivate()
    if elector is not None:
        await elector.stop(release=True)
        await elector.api.close()
    if ctl is not None:
        await ctl.stop()
        await ctl.api.close()


#: How long a replica may hold the Lease with its job loops stopped before its liveness probe
#: fails (taking the Lease and starting the loops are one step apart; more is a stuck leader).
STUCK_LEADER_SECONDS = 15.0


class LeaderHealth:
    """What the liveness probe says of leadership: a replica that holds the Lease but runs no job
    loop for STUCK_LEADER_SECONDS cannot work and keeps any standby from taking over, so the probe
    fails and the kubelet restarts it (its Lease then lapses to a standby)."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.stuck_since: float | None = None

    def check(self, leading: bool, active: bool) -> str:
        if not leading or active:
            self.stuck_since = None
            return "leader" if leading else "standby"
        now = self.clock()
        if self.stuck_since is None:
            self.stuck_since = now
        if now - self.stuck_since >= STUCK_LEADER_SECONDS:
            raise RuntimeError(f"this replica has held the Lease for {now - self.stuck_since:.0f}s with its job "
                               "loops stopped")
        return "leader (starting its loops)"


@kopf.on.probe(id="leadership")
def leadership(memo: kopf.Memo, **_: Any) -> str:
    """Part of kopf's health endpoint (the liveness probe): fails for a stuck leader."""
    ctl = getattr(memo, "controller", None)
    elector = getattr(memo, "elector", None)
    if ctl is None:
        return "starting"
    health = getattr(memo, "leader_health", None)
    if health is None:
        health = memo.leader_health = LeaderHealth()
    leading = elector.may_write() if elector is not None else True
    try:
        return health.check(leading, bool(ctl.active))
    except RuntimeError as e:
        # Permanent: kopf answers the probe 500 at once (a temporary error would be retried
        # inside the request, which then times out instead).
        raise kopf.PermanentError(str(e)) from e


@kopf.on.event(names.GROUP, names.VERSION, names.PLURAL)
async def job_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
    """An SPMDJob was listed, changed or deleted: hand it to the controller."""
    ctl = getattr(memo, "controller", None)
    if ctl is not None:
        ctl.observe_job(type, copy.deepcopy(dict(body)))
