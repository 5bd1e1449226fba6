"""An NCCL all_reduce as GPU training scripts start: set_device(LOCAL_RANK), then the process group.

Prints ``nccl rank R local L device D (NAME): sum S (expected E)`` and exits 1 on a wrong sum.
Needs a CUDA build of torch and a GPU per local rank.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta


def main() -> int:
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)], device="cuda")
    dist.all_reduce(total)
    expected = world * (world + 1) / 2
    name = torch.cuda.get_device_name(local)
    print(f"nccl rank {rank} local {local} device {torch.cuda.current_device()} ({name}): "
          f"sum {total.item():g} (expected {expected:g}), nccl {'.'.join(map(str, torch.cuda.nccl.version()))}",
          flush=True)
    dist.destroy_process_group()
    return 0 if total.item() == expected else 1


if __name__ == "__main__":
    sys.exit(main())
