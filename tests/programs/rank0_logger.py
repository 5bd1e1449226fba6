"""Training as most scripts are written for torchrun: every rank all_reduces each step, and only
rank 0 prints (every ``--log-every`` steps). The other ranks say nothing from start to end: they
are not hung, their collectives complete. Exits 0 after ``--steps`` steps, every rank having
checked each step's sum. With ``--hang-rank R --hang-step S``, rank R sleeps for an hour before
step S (outside any collective: a real hang), and the others block in that step's all_reduce."""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--log-every", type=int, default=1)
    parser.add_argument("--hang-rank", type=int)
    parser.add_argument("--hang-step", type=int, default=0)
    opts = parser.parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(opts.steps):
        if rank == opts.hang_rank and step == opts.hang_step:
            time.sleep(3600)
        t = torch.tensor([float(step + 1)])
        dist.all_reduce(t)
        if t.item() != (step + 1) * world:
            raise SystemExit(f"rank {rank}: step {step} sum {t.item()} != {(step + 1) * world}")
        if rank == 0 and step % opts.log_every == 0:
            print(f"step {step} loss {1.0 / (step + 1):.4f}", flush=True)
        time.sleep(opts.step_seconds)
    dist.destroy_process_group()
    if rank == 0:
        print(f"done after {opts.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
