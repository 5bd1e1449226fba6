"""Admission: a spec that cannot run fails the job once, with InvalidSpec, creating nothing.

Three inputs can say so: the parser (what the CRD's schema and CEL rules would have refused had
the job been admitted through an older CRD, or what only the operator checks), the API server
refusing a child built from the spec in the previous pass as invalid (400/422: a PodSpec field
that is invalid in itself, which neither the CRD nor the parser can see), and a rule of this
version (a policy: :attr:`monarch_spmd.schema.Rule.policy`) that a job never started breaks. The
refusal arrives as an input of the next pass (:attr:`~.model.Observed.rejection`), so one pass
writes one status patch and the Events follow the order of what happened; its message names the
job's fields, not the pod's (:func:`.refusal.classify`). A failed job's children go as a finished
job's do (:func:`.finished.clean`).

Upgrades never fail admitted jobs: a job that already started (it has a phase, or pods) and breaks
only rules added after it was admitted (:attr:`~.model.Observed.outdated`) keeps running; a
Warning Event OutdatedSpec says so once, and ``status.specWarnings`` lists what it breaks.
"""

from __future__ import annotations

from monarch_spmd.spec import SpecError

from . import finished, refusal
from .model import EVENT_WARNING, FAILED
from .status import Pass

REASON: str = "InvalidSpec"
OUTDATED: str = "OutdatedSpec"


def refuse(p: Pass) -> bool:
    """Fails the job when its spec is invalid or a child built from it was refused; True if so."""
    spec, rejection = p.o.spec, p.o.rejection
    if isinstance(spec, SpecError):
        what = f"invalid spec: {spec}"
    elif rejection is not None and rejection.code in (400, 422):
        what = refusal.classify(rejection, spec, p.o.job, p.gang).message
    elif p.o.outdated and p.phase is None and not p.o.pods:
        what = f"invalid spec: {p.o.outdated[0]}"
    else:
        _outdated(p)
        return False
    if p.phase != FAILED:
        message = f"{what}; fix it and create the job again"
        p.fail(REASON, message, failure=p.failure_record(REASON, message))
    finished.clean(p)
    return True


def _outdated(p: Pass) -> None:
    """A started job breaking rules added after it was admitted: said once, never failed."""
    found = [str(e) for e in p.o.outdated]
    if found == list(p.o.status.get("specWarnings") or []):
        return
    if found:
        p.new["specWarnings"] = found
        p.event(EVENT_WARNING, OUTDATED,
                f"the job was admitted before rules of this operator version that its spec breaks: "
                f"{'; '.join(found)}; it keeps running, and a new job with this spec would be refused "
                "(docs/upgrades.md)")
    else:
        p.new.pop("specWarnings", None)
