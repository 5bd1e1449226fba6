"""A torchft training loop as torchft's examples write one, for the replica-group tests.

It never calls ``init_process_group``: torchft's Manager opens the TCPStore at MASTER_ADDR:MASTER_PORT
as a client (the agent store) and joins the Lighthouse named by TORCHFT_LIGHTHOUSE; the group's
DDP and optimizer step through the Manager's quorum. Every rank prints its environment first,
then one line per step with the wall-clock time, its pid and attempt, so a test can order what
the groups did without sleeping:

    torchft_train group G rank R pid P attempt A step S participants N t T w W

(W: the sum of the model's parameters after the step: the same in every group at a step all of
them took part in, once torchft has healed a group that came back.)

Faults, each for one rank of one group (``--*-group`` and ``--*-rank``):

* ``--crash-step K --marker PATH``: SIGKILL itself at step K once (PATH is created first, so the
  restarted rank goes on). With ``--progress-dir`` the restarted ranks of that group start
  training only once every other group has logged ``--behind`` steps more than when it crashed:
  the others provably stepped while it was down.
* ``--fail-step K --code C``: exit with code C at step K, on every attempt.

``--progress-dir``: rank 0 of every group writes its last step to ``DIR/group<G>``.

The last line of each rank is ``torchft_train group G rank R done weights W``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta


def progress(directory: str, group: int) -> int:
    try:
        with open(os.path.join(directory, f"group{group}")) as f:
            return int(f.read().strip() or -1)
    except (OSError, ValueError):
        return -1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--crash-group", type=int, default=-1)
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument("--crash-step", type=int, default=-1)
    p.add_argument("--marker", default="")
    p.add_argument("--fail-group", type=int, default=-1)
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-step", type=int, default=-1)
    p.add_argument("--code", type=int, default=1)
    p.add_argument("--progress-dir", default="")
    p.add_argument("--behind", type=int, default=3)
    opts = p.parse_args(argv)

    group = int(os.environ["REPLICA_GROUP_ID"])
    groups = int(os.environ["NUM_REPLICA_GROUPS"])
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"torchft_train env group {group} rank {rank} pid {os.getpid()} attempt {attempt} "
          + " ".join(f"{k}={os.environ.get(k)}" for k in ("REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS", "TORCHFT_LIGHTHOUSE",
                                                          "TORCHELASTIC_USE_AGENT_STORE", "MASTER_PORT", "WORLD_SIZE")),
          flush=True)
    if group == opts.crash_group and opts.marker and os.path.exists(opts.marker) and opts.progress_dir:
        with open(opts.marker) as f:
            seen = {int(g): int(s) for g, s in (item.split(":") for item in f.read().split())}
        deadline = time.monotonic() + 120
        while any(progress(opts.progress_dir, g) < s + opts.behind for g, s in seen.items()):
            if time.monotonic() > deadline:
                print(f"torchft_train group {group} rank {rank}: the other groups did not step on", flush=True)
                return 3
            time.sleep(0.05)

    import torch
    from torch import nn, optim
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    torch.manual_seed(0)
    m = nn.Linear(4, 2)
    manager = Manager(pg=ProcessGroupGloo(), min_replica_size=1, load_state_dict=m.load_state_dict,
                      state_dict=m.state_dict, replica_id=f"train_ft_{group}", timeout=timedelta(seconds=30))
    m = DistributedDataParallel(manager, m)
    opt = optim.SGD(m.parameters(), lr=0.01)
    opt = Optimizer(manager, opt)
    while manager.current_step() < opts.steps:
        step = manager.current_step()
        if group == opts.crash_group and rank == opts.crash_rank and step == opts.crash_step \
                and opts.marker and not os.path.exists(opts.marker):
            with open(opts.marker, "w") as f:  # the others' progress now, for the restarted ranks
                f.write(" ".join(f"{g}:{progress(opts.progress_dir, g)}" for g in range(groups) if g != group)
                        if opts.progress_dir else "")
            print(f"torchft_train group {group} rank {rank} pid {os.getpid()} crashing at step {step} "
                  f"t {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if group == opts.fail_group and rank == opts.fail_rank and step == opts.fail_step:
            print(f"torchft_train group {group} rank {rank} exiting with code {opts.code} at step {step}", flush=True)
            return opts.code
        opt.zero_grad()
        m(torch.rand(8, 4)).sum().backward()
        opt.step()
        weights = sum(float(p.detach().double().sum()) for p in m.parameters())
        print(f"torchft_train group {group} rank {rank} pid {os.getpid()} attempt {attempt} "
              f"step {manager.current_step()} participants {manager.num_participants()} t {time.time():.3f} "
              f"w {weights:.10f}", flush=True)
        if rank == 0 and opts.progress_dir:
            path = os.path.join(opts.progress_dir, f"group{group}")
            with open(path + ".tmp", "w") as f:
                f.write(str(manager.current_step()))
            os.replace(path + ".tmp", path)
        time.sleep(opts.step_seconds)
    weights = sum(float(p.detach().double().sum()) for p in m.parameters())
    print(f"torchft_train group {group} rank {rank} done weights {weights:.10f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
