"""Actors the Monarch tests spawn beside SPMDActor to look inside the procs.

They live in a module (not in a test file) so that Monarch's procs can import them by name; the
procs find the repository through PYTHONPATH, set by tests/lib/conftest.py.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

from monarch.actor import Actor, endpoint

from tests.programs.check_env import CONTRACT_VARS  # the variables a rank must see


class Probe(Actor):
    """Reads a proc's process state and runs torch.distributed code with the env it was given."""

    @endpoint
    def contract_env(self) -> dict[str, str]:
        return {k: os.environ[k] for k in CONTRACT_VARS if k in os.environ}

    @endpoint
    def state(self) -> tuple[list[str], dict[str, str], list[str]]:
        return list(sys.argv), dict(os.environ), list(sys.path)

    @endpoint
    def allreduce(self) -> float:
        """All-reduce of RANK+1 over gloo, set up only from the env (init_method env://)."""
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
        try:
            value = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(value)
            return float(value.item())
        finally:
            dist.destroy_process_group()

    @endpoint
    def ddp_step(self) -> int:
        """One DDP step (monarch_spmd.examples.ddp_step), again only from the env."""
        from monarch_spmd.examples import ddp_step

        return ddp_step.main([])
