"""What the local runner says of an elastic gang (monarch_spmd.runner's notes, failed-run table and
closing lines), from the events of the real coordinator driven through a shrink, a grow and
failures, as its observer hands them over. A fixed-size gang's words are held by
tests/unit/test_runner_events.py and the process tests; tests/lib/test_runner_elastic_shrink.py
runs the same with real workers."""

from __future__ import annotations

from monarch_spmd import runner
from monarch_spmd.payload import rendezvous as rv
from monarch_spmd.payload.coordinator import Coordinator, Policy
from monarch_spmd.payload.rendezvous import OBSERVERS

from .coordinators import Observed

PROCS = 2  # procs per worker: ranks renumber by the round's members


class Gang:
    """A coordinator of ``members`` workers of PROCS procs and the runner's view of its events."""

    def __init__(self, members: int = 3, minimum: int = 2, max_restarts: int = 0) -> None:
        self.c: Coordinator = Observed(members, 0, Policy(max_restarts=max_restarts, backoff=0.0, min_members=minimum,
                                                          elastic_wait=2.0),
                                       now=0.0, world_size=members * PROCS, run_id="job", wall=lambda: 1000.0)
        self.view = runner._View(procs=PROCS, workers=members, min_workers=minimum, elastic_wait=2.0)
        self.notes: list[str] = []
        self.take(self.c.start())

    def take(self, outs: list) -> None:
        for out in outs:
            if out.to == OBSERVERS:
                self.view.inbox.put(out.message)
        runner._follow(self.view, self.notes.append, self.c.members * PROCS)

    def round_of(self, members: list[int], now: float) -> None:
        """``members`` join (saying hello first when new) and run the open round."""
        for m in members:
            if m not in self.c.incarnations:
                self.take(self.c.hello(m, f"inc-{m}-{now}", now))
            self.take(self.c.join(m, self.c.round, now))
        self.take(self.c.tick(now + 2.0))  # the elastic wait, when some are missing
        for m in sorted(self.c.round_members):
            first = sorted(self.c.round_members).index(m) * PROCS
            self.take(self.c.running(m, self.c.round, [{"rank": first + i, "local_rank": i, "pid": 100 * m + i}
                                                       for i in range(PROCS)], now + 2.5))

    def stopped(self, members: list[int], now: float, failed: dict[int, int] | None = None) -> None:
        """``members`` report their processes gone (``failed``: rank -> exit code) and join the next round."""
        for m in members:
            first = sorted(self.c.round_members).index(m) * PROCS
            rows = [{"rank": first + i, "local_rank": i, "pid": 100 * m + i,
                     "exit_code": (failed or {}).get(first + i, 143), "returncode": (failed or {}).get(first + i, -15),
                     "stopped": first + i not in (failed or {})} for i in range(PROCS)]
            self.take(self.c.exited(m, self.c.round, rows, now))
            self.take(self.c.join(m, self.c.round + 1, now))


def shrunk() -> Gang:
    """3 workers at full size; worker 2 lost; restart 1 runs workers 0 and 1."""
    g = Gang()
    g.round_of([0, 1, 2], 1.0)
    g.take(g.c.lost(2, rv.LOST_DISCONNECTED, 5.0))
    g.stopped([0, 1], 5.5)
    g.round_of([], 6.0)
    assert g.c.round == 1 and g.c.round_members == {0, 1}
    return g


def test_a_shrink_and_a_grow_back_are_said_as_disruptions_and_closed_by_the_sizes_and_counts():
    g = shrunk()
    g.take(g.c.hello(2, "inc-2-again", 10.0))  # the runner started worker 2 again
    g.take(g.c.join(2, 2, 10.0))  # ready while the smaller round runs: the gang grows
    g.stopped([0, 1], 10.5)
    g.round_of([], 11.0)
    assert g.c.round == 2 and g.c.round_members == {0, 1, 2}
    assert g.notes == [
        "member 2's agent is gone (Disconnected); stopping the other ranks",
        "the other ranks restart in place (restart 1, not counted against maxRestarts: a lost worker is a "
        "disruption); the round starts without worker 2 unless it is back within the elastic wait (2s)",
        "restart 1 runs 2 of 3 workers (WORLD_SIZE 4, elastic: at least 2): the gang shrank from 3 to 2 workers "
        "without worker 2, lost in restart 0 (not counted against maxRestarts: a lost worker is a disruption)",
        "restart 1: every rank is running again, 3.50s after the failure",
        "worker 2 is ready: the gang grows from 2 to 3 workers, every rank restarts in place with it (a membership "
        "change, not counted against maxRestarts)",
        "every rank restarts in place (restart 2): a membership change, not counted against maxRestarts",
        "restart 2 runs 3 of 3 workers (WORLD_SIZE 6, elastic: at least 2): the gang grew back from 2 to 3 workers "
        "with worker 2 (a membership change, not counted against maxRestarts)",
        "restart 2: every rank is running again, 3.50s after the gang stopped to grow",
    ]
    assert runner._elastic_history(g.view, 0) == (
        "elastic: restart 0 ran 3, restart 1 ran 2, restart 2 ran 3 of 3 workers; 2 restarts, 0 counted against "
        "maxRestarts (at most 0), 2 not (lost workers and workers back are disruptions)")


def test_a_failure_in_a_smaller_round_is_tabled_with_that_rounds_ranks_and_the_worker_it_ran_without():
    g = shrunk()
    # Rank 3 (worker 1's second proc in restart 1; rank 3 of worker 1 at full size too) exits 1.
    g.take(g.c.failure(1, 1, {"rank": 3, "local_rank": 1, "pid": 101, "exit_code": 1, "returncode": 1,
                              "reason": rv.REASON_ERROR, "at": 1000.0}, 12.0))
    g.stopped([0], 12.5)
    g.stopped([1], 12.5, failed={3: 1})
    final = g.view.final
    assert final is not None and final["exhausted"] and (final["round"], final["counted"]) == (1, 0)
    assert runner._table(g.view, final, 6) == [
        "restart 1, every rank's last process:",
        "  rank  local rank  process      exit code",
        "  0     0           pid 0        -15 (SIGTERM)   stopped (after the first failure)",
        "  1     1           pid 1        -15 (SIGTERM)   stopped (after the first failure)",
        "  2     0           pid 100      -15 (SIGTERM)   stopped (after the first failure)",
        "  3     1           pid 101      1               first failure",
        "restart 1 ran 2 of 3 workers (elastic, at least 2): worker 2, lost in restart 0 (not counted against "
        "maxRestarts: a lost worker is a disruption)",
    ]
    assert runner._uncounted(final) == "; 1 more was a disruption, not counted"


def test_a_program_failure_after_disruptions_says_what_was_counted():
    g = Gang(max_restarts=1)
    g.round_of([0, 1, 2], 1.0)
    g.take(g.c.lost(2, rv.LOST_DISCONNECTED, 5.0))
    g.stopped([0, 1], 5.5)
    g.round_of([], 6.0)
    g.take(g.c.failure(0, 1, {"rank": 1, "local_rank": 1, "pid": 1, "exit_code": 3, "returncode": 3,
                              "reason": rv.REASON_ERROR, "at": 1000.0}, 12.0))
    g.stopped([0], 12.5, failed={1: 3})
    g.stopped([1], 12.5)
    assert g.notes[-2:] == ["rank 1 exited with code 3; stopping the other ranks",
                            "restarting the gang (restart 2, 1 of at most 1 counted: 1 was a disruption) in place"]
