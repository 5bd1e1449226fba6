"""The job's other children: the payload ConfigMap and one master Service per attempt.

While a job is active, the current attempt's headless Service (``<job>-<id>-m<attempt>``) and
the ConfigMap must exist: one deleted by hand is created again by the next pass (a pass follows
every change the controller's watches see, within seconds). Services of other attempts are
deleted, so a name of an older attempt never resolves again. A ConfigMap whose payload hash
differs from this operator's (an upgrade) is brought up to date.
"""

from __future__ import annotations

from .model import CONFIGMAP_CURRENT
from .status import Pass


def ensure(p: Pass) -> None:
    """Plans the ConfigMap and the current attempt's Service; drops other attempts' Services."""
    want = int(p.new.get("restarts") or p.restart)
    if not any(s.restart == want and not s.deleting for s in p.o.services):
        p.service = want
    p.delete_services.extend(s.name for s in p.o.services if s.restart != want and not s.deleting)
    if p.o.configmap != CONFIGMAP_CURRENT:
        p.configmap = True
