"""A rank that hangs without a word, for the progress timeout: on the first attempt, rank
``--rank`` prints one line and then stops itself (SIGSTOP, as a debugger or a stuck collective
would leave it) or sleeps silently (``--sleep``); every other rank prints a line every
``--every`` seconds for ``--seconds`` and exits 0. Prints ``hang rank R pid P restart N`` first."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--every", type=float, default=0.5)
    parser.add_argument("--sleep", action="store_true", help="sleep silently instead of SIGSTOP")
    opts = parser.parse_args(argv)
    rank = int(os.environ["RANK"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"hang rank {rank} pid {os.getpid()} restart {restart}", flush=True)
    if rank == opts.rank and restart == 0:
        print(f"hang rank {rank}: about to hang", flush=True)
        if opts.sleep:
            time.sleep(3600)
        os.kill(os.getpid(), signal.SIGSTOP)
    deadline = time.monotonic() + opts.seconds
    while time.monotonic() < deadline:
        print(f"hang rank {rank}: working", flush=True)
        time.sleep(opts.every)
    print(f"hang rank {rank} done (restart {restart})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
