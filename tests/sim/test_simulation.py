"""The deterministic simulation of failure handling, under the CI profile: the real coordinator,
members, hub and lifecycle against every combination of faults the schedules draw, every
invariant checked after every step (tests/sim/invariants.py; docs/restart-in-place.md,
"Invariants"). A failure names the broken invariant, its minimal schedule and the command that
replays it."""

from __future__ import annotations

import pytest

from .core import Violation
from .profiles import CI_EXAMPLES, replay_command, search
from .sim import run


def test_every_invariant_holds_under_every_schedule_of_the_ci_profile():
    failing = search(CI_EXAMPLES)
    if failing is not None:
        with pytest.raises(Violation) as e:
            run(failing)
        pytest.fail(f"{e.value}\n\nreplay: {replay_command(failing)}", pytrace=False)


def test_a_schedule_replays_exactly():
    schedule = {"seed": 7, "pods": 3, "procs": 2, "spares": 1, "min": None, "elastic_wait": None, "max_restarts": 1,
                "grace": 5, "backoff": 1, "train": 60.0, "extra_nodes": 1, "capacity": 1, "stubborn": 0.3,
                "faults": [{"t": 10.0, "kind": "delete", "target": 1}, {"t": 20.0, "kind": "freeze", "target": 2,
                                                                       "duration": 15.0}]}
    first, second = run(schedule), run(schedule)
    assert first.world.log == second.world.log and first.world.steps == second.world.steps
    assert first.operator.status == second.operator.status
    assert any("FAULT delete 1" in line for line in first.world.log)
