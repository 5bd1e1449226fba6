"""How much the simulation explores: a CI profile (bounded, the same schedules every run) and
the long run's (``python -m tests.sim --minutes N``: new schedules until the time is up).

The CI profile is derandomized: CI runs the same schedules each time (no flaky red), and each
failure it finds comes with its minimal schedule and the command that replays it. The long run
draws new ones from a seed it prints.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from .core import Violation
from .schedules import schedules
from .sim import run

#: Schedules the CI profile runs (about 40 s on one core of the 2-core CI machine).
CI_EXAMPLES = 1200


def ci_settings(examples: int = CI_EXAMPLES) -> settings:
    return settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink],
                    print_blob=False)


def replay_command(schedule: dict[str, Any]) -> str:
    return f"python -m tests.sim --replay '{json.dumps(schedule, sort_keys=True)}'"


def search(examples: int, *, seed: int | None = None, on_run: Callable[[Any], None] | None = None,
           derandomize: bool = True, shrink: bool = True) -> dict[str, Any] | None:
    """Runs up to ``examples`` schedules; returns the first failing one (the minimal one, shrunk,
    with ``shrink``) or None."""
    found: list[dict[str, Any]] = []

    def body(schedule: dict[str, Any]) -> None:
        try:
            sim = run(schedule)
        except Violation:
            found.append(schedule)  # the last appended is the shrunk one
            raise
        if on_run is not None:
            on_run(sim)

    test = given(schedules())(body)
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    test = settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
                    suppress_health_check=list(HealthCheck), phases=phases, print_blob=False)(test)
    if seed is not None and not derandomize:
        test = hypothesis_seed(seed)(test)
    try:
        test()
    except (Violation, BaseExceptionGroup):  # several distinct failures come as a group
        if not found:
            raise
        return found[-1]
    return None


def timed(minutes: float, report: Callable[[str], None]) -> tuple[int, int, dict[str, Any] | None]:
    """The long run: batches of new schedules until ``minutes`` pass or one fails; (schedules,
    steps, the minimal failing schedule or None)."""
    counts = {"schedules": 0, "steps": 0}

    def count(sim: Any) -> None:
        counts["schedules"] += 1
        counts["steps"] += sim.world.steps

    until = time.monotonic() + minutes * 60
    batch = 0
    start = int(time.time())
    while time.monotonic() < until:
        seed = start + batch
        failing = search(2000, seed=seed, on_run=count, derandomize=False)
        batch += 1
        report(f"batch {batch} (seed {seed}): {counts['schedules']} schedules, {counts['steps']} steps so far")
        if failing is not None:
            return counts["schedules"], counts["steps"], failing
    return counts["schedules"], counts["steps"], None
