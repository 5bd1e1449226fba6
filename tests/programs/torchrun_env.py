"""Prints what this rank was given as one JSON line; with ``--gloo`` also all-reduces over gloo.

tests/lib/test_torchrun_parity.py runs it under real torchrun and under ``monarch-spmd run`` with
the same flags and compares the lines rank by rank: the whole environment (the test takes away
what the launcher itself was given), ``sys.argv`` and the working directory. The line is
``TORCHRUN_ENV {"argv": [...], "cwd": "...", "env": {...}}``. ``--gloo`` then joins a gloo group
(env://) and checks an all_reduce of RANK + 1, so MASTER_ADDR and MASTER_PORT are used for real.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    # One write of the whole line: torchrun's ranks share one pipe unbuffered (python -u), where print's
    # separate write of the newline lets another rank's line land between the two.
    line = "TORCHRUN_ENV " + json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}) + "\n"
    sys.stdout.flush()
    data = line.encode()
    while data:
        data = data[os.write(sys.stdout.fileno(), data):]
    if "--gloo" not in sys.argv[1:]:
        return 0
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    try:
        total = torch.tensor([dist.get_rank() + 1])
        dist.all_reduce(total)
        world = dist.get_world_size()
        if int(total.item()) != world * (world + 1) // 2:
            print(f"TORCHRUN_GLOO rank {dist.get_rank()}: all_reduce gave {int(total.item())}", flush=True)
            return 1
        print(f"TORCHRUN_GLOO rank {dist.get_rank()}/{world}: ok", flush=True)
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
