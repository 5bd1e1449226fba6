"""A training script for the end-to-end tests: reports what a rank saw, then trains one step.

Prints one line ``PROBE {json}`` with the rank's contract variables, its pod IP (downward API)
and the address MASTER_ADDR resolves to, then runs a gloo all_reduce and one DDP step in one process group,
printing ``RESULT {json}``. Exits non-zero if either check fails.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from datetime import timedelta

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
        "POD_NAME", "POD_IP")


def main() -> int:
    seen = {k: os.environ.get(k) for k in KEYS}
    seen["master_ip"] = socket.gethostbyname(os.environ["MASTER_ADDR"])
    print("PROBE " + json.dumps(seen), flush=True)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(4, 2))
        gen = torch.Generator().manual_seed(1000 + rank)
        loss = torch.nn.functional.mse_loss(model(torch.randn(8, 4, generator=gen)),
                                            torch.randn(8, 2, generator=gen))
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        gathered = [torch.empty_like(grads) for _ in range(world)]
        dist.all_gather(gathered, grads)
        result = {"sum": total.item(), "expected": world * (world + 1) / 2,
                  "grads_agree": all(torch.equal(g, gathered[0]) for g in gathered)}
        print("RESULT " + json.dumps(result), flush=True)
        return 0 if result["sum"] == result["expected"] and result["grads_agree"] else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
