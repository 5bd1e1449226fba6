"""torchrun's watchdog as a script uses it: each step under ``expires(after=...)``.

With TORCHELASTIC_ENABLE_FILE_TIMER=1 the agent (torchrun's, or monarch-spmd's worker) serves
the pipe named by TORCHELASTIC_TIMER_FILE; this script configures torch's FileTimerClient on it
and runs ``--steps`` steps, each inside ``expires(after=--timeout)``. Rank ``--hang-rank`` hangs
(sleeps an hour) in step ``--hang-step`` of the first attempt, so its timer expires and the agent
kills it. Prints ``watchdog_hang rank R pid P restart N timer FILE`` first and ``... done`` last.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=1)
    opts = parser.parse_args(argv)

    from torch.distributed.elastic.timer import FileTimerClient, configure, expires

    rank = int(os.environ["RANK"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    path = os.environ["TORCHELASTIC_TIMER_FILE"]
    print(f"watchdog_hang rank {rank} pid {os.getpid()} restart {restart} timer {path}", flush=True)
    configure(FileTimerClient(path))
    for step in range(opts.steps):
        with expires(after=opts.timeout, scope=f"step{step}"):
            if rank == opts.hang_rank and step == opts.hang_step and restart == 0:
                print(f"watchdog_hang rank {rank}: hanging in step {step}", flush=True)
                time.sleep(3600)
            time.sleep(0.1)
    print(f"watchdog_hang rank {rank} done (restart {restart})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
