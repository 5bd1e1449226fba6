"""Admission: a spec that cannot run fails the job once, with InvalidSpec, creating nothing.

Two inputs can say so: the parser (what the CRD's schema and CEL rules would have refused had
the job been admitted through an older CRD, or what only the operator checks), and the API
server refusing a pod built from the template in the previous pass (a PodSpec field that is
invalid in itself, which neither the CRD nor the parser can see). The refusal arrives as an input
of the next pass (:attr:`~.model.Observed.rejection`), so one pass writes one status patch and
the Events follow the order of what happened.
"""

from __future__ import annotations

from monarch_spmd.spec import SpecError

from .model import FAILED
from .status import Pass

REASON: str = "InvalidSpec"


def refuse(p: Pass) -> bool:
    """Fails the job when its spec is invalid or a pod built from it was refused; True if so."""
    spec, rejection = p.o.spec, p.o.rejection
    if not isinstance(spec, SpecError) and rejection is None:
        return False
    if p.phase != FAILED:
        what = f"invalid spec: {spec}" if isinstance(spec, SpecError) else rejection
        message = f"{what}; fix it and create the job again"
        p.fail(REASON, message, failure=p.failure_record(REASON, message))
    return True
