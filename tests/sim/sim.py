"""One simulated run: a job, its cluster and its operator, a schedule of faults, the invariants.

:func:`run` builds the world from a schedule (a JSON-able dict: the job's shape and policy, a
seed for every delay, and the faults with their times), runs it on the virtual clock, checks the
invariants after every step (:mod:`.invariants`) and at the end, and raises
:class:`~.core.Violation` naming the broken one with the run's last log lines. The same schedule
always gives the same run.
"""

from __future__ import annotations

import json
from typing import Any

from monarch_spmd.spec import parse_job_spec
from spmd_operator import lifecycle, names

from . import invariants
from .agents import Stranger, Worker
from .cluster import Cluster, Pod, Rank
from .core import WALL0, Conn, Node, Proc, Violation, World
from .operator import Operator

JOB = names.JobRef("sim", "ns", "5e1f0000-0000-4000-8000-00000000c0de")
#: An exit code the job's spec makes permanent (restartPolicy.permanentExitCodes).
PERMANENT_CODE = 42
#: The agent port every pod declares.
AGENT_PORT = 29400


def job_spec(s: dict[str, Any]) -> Any:
    first: dict[str, Any] = {"name": "nodes", "size": s["pods"]}
    if s.get("min") is not None:
        first["minSize"] = s["min"]
    raw: dict[str, Any] = {
        "mesh": [first, {"name": "procs", "size": s["procs"]}],
        "podLayout": "PerHost", "args": ["train.py"], "image": "img",
        "restartPolicy": {"maxRestarts": s["max_restarts"], "backoffSeconds": s["backoff"],
                          "maxBackoffSeconds": max(s["backoff"], 4 * s["backoff"]), "permanentExitCodes": [PERMANENT_CODE],
                          **({"elasticWaitSeconds": s["elastic_wait"]} if s.get("min") is not None else {})},
        "template": {"spec": {"terminationGracePeriodSeconds": s["grace"]}},
    }
    if s.get("spares"):
        raw["spares"] = s["spares"]
    return parse_job_spec(raw, require_image=True)


class Sim:
    """The world of one schedule: nodes, the API's pods, the operator, the ground truth."""

    def __init__(self, schedule: dict[str, Any]) -> None:
        self.schedule = schedule
        self.world = World(schedule["seed"])
        s = schedule
        count = s["pods"] + s.get("spares", 0) + s["extra_nodes"]
        capacity = s.get("capacity", 1)
        self.nodes = [Node(self.world, f"node-{i}", capacity) for i in range(count)]
        self.op_node = Node(self.world, "control-plane", 1000)
        self.cluster = Cluster(self.world, self.nodes, self._start_worker)
        self.cluster.watch_nodes()
        for node in self.nodes:
            kubelet = self.cluster.kubelets[node.name]
            node.on_back.append(lambda k=kubelet: k.later(0.5, k.resync))
        self.spec = job_spec(s)
        self.listeners: dict[int, Any] = {}  # id(pod) -> its coordinator's server
        self.coordinators: list[Worker] = []
        self.latency = {n.name: self.world.uniform(0.0005, 0.01) for n in [*self.nodes, self.op_node]}
        # the ground truth the invariants judge by
        self.real_failures = 0
        self.spares_crash_until = -1.0
        self.permanent = False
        self.faults_done: list[str] = []
        self.last_fault = 0.0
        self.checked_fallbacks: set[int] = set()
        self.operator = Operator(self, self.op_node, JOB, self.spec)
        self.world.checks.append(lambda: invariants.every_step(self))

    # --- what agents and the operator ask of the world --------------------------------------------

    def _start_worker(self, pod: Pod) -> Worker:
        return Worker(self, pod)

    def kubelet(self, pod: Pod) -> Any:
        assert pod.node is not None
        return self.cluster.kubelets[pod.node.name]

    def resolve(self, addr: str) -> Pod | None:
        """MASTER_ADDR (an attempt's Service) to the attempt's rank-0 pod, once it has an address."""
        for attempt in range(0, 256):
            if names.master_addr(JOB, attempt) == addr:
                pod = self.cluster.pods.get(names.pod_name(JOB, attempt, 0))
                return pod if pod is not None and pod.ip and not pod.removed else None
        return None

    def listening(self, server: Any, on: bool = True) -> None:
        if on:
            self.listeners[id(server.pod)] = server
            self.coordinators.append(server.worker)
        else:
            self.listeners.pop(id(server.pod), None)

    def dial(self, client: Proc, addr: str, connected: Any, failed: Any, handlers: Any) -> None:
        """Connects ``client`` to the coordinator at ``addr`` (127.0.0.1: its own pod's)."""
        if addr == "127.0.0.1":
            pod = next((p for p in self.cluster.pods.values() if client in p.procs), None)
        else:
            pod = self.resolve(addr)
        if pod is None:
            client.later(0.05, failed, "socket.gaierror: the name does not resolve")
            return
        self.dial_pod(client, pod, connected, failed, handlers)

    def dial_pod(self, client: Proc, pod: Pod, connected: Any, failed: Any, handlers: Any) -> None:
        server = self.listeners.get(id(pod))
        if pod.node is None or pod.removed:
            client.later(0.05, failed, "OSError: no route to host")
            return
        latency = self.latency[client.node.name] + self.latency[pod.node.name]
        if client.node is not pod.node and (client.node.cut or pod.node.cut):
            client.later(5.0, failed, "TimeoutError: timed out")  # the SYN is dropped: connect's own timeout
            return
        if server is None or not server.alive:
            client.later(2 * latency, failed, "ConnectionRefusedError: refused")
            return
        conn = Conn(self.world, client, server, handlers, (server.server_data, server.server_closed),
                    0.0001 if client.node is pod.node else latency)
        server.later(conn.latency, server.accept, conn)
        client.later(2 * conn.latency, connected, conn)

    def start_rank(self, worker: Worker, rank: int, local: int, round_: int) -> Rank:
        s = self.schedule
        r = Rank(self.cluster, worker, worker.node, rank, local, round_, self.cluster.new_pid(),
                 train=s["train"] + self.world.uniform(0.0, 0.5),
                 ignores_term=self.world.rng.random() < s.get("stubborn", 0.0),
                 # Most ranks die at once on SIGTERM (Python's default); some catch it (a checkpoint).
                 term_delay=(self.world.uniform(0.001, 0.01) if self.world.rng.random() < 0.7
                             else self.world.uniform(0.2, min(2.0, s["grace"]))))
        worker.pod.procs.append(r)
        return r

    def wall_of(self, rank: Rank) -> float:
        """When a rank exited, as its agent knows it (it wakes at once on a process's exit: pidfd)."""
        return WALL0 + (rank.exited_at if rank.exited_at is not None else self.world.now)

    def status_written(self, before: dict[str, Any], after: dict[str, Any], plan: lifecycle.Plan) -> None:
        if self.world.checks:  # (none while a run is only being looked at)
            invariants.on_status(self, before, after, plan)

    # --- faults ---------------------------------------------------------------------------------

    def member_pod(self, m: int) -> Pod | None:
        """The pod that holds member ``m`` of the current gang now (the newest of its index)."""
        gang = self.operator.status.get("gangRestart", self.operator.status.get("restarts", 0)) or 0
        per = self.schedule["procs"]
        best = None
        for pod in self.cluster.pods.values():
            info = pod.info()
            if info is None or info.spare is not None or info.restart != gang or info.rank != m * per:
                continue
            if best is None or info.replacement > best[0]:
                best = (info.replacement, pod)
        return best[1] if best else None

    def spare_pods(self) -> list[Pod]:
        out = []
        for pod in self.cluster.pods.values():
            info = pod.info()
            if info is not None and info.spare is not None and not pod.deleting:
                out.append(pod)
        return sorted(out, key=lambda p: p.name)

    def inject(self, fault: dict[str, Any]) -> None:
        kind, target = fault["kind"], fault.get("target", 0)
        w = self.world
        self.last_fault = max(self.last_fault, w.now + float(fault.get("duration") or 0))
        pod = self.member_pod(target) if kind in ("crash", "delete", "evict", "freeze", "partition", "reset") else None
        if kind in ("delete_spare", "crash_spare", "freeze_spare"):
            spares = self.spare_pods()
            pod = spares[target % len(spares)] if spares else None
        done = f"{kind} {target}"
        if kind == "crash":
            code = PERMANENT_CODE if fault.get("permanent") else int(fault.get("code") or 1)
            worker = pod.worker if pod is not None else None
            ranks = [r for r in (worker.group if isinstance(worker, Worker) else []) if r.alive and not r.signalled
                     and not r.node.frozen]
            if ranks:
                rank = ranks[int(fault.get("local") or 0) % len(ranks)]
                if rank.crash(code):
                    if code == PERMANENT_CODE:
                        self.permanent = True
                    else:
                        self.real_failures += 1
                    done += f" rank {rank.rank} code {code}"
        elif kind in ("delete", "delete_spare") and pod is not None:
            self.cluster.delete(pod.name)
        elif kind == "evict" and pod is not None:
            self.cluster.delete(pod.name, reason="EvictionByEvictionAPI", message="Eviction API: evicting")
        elif kind == "drain":
            for p in sorted(self.cluster.pods.values(), key=lambda p: p.name):
                info = p.info()
                if info is not None and (info.spare is not None or info.rank // self.schedule["procs"] != 0):
                    self.cluster.delete(p.name, reason="EvictionByEvictionAPI", message="drained")
        elif kind == "crash_spare" and pod is not None and isinstance(pod.worker, Worker) \
                and pod.worker.role == "spare" and not pod.node.frozen:
            pod.worker._exit(1, "a spare's worker crashed")
        elif kind in ("freeze", "freeze_spare", "partition") and pod is not None and pod.node is not None:
            node = pod.node
            if kind == "partition":
                node.partition()
                w.after(float(fault.get("duration") or 10.0), node.heal)
            else:
                node.freeze()
                if fault.get("duration"):
                    w.after(float(fault["duration"]), node.thaw)
            done += f" {node.name}"
        elif kind == "spares_crash":
            self.spares_crash_until = w.now + float(fault.get("duration") or 30.0)
        elif kind == "operator":
            if self.operator.up:
                self.operator.kill(float(fault.get("duration") or 1.0))
        elif kind == "reset" and pod is not None and isinstance(pod.worker, Worker):
            worker = pod.worker
            if worker.link is not None and not pod.node.cut:
                conn = worker.link
                conn.dead = True
                conn._detach()
                for side in (conn.a, conn.b):
                    side.run(conn.handlers[id(side)][1], (conn,))
        elif kind == "stranger":
            target_pod = self.cluster.pods.get(names.pod_name(JOB, self.operator.status.get("gangRestart", 0) or 0, 0))
            if target_pod is not None:
                for i in range(int(fault.get("count") or 1)):
                    Stranger(self, self.op_node, fault.get("how") or "silent",
                             names.master_addr(JOB, self.operator.status.get("gangRestart", 0) or 0))
        else:
            done += " (no target)"
        self.faults_done.append(f"{w.now:.2f} {done}")
        w.say(f"FAULT {done}")

    # --- the run --------------------------------------------------------------------------------

    def completing(self) -> bool:
        """Some rank of the newest round exited 0: its training is done."""
        st = self.operator.status
        current = (int(st.get("gangRestart", st.get("restarts")) or 0), int(st.get("restarts") or 0))
        return any(r.epoch == current and r.returncode == 0 for r in self.cluster.ranks_started)

    def finished(self) -> bool:
        phase = self.operator.status.get("phase")
        return phase in ("Succeeded", "Failed") and not any(p.node is not None and not p.ended and not p.node.cut
                                                            for p in self.cluster.pods.values())


def run(schedule: dict[str, Any]) -> Sim:
    """Runs one schedule; raises Violation with the schedule and the log when an invariant breaks."""
    sim = Sim(schedule)
    w = sim.world
    for fault in sorted(schedule["faults"], key=lambda f: f["t"]):
        w.at(float(fault["t"]), sim.inject, fault)
    try:
        horizon = max([float(f["t"]) + float(f.get("duration") or 0) for f in schedule["faults"]] or [0.0])
        w.run_until(horizon + 1.0, sim.finished)
        end = max(sim.last_fault, horizon) + invariants.bound(sim)
        w.run_until(end, sim.finished)
        if not sim.finished() and sim.completing():
            w.run_until(end + 60.0, sim.finished)  # its ranks finished training: the job is ending
            if not sim.finished():
                raise Violation("invariant 5 (liveness): the ranks finished training but the job did not end "
                                f"within 60s (phase {sim.operator.status.get('phase')})")
        invariants.at_end(sim)
    except Violation as e:
        raise Violation(explain(sim, str(e))) from None
    return sim


def explain(sim: Sim, what: str) -> str:
    return "\n".join([what, f"schedule: {json.dumps(sim.schedule, sort_keys=True)}",
                      f"at t={sim.world.now:.3f} after {sim.world.steps} steps; faults: {sim.faults_done}",
                      f"status: {json.dumps({k: v for k, v in sim.operator.status.items() if k != 'conditions'}, default=str)[:1500]}",
                      "log (last 60 lines):", *sim.world.log[-60:]])


__all__ = ["JOB", "PERMANENT_CODE", "Sim", "Violation", "WALL0", "run"]
