"""One DistributedDataParallel step on a tiny linear model over gloo; checks ranks agree.

Every rank feeds different data; after backward the gradients, and after the optimizer step
the parameters, must be identical on every rank (DDP averages gradients). Exits 1 if not.
"""

from __future__ import annotations

import sys
from datetime import timedelta


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
        model = DistributedDataParallel(torch.nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(1000 + rank)  # different data on every rank
        x = torch.randn(8, 4, generator=gen)
        y = torch.randn(8, 2, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        gathered = [torch.empty_like(grads) for _ in range(world)]
        dist.all_gather(gathered, grads)
        grads_agree = all(torch.equal(g, gathered[0]) for g in gathered)
        optimizer.step()
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.empty_like(params) for _ in range(world)]
        dist.all_gather(gathered, params)
        params_agree = all(torch.equal(p, gathered[0]) for p in gathered)
        print(
            f"ddp_step rank {rank}/{world}: loss {loss.item():.4f}, grads agree {grads_agree}, "
            f"params agree {params_agree}",
            flush=True,
        )
        return 0 if grads_agree and params_agree else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
