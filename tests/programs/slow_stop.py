"""Runs until SIGTERM, then "checkpoints" for ``--stop-seconds`` before it exits (code 0).

How training scripts that save a checkpoint on SIGTERM behave; used to keep an old gang's pods
terminating for a while. Prints ``slow_stop rank R ready pid P`` and, on SIGTERM,
``slow_stop rank R checkpointing``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

stopping = False


def on_term(_signum: int, _frame: object) -> None:
    global stopping
    stopping = True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-seconds", type=float, default=15.0)
    parser.add_argument("--run-seconds", type=float, default=3600.0)
    args = parser.parse_args()
    rank = os.environ.get("RANK", "?")
    signal.signal(signal.SIGTERM, on_term)
    print(f"slow_stop rank {rank} ready pid {os.getpid()}", flush=True)
    deadline = time.monotonic() + args.run_seconds
    while not stopping and time.monotonic() < deadline:
        time.sleep(0.1)
    if stopping:
        print(f"slow_stop rank {rank} checkpointing", flush=True)
        time.sleep(args.stop_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
