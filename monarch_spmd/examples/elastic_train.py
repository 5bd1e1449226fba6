"""Training that survives a change of size: torchrun ``--nnodes MIN:MAX``, or an SPMDJob whose
mesh[0] has a ``minSize``. Written as people write scripts for torchrun: ``env://`` rendezvous,
standard library and torch only, no signal handler of its own.

When a node is lost (or comes back) every rank is stopped and started again in a new round, with
a new WORLD_SIZE, RANK and GROUP_RANK. What the script must do to carry on:

1. **Keep the state in a checkpoint that outlives the processes**, written only from a complete
   step: here rank 0 writes ``state.json`` into ``--checkpoint-dir`` after every step, to a
   temporary file renamed over the old one (a rank stopped mid-write leaves the previous
   checkpoint). On every start rank 0 reads it and broadcasts it to the others, so only rank 0's
   pod needs the directory (pod 0 is in every round); a volume every pod mounts (ReadWriteMany)
   also survives the gang being recreated.
2. **Reshard on every start, from WORLD_SIZE and RANK as they are now.** The global batch stays
   ``--global-batch`` samples per step whatever the size; rank r takes the samples i with
   ``i % WORLD_SIZE == r``. Gradients are summed over the ranks (all_reduce) and divided by the
   global batch, so a step's update is the same at any size: the model after N steps does not
   depend on the sizes the job ran at. (With data-parallel optimizers the same holds when the
   learning rate follows the global batch, not the per-rank one.)
3. **Read nothing from the previous round's ranks**: the process group is new every round.

The model: a vector ``w`` fitting y = w_true . x on a fixed synthetic dataset (least squares).
Each start prints ONE line ``elastic_train start {json}`` (the torchrun variables, the pid, the
step it resumes from); every ``--report-every`` steps rank 0 prints ``elastic_train step S world
W``; at the end rank 0 recomputes every step on one process and prints ``elastic_train done at
step S: w matches a run at one fixed size`` (or exits 1 when it does not).

Run it locally as torchrun would: ``monarch-spmd run --nnodes 1:2 --nproc-per-node 2 -m
monarch_spmd.examples.elastic_train --checkpoint-dir /tmp/ckpt``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

#: torchrun's variables each start reports.
REPORTED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_RUN_ID")
DIM = 8
SAMPLES = 4096


def sample(i: int) -> tuple[list[float], float]:
    """Sample ``i`` of the dataset: x from a fixed integer hash, y = w_true . x."""
    x = [((i * 2654435761 + j * 40503) % 1000) / 1000.0 - 0.5 for j in range(DIM)]
    return x, sum((j + 1) * 0.1 * v for j, v in enumerate(x))


def gradient(w: list[float], indices: range | list[int]) -> list[float]:
    """The sum over ``indices`` of d/dw (w.x - y)^2."""
    g = [0.0] * DIM
    for i in indices:
        x, y = sample(i % SAMPLES)
        err = sum(a * b for a, b in zip(w, x)) - y
        for j in range(DIM):
            g[j] += 2.0 * err * x[j]
    return g


def step_indices(step: int, global_batch: int) -> range:
    return range(step * global_batch, (step + 1) * global_batch)


def save(path: str, state: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(path + ".tmp", path)


def load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"step": 0, "w": [0.0] * DIM, "sizes": []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--report-every", type=int, default=10)
    opts = parser.parse_args(argv)
    os.makedirs(opts.checkpoint_dir, exist_ok=True)

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    path = os.path.join(opts.checkpoint_dir, "state.json")
    state = load(path) if rank == 0 else {"step": 0, "w": [0.0] * DIM, "sizes": []}
    env = {k: os.environ.get(k) for k in REPORTED}
    print("elastic_train start " + json.dumps({"env": env, "pid": os.getpid(),
                                                "step": state["step"] if rank == 0 else None}, sort_keys=True),
          flush=True)
    dist.init_process_group("gloo")
    head = torch.tensor([float(state["step"]), *state["w"]], dtype=torch.float64)
    dist.broadcast(head, 0)  # rank 0's checkpoint is everyone's state
    step, w = int(head[0].item()), head[1:].tolist()
    sizes = list(state.get("sizes") or [])
    if not sizes or sizes[-1][1] != world:
        sizes.append([step, world])
    while step < opts.steps:
        mine = [i for i in step_indices(step, opts.global_batch) if i % world == rank]  # this round's shard
        g = torch.tensor(gradient(w, mine), dtype=torch.float64)
        dist.all_reduce(g)
        w = [a - opts.lr * b / opts.global_batch for a, b in zip(w, g.tolist())]
        step += 1
        if rank == 0:
            save(path, {"step": step, "w": w, "sizes": sizes})
            if step % opts.report_every == 0:
                print(f"elastic_train step {step} world {world}", flush=True)
        time.sleep(opts.step_seconds)
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return 0
    ref = [0.0] * DIM
    for s in range(opts.steps):
        ref = [a - opts.lr * b / opts.global_batch for a, b in zip(ref, gradient(ref, step_indices(s, opts.global_batch)))]
    worst = max(abs(a - b) for a, b in zip(w, ref))
    sizes_text = ", ".join(f"{n} ranks from step {s}" for s, n in sizes)
    if worst > 1e-9:
        print(f"elastic_train: w differs from a run at one fixed size by {worst:.3g} ({sizes_text})", flush=True)
        return 1
    print(f"elastic_train done at step {step}: w matches a run at one fixed size ({sizes_text})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
