"""A training script written as people write them for torchrun: work first, then the process group.

Each rank prints when it started (wall clock), does ``--work`` seconds of work before
``init_process_group`` (building a model, loading data), then joins the gloo group and does one
all_reduce. ``--fail-rank R --fail-code C`` makes rank R exit with C at once instead, before any
rank opens its TCPStore. Lines: ``preinit start rank R t=<epoch seconds> pid P`` and ``preinit done
rank R sum S``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> int:
    started = time.time()
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=float, default=0.0, help="seconds of work before init_process_group")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-code", type=int, default=7)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    print(f"preinit start rank {rank} t={started:.3f} pid {os.getpid()}", flush=True)
    if rank == args.fail_rank:
        print(f"preinit rank {rank}: failing with {args.fail_code} before init_process_group", flush=True)
        return args.fail_code
    time.sleep(args.work)

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(f"preinit done rank {rank} sum {total.item():g}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
