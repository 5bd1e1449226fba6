"""Prints a word on every rank, for the tests that read logs: ``say WORD [--kill-rank R [--signal N]]``.

Every rank prints ``WORD rank R`` and exits 0; with ``--kill-rank R`` that rank then kills itself
with signal ``--signal`` (default 9, SIGKILL), so its exit code is the signal's (128 + N).
Standard library only; joins no process group.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("word")
    parser.add_argument("--kill-rank", type=int)
    parser.add_argument("--signal", type=int, default=int(signal.SIGKILL))
    args = parser.parse_args(argv)
    rank = int(os.environ["RANK"])
    print(f"{args.word} rank {rank}", flush=True)
    if rank == args.kill_rank:
        os.kill(os.getpid(), args.signal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
