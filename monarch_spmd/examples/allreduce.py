"""All-reduce of rank+1 over gloo; checks the sum is WORLD_SIZE*(WORLD_SIZE+1)/2.

Run under any launcher that sets the torchrun variables, e.g.
``monarch-spmd run --mesh hosts=2,gpus=2 -- -m monarch_spmd.examples.allreduce``.
Prints one line per rank; exits 1 when the sum is wrong.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for the rendezvous and the collective")
    opts = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=opts.timeout))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        expected = world * (world + 1) / 2
        got = float(value.item())
        print(f"allreduce rank {rank}/{world}: sum {got:g} (expected {expected:g})", flush=True)
        if got != expected:
            print(f"allreduce rank {rank}: WRONG sum {got:g}, expected {expected:g}", file=sys.stderr, flush=True)
            return 1
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
