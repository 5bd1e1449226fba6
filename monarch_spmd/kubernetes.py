"""A Monarch proc mesh on the pods of a Monarch-mode SPMDJob: one controller, many runs, no new pods.

Where it sits: beside :mod:`monarch_spmd.actor`, above :mod:`monarch_spmd.spec` and the payload's
names; the operator and the payload never import it. ``import monarch_spmd`` does not load it,
and it imports ``kubernetes`` (``monarch-spmd[cli]``) and ``monarch`` (``monarch-spmd[monarch]``)
only inside its functions.

An SPMDJob with ``spec.mode: Monarch`` (and ``podLayout: PerHost``) runs one pod per host, each
serving Monarch's worker loop (``monarch.actor.run_worker_loop_forever``, port 26600, the
container port named ``monarch``). :func:`proc_mesh` waits until the job is Running, finds the
pods of its current attempt, attaches to them with ``monarch.actor.attach_to_workers`` and spawns
the procs, returning a ProcMesh whose labels and sizes are the job's mesh::

    from monarch_spmd import SPMDActor, setup_torch_elastic_env
    from monarch_spmd.kubernetes import proc_mesh

    mesh = proc_mesh("trainer", namespace="team-a")        # spec.mesh [hosts=2, gpus=2]
    setup_torch_elastic_env(mesh)                           # RANK, LOCAL_RANK, MASTER_ADDR ... in every proc
    actors = mesh.spawn("_SPMDActor", SPMDActor)
    addr, port = actors.slice(hosts=0, gpus=0).get_host_port.call_one(None).get()
    for _ in range(5):                                      # again and again, on the same pods
        actors.main.call(addr, port, ["-m", "train", "--epochs", "1"]).get()

The proc at coordinates ``(h..., l)`` runs in the pod of host ``h...`` (the pod whose
``spmd.monarch.dev/coord-<dim>`` labels are ``h...``), as local proc ``l``; so ``SPMDActor`` gives
exactly the environment of the same mesh on one machine (the env contract of
:mod:`monarch_spmd.payload.contract`): RANK row-major over the mesh, LOCAL_RANK the coordinate on
the last dimension, GROUP_RANK the host.

Networking. Monarch 0.7.0 talks plain TCP (its TLS is not implemented: any ``ca`` other than
``"trust_all_connections"`` raises NotImplementedError), in both directions: the client dials each
pod's IP on port 26600, and the pods' procs dial the client back. So the client must run where pod
IPs are routable, and the pods must reach it: inside the cluster (a pod: it advertises its own
IP), or on a machine on the pod network (a node, or a host routed to the pod CIDR, as the test
cluster's). Before the first Monarch call of the process, :func:`proc_mesh` makes Monarch's client
listen on the local address that routes to the first pod (``tcp://<that address>:0``): Monarch's
default transport (Unix sockets) reaches no pod, and its ``TcpWithHostname`` needs a host name
that resolves to a routable address. Pass ``client_address`` to choose it, or configure
``monarch.config.configure(default_transport="tcp://ADDR:0")`` yourself first.

Failures. Monarch finds a lost host by asking for its procs' state; with Monarch's default
(``get_proc_state_max_idle`` 1 minute) a call to a pod that was deleted fails only after about 70
seconds. :func:`proc_mesh` sets it to ``host_failure_timeout`` (10 s: the call fails with Monarch's
``SupervisionError`` naming the lost proc's coordinates about 12 s after the pod went). The
operator meanwhile replaces the whole gang (a pod lost under a Monarch-mode job is a failure like
any other); call :func:`proc_mesh` again for a mesh on the new pods: it waits for the new attempt
to be Running. These settings are process-wide, as Monarch's configuration is.

RBAC for a client inside the cluster: ``get`` on ``spmdjobs.spmd.monarch.dev`` and ``list`` on
``pods`` in the job's namespace.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from . import kubeconfig as kubeconfig_rule
from .payload import names

__all__ = [
    "DEFAULT_HOST_FAILURE_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "JobHosts",
    "MonarchJobError",
    "attach",
    "attach_async",
    "find_hosts",
    "proc_mesh",
    "proc_mesh_async",
]

#: Seconds :func:`proc_mesh` waits for the job to be Running and for Monarch to attach and spawn.
DEFAULT_TIMEOUT: Final = 300.0
#: Seconds without an answer after which Monarch takes a host for lost (its get_proc_state_max_idle).
DEFAULT_HOST_FAILURE_TIMEOUT: Final = 10.0
#: Every how many seconds the job and its pods are read while waiting.
POLL_SECONDS: Final = 0.5
#: The label Monarch gives the one dimension of a mesh from attach_to_workers.
_MONARCH_HOSTS_LABEL: Final = "hosts"


class MonarchJobError(RuntimeError):
    """The job cannot serve a Monarch client: it is missing, not in Monarch mode, or ended.

    Attributes:
        job: ``namespace/name``.
    """

    def __init__(self, job: str, message: str) -> None:
        super().__init__(f"SPMDJob {job}: {message}")
        self.job = job


@dataclass(frozen=True)
class JobHosts:
    """The Monarch hosts of one attempt of a Monarch-mode SPMDJob, in host order.

    Attributes:
        name: the job's name.
        namespace: its namespace.
        uid: its uid (the ``spmd.monarch.dev/job-uid`` label of its pods).
        restart: the attempt (``status.restarts``; the pods' ``spmd.monarch.dev/restart``).
        mesh: the ordered mesh ``((name, size), ...)``; the last dimension's procs share a host.
        pods: the pods' names, host ``i`` at index ``i`` (row-major over every dimension but the
            last).
        addresses: the worker loops' addresses, ``tcp://<pod IP>:<port>``, same order.
    """

    name: str
    namespace: str
    uid: str
    restart: int
    mesh: tuple[tuple[str, int], ...]
    pods: tuple[str, ...]
    addresses: tuple[str, ...]

    @property
    def host_mesh(self) -> tuple[tuple[str, int], ...]:
        """Every dimension but the last: one pod per point."""
        return self.mesh[:-1]

    @property
    def per_host(self) -> dict[str, int]:
        """The last dimension, the procs of one host: ``spawn_procs(per_host=...)``."""
        name, size = self.mesh[-1]
        return {name: size}


# --- Kubernetes: find the hosts --------------------------------------------------------------------


def _load_config(kubeconfig: str | None, job: str) -> tuple[Any, str]:
    """The API client and the default namespace (the rule of :mod:`monarch_spmd.kubeconfig`)."""
    try:
        return kubeconfig_rule.load(kubeconfig, how_to_name="pass kubeconfig= or set KUBECONFIG")
    except kubeconfig_rule.ConfigError as err:
        raise MonarchJobError(job, str(err)) from None


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _port(pod: Mapping[str, Any]) -> int:
    """The worker loop's port: the trainer container's port named ``monarch``."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") != names.TRAINER_CONTAINER:
            continue
        for port in container.get("ports") or []:
            if port.get("name") == names.MONARCH_PORT_NAME and port.get("containerPort"):
                return int(port["containerPort"])
    return names.DEFAULT_MONARCH_PORT


def _tcp_address(ip: str, port: int) -> str:
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


def _describe(job: Mapping[str, Any]) -> str:
    status = job.get("status") or {}
    text = f"phase {status.get('phase') or '(none yet)'}"
    if status.get("reason"):
        text += f", reason {status['reason']}"
    if status.get("message"):
        text += f": {status['message']}"
    return text


def hosts_of(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> JobHosts | None:
    """The hosts of ``job``'s current attempt if all of them serve, else None (pure: API objects in).

    Serving: phase Running, Ready (the worker loop listens, as the pod's readiness probe found),
    not being deleted, with an IP. Pods of other attempts or of a namesake job are ignored.

    Raises:
        MonarchJobError: the job is not in Monarch mode, or it ended (Succeeded or Failed), with
            its reason and root cause.
    """
    meta = job.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    if spec.get("mode") != names.MODE_MONARCH:
        raise MonarchJobError(key, f"spec.mode is {spec.get('mode') or names.MODE_PROGRAM}, not {names.MODE_MONARCH}: "
                                   "its pods run spec.args, not Monarch's worker loop; create the job with "
                                   "mode: Monarch and podLayout: PerHost")
    if status.get("phase") in ("Succeeded", "Failed"):
        failure = (status.get("failure") or {})
        why = f"; root cause: rank {failure.get('rank')} ({failure.get('pod')}) {failure.get('reason')}" if failure else ""
        raise MonarchJobError(key, f"the job ended ({_describe(job)}){why}; create it again to get new hosts")
    if status.get("phase") != "Running":
        return None
    mesh = tuple((str(d["name"]), int(d["size"])) for d in spec["mesh"])
    per_host = mesh[-1][1]
    count = math.prod(s for _, s in mesh) // per_host
    restart = int(status.get("restarts") or 0)
    found: dict[int, Mapping[str, Any]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(names.LABEL_JOB_UID) != meta.get("uid") or labels.get(names.LABEL_RESTART) != str(restart):
            continue
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") != "Running" or not (pod.get("status") or {}).get("podIP"):
            continue
        if not _ready(pod):
            continue
        try:
            index = int(labels[names.LABEL_RANK]) // per_host
        except (KeyError, ValueError):
            continue
        found[index] = pod
    if sorted(found) != list(range(count)):
        return None
    ordered = [found[i] for i in range(count)]
    return JobHosts(
        name=str(meta.get("name")),
        namespace=str(meta.get("namespace")),
        uid=str(meta.get("uid")),
        restart=restart,
        mesh=mesh,
        pods=tuple(str(p["metadata"]["name"]) for p in ordered),
        addresses=tuple(_tcp_address(p["status"]["podIP"], _port(p)) for p in ordered),
    )


def _listening(address: str, timeout: float = 1.0) -> bool:
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def find_hosts(job: str, namespace: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
               kubeconfig: str | None = None) -> JobHosts:
    """Waits until Monarch-mode job ``job`` is Running and every host's worker loop accepts
    connections; returns its hosts. No Monarch involved (a debugging aid, and the first half of
    :func:`proc_mesh`).

    Args:
        job: the SPMDJob's name.
        namespace: its namespace (default: the kubeconfig context's, or the pod's own).
        timeout: seconds to wait.
        kubeconfig: a kubeconfig file (default $KUBECONFIG or ~/.kube/config, else in-cluster).

    Raises:
        MonarchJobError: no such job, not in Monarch mode, or it ended.
        TimeoutError: not Running within ``timeout``, naming the phase and why it waits.
    """
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api_client, default_namespace = _load_config(kubeconfig, job)
    namespace = namespace or default_namespace
    key = f"{namespace}/{job}"
    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    waiting = "the job's pods are not all Running and Ready yet"
    while True:
        try:
            body = custom.get_namespaced_custom_object(names.GROUP, names.VERSION, namespace, names.PLURAL, job)
            pods: list[Any] = []
            if (body.get("status") or {}).get("phase") == "Running":
                selector = f"{names.LABEL_JOB}={job},{names.LABEL_JOB_UID}={body['metadata']['uid']}"
                found = core.list_namespaced_pod(namespace, label_selector=selector).items
                pods = api_client.sanitize_for_serialization(found)
        except ApiException as err:
            if err.status == 404:
                raise MonarchJobError(key, "not found; create it first (kubectl apply -f ...)") from None
            if err.status in (401, 403):
                raise MonarchJobError(key, f"reading it is not allowed ({err.status} {err.reason}): the client "
                                           "needs get on spmdjobs and list on pods in the namespace") from None
            raise
        hosts = hosts_of(body, pods)  # raises for a job that cannot serve
        if hosts is not None:
            closed = [a for a in hosts.addresses if not _listening(a)]
            if not closed:
                return hosts
            # A kubelet's readiness probe saw the port open; a node without probes (the test
            # cluster's process node) reports Ready at once.
            waiting = f"the worker loops at {', '.join(closed)} do not accept connections yet"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"SPMDJob {key}: not ready for a Monarch client within {timeout:g}s "
                               f"({_describe(body)}; {waiting})")
        time.sleep(min(POLL_SECONDS, remaining))


# --- Monarch: attach and spawn --------------------------------------------------------------------


def _route_address(address: str) -> str:
    """The local IP address the kernel would use to reach ``address`` (a UDP connect sends nothing)."""
    host = address.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return str(s.getsockname()[0])


def _prepare_client(hosts: JobHosts, client_address: str | None, host_failure_timeout: float) -> None:
    """Makes Monarch's client reachable from the pods (before its first use) and sets how soon a
    lost host fails a call."""
    from monarch.config import configure, get_global_config

    configure(get_proc_state_max_idle=f"{max(1, int(math.ceil(host_failure_timeout)))}s")
    transport = str(get_global_config().get("default_transport"))
    # Monarch's default (Unix sockets), in-process or localhost TCP: no pod reaches them.
    local = any(word in transport.lower() for word in ("unix", "local"))
    started = _client_started()
    if not started and (local or client_address is not None):
        ip = client_address or _route_address(hosts.addresses[0])
        configure(default_transport=f"tcp://[{ip}]:0" if ":" in ip else f"tcp://{ip}:0")
    elif started and local:
        raise RuntimeError(
            f"Monarch's client in this process already started on {transport}, which the pods of "
            f"SPMDJob {hosts.namespace}/{hosts.name} cannot reach: call monarch_spmd.kubernetes.proc_mesh "
            "before any other Monarch call (this_host(), ...), or configure a TCP transport first: "
            "monarch.config.configure(default_transport='tcp://<an address the pods reach>:0')")


def _client_started() -> bool:
    try:
        from monarch._src.actor import actor_mesh
    except ImportError:
        return False
    lazy = getattr(actor_mesh, "_client_context", None)
    return getattr(lazy, "_val", None) is not None


def _attach_hosts(hosts: JobHosts) -> Any:
    """The HostMesh of the job's hosts (Monarch 0.7.0 has no TLS for it: "trust_all_connections")."""
    from monarch.actor import attach_to_workers

    return attach_to_workers(name=hosts.name, ca="trust_all_connections", workers=list(hosts.addresses))


def _shaped(host_mesh: Any, hosts: JobHosts) -> Any:
    """``host_mesh`` (Monarch's one dimension ``hosts``) reshaped to the job's host dimensions."""
    dims = hosts.host_mesh
    if not dims:
        return host_mesh.slice(**{_MONARCH_HOSTS_LABEL: 0})  # one host, no host dimension
    labels = tuple(n for n, _ in dims)
    if labels == (_MONARCH_HOSTS_LABEL,):
        return host_mesh
    source = _MONARCH_HOSTS_LABEL
    if _MONARCH_HOSTS_LABEL in labels[1:]:
        source = "_monarch_spmd_hosts"  # free the name for the job's own dimension
        host_mesh = host_mesh.rename(**{_MONARCH_HOSTS_LABEL: source})
    return host_mesh.split(**{source: labels}, **dict(dims[1:]))


def attach(hosts: JobHosts, *, timeout: float = DEFAULT_TIMEOUT, client_address: str | None = None,
           host_failure_timeout: float = DEFAULT_HOST_FAILURE_TIMEOUT) -> Any:
    """Attaches to ``hosts`` (from :func:`find_hosts`) and spawns their procs; returns the ProcMesh.

    Raises:
        TimeoutError: Monarch did not attach or spawn within ``timeout``.
        RuntimeError: Monarch's client in this process cannot reach pods (see the module docstring),
            or Monarch refused the attach (its message names the host).
    """
    deadline = time.monotonic() + timeout
    _prepare_client(hosts, client_address, host_failure_timeout)
    host_mesh = _shaped(_attach_hosts(hosts), hosts)
    _wait(host_mesh.initialized, deadline, hosts, "attaching to the hosts")
    procs = host_mesh.spawn_procs(per_host=hosts.per_host, name=hosts.name)
    _wait(procs.initialized, deadline, hosts, "spawning the procs")
    return procs


def _wait(future: Any, deadline: float, hosts: JobHosts, what: str) -> None:
    try:
        future.get(timeout=max(0.001, deadline - time.monotonic()))
    except TimeoutError:
        raise TimeoutError(f"SPMDJob {hosts.namespace}/{hosts.name}: {what} at {', '.join(hosts.addresses)} "
                           "did not finish in time") from None


def proc_mesh(job: str, namespace: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
              kubeconfig: str | None = None, client_address: str | None = None,
              host_failure_timeout: float = DEFAULT_HOST_FAILURE_TIMEOUT) -> Any:
    """A Monarch ProcMesh on the pods of Monarch-mode SPMDJob ``job``, shaped as its mesh.

    Waits until the job is Running (every pod of its current attempt Ready and its worker loop
    accepting connections), attaches to its pods and spawns the last mesh dimension's procs on
    each: for ``spec.mesh`` [hosts=2, gpus=2] a mesh with labels ``hosts, gpus`` and sizes 2, 2, on
    which ``setup_torch_elastic_env`` and ``SPMDActor.main`` work as on one machine.

    Args:
        job: the SPMDJob's name.
        namespace: its namespace (default: the kubeconfig context's, or the pod's own).
        timeout: seconds to wait for the job, then again at most this long for Monarch.
        kubeconfig: a kubeconfig file (default $KUBECONFIG or ~/.kube/config, else in-cluster).
        client_address: the local IP the pods reach this client at (default: the address that
            routes to the first pod). Only before the process's first Monarch call.
        host_failure_timeout: seconds after which Monarch takes an unanswering host for lost
            (process-wide).

    Raises:
        MonarchJobError: no such job, not in Monarch mode, or it ended.
        TimeoutError: the job did not become Running, or Monarch did not attach, in time.
        RuntimeError: from Monarch, or when this process's Monarch client cannot reach pods.
    """
    hosts = find_hosts(job, namespace, timeout=timeout, kubeconfig=kubeconfig)
    return attach(hosts, timeout=timeout, client_address=client_address, host_failure_timeout=host_failure_timeout)


async def attach_async(hosts: JobHosts, *, timeout: float = DEFAULT_TIMEOUT, client_address: str | None = None,
                       host_failure_timeout: float = DEFAULT_HOST_FAILURE_TIMEOUT) -> Any:
    """The awaitable twin of :func:`attach`."""
    _prepare_client(hosts, client_address, host_failure_timeout)
    host_mesh = _shaped(_attach_hosts(hosts), hosts)
    try:
        await asyncio.wait_for(_awaited(host_mesh.initialized), timeout)
        procs = host_mesh.spawn_procs(per_host=hosts.per_host, name=hosts.name)
        await asyncio.wait_for(_awaited(procs.initialized), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"SPMDJob {hosts.namespace}/{hosts.name}: attaching to {', '.join(hosts.addresses)} "
                           "and spawning the procs did not finish in time") from None
    return procs


async def _awaited(future: Any) -> Any:
    return await future


async def proc_mesh_async(job: str, namespace: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                          kubeconfig: str | None = None, client_address: str | None = None,
                          host_failure_timeout: float = DEFAULT_HOST_FAILURE_TIMEOUT) -> Any:
    """The awaitable twin of :func:`proc_mesh`: same arguments, result and errors. The Kubernetes
    calls run in a thread, so the event loop keeps running while the job starts."""
    hosts = await asyncio.to_thread(find_hosts, job, namespace, timeout=timeout, kubeconfig=kubeconfig)
    return await attach_async(hosts, timeout=timeout, client_address=client_address,
                              host_failure_timeout=host_failure_timeout)
