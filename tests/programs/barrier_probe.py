"""Records when each process of each attempt starts and ends, for the restart barrier's test.

Appends one JSON line per event to ``--log`` (``{"event": "start"|"exit", "rank", "restart",
"pid", "t"}``, ``t`` from time.time()). On the first attempt rank ``--fail-rank`` exits with 3 at
once, and every other rank takes ``--stop-seconds`` to exit after SIGTERM (a checkpoint being
saved); on later attempts every rank exits 0 at once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def record(path: str, event: str, rank: int, restart: int) -> None:
    line = json.dumps({"event": event, "rank": rank, "restart": restart, "pid": os.getpid(), "t": time.time()})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--stop-seconds", type=float, default=2.0)
    opts = parser.parse_args(argv)
    rank = int(os.environ["RANK"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    record(opts.log, "start", rank, restart)
    print(f"barrier_probe rank {rank} pid {os.getpid()} restart {restart}", flush=True)
    if restart > 0:
        record(opts.log, "exit", rank, restart)
        return 0
    if rank == opts.fail_rank:
        time.sleep(0.5)
        record(opts.log, "exit", rank, restart)
        return 3
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    while not stopping:
        time.sleep(0.05)
    time.sleep(opts.stop_seconds)
    record(opts.log, "exit", rank, restart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
