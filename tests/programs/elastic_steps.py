"""A training loop for an elastic run (torchrun's ``--nnodes MIN:MAX``), written as torchrun users
write one: standard library and torch only, ``init_process_group("gloo")`` from torchrun's
variables, no signal handler of its own. It trains at whatever size its round has, until told to
stop.

Each rank prints ``elastic_steps rank R world W restart N pid P`` first (RANK, WORLD_SIZE,
TORCHELASTIC_RESTART_COUNT), then every ``--step-seconds`` all-reduces ``[1, stop]`` over the
gang (the first entry must sum to the world's size) and prints ``elastic_steps rank R world W
restart N step S``. Once the file ``--stop-file`` exists on any rank the ranks agree on it through
that all_reduce, so all leave at the same step, and exit 0 after ``elastic_steps rank R world W
restart N done at step S``. While the file ``--fail-file`` exists, rank ``--fail-rank`` exits with
``--code`` before its next step, in every round: a failure of the program. A collective that
breaks because a peer went raises, as in any script (exit 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--fail-file", default="")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--code", type=int, default=1)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    opts = parser.parse_args(argv)

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    who = f"elastic_steps rank {rank} world {world} restart {restart}"
    print(f"{who} pid {os.getpid()}", flush=True)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    step = 0
    while True:
        if rank == opts.fail_rank and opts.fail_file and os.path.exists(opts.fail_file):
            print(f"{who} failing with code {opts.code} at step {step}", flush=True)
            os._exit(opts.code)
        time.sleep(opts.step_seconds)
        flags = torch.tensor([1.0, 1.0 if os.path.exists(opts.stop_file) else 0.0])
        dist.all_reduce(flags)
        if flags[0].item() != world:
            print(f"{who}: all_reduce counted {flags[0].item():g} ranks, expected {world}", flush=True)
            return 1
        print(f"{who} step {step}", flush=True)
        if flags[1].item() > 0:
            break
        step += 1
    dist.barrier()
    dist.destroy_process_group()
    print(f"{who} done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
