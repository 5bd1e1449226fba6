"""A training loop with one rank that hangs the gang, for the hang-blame tests.

Written as torchrun users write one: ``init_process_group("gloo")`` from torchrun's variables, a
loop whose every step prints a line and all_reduces a tensor, a barrier at the end. On the first
attempt rank ``--rank`` stops making progress after printing step ``--step``, in one of three
ways (``--hang``), while its peers go on into that step's all_reduce and wait for it there:

* ``sleep``: it sleeps (a blocking call outside any collective, as a stuck file read would be);
* ``spin``: it loops without end in Python (a busy loop, as an endless retry would be);
* ``skip``: it leaves the loop early (a ``break`` on a wrong condition) and waits in the final
  barrier, a different collective at a different call site than its peers'.

With ``--watchdog SECONDS`` every step runs under torchrun's watchdog
(``torch.distributed.elastic.timer.expires(after=SECONDS)``, TORCHELASTIC_ENABLE_FILE_TIMER=1 and
the agent's TORCHELASTIC_TIMER_FILE), its timers asking for ``--watchdog-signal`` (SIGKILL, as
torch's FileTimerClient does by default, or SIGABRT).

Prints ``stuck_rank rank R pid P restart N`` first and ``stuck_rank rank R done`` last.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time


def spin() -> None:
    os.nice(19)  # the lowest priority: on a loaded test machine the other ranks keep their CPU
    n = 0
    while True:  # never returns: a busy loop in Python
        n = (n * 31 + 7) % 1000003


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--step", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hang", choices=("sleep", "spin", "skip"), default="sleep")
    parser.add_argument("--watchdog", type=float, default=0.0, help="each step under expires(after=...)")
    parser.add_argument("--watchdog-signal", choices=("SIGKILL", "SIGABRT"), default="SIGKILL")
    opts = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"stuck_rank rank {rank} pid {os.getpid()} restart {restart}", flush=True)
    dist.init_process_group("gloo")
    stuck = rank == opts.rank and restart == 0
    guard = lambda scope: contextlib.nullcontext()  # noqa: E731
    if opts.watchdog:
        from torch.distributed.elastic.timer import FileTimerClient, configure, expires

        configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"], signal=signal.Signals[opts.watchdog_signal]))
        guard = lambda scope: expires(after=opts.watchdog, scope=scope)  # noqa: E731
    total = torch.zeros(1)
    for step in range(opts.steps):
        print(f"stuck_rank rank {rank} step {step}", flush=True)
        with guard(f"step{step}"):
            if stuck and step == opts.step:
                if opts.hang == "sleep":
                    time.sleep(3600)
                elif opts.hang == "spin":
                    spin()
                else:
                    break
            t = torch.ones(1) * (step + 1)
            dist.all_reduce(t)
            total += t
    dist.barrier()
    dist.destroy_process_group()
    print(f"stuck_rank rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
