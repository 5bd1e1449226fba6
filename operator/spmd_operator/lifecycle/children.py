"""The job's other children: one master Service and (for a gang scheduler) one PodGroup per
attempt; and the namespace's payload ConfigMap, which its jobs share.

While a job is active, the current attempt's headless Service (``<job>-<id>-m<attempt>``), its
PodGroup (``<job>-<id>-r<attempt>``, with spec.scheduling.provider Volcano or Coscheduling) and
the namespace's ConfigMap of this operator's payload (``monarch-spmd-payload-<hash>``) must exist:
one deleted by hand is created again by the next pass (a pass follows every change the
controller's watches see, within seconds). Services and PodGroups of other attempts are deleted,
so a name of an older attempt never resolves again and an old group holds no place in the
scheduler (a replica group's pods' own Services, :func:`spmd_operator.replicagroups.build_host_service`,
carry their attempt too and go with it). An upgraded operator's payload is another ConfigMap (another hash): pods already
running keep the one they mount.
"""

from __future__ import annotations

from monarch_spmd.spec import SCHEDULING_COSCHEDULING, SCHEDULING_VOLCANO

from .. import names
from .model import CONFIGMAP_CURRENT

#: Providers that gang-schedule an attempt's pods through a PodGroup.
GANG_PROVIDERS = frozenset({SCHEDULING_VOLCANO, SCHEDULING_COSCHEDULING})
from .status import Pass


def ensure(p: Pass) -> None:
    """Plans the ConfigMap and the current attempt's Service; drops other attempts' Services."""
    want = p.new_gang()
    master = names.service_name(p.o.job, want)
    if not any(s.name == master and not s.deleting for s in p.o.services):
        p.service = want
    p.delete_services.extend(s.name for s in p.o.services if s.restart != want and not s.deleting)
    if p.o.configmap != CONFIGMAP_CURRENT:
        p.configmap = True
    if p.spec.scheduling_provider in GANG_PROVIDERS:
        if not any(g.restart == want and not g.deleting for g in p.o.podgroups):
            p.podgroup = want
    p.delete_podgroups.extend(g.name for g in p.o.podgroups if g.restart != want and not g.deleting)
