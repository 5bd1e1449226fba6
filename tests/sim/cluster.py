"""The simulated cluster: the API's pods, a scheduler, each node's kubelet, and the ranks.

The pods are the operator's own pod bodies (``spmd_operator.builders``), with a status this
module keeps as the kubelet would: Pending until bound and started, Running with an IP, then
Succeeded or Failed with the trainer's exit code and termination message; a graceful deletion
sends SIGTERM to the container's first process and SIGKILL after the pod's grace period; the
pod leaves the API once its containers ended. A kubelet on a frozen node does nothing until
the thaw: its pods keep their last status (Running), as a real NotReady node's do.

A rank is a process of one round. It trains until the round's length has passed (then exits
0), exits when told (SIGTERM after a delay, or never for ranks that ignore it; SIGKILL at once),
and breaks, exiting 1, soon after a peer of its round dies: a collective whose peer is gone
fails. A peer on a node whose traffic is dropped does not break anyone: their collectives hang.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from spmd_operator import lifecycle, names

from .core import Node, Proc, World

#: The trainer's exit code a kubelet reports for a container killed by SIGKILL.
SIGKILL_CODE = 137


class Rank(Proc):
    """One training process of round ``round`` (global rank ``rank``)."""

    def __init__(self, cluster: Cluster, agent: Any, node: Node, rank: int, local: int, round_: int, pid: int,
                 train: float, ignores_term: bool, term_delay: float) -> None:
        super().__init__(cluster.world, node, f"rank {rank} r{round_} pid {pid}")
        self.cluster = cluster
        self.agent = agent
        self.rank, self.local, self.round, self.pid = rank, local, round_, pid
        #: The gang it belongs to (its MASTER_ADDR: the attempt its pod was created for) and round.
        self.gang = int(agent.pod.labels.get(names.LABEL_RESTART, 0))
        self.epoch = (self.gang, round_)
        self.returncode: int | None = None
        self.exited_at: float | None = None
        self.signalled = False   # SIGTERM or SIGKILL came (the agent stops it, or the pod goes)
        self.stopped = False     # the agent stopped it (for a restart, not a failure)
        self.ignores_term = ignores_term
        self.term_delay = term_delay
        self.started = self.world.now
        self.frozen_for_stacks = False
        cluster.ranks.append(self)
        cluster.ranks_started.append(self)
        self.later(train, self._done)

    @property
    def active(self) -> bool:
        """Running code now: alive, its node not frozen."""
        return self.alive and not self.node.frozen

    @property
    def code(self) -> int | None:
        if self.returncode is None:
            return None
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    def _done(self) -> None:
        """Its training is done, if its round's collectives can complete: every peer of the round
        alive (or done) and reachable; else it waits in a collective (a peer cut off hangs it)."""
        peers = [r for r in self.cluster.ranks_started if r.epoch == self.epoch]
        if self.node.cut or any(r.alive and r.node.cut for r in peers) or any(
                not r.alive and r.returncode != 0 for r in peers):
            self.later(1.0, self._done)
            return
        self.exit(0)

    def crash(self, code: int) -> bool:
        """An injected failure: the rank exits ``code`` now (False when it was not running)."""
        if not self.alive or self.signalled:
            return False
        self.exit(code)
        return True

    def term(self) -> None:
        """SIGTERM: it ends after a while (or ignores it)."""
        if not self.alive:
            return
        self.signalled = True
        if not self.ignores_term:
            self.world.after(self.term_delay, self._term_exit)

    def _term_exit(self) -> None:
        self.run(self.exit, (-15,))

    def kill(self) -> None:
        """SIGKILL (also to a stopped process: the kernel ends it)."""
        if self.alive:
            self.signalled = True
            self.exit(-9, force=True)

    def exit(self, returncode: int, *, force: bool = False) -> None:
        if not self.alive:
            return
        if self.node.frozen and not force:
            return
        self.returncode = returncode
        self.exited_at = self.world.now
        self.die()
        self.cluster.rank_ended(self)
        self.agent.child_exited(self)

    def break_collective(self) -> None:
        """A peer of its round is gone: its collective fails."""
        if self.alive and not self.signalled:
            self.exit(1)


class Pod:
    """A pod in the API and the kubelet's view of its container."""

    def __init__(self, cluster: Cluster, body: dict[str, Any], uid: str) -> None:
        self.cluster = cluster
        self.body = body
        body["metadata"]["uid"] = uid
        body["metadata"]["creationTimestamp"] = lifecycle.format_time(cluster.world.datetime())
        body["status"] = {"phase": "Pending"}
        self.name: str = body["metadata"]["name"]
        self.uid = uid
        self.node: Node | None = None
        self.worker: Any = None
        self.procs: list[Proc] = []  # every process of its container
        self.deleting = False
        self.removed = False
        self.started = False
        self.ended = False
        self.created = cluster.world.now
        self.env = self._env()

    # --- what the API shows -----------------------------------------------------------------

    @property
    def labels(self) -> dict[str, str]:
        return self.body["metadata"].setdefault("labels", {})

    @property
    def phase(self) -> str:
        return self.body["status"].get("phase", "Pending")

    @property
    def ip(self) -> str | None:
        return self.body["status"].get("podIP")

    def info(self) -> lifecycle.PodInfo | None:
        return lifecycle.pod_info(self.body)

    def _env(self) -> dict[str, str]:
        trainer = next(c for c in self.body["spec"]["containers"] if c.get("name") == names.CONTAINER_NAME)
        out: dict[str, str] = {}
        for e in trainer.get("env") or []:
            if "value" in e:
                out[e["name"]] = str(e["value"])
        return out

    def resolved_env(self) -> dict[str, str]:
        """The container's environment, the downward API's variables filled in."""
        trainer = next(c for c in self.body["spec"]["containers"] if c.get("name") == names.CONTAINER_NAME)
        out = dict(self.env)
        fields = {"metadata.name": self.name, "metadata.namespace": self.body["metadata"].get("namespace", ""),
                  "spec.nodeName": self.node.name if self.node else "", "status.podIP": self.ip or "",
                  "metadata.uid": self.uid}
        for e in trainer.get("env") or []:
            ref = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if ref is not None:
                out[e["name"]] = fields.get(ref, "")
        return out

    def avoided(self) -> set[str]:
        """The nodes its required node affinity keeps it off."""
        out: set[str] = set()
        required = ((self.body["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or {}
        for term in required.get("nodeSelectorTerms") or []:
            for expression in term.get("matchExpressions") or []:
                if expression.get("key") == "kubernetes.io/hostname" and expression.get("operator") == "NotIn":
                    out.update(expression.get("values") or [])
        return out

    def grace(self) -> float:
        value = self.body["spec"].get("terminationGracePeriodSeconds")
        return float(value) if isinstance(value, (int, float)) else 30.0

    def set_status(self, **fields: Any) -> None:
        self.body["status"].update(fields)
        self.cluster.changed(self)

    def condition(self, type_: str, status: str, reason: str = "", message: str = "") -> None:
        conditions = [c for c in self.body["status"].get("conditions") or [] if c.get("type") != type_]
        conditions.append({"type": type_, "status": status, "reason": reason, "message": message})
        self.set_status(conditions=conditions)


class Kubelet(Proc):
    """A node's kubelet: starts containers, reports their ends, stops deleted pods."""

    def __init__(self, cluster: Cluster, node: Node) -> None:
        super().__init__(cluster.world, node, f"kubelet {node.name}")
        self.cluster = cluster

    def bound(self, pod: Pod) -> None:
        self.later(self.world.uniform(0.3, 2.0), self._start, pod)

    def api(self, fn: Callable[..., Any], *args: Any) -> bool:
        """False (and ``fn`` tried again later) while the node's traffic is cut: the kubelet cannot
        reach the API server (its pods' status stays what it last said)."""
        if self.node.cut:
            self.later(1.0, fn, *args)
            return False
        return True

    def resync(self) -> None:
        """The kubelet reports again after its node was cut off: its running pods are Ready."""
        for pod in self.cluster.pods.values():
            if pod.node is self.node and pod.started and not pod.ended:
                ready = next((c for c in pod.body["status"].get("conditions") or [] if c.get("type") == "Ready"), {})
                if ready.get("status") != "True":
                    pod.condition("Ready", "True")

    def _start(self, pod: Pod) -> None:
        if pod.removed or pod.started:
            return
        if not self.api(self._start, pod):
            return
        if pod.deleting:
            self._remove(pod)
            return
        pod.started = True
        self.cluster.next_ip += 1
        pod.set_status(phase="Running", podIP=f"10.0.{self.cluster.next_ip // 250}.{self.cluster.next_ip % 250}")
        pod.condition("ContainersReady", "True")
        pod.condition("Ready", "True")
        pod.worker = self.cluster.start_worker(pod)

    def container_ended(self, pod: Pod, code: int, message: str | None) -> None:
        """The container's first process exited ``code``: every process of it goes; the kubelet
        reports the end a moment later."""
        if pod.ended:
            return
        pod.ended = True
        for proc in list(pod.procs):
            if isinstance(proc, Rank):
                proc.kill()
            else:
                proc.die()
        self.later(self.world.uniform(0.1, 1.0), self._report_end, pod, code, message)

    def _report_end(self, pod: Pod, code: int, message: str | None) -> None:
        if not self.api(self._report_end, pod, code, message):
            return
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                      "finishedAt": lifecycle.format_time(self.world.datetime())}
        if message:
            terminated["message"] = message
        pod.set_status(phase="Succeeded" if code == 0 else "Failed",
                       containerStatuses=[{"name": names.CONTAINER_NAME, "state": {"terminated": terminated}}])
        pod.condition("ContainersReady", "False")
        pod.condition("Ready", "False")
        if pod.deleting:
            self._remove(pod)

    def delete(self, pod: Pod) -> None:
        """The pod's deletion reached this kubelet: SIGTERM, then SIGKILL after its grace."""
        if not self.api(self.delete, pod):
            return
        if pod.ended or not pod.started:
            self._remove(pod)
            return
        pod.worker.signal(15)
        self.later(pod.grace(), self._grace_over, pod)

    def _grace_over(self, pod: Pod) -> None:
        if not pod.ended:
            self.container_ended(pod, SIGKILL_CODE, None)

    def _remove(self, pod: Pod) -> None:
        self.cluster.remove(pod)


class Cluster:
    """The API's pods of one job, the nodes, the scheduler and the ranks."""

    def __init__(self, world: World, nodes: list[Node], start_worker: Callable[[Pod], Any]) -> None:
        self.world = world
        self.nodes = nodes
        self.kubelets = {n.name: Kubelet(self, n) for n in nodes}
        self.pods: dict[str, Pod] = {}
        self.gone: list[tuple[float, Pod]] = []
        self.ranks: list[Rank] = []
        self.ranks_started: list[Rank] = []  # every rank of the run (the invariants' record)
        self.start_worker = start_worker
        self.next_ip = 0
        self.next_uid = 0
        self.next_pid = 100
        self.watchers: list[Callable[[Pod], None]] = []
        self.created = 0
        self.names: set[str] = set()  # every pod name ever created
        self.reused: list[str] = []  # spare names created again once their pod was gone (invariant 7)
        self.scheduling = False

    # --- the API ----------------------------------------------------------------------------

    def create(self, body: dict[str, Any]) -> Pod | None:
        """Creates a pod; None when its name is taken (a 409)."""
        name = body["metadata"]["name"]
        if name in self.pods:
            return None
        if name in self.names and (body["metadata"].get("labels") or {}).get(names.LABEL_SPARE) is not None:
            self.reused.append(name)
        self.names.add(name)
        self.next_uid += 1
        pod = Pod(self, copy.deepcopy(body), f"uid-{self.next_uid:05d}")
        self.pods[name] = pod
        self.created += 1
        self.world.say(f"pod {name} created")
        self.changed(pod)
        self._schedule_soon()
        return pod

    def delete(self, name: str, *, reason: str | None = None, message: str = "") -> None:
        """A graceful deletion (``reason``: the DisruptionTarget condition's, an eviction)."""
        pod = self.pods.get(name)
        if pod is None or pod.deleting:
            return
        if reason is not None:
            pod.condition("DisruptionTarget", "True", reason, message)
        pod.deleting = True
        pod.body["metadata"]["deletionTimestamp"] = lifecycle.format_time(self.world.datetime())
        self.world.say(f"pod {name} deleted{f' ({reason})' if reason else ''}")
        self.changed(pod)
        if pod.node is None:
            self.remove(pod)
        else:
            self.kubelets[pod.node.name].later(self.world.uniform(0.05, 0.5), self.kubelets[pod.node.name].delete, pod)

    def relabel(self, name: str, labels: dict[str, str | None]) -> bool:
        pod = self.pods.get(name)
        if pod is None:
            return False
        for key, value in labels.items():
            if value is None:
                pod.labels.pop(key, None)
            else:
                pod.labels[key] = value
        self.world.say(f"pod {name} relabelled {labels.get(names.LABEL_RANK)}")
        self.changed(pod)
        return True

    def remove(self, pod: Pod) -> None:
        if pod.removed:
            return
        pod.removed = True
        for proc in list(pod.procs):
            if isinstance(proc, Rank):
                proc.kill()
            else:
                proc.die()
        self.pods.pop(pod.name, None)
        self.gone.append((self.world.now, pod))
        self.world.say(f"pod {pod.name} gone")
        self.changed(pod)
        self._schedule_soon()

    def changed(self, pod: Pod) -> None:
        for watch in self.watchers:
            watch(pod)

    # --- the node controller ------------------------------------------------------------------

    def watch_nodes(self) -> None:
        """Every 5 s: a node that has not reported for 40 s (frozen, cut off) is NotReady, and its
        pods are marked not ready (their phase stays what the kubelet said last)."""
        for node in self.nodes:
            silent_since = node.cut_since
            if silent_since is None or self.world.now - silent_since < 40.0:
                continue
            for pod in self.pods.values():
                ready = next((c for c in pod.body["status"].get("conditions") or [] if c.get("type") == "Ready"), {})
                if pod.node is node and ready.get("status") == "True":
                    pod.condition("Ready", "False", "NodeNotReady", f"node {node.name} stopped reporting")
        self.world.after(5.0, self.watch_nodes)

    # --- the scheduler ----------------------------------------------------------------------

    def _schedule_soon(self) -> None:
        if not self.scheduling:
            self.scheduling = True
            self.world.after(self.world.uniform(0.05, 0.3), self._schedule)

    def _schedule(self) -> None:
        self.scheduling = False
        waiting = [p for p in self.pods.values() if p.node is None and not p.deleting]
        for pod in waiting:
            node = self._fit(pod)
            if node is None:
                scheduled = next((c for c in pod.body["status"].get("conditions") or []
                                  if c.get("type") == "PodScheduled"), {})
                if scheduled.get("status") != "False":
                    pod.condition("PodScheduled", "False", "Unschedulable",
                                  "0/N nodes are available: no node fits the pod")
                continue
            pod.node = node
            pod.body["spec"]["nodeName"] = node.name
            pod.condition("PodScheduled", "True")
            self.kubelets[node.name].bound(pod)
        if any(p.node is None and not p.deleting for p in self.pods.values()):
            self.scheduling = True
            self.world.after(1.0, self._schedule)

    def _fit(self, pod: Pod) -> Node | None:
        avoid = pod.avoided()
        fits = []
        for node in self.nodes:
            if node.name in avoid:
                continue
            if node.frozen and node.frozen_since is not None and self.world.now - node.frozen_since > 40.0:
                continue  # NotReady: the node controller tainted it
            held = sum(1 for p in self.pods.values() if p.node is node and not p.ended)
            if held < node.capacity:
                fits.append(node)
        return self.world.rng.choice(fits) if fits else None

    # --- ranks ------------------------------------------------------------------------------

    def new_pid(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def rank_ended(self, rank: Rank) -> None:
        """A rank's peers of the same round break soon, unless its node's traffic was cut."""
        if rank.returncode == 0 or rank.node.cut:
            return
        for peer in self.ranks:
            if peer is not rank and peer.alive and peer.epoch == rank.epoch and not peer.node.cut \
                    and not peer.signalled:
                peer.later(self.world.uniform(0.05, 1.0), peer.break_collective)
        self.ranks = [r for r in self.ranks if r.alive]
