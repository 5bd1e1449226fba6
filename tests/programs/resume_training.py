"""A training script written as people write them for torchrun: checkpoints, restarts, Ctrl-C.

* resumes from ``--checkpoint-dir`` (one JSON file per rank) when TORCHELASTIC_RESTART_COUNT says
  this is a restart, and says from which step;
* every step all-reduces a tensor over gloo (``init_process_group("gloo")`` from torchrun's env),
  so every restart proves the new processes found each other, and none of the old ones;
* rank ``--fail-rank`` exits with ``--fail-code`` at step ``--fail-step`` of the first attempt only
  (``--fail-every-attempt``: of every attempt);
* Ctrl-C (SIGINT) raises KeyboardInterrupt: the ``finally`` block saves a checkpoint and says so;
* ``--progress-bar`` writes each step as a tqdm-style ``\\r`` line (no newline until the end);
* ``--grandchild`` starts a ``sleep`` child first (a data-loader worker, say), to show that
  stopping a rank also ends what it started.

Prints ``resume_training rank R pid P restart N from step S master ADDR:PORT`` first and
``... done`` last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def save(path: str, step: int) -> None:
    """Writes the checkpoint as careful scripts do: a temporary file, then an atomic rename, so a
    rank stopped mid-write leaves the previous checkpoint, never a truncated one."""
    with open(path + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-step", type=int, default=1)
    parser.add_argument("--fail-code", type=int, default=3)
    parser.add_argument("--fail-every-attempt", action="store_true")
    parser.add_argument("--progress-bar", action="store_true")
    parser.add_argument("--grandchild", action="store_true")
    opts = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    path = os.path.join(opts.checkpoint_dir, f"rank{rank}.json")
    step = 0
    if restart > 0 and os.path.exists(path):
        with open(path) as f:
            step = json.load(f)["step"]
    print(f"resume_training rank {rank} pid {os.getpid()} restart {restart} from step {step} "
          f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    if opts.grandchild:
        child = subprocess.Popen(["sleep", "600"])
        print(f"resume_training rank {rank} grandchild pid {child.pid}", flush=True)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    try:
        while step < opts.steps:
            if rank == opts.fail_rank and step == opts.fail_step and (restart == 0 or opts.fail_every_attempt):
                print(f"resume_training rank {rank}: failing at step {step} (restart {restart})", flush=True)
                sys.stdout.flush()
                os._exit(opts.fail_code)
            total = torch.tensor([float(rank + 1)])
            dist.all_reduce(total)
            if total.item() != world * (world + 1) / 2:
                print(f"resume_training rank {rank}: all_reduce gave {total.item()}", flush=True)
                return 1
            step += 1
            save(path, step)
            if opts.progress_bar:
                sys.stderr.write(f"\rstep {step}/{opts.steps}")
                sys.stderr.flush()
            time.sleep(opts.step_seconds)
        if opts.progress_bar:
            sys.stderr.write("\n")
        print(f"resume_training rank {rank} done at step {step} (restart {restart}, all_reduce sum ok)", flush=True)
        return 0
    except KeyboardInterrupt:
        print(f"resume_training rank {rank}: KeyboardInterrupt at step {step}", flush=True)
        return 130
    finally:
        save(path, step)
        print(f"resume_training rank {rank}: checkpoint saved at step {step}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
