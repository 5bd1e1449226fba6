"""A rank that leaves processes behind, as training scripts do when they crash: for the zombie tests.

Each attempt starts a torch DataLoader with two worker processes and takes one batch, starts a
``multiprocessing.Process`` and a ``subprocess.Popen`` that outlive it a moment, prints their
pids (``left N pids ...``), and ends at once without waiting for any of them (``os._exit``, as a
crash or a SIGKILL ends a process): code 3 until TORCHELASTIC_RESTART_COUNT reaches
``--restarts``, then 0 (with ``--alternate`` one rank a restart fails, the others are stopped). The last attempt first waits until every process an earlier attempt left
has ended, then counts the zombies in its PID namespace (``zombies N``): PID 1 must have reaped
them all.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _processes() -> dict[int, str]:
    """pid -> state letter of every process in this PID namespace (its own /proc)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    out[int(name)] = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds the last attempt waits at most")
    parser.add_argument("--alternate", action="store_true",
                        help="only rank RESTART %% WORLD_SIZE fails; the others wait to be stopped (a SIGTERM "
                             "ends them at once, their children left behind), so no one pod fails twice in a row")
    opts = parser.parse_args()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart >= opts.restarts:
        me, parent = os.getpid(), os.getppid()
        deadline = time.monotonic() + opts.settle
        while True:
            others = {p: s for p, s in _processes().items() if p not in (1, me, parent)}
            if not others or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        zombies = sorted(p for p, s in others.items() if s == "Z")
        print(f"leave_orphans restart {restart}: zombies {len(zombies)} others {sorted(others)}", flush=True)
        return 0

    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(torch.arange(8), batch_size=2, num_workers=2)
    batches = iter(loader)
    next(batches)
    workers = [w.pid for w in batches._workers]  # type: ignore[attr-defined]
    child = multiprocessing.get_context("fork").Process(target=_sleep, args=(0.5,))
    child.start()
    sub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    left = [*workers, child.pid, sub.pid]
    print(f"leave_orphans restart {restart}: left {len(left)} pids {left}", flush=True)
    sys.stdout.flush()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if opts.alternate and int(os.environ.get("RANK", "0")) != restart % world:
        time.sleep(600)  # stopped by the agent when the failing rank's failure stops the round
    os._exit(3)


if __name__ == "__main__":
    raise SystemExit(main())
