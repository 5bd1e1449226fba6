"""Shared builders for the lifecycle policy tests: a 2x2 job, its pods, its status, one pass."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt

from monarch_spmd.spec import parse_job_spec
from spmd_operator import lifecycle, names
from spmd_operator.lifecycle import ChildInfo, Observed, PodInfo

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
T0 = "2026-01-01T11:00:00Z"
JOB = names.JobRef("hello", "ns", "3fa9c0de-0000-4000-8000-000000000001")
BASE = {"mesh": [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 2}], "args": ["train.py"], "image": "img"}


def spec(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return parse_job_spec(raw, require_image=True)


def pod_name(rank, restart=0):
    return names.pod_name(JOB, restart, rank)


def pod(rank, phase="Running", restart=0, **kw):
    return PodInfo(name=pod_name(rank, restart), rank=rank, restart=restart, phase=phase, node=f"node-{rank}", **kw)


def gang(phase="Running", restart=0, n=4):
    return [pod(r, phase, restart) for r in range(n)]


def deleting(pods):
    return [dataclasses.replace(p, deleting=True) for p in pods]


def service(restart):
    return ChildInfo(name=names.service_name(JOB, restart), restart=restart)


def status(phase, restarts=0, **kw):
    out = {"phase": phase, "restarts": restarts, "startTime": T0, "mesh": "hosts=2,gpus=2", "procs": 4,
           "masterAddr": names.master_addr(JOB, restarts)}
    if phase == "Running":
        out["conditions"] = lifecycle.set_condition([], "Running", "True", "AllProcsRunning", "all 4 procs are running", NOW)
    out.update(kw)
    return out


def run(s=None, st=None, pods=(), now=NOW, generation=1, services=None, configmap=lifecycle.CONFIGMAP_CURRENT,
        rejection=None, gone=(), podgroups=(), workload=None, outdated=(), coordinator=None, spares=(),
        creating=()):
    """One pass. By default the current attempt's Service exists and the ConfigMap is current."""
    st = st or {}
    if services is None:
        services = [service(int(st.get("gangRestart", st.get("restarts")) or 0))] if st else []
    o = Observed(job=JOB, generation=generation, spec=s or spec(), status=st, pods=tuple(pods), gone=tuple(gone),
                 services=tuple(services), configmap=configmap, rejection=rejection, now=now,
                 podgroups=tuple(podgroups), workload=workload, outdated=tuple(outdated), coordinator=coordinator,
                 spares=tuple(spares), creating=frozenset(creating))
    return lifecycle.reconcile(o)


def apply(st, plan):
    """The status after the plan's merge patch."""
    return merge(st or {}, plan.status)


def merge(a, patch):
    out = dict(a)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def cond(st, type_):
    return next((c for c in st.get("conditions", []) if c["type"] == type_), None)


def events(plan):
    return [(e.type, e.reason) for e in plan.events]
