"""The simulation from the command line.

    python -m tests.sim --minutes 60          the long run: new schedules until the time is up
    python -m tests.sim --replay '<json>'     one schedule again, its log and its verdict
    python -m tests.sim --examples 5000       the CI profile's search with more schedules
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .core import Violation
from .profiles import replay_command, search, timed
from .sim import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, help="run new schedules for this long")
    parser.add_argument("--replay", metavar="JSON", help="replay one schedule (as a failure prints it)")
    parser.add_argument("--examples", type=int, help="the CI profile's search, with this many schedules")
    args = parser.parse_args(argv)
    if args.replay:
        schedule = json.loads(args.replay)
        try:
            sim = run(schedule)
        except Violation as e:
            print(e)
            return 1
        print("\n".join(sim.world.log))
        print(f"no violation: {sim.world.steps} steps, the job {sim.operator.status.get('phase')}")
        return 0
    if args.minutes:
        began = time.monotonic()
        schedules, steps, failing = timed(args.minutes, lambda line: print(line, flush=True))
        took = time.monotonic() - began
        if failing is not None:
            try:
                run(failing)
            except Violation as e:
                print(e)
            print(f"replay: {replay_command(failing)}")
            return 1
        print(f"no violation in {schedules} schedules ({steps} steps) in {took / 60:.1f} minutes")
        return 0
    failing = search(args.examples or 1200)
    if failing is None:
        print("no violation")
        return 0
    try:
        run(failing)
    except Violation as e:
        print(e)
    print(f"replay: {replay_command(failing)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
