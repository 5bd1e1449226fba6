"""Prints what torchrun's elastic agent gave this rank, then trains until told to stop.

benchmarks/torchrun_elastic_reference.py runs it under the real torchrun with ``--nnodes MIN:MAX``
and loses and adds nodes, to record exactly what each rank is given when an elastic job shrinks
and grows (docs/design/torchrun-elastic.md). It is written as torchrun users write a script:
standard library and torch only, ``env://`` rendezvous, no SIGTERM or SIGINT handler of its own
(so the agent's signals act on it as on any user script).

On start it prints ONE line ``elastic_env {json}``: ``env`` holds every torchrun variable (each
of ``NAMES`` with its value, or null when absent, plus any other variable whose name starts with
TORCH or contains ELASTIC), ``pid`` this process, ``agent_pid`` its parent (the torchrun agent)
and ``t`` its time.time(). It then joins a gloo group and all_reduces every 0.2 s, printing
``elastic_env rank R step S`` after each step. When the file named by ``--stop-file`` exists on
any rank, the ranks agree on it through the same all_reduce (so all leave at the same step), then
barrier, destroy the group and exit 0. A failed init or collective (a peer lost) prints
``elastic_env rank R error TYPE: MESSAGE`` and the exception propagates (exit 1), as it would in
an unprepared training script. SIGUSR1 makes it dump its Python stacks to stderr (faulthandler)
and carry on.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time

NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)


def say(line: str) -> None:
    # One write per line: the ranks of an agent share its stdout, and print's separate write of
    # the newline can let another rank's line land in between.
    data = (line + "\n").encode()
    while data:
        data = data[os.write(sys.stdout.fileno(), data):]


def torchrun_env() -> dict[str, str | None]:
    env: dict[str, str | None] = {name: os.environ.get(name) for name in NAMES}
    for name, value in sorted(os.environ.items()):
        if name.startswith("TORCH") or "ELASTIC" in name:
            env[name] = value
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--interval", type=float, default=0.2)
    opts = parser.parse_args(argv)
    # SIGUSR1 dumps every thread's Python stack to stderr (the benchmark's view into a hang); it
    # touches no other signal.
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    say("elastic_env " + json.dumps(
        {"env": torchrun_env(), "pid": os.getpid(), "agent_pid": os.getppid(), "t": time.time()}
    ))

    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "-1"))
    step = 0
    try:
        dist.init_process_group("gloo")
        while True:
            flag = torch.tensor([1.0, 1.0 if os.path.exists(opts.stop_file) else 0.0])
            dist.all_reduce(flag)
            say(f"elastic_env rank {rank} step {step}")
            if flag[1].item() > 0:
                break
            step += 1
            time.sleep(opts.interval)
        dist.barrier()
    except Exception as e:  # print it for the benchmark, then fail as any script would
        say(f"elastic_env rank {rank} error {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        raise
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
