"""The simulated operator: the real lifecycle, the real observer's account, the controller's writes.

A pass is the controller's (``Controller.reconcile_once``): what the API shows of the job's pods
(``lifecycle.pod_info`` of the very pod bodies the real builders made), the deleted pods it still
remembers (tombstones), what its observer heard from the current gang's coordinator (the real
``spmd_operator.observer.Observer``, fed by a simulated connection, tended as
``Observers.tend`` does), then ``lifecycle.reconcile`` and the plan carried out in the
controller's order: Events, the status, deletions, adoptions, creations (the real builders). A
pass runs on any change of its pods or of what the observer heard (at most one per
COALESCE_SECONDS), when the plan asks to be woken, and every resync.

The operator can be killed: its memory (the observer's account, the tombstones, the names it
created) is lost; the status it wrote stays in the API.
"""

from __future__ import annotations

from typing import Any

from monarch_spmd.payload import follow, rendezvous
from monarch_spmd.spec import JobSpec
from spmd_operator import builders, controller, creation, lifecycle, names
from spmd_operator import observer as observer_mod
from spmd_operator.informer import TOMBSTONE_SECONDS

from .cluster import Cluster, Pod
from .core import Conn, Node, Proc

#: How long a created pod's name is remembered (creation.CREATED_MEMORY_SECONDS).
CREATED_MEMORY = creation.CREATED_MEMORY_SECONDS


def merge(status: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch applied."""
    out = dict(status)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


class ObserverLink(Proc):
    """The operator's observer connection (``spmd_operator.observer.Observer._run``)."""

    def __init__(self, op: Operator, pod: Pod) -> None:
        super().__init__(op.world, op.node, f"observer of {pod.name}")
        self.op = op
        self.pod = pod
        info = pod.info()
        self.observer = observer_mod.Observer((pod.name, pod.uid), pod.ip or "", 29400, op.wake,
                                              token=(info.agent_token if info else "") or "", run_id=op.job.uid,
                                              job=f"{op.job.namespace}/{op.job.name}", clock=op.world.wall)
        self.conn: Conn | None = None
        self.tries = 0
        self.stopped = False
        self.first = True
        self.lines = rendezvous.LineBuffer()
        self.later(0.0, self._dial)

    @property
    def target(self) -> tuple[str, str]:
        return (self.pod.name, self.pod.uid)

    def stop(self) -> None:
        self.stopped = True
        self.observer.stop()
        if self.conn is not None:
            self.conn.close(self)
            self.conn = None
        self.die()

    def _dial(self) -> None:
        if self.stopped or self.observer.final is not None:
            return
        self.op.sim.dial_pod(self, self.pod, self._connected, self._failed, (self._data, self._closed))

    def _failed(self, error: str = "ConnectionRefusedError: refused") -> None:
        self._error(error)

    def _error(self, error: str) -> None:
        if self.stopped:
            return
        o = self.observer
        o.follower.disconnected()
        if error != o.error:
            o.error = error
            o._view = None
            self.op.wake()
        if o.connected:
            o.connected = False
            o.dark_since = self.world.wall()
            o._view = None
            self.op.wake()
        if o.final is not None:
            return
        wait = observer_mod.RECONNECT_SECONDS[min(self.tries, len(observer_mod.RECONNECT_SECONDS) - 1)]
        self.tries += 1
        self.later(wait, self._dial)

    def _connected(self, conn: Conn) -> None:
        if self.stopped:
            conn.close(self)
            return
        self.conn = conn
        self.first = True
        self.lines = rendezvous.LineBuffer()
        conn.send(self, rendezvous.encode(self.observer.follower.hello()))
        self.later(rendezvous.HEARTBEAT_INTERVAL, self._beat, conn)

    def _beat(self, conn: Conn) -> None:
        """Observer._beat: a heartbeat every second while connected."""
        if conn is not self.conn or self.stopped or not conn.send(self, rendezvous.encode({"type": rendezvous.HEARTBEAT})):
            return
        self.later(rendezvous.HEARTBEAT_INTERVAL, self._beat, conn)

    def _data(self, conn: Conn, data: bytes) -> None:
        if conn is not self.conn or self.stopped:
            return
        try:
            for message in self.lines.feed(data):
                if self.first:
                    self.first = False
                    self.observer._welcome(message)
                    self.tries = 0
                else:
                    self.observer._take(message)
        except (rendezvous.ProtocolError, follow.Refused, follow.ForeignRun, ConnectionError) as e:
            conn.close(self)
            self.conn = None
            self._error(f"{type(e).__name__}: {e}")
            return
        self.op.wake()

    def _closed(self, conn: Conn) -> None:
        if conn is not self.conn:
            return
        self.conn = None
        self._error("the coordinator closed the connection")


class Operator(Proc):
    """One operator replica leading, for one job."""

    def __init__(self, sim: Any, node: Node, job: names.JobRef, spec: JobSpec) -> None:
        super().__init__(sim.world, node, "operator")
        self.sim = sim
        self.cluster: Cluster = sim.cluster
        self.job = job
        self.spec = spec
        self.status: dict[str, Any] = {}
        self.events: list[tuple[float, str, str, str]] = []
        self.tokens: dict[int, str] = {}
        self.services: set[int] = set()
        self.up = True
        self.link: ObserverLink | None = None
        self.tombstones: list[tuple[float, lifecycle.PodInfo]] = []
        self.created: dict[str, float] = {}
        self.pending = False
        self.last_pass = -1.0
        self.passes = 0
        self.plans: list[lifecycle.Plan] = []
        self.recreations: list[tuple[float, int]] = []
        self.cluster.watchers.append(self._pod_changed)
        self.wake()
        self.later(controller.DEFAULT_RESYNC_SECONDS, self._resync)

    # --- waking -------------------------------------------------------------------------------

    def _pod_changed(self, pod: Pod) -> None:
        if pod.removed and self.up:
            info = pod.info()
            if info is not None:
                self.tombstones.append((self.world.now, info))
        self.wake()

    def wake(self) -> None:
        if not self.up or self.pending:
            return
        self.pending = True
        when = max(self.world.now, self.last_pass + controller.COALESCE_SECONDS)
        self.world.at(when, self.run, self._pass, ())

    def _requeue(self, delay: float) -> None:
        self.later(max(0.0, delay), self.wake)

    def _resync(self) -> None:
        self.wake()
        self.later(controller.DEFAULT_RESYNC_SECONDS, self._resync)

    def kill(self, down: float) -> None:
        """The operator's process dies and starts again ``down`` seconds later, remembering nothing."""
        self.world.say(f"operator killed for {down:.1f}s")
        self.up = False
        if self.link is not None:
            self.link.stop()
            self.link = None
        self.tombstones = []
        self.created = {}
        self.pending = False
        self.world.after(down, self._start_again)

    def _start_again(self) -> None:
        self.world.say("operator started again")
        self.up = True
        self.wake()

    # --- a pass -------------------------------------------------------------------------------

    def _tend(self, o: lifecycle.Observed) -> lifecycle.CoordinatorView | None:
        """``Observers.tend``: the connection to the current gang's rank-0 pod while it runs."""
        phase = o.status.get("phase")
        if phase not in (lifecycle.PENDING, lifecycle.RUNNING, lifecycle.RESTARTING):
            self._close_link()
            return None
        restarts = int(o.status.get("restarts") or 0)
        gang = o.status.get("gangRestart")
        gang = gang if isinstance(gang, int) and not isinstance(gang, bool) else restarts
        zero = next((p for p in o.pods if p.restart == gang and p.rank == 0 and p.replacement == 0), None)
        name = names.pod_name(self.job, gang, 0)
        if self.link is not None and self.link.pod.name != name:
            self._close_link()
        alive = (zero is not None and zero.phase == lifecycle.RUNNING and not zero.deleting and zero.ip
                 and zero.agent_port is not None)
        if alive:
            assert zero is not None
            pod = self.cluster.pods.get(zero.name)
            if pod is not None and self.link is not None and self.link.target != (pod.name, pod.uid):
                self._close_link()
            if self.link is None and pod is not None:
                self.link = ObserverLink(self, pod)
        elif self.link is not None and not self.link.stopped:
            self._stop_link()  # rank 0's pod is gone or ending: keep what was heard
        return self.link.observer.view() if self.link is not None else None

    def gives_up(self, plan: lifecycle.Plan) -> bool:
        """Whether the pass gives the observed gang up (deletes its rank-0 pod)."""
        assert self.link is not None
        return self.link.pod.name in plan.delete_pods

    def _stop_link(self) -> None:
        assert self.link is not None
        self.link.stopped = True
        self.link.observer.stop()
        if self.link.conn is not None:
            self.link.conn.close(self.link)
            self.link.conn = None

    def _close_link(self) -> None:
        if self.link is not None:
            self.link.stop()
            self.link = None

    def observed(self) -> lifecycle.Observed:
        now = self.world.now
        self.tombstones = [(t, i) for t, i in self.tombstones if now - t < TOMBSTONE_SECONDS]
        infos = [i for i in (p.info() for p in self.cluster.pods.values()) if i is not None]
        return lifecycle.Observed(
            job=self.job, generation=1, spec=self.spec, status=dict(self.status),
            pods=tuple(i for i in infos if i.spare is None), spares=tuple(i for i in infos if i.spare is not None),
            gone=tuple(i for _, i in self.tombstones if i.spare is None),
            services=tuple(lifecycle.ChildInfo(name=names.service_name(self.job, r), restart=r) for r in sorted(self.services)),
            now=self.world.datetime())

    def _pass(self) -> None:
        self.pending = False
        if not self.up:
            return
        self.last_pass = self.world.now
        self.passes += 1
        o = self.observed()
        o = lifecycle.Observed(**{**o.__dict__, "coordinator": self._tend(o)})
        # Creator.shown: names the API shows, or showed deleted since, need no memory of creation.
        for child in (*o.pods, *o.spares):
            self.created.pop(child.name, None)
        for when, info in self.tombstones:
            if info.name in self.created and when > self.created[info.name]:
                del self.created[info.name]
        plan = lifecycle.reconcile(o)
        if self.link is not None and not self.link.stopped and self.gives_up(plan):
            self._stop_link()  # Controller.reconcile_once: a gang given up is heard no more
        self.plans.append(plan)
        if len(self.plans) > 50:
            del self.plans[:25]
        self._carry_out(o, plan)
        if plan.requeue_after is not None:
            self._requeue(plan.requeue_after)

    def _carry_out(self, o: lifecycle.Observed, plan: lifecycle.Plan) -> None:
        for event in plan.events:
            self.events.append((self.world.now, event.type, event.reason, event.message))
            self.world.say(f"Event {event.type} {event.reason}: {event.message[:160]}")
        if plan.status:
            before = self.status
            self.status = merge(self.status, plan.status)
            if before.get("phase") != self.status.get("phase") or before.get("restarts") != self.status.get("restarts"):
                self.world.say(f"status {self.status.get('phase')} restarts {self.status.get('restarts')} "
                               f"disruptions {self.status.get('disruptions')} gang {self.status.get('gangRestart')}")
            self.sim.status_written(before, self.status, plan)
        for name in plan.delete_pods:
            self.created.pop(name, None)
            self.cluster.delete(name)
        if plan.service is not None:
            self.services.add(plan.service)
        for name in plan.delete_services:
            self.services = {r for r in self.services if names.service_name(self.job, r) != name}
        spares = {s.name: s for s in o.spares}
        for name, index, replacement in plan.adopt:
            if name in spares:
                self.cluster.relabel(name, builders.adopt_labels(self.job, self.spec, index, spares[name].restart,
                                                                 replacement))
        self._create(plan)

    def _token(self, attempt: int) -> str:
        if attempt not in self.tokens:
            self.tokens[attempt] = "%043x" % self.world.rng.getrandbits(170)
        return self.tokens[attempt]

    def _create(self, plan: lifecycle.Plan) -> None:
        bodies = []
        for index in plan.create:
            bodies.append(builders.build_pod(self.job, self.spec, index, plan.restart, disruptions=plan.disruptions,
                                             payload="payload", token=self._token(plan.restart),
                                             avoid_nodes=plan.avoid_nodes))
        for index, replacement in plan.replace:
            bodies.append(builders.build_pod(self.job, self.spec, index, plan.restart, replacement=replacement,
                                             restart_count=plan.replace_round, disruptions=plan.disruptions,
                                             payload="payload", token=self._token(plan.restart),
                                             avoid_nodes=plan.avoid_nodes))
        for spare in plan.spares:
            bodies.append(builders.build_spare_pod(self.job, self.spec, spare, plan.spare_restart,
                                                   disruptions=plan.disruptions, payload="payload",
                                                   token=self._token(plan.spare_restart), avoid_nodes=plan.avoid_nodes))
        for body in bodies:
            name = body["metadata"]["name"]
            if name in self.created and self.world.now - self.created[name] < CREATED_MEMORY:
                continue
            if self.cluster.create(body) is not None:
                self.created[name] = self.world.now
