"""The trivial training program of benchmarks/inplace_local.py: as little as a rank can be.

``--ready-dir DIR``: write the process's pid to ``DIR/<restart>.<rank>`` first.

``--mode sleep``: turn into ``sleep`` (exec), so a
thousand ranks hold a few MiB each and no CPU while the benchmark measures the agents.

``--mode steps``: a rank that works in steps of ``--step`` seconds, printing one line per step
(progress for the progress timeout). With ``--ready-dir``, the ranks of a restart step together as
a collective would make them: each waits for every rank's previous step (files in the folder), so
one rank stopped stops the gang's output, as a hang in training does. With ``--watchdog SECONDS``, arming torchrun's file timer
around each step: one JSON request line per acquire and release on TORCHELASTIC_TIMER_FILE, the
exact format torch's FileTimerClient writes (written here with the standard library, so the
benchmark does not import torch into every rank; tests/lib/test_agent.py uses torch's own client).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def timer_request(path: str, scope: str, expires: float, sig: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, (json.dumps({"version": 1, "pid": os.getpid(), "scope_id": scope, "expiration_time": expires,
                                  "signal": sig}) + "\n").encode())
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("sleep", "steps"), default="sleep")
    parser.add_argument("--ready-dir")
    parser.add_argument("--sleep", type=float, default=3600.0)
    parser.add_argument("--step", type=float, default=0.5)
    parser.add_argument("--watchdog", type=float, default=0.0)
    opts = parser.parse_args(argv)
    rank, restart = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    if opts.ready_dir:  # <restart>.<rank> holds the pid (a sleep execs in place: the same pid)
        fd = os.open(os.path.join(opts.ready_dir, f".{restart}.{rank}"), os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.rename(os.path.join(opts.ready_dir, f".{restart}.{rank}"), os.path.join(opts.ready_dir, f"{restart}.{rank}"))
    if opts.mode == "sleep":
        os.execvp("sleep", ["sleep", f"{opts.sleep:g}"])
    path = os.environ.get("TORCHELASTIC_TIMER_FILE", "")
    print(f"rank {rank} pid {os.getpid()} restart {restart}", flush=True)
    step = 0
    while True:
        if opts.watchdog:
            timer_request(path, "step", time.time() + opts.watchdog, int(signal.SIGKILL))
        time.sleep(opts.step)
        if opts.watchdog:
            timer_request(path, "step", -1, 0)
        step += 1
        if opts.ready_dir:
            barrier(opts.ready_dir, restart, rank, step)
        print(f"rank {rank} step {step}", flush=True)


def barrier(folder: str, restart: str, rank: str, step: int) -> None:
    """Step ``step`` of this rank, once every rank of the restart finished the one before: a
    collective's coupling, with files (no torch in the benchmark's ranks)."""
    folder = os.path.join(folder, "steps")  # beside the pid files, not among them
    os.makedirs(folder, exist_ok=True)
    mine = os.path.join(folder, f"{restart}.{rank}")
    with open(mine + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(mine + ".tmp", mine)
    world = int(os.environ["WORLD_SIZE"])
    while True:
        steps = []
        for r in range(world):
            try:
                with open(os.path.join(folder, f"{restart}.{r}")) as f:
                    steps.append(int(f.read() or 0))
            except (FileNotFoundError, ValueError):
                steps.append(0)
        if min(steps) >= step - 1:
            return
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
