"""Refusals: the API server would not create a child of the job; the job says why, in its own terms.

Where it sits: a lifecycle policy (above :mod:`.status`, :mod:`spmd_operator.podpaths` and
:mod:`monarch_spmd.quantity`). The controller hands the latest refusal of a create (a pod, the
master Service, the worker ConfigMap, a PodGroup, the Kueue Workload) to the next pass as
:attr:`~.model.Observed.rejection`; :func:`classify` reads it and this module acts on it.

What a refusal means, by the API server's answer:

* **400 or 422, invalid**: the template holds something no pod may have. Permanent: the job fails
  with reason InvalidSpec (:mod:`.admission`), and the message names the job's field and value
  (``spec.template.spec.containers[0].resources.limits.memory: Invalid value: "-1" ...``), not
  the pod's, via :mod:`spmd_operator.podpaths` (a quantity the server cannot even decode is found
  in the template by :func:`monarch_spmd.spec.pod_problems`).
* **403 exceeded quota** (reason QuotaExceeded): a ResourceQuota of the namespace; the message
  names the quota and each resource with what was requested, used and allowed.
* **403 Pod Security** (reason PodSecurity): the namespace's ``pod-security.kubernetes.io/enforce``
  level; the message names the level and, for each check, the job's field to set
  (``spec.template.spec.containers[0].securityContext.allowPrivilegeEscalation=false``).
* **403, anything else** (reason Forbidden): another admission plugin or webhook, or RBAC.

A 403 is waited out, not failed: quota frees up, a namespace label or the job's template (while
suspended) can change. The job stays in its phase (Pending or Restarting) and says why at once:
``status.reason``/``status.message`` (``kubectl get -o wide``, ``monarch-spmd status``), the
conditions Created and Running (False, with the reason), ``status.refusal`` (below) and one Warning
Event per distinct refusal (the same quota and resources, or the same Pod Security level, is not
announced again on every retry). Creation is retried with back-off (:data:`RETRY_SECONDS`, from
the number of refusals in a row). A gang that has stayed incomplete because of refusals for
:data:`RELEASE_SECONDS` releases what it holds: its pods are deleted (they would hold quota,
nodes and GPUs while waiting for ranks that cannot be created, and a rank waiting for its master
would fail the attempt), a Warning Event GangReleased says so, and the next try comes after
:data:`RELEASE_WAIT_SECONDS` (longer after each release). These deletions are no failure: no
restart is used. Once every child exists ``status.refusal`` is removed and Created is True again.

``status.refusal`` (written by :func:`handle`): reason, kind and name of the child, code,
message, cause (what makes two refusals the same), since (the first refusal in a row), lastTime,
retries, retryAt (no create before then), heldSince (since when the incomplete gang has held pods),
releases and releasedAt, and probe/probed: after a back-off one pod is created first (the
lowest missing rank), and only once the server took it does the rest of the gang follow, so a
refused gang of thousands of pods costs one refused request per retry, not thousands.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Final

from monarch_spmd.spec import JobSpec, pod_problems

from .. import names, podpaths
from .model import EVENT_WARNING, RESTARTING, RUNNING, Refusal, format_time, parse_time
from .status import Pass

QUOTA: Final = "QuotaExceeded"
POD_SECURITY: Final = "PodSecurity"
FORBIDDEN: Final = "Forbidden"
INVALID: Final = "InvalidSpec"
RELEASED: Final = "GangReleased"
#: Seconds before the next create after the 1st, 2nd ... refusal in a row (the last repeats).
RETRY_SECONDS: Final = (2.0, 4.0, 8.0, 16.0, 30.0)
#: A gang incomplete because of refusals this long deletes the pods it holds.
RELEASE_SECONDS: Final = 30.0
#: Seconds before the next try after the 1st, 2nd ... release (the last repeats).
RELEASE_WAIT_SECONDS: Final = (30.0, 60.0, 120.0, 300.0)

_QUOTA_EXCEEDED: Final = re.compile(r"exceeded quota: (?P<quota>[^,]+), requested: (?P<requested>.*), "
                                    r"used: (?P<used>.*), limited: (?P<limited>.*)$")
_QUOTA_FAILED: Final = re.compile(r"failed quota: (?P<quota>[^:]+): (?P<what>.*)$")
_PSA: Final = re.compile(r'violates PodSecurity "(?P<level>[^"]+)": (?P<checks>.*)$')
_PSA_CONTAINER: Final = re.compile(r'(?P<who>pod or container|container|containers) "(?P<name>[^"]+)"(?: must set | must not set | must )')
#: "must specify limits.cpu for: trainer; limits.memory for: trainer,side" (quota's needs per container).
_MUST_SPECIFY: Final = re.compile(r"(?P<resource>[\w./-]+) for: (?P<containers>[\w,-]+)")


@dataclass(frozen=True)
class Verdict:
    """What a refusal means for the job.

    Attributes:
        reason: QuotaExceeded, PodSecurity, Forbidden or InvalidSpec.
        cause: what makes two refusals the same (one Warning Event per cause).
        message: the refusal in the job's terms, in one line.
        permanent: the job fails (InvalidSpec) rather than waiting.
    """

    reason: str
    cause: str
    message: str
    permanent: bool


def _pairs(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        key, _, value = item.strip().partition("=")
        if key:
            out[key] = value
    return out


def _after_forbidden(message: str) -> str:
    """The server's message without its ``pods "x" is forbidden:`` prefix."""
    return message.split(" is forbidden: ", 1)[1] if " is forbidden: " in message else message


def _what(refusal: Refusal, spec: JobSpec | None) -> str:
    """``pod hello-abcde-r0-1 (rank 1)``, ``Service hello-abcde-m0``."""
    if refusal.kind == "Pod":
        where = ""
        if refusal.index is not None and spec is not None:
            per = spec.mesh[-1].size if spec.pod_layout == names.PER_HOST else 1
            where = f" (rank {refusal.index})" if per == 1 else f" (ranks {refusal.index * per}..{refusal.index * per + per - 1})"
        return f"pod {refusal.name}{where}"
    return f"{refusal.kind} {refusal.name}"


def _quota(refusal: Refusal, spec: JobSpec | None, namespace: str) -> Verdict | None:
    text = _after_forbidden(refusal.message)
    m = _QUOTA_EXCEEDED.search(text)
    if m:
        requested, used, limited = (_pairs(m.group(k)) for k in ("requested", "used", "limited"))
        resources = sorted(requested)
        detail = "; ".join(f"{r}: requested {requested[r]}, used {used.get(r, '?')}, limited {limited.get(r, '?')}"
                           for r in resources)
        quota = m.group("quota").strip()
        return Verdict(QUOTA, f"ResourceQuota {quota}: {', '.join(resources)}",
                       f"{_what(refusal, spec)} refused by ResourceQuota {quota} of namespace {namespace}: {detail}",
                       False)
    m = _QUOTA_FAILED.search(text)
    if m:
        quota = m.group("quota").strip()
        what = m.group("what").strip()
        fields = [f"{podpaths.container_path(spec, name)}.resources.{n.group('resource')}"
                  for n in _MUST_SPECIFY.finditer(what) for name in n.group("containers").split(",")] if spec else []
        hint = f"set {', '.join(fields)}" if fields else "set them in spec.template.spec.containers[].resources"
        return Verdict(QUOTA, f"ResourceQuota {quota}: {what}",
                       f"{_what(refusal, spec)} refused by ResourceQuota {quota} of namespace {namespace}: {what} "
                       f"({hint})", False)
    return None


def _pod_security(refusal: Refusal, spec: JobSpec | None, namespace: str) -> Verdict | None:
    m = _PSA.search(_after_forbidden(refusal.message))
    if not m:
        return None
    checks = m.group("checks")
    if spec is not None:
        def where(c: re.Match[str]) -> str:
            path = podpaths.container_path(spec, c.group("name"))
            if c.group("who") == "pod or container":
                return f"spec.template.spec (or {path}) must set "
            return f"{path} must {'not set ' if 'must not set' in c.group(0) else 'set ' if 'must set' in c.group(0) else ''}"
        checks = _PSA_CONTAINER.sub(where, checks)
    level = m.group("level")
    return Verdict(POD_SECURITY, f'PodSecurity "{level}"',
                   f'{_what(refusal, spec)} violates Pod Security "{level}" enforced on namespace {namespace}: {checks} '
                   "(docs/pod-security.md)", False)


def classify(refusal: Refusal, spec: JobSpec | None, job: names.JobRef, restart: int) -> Verdict:
    """What a refusal means (see the module docstring), its message in the job's terms."""
    if refusal.code in (400, 422):
        text = refusal.message
        if spec is not None and refusal.kind == "Pod":
            index = refusal.index or 0
            # A value the server cannot even decode ("cannot be handled as a Pod: quantities must
            # match ...") is named by reading the template; anything else by mapping its paths.
            bad = pod_problems({"template": spec.template}) if "cannot be handled as a" in text else []
            text = str(bad[0]) if bad else podpaths.translate(job, spec, text, index, restart)
        return Verdict(INVALID, text, f"the API server refused {_what(refusal, spec)}: {text}", True)
    verdict = _quota(refusal, spec, job.namespace) or _pod_security(refusal, spec, job.namespace)
    if verdict is not None:
        return verdict
    cause = re.sub(r'"[^"]*"', '""', _after_forbidden(refusal.message))
    return Verdict(FORBIDDEN, cause, f"the API server refused {_what(refusal, spec)}: {refusal.message}", False)


def _seconds(table: tuple[float, ...], n: int) -> float:
    return table[min(max(n, 1), len(table)) - 1]


def _missing(p: Pass) -> bool:
    """Whether the pass still has children to create (the gang, its Service, ConfigMap ...)."""
    current = p.current()
    gang_missing = p.phase != RUNNING and (
        len(current) < p.pods_per_attempt or any(pod.deleting for pod in current.values()))
    return bool(p.create) or gang_missing or p.service is not None or p.configmap or p.podgroup is not None or p.workload


def released(p: Pass) -> bool:
    """Whether the current gang's pods are being deleted by a release (no failure: no restart)."""
    return bool((p.o.status.get("refusal") or {}).get("releasedAt")) and p.phase != RUNNING


def handle(p: Pass) -> None:
    """Records a waiting refusal, holds creation during its back-off, releases an incomplete gang.

    Runs at the end of a pass of an active job (after the gang and its children were planned), and
    removes ``status.refusal`` once nothing is missing any more.
    """
    old: dict[str, Any] = dict(p.o.status.get("refusal") or {})
    r = p.o.rejection
    last = parse_time(old.get("lastTime"))
    fresh = r is not None and r.code == 403 and (last is None or (parse_time(r.at) or p.now) > last)
    if not old and not fresh:
        return
    if not fresh and not _missing(p):
        p.new.pop("refusal", None)
        before = next((c for c in p.conditions if c.get("type") == "Created"), {})
        if before.get("status") == "False" and before.get("reason") == old.get("reason"):
            p.condition("Created", "True", "PodsCreated", f"created {p.pods_per_attempt} pods for mesh {p.new.get('mesh')}")
        return
    new = dict(old)
    if fresh:
        assert r is not None
        verdict = classify(r, p.spec, p.o.job, p.gang)
        at = r.at
        if verdict.cause != old.get("cause"):
            p.event(EVENT_WARNING, verdict.reason, verdict.message)
            new.update(since=at, retries=0, releases=0)
            new.pop("releasedAt", None)
            new.pop("heldSince", None)
        retries = int(new.get("retries") or 0) + 1
        when = parse_time(at) or p.now
        new.update(reason=verdict.reason, cause=verdict.cause, message=verdict.message, kind=r.kind,
                   name=r.name, code=r.code, lastTime=at, retries=retries,
                   retryAt=format_time(when + dt.timedelta(seconds=_seconds(RETRY_SECONDS, retries))))
        new.setdefault("since", at)
        new.setdefault("releases", 0)
        new.setdefault("heldSince", at)
        new.pop("probe", None)
        new.pop("probed", None)
    elif new.get("probe") and any(pod.name == new["probe"] and not pod.deleting for pod in p.current().values()):
        new.pop("probe")
        new["probed"] = True  # the server took the probe: the rest of the gang goes at once
    holding = [pod for pod in p.current().values() if not pod.deleting and not pod.finished]
    held = parse_time(new.get("heldSince"))
    if holding and held is not None and (p.now - held).total_seconds() >= RELEASE_SECONDS:
        releases = int(new.get("releases") or 0) + 1
        wait = _seconds(RELEASE_WAIT_SECONDS, releases)
        new.update(releases=releases, releasedAt=format_time(p.now), retryAt=format_time(p.now + dt.timedelta(seconds=wait)))
        new.pop("heldSince", None)
        p.delete_pods.extend(pod.name for pod in holding)
        p.event(EVENT_WARNING, RELEASED,
                f"released the {len(holding)} pods of the incomplete gang (attempt {p.restart}) after "
                f"{int(RELEASE_SECONDS)}s of refusals ({new.get('reason')}: {new.get('cause')}); next try in {int(wait)}s")
    elif holding and held is not None:
        p.requeue.append(RELEASE_SECONDS - (p.now - held).total_seconds())
    retry_at = parse_time(new.get("retryAt"))
    attempt = p.create_restart if p.create_restart is not None else p.gang
    if retry_at is not None and retry_at > p.now:
        # Back-off: nothing is created before retryAt (the pass is woken then).
        p.create.clear()
        p.service = None
        p.podgroup = None
        p.configmap = False
        p.workload = False
        p.requeue.append((retry_at - p.now).total_seconds())
    elif p.create and not new.get("probed"):
        # The back-off is over: one pod tries first, so a refused gang of thousands is not sent
        # again whole every retry; once the server takes it, the rest follows at once.
        first = min(p.create)
        p.create[:] = [first]
        new["probe"] = names.pod_name(p.o.job, attempt, first)
    p.new["refusal"] = new
    # Pods of this attempt the server took that the informer does not show yet count as created
    # (a gang's pods go at once: the refusal of one comes with the others' creation, before their
    # watch events).
    shown = {pod.name for pod in p.current().values() if not pod.deleting}
    coming = {names.pod_name(p.o.job, attempt, i) for i in range(p.pods_per_attempt)} & p.o.creating
    created = len(shown | coming)
    left = max(0, int((retry_at - p.now).total_seconds())) if retry_at is not None else 0
    after = (f"; released the incomplete gang {new['releases']} time(s) (a gang held {int(RELEASE_SECONDS)}s "
             "without every pod is released)" if new.get("releases") else "")
    message = (f"{created}/{p.pods_per_attempt} pods created; {new.get('message')}{after}; "
               f"retrying {'in ' + str(left) + 's' if left else 'now'}")
    reason = str(new.get("reason"))
    p.condition("Created", "False", reason, message)
    # The condition that explains the phase (status.reason and status.message come from it).
    if p.phase == RESTARTING:
        p.condition(RESTARTING, "True", reason, message)
    else:
        p.condition(RUNNING, "False", reason, message)
