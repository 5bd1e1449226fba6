"""The launch benchmark's workload: join a gloo group, do one all_reduce, record when it finished.

Every launcher runs this same module (``-m benchmarks.first_allreduce --out DIR [--preinit S]``).
Each rank writes ``DIR/rank-<RANK>.json`` with the wall-clock time (``time.time()``) at which the
module started running (``t_start``, before anything is imported) and right after its first
all_reduce completed, the all_reduce's result and the world size, so the caller can check that
the collective really ran, subtract its own start timestamp and see the ranks' start skew.

``--preinit S``: the rank first imports torch and works for S seconds (a sleep standing in for
building the model and loading data) before ``init_process_group``, as scripts written for
torchrun do; the launcher's start skew then shows up in the total.
"""

from __future__ import annotations

import time

T_START = time.time()  # first: when this rank's program began, whatever launched it

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="folder for rank-<RANK>.json")
    parser.add_argument("--preinit", type=float, default=0.0,
                        help="seconds of work (sleep) after importing torch, before init_process_group")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    if args.preinit > 0:
        time.sleep(args.preinit)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1)
    dist.all_reduce(t)
    done = time.time()
    record = {
        "rank": rank,
        "world_size": world,
        "t_start": T_START,
        "t_first_allreduce": done,
        "sum": float(t.item()),
        "pid": os.getpid(),
        "env_rank": os.environ.get("RANK"),
    }
    os.makedirs(args.out, exist_ok=True)
    tmp = os.path.join(args.out, f".rank-{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(args.out, f"rank-{rank}.json"))
    dist.destroy_process_group()


if __name__ == "__main__":
    # No SystemExit on success: under the original monarch.spmd SPMDActor.main, a SystemExit(0)
    # from the script aborts the actor; falling off the end works under every launcher.
    main()
