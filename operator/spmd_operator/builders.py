"""Pure functions that build an SPMDJob's children as plain dicts: Service, Pods, PodGroups and
the Kueue Workload; and the namespace's payload ConfigMap, which its jobs share.

Where it sits: above :mod:`spmd_operator.names` and the library (:mod:`monarch_spmd.spec` for the
parsed spec, :mod:`monarch_spmd.policy` for the shared rules, the payload's worker for its input
variables), below :mod:`spmd_operator.controller`, which sends what these functions return to the
API server. Nothing here talks to Kubernetes, so every child can be unit-tested as a dict;
nothing is rendered from YAML text.

What a pod gets (docs/interfaces.md is the contract):

* command ``[spec.python, /opt/monarch-spmd/payload/worker.py, --, *spec.args]``: the worker,
  shipped in the namespace's ``monarch-spmd-payload-<hash>`` ConfigMap (:func:`build_worker_configmap`)
  and mounted read-only, so a stock PyTorch image works;
* the MONARCH_SPMD_* inputs of :func:`monarch_spmd.payload.worker.worker_input_env` that differ
  from the worker's defaults (the mesh, coordinates, master and attempt always) plus POD_NAME,
  POD_NAMESPACE, POD_IP and NODE_NAME from the downward API (always the pod's own); a variable the
  user's ``trainer`` container sets keeps the user's value (the spec lets users set only the
  harmless ones: no torchrun contract variable, no MONARCH_SPMD_* input but two);
* labels job, job-uid, (first) rank, restart and one ``coord-<dim>`` per coordinate; the owner
  reference of the job (controller), so deleting the job deletes the pod;
* a memory-backed ``/dev/shm`` (``spec.shmSize`` its limit) unless the template mounts one;
* Monarch mode (``spec.mode: Monarch``, always PerHost): command ``[spec.python, worker.py]``
  without an argv and MONARCH_SPMD_MODE=Monarch, so the worker serves Monarch's worker loop; the
  container port ``monarch`` (26600) and a TCP readiness probe on it, so the pod is Ready once the
  loop listens (a port or probe the template sets stays the user's);
* GPUs: ``gpusPerProc`` >= 1 sets the ``nvidia.com/gpu`` limit (times the host's procs in the
  PerHost layout). In the PerProc layout each such pod is its own torchrun node
  (MONARCH_SPMD_LOCAL_RANK_SCOPE=pod: LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, as with
  ``torchrun --nproc-per-node=1``), so ``torch.cuda.set_device(LOCAL_RANK)`` picks the pod's own
  GPU; a GPU limit set only in the template gets the same scope. In PerHost, LOCAL_RANK is the
  proc's index in its pod;
* for a gang scheduler, its schedulerName and the label or annotation of the attempt's PodGroup;
* restart in place (restartPolicy.mode InPlace, the default): the restart-in-place inputs
  (MONARCH_SPMD_AGENT_PORT, the policy, back-off, join and progress timeouts, the stop grace
  from terminationGracePeriodSeconds, MONARCH_SPMD_DISRUPTIONS) and the container port
  ``spmd-agent``; a pod replaced alone is named ``<job>-<id>-r<attempt>-<index>-<n>``;
* failureOutput None: MONARCH_SPMD_FAILURE_OUTPUT=None and terminationMessagePolicy File (the
  kubelet copies no log into the termination message).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.resources
import re
from collections.abc import Collection, Mapping
from typing import Any, Final

from monarch_spmd import policy
from monarch_spmd import spec as spec_module
from monarch_spmd.payload import contract, worker
from monarch_spmd.spec import JobSpec

from . import names
from .names import JobRef

GPU_RESOURCE: Final = policy.GPU_RESOURCE
#: Scheduling topology for ``colocate``: one node.
COLOCATE_TOPOLOGY_KEY: Final = "kubernetes.io/hostname"
COLOCATE_WEIGHT: Final = 100
#: The memory-backed /dev/shm every pod gets.
SHM_VOLUME: Final = "dshm"
SHM_PATH: Final = "/dev/shm"
#: Downward-API variables every pod gets (name -> fieldPath): the pod's own, never the template's.
DOWNWARD_ENV: Final = spec_module.DOWNWARD_ENV
#: Monarch mode: the worker loop's port, and the readiness probe that makes the pod Ready (and the
#: job Running) only once the loop accepts connections.
MONARCH_PORT: Final = names.DEFAULT_MONARCH_PORT
MONARCH_PORT_NAME: Final = names.MONARCH_PORT_NAME
MONARCH_READINESS_PROBE: Final = {
    "tcpSocket": {"port": MONARCH_PORT_NAME},
    "periodSeconds": 2,
    "timeoutSeconds": 1,
    "failureThreshold": 3,
}


def owner_reference(job: JobRef) -> dict[str, Any]:
    """The controller owner reference to ``job`` (garbage collection deletes children with it)."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def job_labels(job: JobRef) -> dict[str, str]:
    """The labels of every child: the job's name (what the operator watches) and its uid."""
    return {names.LABEL_JOB: job.name, names.LABEL_JOB_UID: job.uid}


def _metadata(job: JobRef, name: str, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": job.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner_reference(job)],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def service_selector(job: JobRef, restart: int) -> dict[str, str]:
    """The rank-0 pod of attempt ``restart`` of this job (by uid): what MASTER_ADDR resolves to."""
    return {names.LABEL_JOB_UID: job.uid, names.LABEL_RANK: "0", names.LABEL_RESTART: str(restart)}


def build_service(job: JobRef, spec: JobSpec, restart: int) -> dict[str, Any]:
    """The headless Service of attempt ``restart``, selecting that attempt's rank-0 pod.

    One Service per attempt (:func:`names.service_name`), so MASTER_ADDR of a new attempt is a
    name no older pod ever answered to. ``publishNotReadyAddresses`` makes the name resolve as
    soon as the pod has an IP (the pods have no readiness probe that could gate a rendezvous);
    ``clusterIP: None`` makes it resolve to the pod IP itself, so the port list is informational.
    """
    labels = {**job_labels(job), names.LABEL_RESTART: str(restart)}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.service_name(job, restart), labels),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": service_selector(job, restart),
            "ports": [{"name": "master", "port": spec.master_port, "targetPort": spec.master_port, "protocol": "TCP"}],
        },
    }


def worker_files() -> dict[str, str]:
    """Reads the payload (every ``*.py`` of ``monarch_spmd/payload``) from the installed package.

    Called once at operator start; the texts go into the payload ConfigMaps. The package boundary
    is the list: whatever the payload package holds is shipped, nothing else.

    Raises:
        FileNotFoundError: when the payload is missing; reinstall the project (``pip install .``).
    """
    root = importlib.resources.files("monarch_spmd.payload")
    files = {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in root.iterdir()
        if entry.name.endswith(".py") and entry.is_file()
    }
    if "worker.py" not in files:
        raise FileNotFoundError(
            f"monarch_spmd/payload/worker.py is missing from the installed package ({root}); "
            "reinstall the project (pip install .) so the operator can ship the worker"
        )
    return dict(sorted(files.items()))


def payload_hash(files: Mapping[str, str]) -> str:
    """A short hash of the payload's files: the end of the payload ConfigMap's name."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def installed_payload_configmap() -> str:
    """The payload ConfigMap's name for the installed package's payload (:func:`build_pod`'s default)."""
    return names.payload_configmap_name(payload_hash(worker_files()))


def build_worker_configmap(namespace: str, files: Mapping[str, str]) -> dict[str, Any]:
    """The ConfigMap ``monarch-spmd-payload-<hash>`` of ``namespace``: the payload's files,
    mounted into every pod of the namespace's jobs.

    One per namespace and payload, not one per job: the payload is about 160 KB, which 1,000 jobs
    would each have written to etcd and sent through the API server (160 MB). It is immutable
    (the kubelets need not watch it; a new payload is a new name, so an upgraded operator's pods
    mount the new one while the running pods keep theirs) and has no owner: the operator deletes
    it once no unfinished job of the namespace is left (:meth:`.payloads.Payloads.sweep`).

    Args:
        namespace: the jobs' namespace.
        files: file name -> text, as :func:`worker_files` returns.
    """
    digest = payload_hash(files)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.payload_configmap_name(digest),
            "namespace": namespace,
            "labels": {names.LABEL_PAYLOAD: digest},
            "annotations": {names.PAYLOAD_HASH_ANNOTATION: digest},
        },
        "immutable": True,
        "data": dict(files),
    }


def pod_coords(spec: JobSpec, index: int) -> list[int]:
    """The coordinates of pod ``index``: its proc's, or (PerHost) its host's: all but the last."""
    procs = policy.procs_per_pod(spec)
    if not 0 <= index < policy.pods_per_attempt(spec):
        raise ValueError(f"index: {index!r} is out of range; valid is 0..{policy.pods_per_attempt(spec) - 1}")
    coords = contract.coords_of(spec.mesh_pairs, index * procs)
    return coords[:-1] if spec.pod_layout == names.PER_HOST else coords


def pod_labels(job: JobRef, spec: JobSpec, index: int, restart: int) -> dict[str, str]:
    """The operator's labels of a pod: job, (first) rank, restart and one label per coordinate.

    A PerHost pod also says how many procs it runs (``spmd.monarch.dev/procs``), so that
    ``monarch-spmd logs`` knows its lines carry rank prefixes already.
    """
    procs = policy.procs_per_pod(spec)
    labels = {**job_labels(job), names.LABEL_RANK: str(index * procs), names.LABEL_RESTART: str(restart)}
    for dim, c in zip(spec.mesh, pod_coords(spec, index)):
        labels[names.coord_label(dim.name)] = str(c)
    if spec.pod_layout == names.PER_HOST:
        labels[names.LABEL_PROCS] = str(procs)
    return labels


def _trainer_index(containers: list[Any]) -> int | None:
    for i, c in enumerate(containers):
        if isinstance(c, Mapping) and c.get("name") in (None, names.CONTAINER_NAME):
            return i
    return None


def pod_env(job: JobRef, spec: JobSpec, index: int, restart: int, *, restart_count: int | None = None,
            disruptions: int = 0, keep: Collection[str] = (), token: str | None = None) -> list[dict[str, Any]]:
    """The operator's env of a pod: the downward API variables, then the MONARCH_SPMD_* inputs
    that differ from the worker's defaults (and the mesh, coordinates, master and attempt, always).

    Args:
        restart: the gang attempt the pod belongs to (its MASTER_ADDR).
        restart_count: MONARCH_SPMD_RESTART_COUNT, when it is not ``restart``: a pod replaced
            alone during a restart in place joins the gang's open round.
        disruptions: restarts so far that do not count against maxRestarts (restart in place).
        keep: inputs written even when they hold the default (the template refers to them).
        token: the attempt's agent token (MONARCH_SPMD_AGENT_TOKEN), for a gang that restarts in
            place: the same in every pod of the attempt, so only they (and the operator, which
            reads it back from rank 0's pod) reach its coordinator.
    """
    inputs = worker.worker_input_env(
        spec.mesh_pairs,
        pod_coords(spec, index),
        names.master_addr(job, restart),
        spec.master_port,
        restart_count=restart if restart_count is None else restart_count,
        max_restarts=spec.max_restarts,
        run_id=job.uid,
        rendezvous_timeout=spec.rendezvous_timeout_seconds,
        local_rank_scope=policy.local_rank_scope(spec),
        pod_layout=spec.pod_layout,
        mode=spec.mode,
        monarch_port=MONARCH_PORT,
        defaults=False,
        keep=keep,
        agent_token=token if policy.agent_port(spec) is not None else None,
        **policy.in_place_inputs(spec, disruptions),
    )
    env: list[dict[str, Any]] = [
        {"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}} for var, path in DOWNWARD_ENV
    ]
    env.extend({"name": k, "value": v} for k, v in inputs.items())
    return env


_REFERENCE = re.compile(r"\$\((MONARCH_SPMD_[A-Z0-9_]+)\)")


def _referenced(trainer: Mapping[str, Any], spec: JobSpec) -> set[str]:
    """The MONARCH_SPMD_* inputs the user's trainer refers to as ``$(NAME)`` in its env or argv:
    the kubelet expands only variables the container has, so those are written even at their
    default."""
    texts = [*spec.args, *(str(e.get("value") or "") for e in trainer.get("env") or [] if isinstance(e, Mapping))]
    return {name for text in texts if "$(" in text for name in _REFERENCE.findall(text)}


def _merge_env(ours: list[dict[str, Any]], user: list[Any]) -> list[dict[str, Any]]:
    """Ours first (so the user's values may refer to them as $(POD_NAME)), minus what the user sets.

    The pod's own variables (the downward API's POD_IP ...) are never shadowed: the spec refuses a
    template that sets one, and a job stored before that rule still gets the pod's real values.
    """
    own = {name for name, _ in DOWNWARD_ENV}
    user = [e for e in user if not (isinstance(e, Mapping) and e.get("name") in own)]
    user_names = {e.get("name") for e in user if isinstance(e, Mapping)}
    return [e for e in ours if e["name"] not in user_names] + [copy.deepcopy(e) for e in user]


def _keep_off(pod_spec: dict[str, Any], nodes: Collection[str]) -> None:
    """Adds ``kubernetes.io/hostname NotIn nodes`` to every required node selector term (the
    terms are ORed, their expressions ANDed), making one when the template has none."""
    expression = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": sorted(nodes)}
    required = (pod_spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
                .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {}))
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchExpressions", []).append(dict(expression, values=list(expression["values"])))


def _colocate_term(job: JobRef, spec: JobSpec, index: int, restart: int) -> dict[str, Any]:
    first = spec.mesh[0].name
    coord = pod_coords(spec, index)[0]
    return {
        "weight": COLOCATE_WEIGHT,
        "podAffinityTerm": {
            "labelSelector": {
                "matchLabels": {
                    names.LABEL_JOB_UID: job.uid,
                    names.LABEL_RESTART: str(restart),
                    names.coord_label(first): str(coord),
                }
            },
            "topologyKey": COLOCATE_TOPOLOGY_KEY,
        },
    }


def _shared_memory(pod_spec: dict[str, Any], trainer: dict[str, Any], spec: JobSpec) -> None:
    """A memory-backed /dev/shm (NCCL, gloo and DataLoader workers use shared memory), unless the
    template mounts something there itself. Its size counts against the pod's memory limit."""
    if any(m.get("mountPath") == SHM_PATH for m in trainer.get("volumeMounts") or []):
        return
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if spec.shm_size:
        empty_dir["sizeLimit"] = spec.shm_size
    pod_spec["volumes"] = [v for v in pod_spec.get("volumes") or [] if v.get("name") != SHM_VOLUME]
    pod_spec["volumes"].append({"name": SHM_VOLUME, "emptyDir": empty_dir})
    trainer["volumeMounts"].append({"name": SHM_VOLUME, "mountPath": SHM_PATH})


def _serve_monarch(trainer: dict[str, Any]) -> None:
    """Monarch mode: the worker loop's container port and a readiness probe on it (in place)."""
    ports = [dict(p) for p in trainer.get("ports") or []]
    if not any(p.get("name") == MONARCH_PORT_NAME or p.get("containerPort") == MONARCH_PORT for p in ports):
        ports.append({"name": MONARCH_PORT_NAME, "containerPort": MONARCH_PORT, "protocol": "TCP"})
    trainer["ports"] = ports
    trainer.setdefault("readinessProbe", copy.deepcopy(MONARCH_READINESS_PROBE))


def _serve_agent(trainer: dict[str, Any], port: int) -> None:
    """Restart in place: the coordinator's container port (every pod declares it; rank 0's listens)."""
    ports = [dict(p) for p in trainer.get("ports") or []]
    if not any(p.get("name") == names.AGENT_PORT_NAME or p.get("containerPort") == port for p in ports):
        ports.append({"name": names.AGENT_PORT_NAME, "containerPort": port, "protocol": "TCP"})
    trainer["ports"] = ports


def build_pod(job: JobRef, spec: JobSpec, index: int, restart: int, *, replacement: int = 0,
              restart_count: int | None = None, disruptions: int = 0,
              payload: str | None = None, token: str | None = None,
              avoid_nodes: Collection[str] = ()) -> dict[str, Any]:
    """Pod ``index`` of gang attempt ``restart``, merged with the user's pod template.

    In the PerProc layout pod ``index`` runs rank ``index``; in PerHost it runs the procs of host
    ``index`` (ranks ``index * L .. index * L + L - 1``, L the last dimension's size) and holds
    their GPUs (``gpusPerProc * L``). With restartPolicy.mode InPlace every pod gets the
    restart-in-place inputs (the coordinator's port, the policy, the back-off, the progress
    timeout, the stop grace: :func:`monarch_spmd.policy.in_place_inputs`) and declares the
    coordinator's container port ``spmd-agent``; with RecreatePods it gets none of them.

    Args:
        job: the owning job.
        spec: the parsed spec (``spec.image`` must be set).
        index: the pod's index in the gang, 0..pods per attempt - 1.
        restart: the gang attempt, 0 first; goes into the name, a label and the env.
        replacement: restart in place: this pod replaces a lost one of its gang alone, for the
            ``replacement``-th time for this index (its name gets ``-<replacement>``, its label
            ``spmd.monarch.dev/replacement``); 0 for the gang's own pods.
        restart_count: MONARCH_SPMD_RESTART_COUNT when it is not ``restart`` (a replacement
            joins the gang's open round).
        disruptions: restarts so far not counted against maxRestarts (status.disruptions).
        payload: the payload ConfigMap the pod mounts (:func:`names.payload_configmap_name`);
            None: the installed package's.
        token: the attempt's agent token (InPlace only; see :func:`pod_env`); None: none, and
            the coordinator accepts any connection (as pods of earlier versions do).
        avoid_nodes: nodes the pod must not be scheduled on (a node lost under the previous
            attempt): a required node affinity term, ANDed into each of the template's own.

    Raises:
        ValueError: for an index out of range or a spec without an image (parse the spec with
            ``require_image=True`` first).
    """
    if not spec.image:
        raise ValueError("spec.image: required to build a pod; parse the spec with require_image=True")
    template = spec.template
    user_meta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = copy.deepcopy(dict(template.get("spec") or {}))

    containers = list(pod_spec.get("containers") or [])
    idx = _trainer_index(containers)
    trainer: dict[str, Any] = copy.deepcopy(dict(containers[idx])) if idx is not None else {}
    trainer["name"] = names.CONTAINER_NAME
    trainer["image"] = spec.image
    if spec.mode == names.MODE_MONARCH:
        trainer["command"] = [spec.python, names.WORKER_SCRIPT]
        _serve_monarch(trainer)
    else:
        trainer["command"] = [spec.python, names.WORKER_SCRIPT, "--", *spec.args]
    trainer.pop("args", None)
    agent = policy.agent_port(spec)
    if agent is not None:
        _serve_agent(trainer, agent)
    env = pod_env(job, spec, index, restart, restart_count=restart_count, disruptions=disruptions,
                  keep=_referenced(trainer, spec), token=token)
    trainer["env"] = _merge_env(env, list(trainer.get("env") or []))
    mounts = [m for m in trainer.get("volumeMounts") or [] if m.get("name") != names.WORKER_VOLUME]
    mounts.append({"name": names.WORKER_VOLUME, "mountPath": names.WORKER_MOUNT_PATH, "readOnly": True})
    trainer["volumeMounts"] = mounts
    # The end of the log becomes the termination message when the program fails without writing
    # one: status.failure then shows the traceback; not with failureOutput None, whose output must
    # not reach anything but the pod's log.
    quiet = spec.failure_output == spec_module.FAILURE_OUTPUT_NONE
    trainer.setdefault("terminationMessagePolicy", "File" if quiet else "FallbackToLogsOnError")
    gpus = policy.gpus_per_pod(spec)
    if gpus >= 1:
        resources = trainer.setdefault("resources", {})
        resources.setdefault("limits", {})[GPU_RESOURCE] = str(gpus)
        if GPU_RESOURCE in (resources.get("requests") or {}):
            resources["requests"][GPU_RESOURCE] = str(gpus)
    if idx is None:
        containers.insert(0, trainer)
    else:
        containers[idx] = trainer
    pod_spec["containers"] = containers

    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != names.WORKER_VOLUME]
    volumes.append({"name": names.WORKER_VOLUME,
                    "configMap": {"name": payload or installed_payload_configmap()}})
    pod_spec["volumes"] = volumes
    _shared_memory(pod_spec, trainer, spec)
    pod_spec["restartPolicy"] = "Never"

    if avoid_nodes:
        _keep_off(pod_spec, avoid_nodes)
    if spec.colocate and spec.pod_layout != names.PER_HOST:  # a PerHost pod is its host already
        affinity = pod_spec.setdefault("affinity", {})
        preferred = affinity.setdefault("podAffinity", {}).setdefault(
            "preferredDuringSchedulingIgnoredDuringExecution", []
        )
        preferred.append(_colocate_term(job, spec, index, restart))

    labels = {**(user_meta.get("labels") or {}), **pod_labels(job, spec, index, restart)}
    if replacement:
        labels[names.LABEL_REPLACEMENT] = str(replacement)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(job, names.pod_name(job, restart, index, replacement), labels,
                              user_meta.get("annotations")),
        "spec": pod_spec,
    }
    join_gang(pod, job, spec, restart)
    return pod


def build_spare_pod(job: JobRef, spec: JobSpec, spare: int, restart: int, *, disruptions: int = 0,
                    payload: str | None = None, token: str | None = None,
                    avoid_nodes: Collection[str] = ()) -> dict[str, Any]:
    """Hot spare ``spare`` of gang attempt ``restart`` (spec.spares): built as the gang's pod 1 is
    (image, resources, GPUs, volumes, the attempt's token and inputs), then made no member's: its
    name ``<job>-<id>-r<restart>-s<spare>``, the label ``spmd.monarch.dev/spare`` instead of a rank
    and coordinates, and MONARCH_SPMD_SPARE instead of MONARCH_SPMD_COORDS (its worker waits at the
    coordinator to take a lost pod's place: docs/restart-in-place.md)."""
    pod = build_pod(job, spec, 1, restart, disruptions=disruptions, payload=payload, token=token,
                    avoid_nodes=avoid_nodes)
    meta = pod["metadata"]
    meta["name"] = names.spare_pod_name(job, restart, spare)
    member = pod_labels(job, spec, 1, restart)
    labels = {k: v for k, v in meta["labels"].items()
              if k not in member or k in (names.LABEL_JOB, names.LABEL_JOB_UID, names.LABEL_RESTART, names.LABEL_PROCS)}
    labels[names.LABEL_SPARE] = str(spare)
    meta["labels"] = labels
    trainer = next(c for c in pod["spec"]["containers"] if c.get("name") == names.CONTAINER_NAME)
    env = [e for e in trainer.get("env") or [] if e.get("name") != worker.COORDS_VAR]
    env.append({"name": worker.SPARE_VAR, "value": str(spare)})
    trainer["env"] = env
    affinity = pod["spec"].get("affinity") or {}
    preferred = (affinity.get("podAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution")
    if spec.colocate and preferred:
        preferred.pop()  # the term build_pod added for pod 1's host: a spare belongs to none
    return pod


def adopt_labels(job: JobRef, spec: JobSpec, index: int, restart: int, replacement: int) -> dict[str, str | None]:
    """The label patch that makes a hot spare's pod the ``replacement``-th replacement of pod
    ``index`` of attempt ``restart`` (its spare took that pod's place): the pod's rank and
    coordinate labels, ``spmd.monarch.dev/replacement``, and no ``spmd.monarch.dev/spare``."""
    return {**pod_labels(job, spec, index, restart), names.LABEL_REPLACEMENT: str(replacement),
            names.LABEL_SPARE: None}


# --- network isolation ------------------------------------------------------------------------

NETWORK_POLICY_API: Final = ("networking.k8s.io", "v1", "networkpolicies")


def build_network_policy(job: JobRef, spec: JobSpec, operator_namespace: str | None,
                         operator_labels: Mapping[str, str]) -> dict[str, Any] | None:
    """The job's NetworkPolicy: only the job's own pods reach its pods (every port: the agent's,
    the TCPStore's, the backends', which the OS picks), and the operator reaches the agent port
    (its observer); nothing else. None in Monarch mode, whose client attaches from anywhere.

    Args:
        operator_namespace: the operator pod's namespace; None when it does not run in a pod
            (then no pod can be named for it: only the job's pods are let in).
        operator_labels: labels that select the operator's pods in that namespace ({}: any pod
            of the namespace).
    """
    if spec.mode == names.MODE_MONARCH:
        return None
    own = {"podSelector": {"matchLabels": {names.LABEL_JOB: job.name, names.LABEL_JOB_UID: job.uid}}}
    ingress: list[dict[str, Any]] = [{"from": [own]}]
    agent = policy.agent_port(spec)
    if operator_namespace and agent is not None:
        ingress.append({
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}},
                      "podSelector": {"matchLabels": dict(operator_labels)}}],
            "ports": [{"protocol": "TCP", "port": agent}],
        })
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, names.network_policy_name(job), job_labels(job)),
        "spec": {"podSelector": own["podSelector"], "policyTypes": ["Ingress"], "ingress": ingress},
    }


# --- gang scheduling ----------------------------------------------------------------------------

#: What each gang scheduler needs: its PodGroup API, the scheduler name pods use by default, and
#: how a pod names its group (docs/gang-scheduling.md has where these come from).
VOLCANO_GROUP: Final = ("scheduling.volcano.sh", "v1beta1", "podgroups")
COSCHEDULING_GROUP: Final = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
VOLCANO_SCHEDULER: Final = "volcano"
COSCHEDULING_SCHEDULER: Final = "scheduler-plugins-scheduler"
VOLCANO_GROUP_ANNOTATION: Final = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
#: Kueue's Workload API and the label that names a job's LocalQueue.
KUEUE_WORKLOAD: Final = ("kueue.x-k8s.io", "v1beta2", "workloads")
KUEUE_FLAVORS: Final = ("kueue.x-k8s.io", "v1beta2", "resourceflavors")
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"

PODGROUP_APIS: Final = {spec_module.SCHEDULING_VOLCANO: VOLCANO_GROUP,
                        spec_module.SCHEDULING_COSCHEDULING: COSCHEDULING_GROUP}


def scheduler_name(spec: JobSpec) -> str | None:
    """The schedulerName of the job's pods: spec.scheduling's, or its provider's default."""
    if spec.scheduler_name:
        return spec.scheduler_name
    return {spec_module.SCHEDULING_VOLCANO: VOLCANO_SCHEDULER,
            spec_module.SCHEDULING_COSCHEDULING: COSCHEDULING_SCHEDULER}.get(spec.scheduling_provider)


def join_gang(pod: dict[str, Any], job: JobRef, spec: JobSpec, restart: int) -> None:
    """Makes a pod join its attempt's PodGroup and use the gang scheduler (in place)."""
    name = scheduler_name(spec)
    if name:
        pod["spec"]["schedulerName"] = name
    group = names.podgroup_name(job, restart)
    if spec.scheduling_provider == spec_module.SCHEDULING_VOLCANO:
        pod["metadata"].setdefault("annotations", {})[VOLCANO_GROUP_ANNOTATION] = group
    elif spec.scheduling_provider == spec_module.SCHEDULING_COSCHEDULING:
        pod["metadata"]["labels"][COSCHEDULING_GROUP_LABEL] = group


def build_podgroup(job: JobRef, spec: JobSpec, restart: int) -> dict[str, Any]:
    """The PodGroup of attempt ``restart``: minMember is every pod of the attempt and its hot
    spares, all or nothing; an elastic job's (mesh[0].minSize) its minimum of pods and the
    spares: it may start at that size.

    Volcano's (scheduling.volcano.sh/v1beta1) carries the queue and the priority class of the
    template; coscheduling's (scheduling.x-k8s.io/v1alpha1) the scheduling timeout.
    """
    group, version, _ = PODGROUP_APIS[spec.scheduling_provider]
    body: dict[str, Any] = {"minMember": (spec.min_members or policy.pods_per_attempt(spec)) + spec.spares}
    if spec.scheduling_provider == spec_module.SCHEDULING_VOLCANO:
        if spec.scheduling_queue:
            body["queue"] = spec.scheduling_queue
        priority = (spec.template.get("spec") or {}).get("priorityClassName")
        if priority:
            body["priorityClassName"] = priority
    elif spec.scheduling_timeout_seconds is not None:
        body["scheduleTimeoutSeconds"] = spec.scheduling_timeout_seconds
    labels = {**job_labels(job), names.LABEL_RESTART: str(restart)}
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "PodGroup",
        "metadata": _metadata(job, names.podgroup_name(job, restart), labels),
        "spec": body,
    }


def build_workload(job: JobRef, spec: JobSpec) -> dict[str, Any]:
    """The job's Kueue Workload: one pod set of every pod of an attempt, on spec.scheduling.queue.

    Kueue admits it when the queue's quota covers the whole gang (the pods' requests times their
    number); until then the job holds no pod (see lifecycle.suspend). An elastic job's pod set is
    its largest size (mesh[0].size) and its spares: every smaller size it may run at is within
    what Kueue admitted, so neither a shrink nor the grow back waits for another admission.
    """
    pod = build_pod(job, spec, 0, 0)
    template_spec = {k: v for k, v in pod["spec"].items() if k != "schedulerName"}
    group, version, _ = KUEUE_WORKLOAD
    workload: dict[str, Any] = {
        "apiVersion": f"{group}/{version}",
        "kind": "Workload",
        "metadata": _metadata(job, names.workload_name(job), {**job_labels(job), KUEUE_QUEUE_LABEL: spec.scheduling_queue or ""}),
        "spec": {
            "queueName": spec.scheduling_queue,
            "podSets": [{"name": "procs", "count": policy.pods_per_attempt(spec) + spec.spares,
                         "template": {"spec": template_spec}}],
        },
    }
    priority = (spec.template.get("spec") or {}).get("priorityClassName")
    if priority:
        workload["spec"]["priorityClassName"] = priority
    return workload


def place_on_flavors(pod: dict[str, Any], flavors: list[Mapping[str, Any]]) -> None:
    """Puts a pod where Kueue admitted its job: the ResourceFlavors' node labels join its
    nodeSelector and their tolerations its tolerations (what Kueue's own integrations do)."""
    spec = pod["spec"]
    for flavor in flavors:
        body = flavor.get("spec") or {}
        if body.get("nodeLabels"):
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **body["nodeLabels"]}
        for toleration in body.get("tolerations") or []:
            if toleration not in (spec.get("tolerations") or []):
                spec.setdefault("tolerations", []).append(copy.deepcopy(toleration))
