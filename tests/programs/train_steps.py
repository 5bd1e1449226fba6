"""A training loop as torchrun users write one, for the restart-in-place tests.

Every rank joins a gloo process group (``init_process_group("gloo")`` from torchrun's variables),
then runs ``--steps`` steps: its own work (a sleep of ``--step-seconds``), an all_reduce of
``step + 1`` over the gang (each rank checks the sum; while it waits for its peers it says so
every 0.5 s, as a training loop's logging does, unless ``--quiet-wait``), a line of output. It prints ``train_steps rank R pid P
restart N`` first (TORCHELASTIC_RESTART_COUNT) and ``train_steps rank R done restart N sum S``
last, so a test reads from the pods' logs which processes ran in which restart.

Failures on purpose, each on the attempts it names (``--fail 0:3,1:0``: restart 0 at step 3 and
restart 1 at step 0):

* ``--fail-rank R --code C``: rank R exits with code C;
* ``--hang-rank R --hang stop``: rank R stops itself (SIGSTOP: a stuck collective, a debugger);
  ``--hang sleep``: it sleeps in silence; ``--hang watchdog``: each step runs under torchrun's
  watchdog (``torch.distributed.elastic.timer.expires(after=--timeout)``, the agent serving
  TORCHELASTIC_TIMER_FILE) and rank R sleeps in it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from datetime import timedelta


def _schedule(text: str) -> dict[int, int]:
    out = {}
    for part in filter(None, text.split(",")):
        restart, _, step = part.partition(":")
        out[int(restart)] = int(step or 0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--fail", default="", help="restart:step pairs, comma-separated")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--code", type=int, default=3)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang", choices=("stop", "sleep", "watchdog"), default="stop")
    parser.add_argument("--timeout", type=float, default=3.0, help="the watchdog's expires(after=...)")
    parser.add_argument("--quiet-wait", action="store_true",
                        help="all_reduce as most scripts do: blocked in the collective, saying nothing")
    opts = parser.parse_args(argv)
    schedule = _schedule(opts.fail)

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"train_steps rank {rank} pid {os.getpid()} restart {restart} world {world}", flush=True)
    import torch
    import torch.distributed as dist

    print(f"train_steps rank {rank} imported torch", flush=True)
    guard = lambda scope: contextlib.nullcontext()  # noqa: E731
    if opts.hang == "watchdog":
        from torch.distributed.elastic.timer import FileTimerClient, configure, expires

        configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        guard = lambda scope: expires(after=opts.timeout, scope=scope)  # noqa: E731
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
    total = 0.0
    for step in range(opts.steps):
        with guard(f"step{step}"):  # the step's own work (the watchdog's scope), then the collective
            if schedule.get(restart) == step:
                if rank == opts.fail_rank:
                    print(f"train_steps rank {rank}: failing with code {opts.code} at step {step} (restart {restart})",
                          flush=True)
                    os._exit(opts.code)
                if rank == opts.hang_rank:
                    print(f"train_steps rank {rank}: hanging at step {step} (restart {restart})", flush=True)
                    if opts.hang == "stop":
                        os.kill(os.getpid(), signal.SIGSTOP)
                    time.sleep(3600)
            time.sleep(opts.step_seconds)
        value = torch.tensor([float(step + 1)])
        if opts.quiet_wait:
            dist.all_reduce(value)  # as most scripts call it: blocked in the collective, silent
        else:
            work = dist.all_reduce(value, async_op=True)
            said = time.monotonic()
            while not work.is_completed():  # a training loop that logs while it waits for its peers
                time.sleep(0.02)
                if time.monotonic() - said >= 0.5:
                    print(f"train_steps rank {rank} waiting in step {step}", flush=True)
                    said = time.monotonic()
            work.wait()
        expected = float(world * (step + 1))
        if value.item() != expected:
            print(f"train_steps rank {rank}: all_reduce gave {value.item()}, expected {expected}", flush=True)
            return 1
        total += value.item()
        print(f"train_steps rank {rank} step {step} restart {restart} sum {value.item():g}", flush=True)
    dist.destroy_process_group()
    print(f"train_steps rank {rank} done restart {restart} sum {total:g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
