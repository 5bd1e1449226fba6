"""The controller's observer connections: which job listens to which coordinator, and when.

Owns the opening and closing of every job's connection to the coordinator of its gang that
restarts in place (restartPolicy.mode InPlace; one :class:`.observer.Observer` per job, held in
:attr:`.jobloop.JobLoop.observer`), and their states for the metrics. Each pass tends its job's
connection in a step of its own (:meth:`Observers.tend`), after the snapshot it observes was
built (which opens nothing) and before the lifecycle decides: the connection goes to the current
gang's rank-0 pod while it runs, and closes when that pod goes, a new gang starts, the job ends,
is suspended or deleted, or this replica stops leading. It only listens and wakes the job's loop;
the pass turns what it heard into the job's status (:mod:`.lifecycle.inplace`).

Where it sits: a part of the controller (:mod:`.controller` makes one and closes a job's
connection when the job's loop ends); above :mod:`.observer` (one connection),
:mod:`.jobloop` and :mod:`.lifecycle`; no Kubernetes API here at all.
"""

from __future__ import annotations

from collections.abc import Mapping

from monarch_spmd import policy

from . import lifecycle, names
from .jobloop import JobKey, JobLoop
from .observer import Observer


class Observers:
    """The observer connections of the jobs the controller knows.

    Args:
        jobs: the controller's jobs (read, never changed here).
    """

    def __init__(self, jobs: Mapping[JobKey, JobLoop]) -> None:
        self.jobs = jobs

    def tend(self, loop: JobLoop, o: lifecycle.Observed) -> lifecycle.CoordinatorView | None:
        """Opens, keeps or closes the job's connection from what the pass observes (``o``, whose
        spec parsed), and returns what it heard of the current gang's coordinator (None: nothing,
        or no gang restarting in place).

        The connection is to the current gang's rank-0 pod while it runs and declares the agent
        port; once that pod ends, what was heard last stays (the coordinator's verdict names the
        root cause); a new gang, a job that ended or is held, and RecreatePods drop it.
        """
        job, spec, status = o.job, o.spec, o.status
        phase = status.get("phase")
        if not policy.restarts_in_place(spec) or phase not in (lifecycle.PENDING, lifecycle.RUNNING, lifecycle.RESTARTING):
            self.close(loop)
            return None
        restarts = int(status.get("restarts") or 0)
        gang = status.get("gangRestart")
        gang = gang if isinstance(gang, int) and not isinstance(gang, bool) else restarts
        zero = next((p for p in o.pods if p.restart == gang and p.rank == 0 and p.replacement == 0), None)
        name = names.pod_name(job, gang, 0)
        if loop.observer is not None and loop.observer.pod_name != name:
            self.close(loop)  # another gang's
        alive = (zero is not None and zero.phase == lifecycle.RUNNING and not zero.deleting and zero.ip
                 and zero.agent_port is not None)
        if alive:
            assert zero is not None and zero.ip is not None and zero.agent_port is not None
            target = (zero.name, zero.uid, zero.ip, zero.agent_port)
            if loop.observer is not None and loop.observer.target != target:
                self.close(loop)  # the same name, another pod (or address)
            if loop.observer is None:
                loop.observer = Observer((zero.name, zero.uid), zero.ip, zero.agent_port, loop.wake.set,
                                         token=zero.agent_token or "", run_id=job.uid,
                                         job=f"{job.namespace}/{job.name}")
            loop.observer.start()
        elif loop.observer is not None:
            loop.observer.stop()  # rank 0's pod is gone or ending: keep what was heard
        return loop.observer.view() if loop.observer is not None else None

    @staticmethod
    def close(loop: JobLoop) -> None:
        """Closes the job's connection and forgets what it heard."""
        if loop.observer is not None:
            loop.observer.stop()
            loop.observer = None

    def states(self) -> list[tuple[bool, float | None]]:
        """Of every observer connection: (connected, seconds since the stalest rank's last output
        while its gang runs, else None), for the metrics (read on the event loop)."""
        out = []
        for loop in self.jobs.values():
            o = loop.observer
            if o is not None and o.running:
                out.append((o.connected, o.seconds_since_progress()))
        return out
