"""Replica groups (spec.replicaGroups): one SPMDJob per group, one torchft Lighthouse, and the
job's status from its groups'.

Where it sits: beside :mod:`.lifecycle` (pure, no clock, no Kubernetes), below
:mod:`.controller`, which runs :func:`plan` in place of the lifecycle's reconcile for a job with
replica groups, carries out what it returns, and dresses every pod and NetworkPolicy of a group
job with :func:`dress_pod` and :func:`dress_network_policy`. docs/torchft.md is the user's account.

A job with ``spec.replicaGroups: {count: G, minReplicas: M}`` is a *parent*: it runs no gang of its
own. It owns

* G group jobs, SPMDJobs named ``<job>-g<g>`` (labels :data:`LABEL_GROUPS_OF` and
  :data:`LABEL_GROUP`), each the parent's spec without ``replicaGroups`` (and without
  ``ttlSecondsAfterFinished``: they go with the parent): a gang of its own, with every rule of
  today (restart in place, spares, node loss, elastic sizes), its own maxRestarts (the budget is
  per group, as in the local runner: a group's failures never spend another's);
* one Lighthouse pod ``<job>-lighthouse`` (``torchft_lighthouse --min_replicas M`` from spec.image,
  restartPolicy Always: the kubelet starts a Lighthouse that exits again in place; a pod lost is
  created again by the next pass) and its headless Service of the same name (TORCHFT_LIGHTHOUSE).

Every pod of a group job gets the group's torchft env (:func:`group_env`, carried on the group job
as the annotation :data:`ANNOTATION_ENV`) and the label :data:`LABEL_GROUPS_OF`, which its
NetworkPolicy and the parent's let in: torchft's process groups connect ranks of different groups
(the same local rank of each group), and every rank reaches the Lighthouse. Each such pod also
gets a headless Service of its own name (:func:`build_host_service`): torchft advertises ranks by
their hostname.

The job's phase (:func:`phase_of`): Succeeded once every group ended and at least M succeeded;
Failed once fewer than M groups can still run (the others Failed: their own restarts used up, or a
permanent failure), the remaining groups then suspended (their pods deleted) and the Lighthouse
deleted; Running while at least M groups run; else Pending (no group ran yet) or Restarting.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from monarch_spmd.spec import JobSpec, ReplicaGroups

from . import names
from .builders import _metadata, job_labels, owner_reference
from .names import JobRef

#: On a group job and its pods: the parent job's name.
LABEL_GROUPS_OF: Final = f"{names.GROUP}/replica-groups-of"
#: On a group job and its pods: the group's index.
LABEL_GROUP: Final = f"{names.GROUP}/replica-group"
#: On the Lighthouse pod and Service.
LABEL_ROLE: Final = names.LABEL_ROLE
ROLE_LIGHTHOUSE: Final = names.ROLE_LIGHTHOUSE
#: On a group job's pod: its own name, which its host Service selects (:func:`build_host_service`).
LABEL_POD: Final = f"{names.GROUP}/pod"
#: On a group job: the env (JSON object) its pods' trainer gets.
ANNOTATION_ENV: Final = f"{names.GROUP}/replica-group-env"
#: The worker's input that makes rank 0's worker host the group's TCPStore (torchft's Manager is
#: a client of the store at MASTER_PORT, as under torchrun).
AGENT_STORE_VAR: Final = "MONARCH_SPMD_AGENT_STORE"
#: The Lighthouse's requests: it is small (a quorum per step, a few KiB each).
LIGHTHOUSE_RESOURCES: Final = {"requests": {"cpu": "100m", "memory": "64Mi"}}
#: What a group job's status.phase says, and the phases a group ends in.
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
RUNNING: Final = "Running"
PENDING: Final = "Pending"
RESTARTING: Final = "Restarting"
SUSPENDED: Final = "Suspended"
#: Copied from the parent to no group: the parent's own (its groups go with it).
PARENT_ONLY_FIELDS: Final = ("replicaGroups", "ttlSecondsAfterFinished")


def group_name(job: JobRef, group: int) -> str:
    return f"{job.name}-g{group}"


def lighthouse_name(job: JobRef) -> str:
    return f"{job.name}-{ROLE_LIGHTHOUSE}"


def lighthouse_url(job: JobRef, rg: ReplicaGroups) -> str:
    """TORCHFT_LIGHTHOUSE: the Lighthouse's headless Service, which resolves to its pod's IP."""
    return f"http://{lighthouse_name(job)}.{job.namespace}.svc:{rg.lighthouse_port}"


def group_env(job: JobRef, rg: ReplicaGroups, group: int) -> dict[str, str]:
    """What every rank of group ``group`` gets beside the contract, as torchft's launcher gives it."""
    env = {
        "REPLICA_GROUP_ID": str(group),
        "NUM_REPLICA_GROUPS": str(rg.count),
        "TORCHFT_LIGHTHOUSE": lighthouse_url(job, rg),
        "TORCHFT_MANAGER_PORT": str(rg.manager_port),
        "TORCHFT_QUORUM_RETRIES": str(rg.quorum_retries),
        AGENT_STORE_VAR: "1",
    }
    for var, value in (("TORCHFT_TIMEOUT_SEC", rg.timeout_seconds),
                       ("TORCHFT_QUORUM_TIMEOUT_SEC", rg.quorum_timeout_seconds),
                       ("TORCHFT_CONNECT_TIMEOUT_SEC", rg.connect_timeout_seconds)):
        if value is not None:
            env[var] = str(value)
    return env


def build_group_job(parent: Mapping[str, Any], job: JobRef, rg: ReplicaGroups, group: int,
                    suspend: bool) -> dict[str, Any]:
    """Group ``group``'s SPMDJob: the parent's spec without its own fields, owned by the parent."""
    spec = {k: copy.deepcopy(v) for k, v in (parent.get("spec") or {}).items() if k not in PARENT_ONLY_FIELDS}
    spec["suspend"] = suspend
    labels = {**((parent.get("metadata") or {}).get("labels") or {}),
              LABEL_GROUPS_OF: job.name, LABEL_GROUP: str(group)}
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": group_name(job, group),
            "namespace": job.namespace,
            "labels": labels,
            "annotations": {ANNOTATION_ENV: json.dumps(group_env(job, rg, group), sort_keys=True)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def lighthouse_labels(job: JobRef) -> dict[str, str]:
    """The job's labels and the role (the pods' informer keeps it as rank -1: a pod of no gang)."""
    return {**job_labels(job), LABEL_ROLE: ROLE_LIGHTHOUSE}


def build_lighthouse_pod(job: JobRef, spec: JobSpec, rg: ReplicaGroups) -> dict[str, Any]:
    """The Lighthouse: ``torchft_lighthouse`` from spec.image, kept running by the kubelet
    (restartPolicy Always), with the placement fields of the template (node selector,
    tolerations, pull secrets, security context) and none of its containers."""
    template = spec.template.get("spec") or {}
    pod_spec: dict[str, Any] = {
        k: copy.deepcopy(template[k]) for k in ("nodeSelector", "tolerations", "imagePullSecrets", "securityContext",
                                                "priorityClassName", "serviceAccountName") if k in template
    }
    port = rg.lighthouse_port
    pod_spec.update({
        "restartPolicy": "Always",
        "containers": [{
            "name": ROLE_LIGHTHOUSE,
            "image": spec.image,
            "command": ["torchft_lighthouse", "--min_replicas", str(rg.min_replicas), "--bind", f"0.0.0.0:{port}",
                        "--join_timeout_ms", str(rg.join_timeout_seconds * 1000),
                        "--heartbeat_timeout_ms", str(rg.heartbeat_timeout_seconds * 1000)],
            "ports": [{"name": ROLE_LIGHTHOUSE, "containerPort": port, "protocol": "TCP"}],
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2, "timeoutSeconds": 1},
            "resources": copy.deepcopy(LIGHTHOUSE_RESOURCES),
        }],
    })
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _metadata(job, lighthouse_name(job), lighthouse_labels(job)), "spec": pod_spec}


def build_lighthouse_service(job: JobRef, rg: ReplicaGroups) -> dict[str, Any]:
    """The Lighthouse's headless Service: its name resolves to the pod's IP as soon as it has one."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(job, lighthouse_name(job), {**job_labels(job), LABEL_ROLE: ROLE_LIGHTHOUSE}),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {names.LABEL_JOB_UID: job.uid, LABEL_ROLE: ROLE_LIGHTHOUSE},
                 "ports": [{"name": ROLE_LIGHTHOUSE, "port": rg.lighthouse_port, "targetPort": rg.lighthouse_port,
                            "protocol": "TCP"}]},
    }


def build_lighthouse_network_policy(job: JobRef) -> dict[str, Any]:
    """Only the job's groups' pods reach the Lighthouse."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _metadata(job, names.network_policy_name(job), job_labels(job)),
        "spec": {"podSelector": {"matchLabels": {names.LABEL_JOB_UID: job.uid, LABEL_ROLE: ROLE_LIGHTHOUSE}},
                 "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {LABEL_GROUPS_OF: job.name}}}]}]},
    }


# --- a group job's pods ---------------------------------------------------------------------------


def group_of(body: Mapping[str, Any]) -> tuple[str, int] | None:
    """(parent job name, group index) of a group job, or None for any other job."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    parent, group = labels.get(LABEL_GROUPS_OF), labels.get(LABEL_GROUP)
    if not parent or group is None:
        return None
    try:
        return str(parent), int(group)
    except (TypeError, ValueError):
        return None


def dress_pod(pod: dict[str, Any], job_body: Mapping[str, Any]) -> None:
    """A pod of a group job: its group's env in the trainer (after the operator's, so a user's
    own value in the template still wins) and the label its siblings' NetworkPolicies let in."""
    of = group_of(job_body)
    if of is None:
        return
    raw = ((job_body.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ENV) or "{}"
    try:
        env = json.loads(raw)
    except ValueError:
        env = {}
    pod["metadata"].setdefault("labels", {}).update({LABEL_GROUPS_OF: of[0], LABEL_GROUP: str(of[1]),
                                                     LABEL_POD: pod["metadata"]["name"]})
    for container in pod["spec"].get("containers") or []:
        if container.get("name") != names.CONTAINER_NAME:
            continue
        have = {e.get("name") for e in container.get("env") or []}
        container.setdefault("env", []).extend(
            {"name": str(k), "value": str(v)} for k, v in sorted(env.items()) if k not in have)


def build_host_service(job: JobRef, pod: Mapping[str, Any]) -> dict[str, Any]:
    """A headless Service named as a group job's pod (its hostname), selecting it: torchft
    advertises each rank's address as ``socket.gethostname()`` (the Manager of a group's rank 0,
    the HTTP checkpoint transport every rank serves a recovering group from), and a bare pod name
    resolves in another pod only through a Service of that name (the namespace's search domain).
    Owned by the group job and labelled with the pod's attempt: deleted with that attempt's
    Services (a replacement in place has a name, so a Service, of its own)."""
    pod_name = pod["metadata"]["name"]
    restart = (pod["metadata"].get("labels") or {}).get(names.LABEL_RESTART, "0")
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(job, pod_name, {**job_labels(job), LABEL_POD: pod_name, names.LABEL_RESTART: restart}),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {names.LABEL_JOB_UID: job.uid, LABEL_POD: pod_name},
                 "ports": [{"name": "torchft", "port": 1, "targetPort": 1, "protocol": "TCP"}]},
    }


def dress_network_policy(policy: dict[str, Any], job_body: Mapping[str, Any]) -> None:
    """A group job's NetworkPolicy also lets in its sibling groups' pods (torchft's process groups
    connect the same local rank of every group)."""
    of = group_of(job_body)
    if of is None:
        return
    policy["spec"]["ingress"].append({"from": [{"podSelector": {"matchLabels": {LABEL_GROUPS_OF: of[0]}}}]})


# --- the parent's pass ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """What the parent knows of one group job."""

    index: int
    name: str
    phase: str | None
    restarts: int = 0
    disruptions: int = 0
    reason: str | None = None
    message: str | None = None
    suspended: bool = False

    @classmethod
    def of(cls, index: int, body: Mapping[str, Any]) -> Group:
        status = body.get("status") or {}
        return cls(index=index, name=str((body.get("metadata") or {}).get("name", "")), phase=status.get("phase"),
                   restarts=int(status.get("restarts") or 0), disruptions=int(status.get("disruptions") or 0),
                   reason=status.get("reason"), message=status.get("message"),
                   suspended=bool((body.get("spec") or {}).get("suspend")))


@dataclass(frozen=True)
class GroupsPlan:
    """What one pass over a parent decided.

    Attributes:
        create_groups: indices of the group jobs to create.
        suspend_groups: names of group jobs to suspend (the job failed, or is suspended).
        resume_groups: names of group jobs to resume (the job resumed).
        lighthouse: create the Lighthouse pod, its Service and NetworkPolicy (those missing).
        delete_lighthouse: delete the Lighthouse pod and Service (the job ended or is suspended).
        restart_lighthouse: delete the Lighthouse pod that ended (the next pass creates it).
        status: the status merge patch (only what changed).
        events: (type, reason, message) of Events to post.
    """

    create_groups: tuple[int, ...] = ()
    suspend_groups: tuple[str, ...] = ()
    resume_groups: tuple[str, ...] = ()
    lighthouse: bool = False
    delete_lighthouse: bool = False
    restart_lighthouse: bool = False
    status: dict[str, Any] = field(default_factory=dict)
    events: tuple[tuple[str, str, str], ...] = ()


def phase_of(groups: Sequence[Group], count: int, min_replicas: int, started: bool) -> tuple[str, str, str]:
    """(phase, reason, message) of a parent from its groups (``started``: a group ran before)."""
    ended = {g.index: g for g in groups if g.phase in (SUCCEEDED, FAILED)}
    succeeded = [g for g in ended.values() if g.phase == SUCCEEDED]
    failed = sorted((g for g in ended.values() if g.phase == FAILED), key=lambda g: g.index)
    running = [g for g in groups if g.phase == RUNNING]
    failed_text = "; ".join(f"group {g.index} ({g.name}) failed: {g.reason or 'Failed'}"
                            + (f": {g.message}" if g.message else "") for g in failed)
    if len(ended) == count:
        if len(succeeded) >= min_replicas:
            tail = f"; {failed_text}" if failed else ""
            return SUCCEEDED, "GroupsSucceeded", f"{len(succeeded)} of {count} replica groups succeeded{tail}"
        return FAILED, "TooFewReplicaGroups", (f"{len(succeeded)} of {count} replica groups succeeded, fewer than "
                                               f"minReplicas {min_replicas}; {failed_text}")
    if count - len(failed) < min_replicas:
        return FAILED, "TooFewReplicaGroups", (f"{len(failed)} of {count} replica groups failed for good, leaving "
                                               f"fewer than minReplicas {min_replicas}; {failed_text}")
    if len(running) + len(succeeded) >= min_replicas and running:
        return RUNNING, "ReplicaGroupsRunning", (f"{len(running)} of {count} replica groups running"
                                                 + (f"; {failed_text}" if failed else ""))
    if started:
        return RESTARTING, "ReplicaGroupsRestarting", (f"{len(running)} of {count} replica groups running, fewer "
                                                       f"than minReplicas {min_replicas}")
    return PENDING, "ReplicaGroupsStarting", f"{len(running)} of {count} replica groups running"


def plan(job: JobRef, spec: JobSpec, status: Mapping[str, Any], children: Mapping[int, Mapping[str, Any]],
         lighthouse_pod: tuple[str, bool] | None, lighthouse_service: bool, now: str) -> GroupsPlan:
    """One pass over a parent job.

    Args:
        status: the parent's status as stored.
        children: the group jobs that exist, by index (any other index is missing).
        lighthouse_pod: the Lighthouse pod's (phase, deleting), or None when there is none.
        lighthouse_service: its Service exists.
        now: the time (RFC 3339) for startTime and completionTime.
    """
    rg = spec.replica_groups
    assert rg is not None
    old_phase = status.get("phase")
    terminal = old_phase in (SUCCEEDED, FAILED)
    groups = [Group.of(i, body) for i, body in sorted(children.items()) if 0 <= i < rg.count]
    events: list[tuple[str, str, str]] = []
    create = () if terminal else tuple(i for i in range(rg.count) if i not in children)
    if spec.suspend and not terminal:
        phase, reason, message = SUSPENDED, "Suspended", "spec.suspend: every group is suspended"
    else:
        phase, reason, message = phase_of(groups, rg.count, rg.min_replicas, started=bool(status.get("startTime")))
        if terminal:
            phase, reason, message = old_phase, status.get("reason") or reason, status.get("message") or message
    ended = phase in (SUCCEEDED, FAILED)
    out: dict[str, Any] = {}
    if phase != old_phase:
        out.update({"phase": phase, "reason": reason, "message": message})
        kind = "Warning" if phase in (FAILED, RESTARTING) else "Normal"
        events.append((kind, reason, message))
    elif (reason, message) != (status.get("reason"), status.get("message")):
        out.update({"reason": reason, "message": message})
    if phase == RUNNING and not status.get("startTime"):
        out["startTime"] = now
    if ended and not status.get("completionTime"):
        out["completionTime"] = now
    rows = [{"index": g.index, "name": g.name, "phase": g.phase or PENDING, "restarts": g.restarts,
             "disruptions": g.disruptions, **({"reason": g.reason} if g.reason else {})} for g in groups]
    if rows != status.get("groups"):
        out["groups"] = rows
    counts = {"count": rg.count, "minReplicas": rg.min_replicas,
              "running": sum(1 for g in groups if g.phase == RUNNING),
              "succeeded": sum(1 for g in groups if g.phase == SUCCEEDED),
              "failed": sum(1 for g in groups if g.phase == FAILED)}
    if counts != status.get("replicaGroups"):
        out["replicaGroups"] = counts
    for g in groups:
        if g.phase == FAILED and not any(r.get("index") == g.index and r.get("phase") == FAILED
                                         for r in status.get("groups") or []):
            events.append(("Warning", "GroupFailed", f"replica group {g.index} ({g.name}) failed: {g.reason or FAILED}"
                           + (f": {g.message}" if g.message else "")))
    hold = ended or spec.suspend
    suspend = tuple(g.name for g in groups if hold and not g.suspended and g.phase not in (SUCCEEDED, FAILED))
    resume = tuple(g.name for g in groups if not hold and g.suspended)
    lighthouse_up = not hold
    pod_ended = lighthouse_pod is not None and lighthouse_pod[0] in (SUCCEEDED, FAILED) and not lighthouse_pod[1]
    return GroupsPlan(
        create_groups=create,
        suspend_groups=suspend,
        resume_groups=resume,
        lighthouse=lighthouse_up and (lighthouse_pod is None or not lighthouse_service),
        delete_lighthouse=not lighthouse_up and (lighthouse_pod is not None or lighthouse_service),
        restart_lighthouse=lighthouse_up and pod_ended,
        status=out,
        events=tuple(events),
    )
