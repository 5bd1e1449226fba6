"""Fails on purpose, for restart tests: rank ``--rank`` exits with ``--code``.

By default it fails only on the first attempt (TORCHELASTIC_RESTART_COUNT is 0), so a gang
restart succeeds; ``--always`` fails on every attempt. The other ranks sleep ``--sleep`` seconds
(default 0) and exit 0, so a test can see them stopped early. Every rank prints its pid first.

All ranks first join a gloo process group (as a real training script would: each waits in
init_process_group until every rank has joined), unless ``--no-rendezvous`` is given.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, default=0, help="the rank that fails (default 0)")
    parser.add_argument("--code", type=int, default=3, help="its exit code, 1..255 (default 3)")
    parser.add_argument("--always", action="store_true", help="fail on every attempt, not only the first")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds the other ranks sleep (default 0)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds the failing rank waits first")
    parser.add_argument("--no-rendezvous", dest="rendezvous", action="store_false", help="skip the gloo group")
    opts = parser.parse_args(argv)
    if not 1 <= opts.code <= 255:
        parser.error(f"--code: {opts.code} is out of range; valid is 1..255")

    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"fail_once rank {rank} pid {os.getpid()} restart {restart}", flush=True)
    if opts.rendezvous:
        from datetime import timedelta

        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
        print(f"fail_once rank {rank}: joined the gloo group", flush=True)
    if rank == opts.rank and (opts.always or restart == 0):
        time.sleep(opts.delay)
        print(f"fail_once rank {rank}: exiting with code {opts.code} (restart {restart})", flush=True)
        return opts.code
    time.sleep(opts.sleep)
    print(f"fail_once rank {rank}: done (restart {restart})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
