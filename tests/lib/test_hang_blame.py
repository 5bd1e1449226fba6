"""A hung gang names the rank that hangs it, with every rank's Python stack in the output.

`monarch-spmd run --progress-timeout N` runs tests/programs/stuck_rank.py (a gloo training loop)
whose rank 1 hangs in one of three ways while ranks 0 and 2 wait for it in an all_reduce: it
sleeps, it spins in a busy loop, or it skips the rest of the loop and waits in the final barrier.
Whichever rank went silent first, the root cause must name rank 1 and where it is, and every
rank's dump must be in the output under its prefix. The runs alternate two layouts: the three
ranks in one worker (one pod: its agent judges them), and one rank in each of three workers (three
pods: the first agent to see a hang tells the coordinator, every agent freezes and dumps its rank,
and the coordinator judges all three). Each kind runs RUNS times (a few
gangs at once, started one after the other as the previous one's ranks finished importing torch,
so the imports of a loaded machine do not add up into the ranks' silence); at least NEEDED of
each kind must name rank 1.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from .conftest import cli_cmd

PROGRAMS = "tests.programs"
#: One pod of three procs; three pods of one proc each.
LAYOUTS = (("--nproc-per-node", "3"), ("--nnodes", "3", "--nproc-per-node", "1"))
RUNS = 10
NEEDED = 9
#: Longer than importing torch and joining the gloo group take on a loaded 2-core machine.
PROGRESS_TIMEOUT = "15"
AT_ONCE = 5
#: What the root cause must say for each kind of hang (after ``NoProgress (``).
KINDS = {
    "sleep": r"rank 1 is not in a collective \(at stuck_rank\.py:\d+ in main\); ranks 0, 2 wait in all_reduce",
    "spin": r"rank 1 is not in a collective \(at stuck_rank\.py:\d+ in spin\); ranks 0, 2 wait in all_reduce",
    "skip": (r"rank 1 waits in barrier \(at stuck_rank\.py:\d+ in main\), apart from its peers; "
             r"ranks 0, 2 wait in all_reduce"),
}


def _started(reader) -> bool:
    """Every rank has imported torch (it printed its first step) or the run is over."""
    return reader.proc.poll() is not None or len(re.findall(r"stuck_rank rank \d step 0", reader.text)) >= 3


def _named_rank_1(kind: str, code: int, text: str) -> str | None:
    """Why the run did not name rank 1 as it should, or None."""
    last = text.rstrip().splitlines()[-1] if text.strip() else ""
    expected = (r"^\[monarch-spmd\] job failed: rank 1 was killed by SIGABRT \(exit code 134\): NoProgress \("
                + KINDS[kind])
    if code != 134 or not re.search(expected, last):
        return f"exit code {code}, last line {last[:400]!r}"
    dumps = {int(r) for r in re.findall(r"^\[rank (\d)\] Fatal Python error: Aborted$", text, re.M)}
    if dumps != {0, 1, 2}:
        return f"dumps of ranks {sorted(dumps)} only"
    frames = re.search(r"innermost frames of rank 1: ([^;)]*)", last)
    if not frames or "stuck_rank.py:" not in frames.group(1):
        return f"no frames of rank 1 in {last!r}"
    return None


def test_the_rank_that_hangs_the_gang_is_named_in_nine_of_ten_runs_of_each_kind(spawn):
    queue = [(kind, LAYOUTS[i % len(LAYOUTS)]) for i in range(RUNS) for kind in KINDS]  # kinds interleaved
    running: list[tuple[str, tuple[str, ...], object]] = []
    misses: dict[str, list[str]] = {kind: [] for kind in KINDS}
    began = time.monotonic()
    while queue or running:
        if queue and len(running) < AT_ONCE and all(_started(r) for _, _, r in running):
            kind, layout = queue.pop(0)
            cmd = cli_cmd("run", *layout, "--progress-timeout", PROGRESS_TIMEOUT,
                          "-m", f"{PROGRAMS}.stuck_rank", "--hang", kind)
            running.append((kind, layout, spawn(cmd)))
            continue
        for item in [item for item in running if item[2].proc.poll() is not None]:
            kind, layout, reader = item
            running.remove(item)
            code = reader.finish(60)
            why = _named_rank_1(kind, code, reader.text)
            if why is not None:
                misses[kind].append(f"{' '.join(layout)}: {why}")
        time.sleep(0.1)
    rates = {kind: f"{RUNS - len(m)}/{RUNS}" for kind, m in misses.items()}
    print(f"rank 1 named: {rates} in {time.monotonic() - began:.0f}s")
    for kind, whys in misses.items():
        for why in whys:
            print(f"missed ({kind}): {why}")
    assert all(RUNS - len(m) >= NEEDED for m in misses.values()), (rates, misses)


@pytest.mark.parametrize("ranks", [2, 3])
def test_torchruns_watchdog_takes_the_stacks_too_and_names_the_rank_that_hangs(spawn, ranks):
    """Every step under ``expires(after=8)`` with torch's default SIGKILL; rank 1 sleeps outside
    its collective. Whichever rank's timer expires first (often rank 0, waiting for rank 1), its
    stack is taken with every other rank's before it ends, so the failure names rank 1, the rank
    not in a collective. With two ranks, a rank killed first would leave the rule rank 1's stack
    alone (no rank waiting), and the verdict would fall back to the expired rank."""
    env = {**os.environ, "TORCHELASTIC_ENABLE_FILE_TIMER": "1"}
    reader = spawn(cli_cmd("run", "--nproc-per-node", str(ranks), "-m", f"{PROGRAMS}.stuck_rank", "--hang", "sleep",
                           "--watchdog", "8"), env=env)
    code = reader.finish(240)
    text = reader.text
    last = text.rstrip().splitlines()[-1]
    assert re.search(r"^monarch-spmd worker: rank (\d) hangs \(WatchdogTimeout\)", text, re.M), text[-3000:]
    dumps = {int(r) for r in re.findall(r"^\[rank (\d)\] Fatal Python error: Aborted$", text, re.M)}
    assert dumps == set(range(ranks)), (dumps, text[-3000:])
    assert code == 134, text[-3000:]
    assert re.search(r"job failed: rank 1 was killed by SIGABRT \(exit code 134\): WatchdogTimeout \(rank 1 is not "
                     r"in a collective \(at stuck_rank\.py:\d+ in main\); (rank \d waits|ranks 0, 2 wait) in all_reduce", last), last
