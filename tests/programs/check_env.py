"""Checks every torchrun contract variable of this process against the mesh; exits 1 on a mismatch.

The expected values are computed here independently of ``monarch_spmd.payload.contract`` (this file uses
only the standard library, and torch with ``--gloo``), from the options below where given:

==========================  ============================  =========================================
expectation                 option                        otherwise
==========================  ============================  =========================================
mesh                        ``--mesh hosts=2,gpus=2``     [GROUP_WORLD_SIZE, LOCAL_WORLD_SIZE]: the
                                                          variables must then agree with each other
coordinates                 (none)                        from RANK
local-rank scope            ``--local-rank-scope``        mesh
master address / port       ``--master-addr/-port``       any
restart count / limit       ``--restart-count/--max-..``  any
run id                      ``--run-id``                  any non-empty
role name                   ``--role-name``               "default"
OMP_NUM_THREADS             ``--omp-num-threads``         "1" when LOCAL_WORLD_SIZE > 1, else any
==========================  ============================  =========================================

It also checks that no MONARCH_SPMD_* variable (the worker's own inputs) reached the program, as
torchrun's workers see only torchrun's variables and their own environment.

Then it joins a gloo process group (env://) and checks that the ranks gathered from all procs are
exactly 0..WORLD_SIZE-1: this exercises MASTER_ADDR/MASTER_PORT for real, and under the worker it
makes every rank wait in init_process_group for rank 0's TCPStore, as under torchrun.
``--no-gloo`` checks the variables only (one proc, or procs whose env was set without a worker,
such as Monarch's ``setup_torch_elastic_env``). Prints one line per rank.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

CONTRACT_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
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
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)


def _mesh(text: str) -> list[tuple[str, int]]:
    dims = []
    for part in text.split(","):
        name, _, size = part.partition("=")
        dims.append((name.strip(), int(size)))
    return dims


def expected_env(opts: argparse.Namespace, env: dict[str, str]) -> tuple[dict[str, str | None], list[str]]:
    """The expected value of each contract variable (None: any non-empty value) and problems."""
    problems = [f"{k} reached the program (the worker's inputs must not)" for k in sorted(env)
                if k.startswith("MONARCH_SPMD_")]
    if opts.mesh:
        mesh = _mesh(opts.mesh)
    else:
        try:
            local = int(env.get("LOCAL_WORLD_SIZE", ""))
            mesh = [("group", int(env.get("WORLD_SIZE", "")) // local), ("local", local)]
        except (ValueError, ZeroDivisionError):
            return {}, [*problems, "no mesh: pass --mesh NAME=SIZE,... (WORLD_SIZE/LOCAL_WORLD_SIZE do not give one)"]
    sizes = [s for _, s in mesh]
    world = math.prod(sizes)
    try:
        rank = int(env.get("RANK", ""))
    except ValueError:
        return {}, [*problems, f"RANK={env.get('RANK')!r} is not an integer"]
    coords, r = [], rank
    for size in reversed(sizes):
        r, c = divmod(r, size)
        coords.append(c)
    coords.reverse()
    scope = opts.local_rank_scope or "mesh"
    local_world = 1 if scope == "pod" else sizes[-1]
    local_rank = 0 if scope == "pod" else coords[-1]

    def pick(option: object, default: str | None) -> str | None:
        return str(option) if option is not None else default

    if local_world > 1:
        omp = str(opts.omp_num_threads) if opts.omp_num_threads is not None else "1"
    else:
        omp = str(opts.omp_num_threads) if opts.omp_num_threads is not None else "*"
    want: dict[str, str | None] = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // local_world),
        "GROUP_WORLD_SIZE": str(world // local_world),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": pick(opts.role_name, "default"),
        "MASTER_ADDR": pick(opts.master_addr, None),
        "MASTER_PORT": pick(opts.master_port, None),
        "TORCHELASTIC_RESTART_COUNT": pick(opts.restart_count, None),
        "TORCHELASTIC_MAX_RESTARTS": pick(opts.max_restarts, None),
        "TORCHELASTIC_RUN_ID": pick(opts.run_id, None),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": omp,
    }
    return want, problems


def check(want: dict[str, str | None], env: dict[str, str]) -> list[str]:
    """Mismatches between ``want`` and ``env``, one message per variable."""
    problems = []
    for var in CONTRACT_VARS:
        expected = want.get(var)
        got = env.get(var)
        if expected == "*":
            continue
        if got is None or got == "":
            problems.append(f"{var} is not set" + (f"; expected {expected!r}" if expected else ""))
        elif expected is not None and got != expected:
            problems.append(f"{var}={got!r}; expected {expected!r}")
    port = env.get("MASTER_PORT", "")
    if port and (not port.isdigit() or not 1 <= int(port) <= 65535):
        problems.append(f"MASTER_PORT={port!r} is not a port in 1..65535")
    return problems


def gloo_check(timeout: float) -> list[str]:
    """Joins a gloo group and checks the gathered ranks are exactly 0..WORLD_SIZE-1."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout))
    try:
        world = dist.get_world_size()
        mine = torch.tensor([dist.get_rank()])
        ranks = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(ranks, mine)
        got = sorted(int(r.item()) for r in ranks)
        return [] if got == list(range(world)) else [f"gloo all_gather of ranks gave {got}"]
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Checks the torchrun contract variables.")
    parser.add_argument("--mesh", help="ordered mesh NAME=SIZE,...; default [GROUP_WORLD_SIZE, LOCAL_WORLD_SIZE]")
    parser.add_argument("--local-rank-scope", choices=["mesh", "pod"])
    parser.add_argument("--master-addr")
    parser.add_argument("--master-port", type=int)
    parser.add_argument("--restart-count", type=int)
    parser.add_argument("--max-restarts", type=int)
    parser.add_argument("--run-id")
    parser.add_argument("--role-name")
    parser.add_argument("--omp-num-threads", type=int)
    parser.add_argument("--no-gloo", dest="gloo", action="store_false", help="skip the gloo all_gather of ranks")
    parser.add_argument("--timeout", type=float, default=120.0, help="gloo rendezvous timeout (seconds)")
    opts = parser.parse_args(argv)

    env = dict(os.environ)
    want, problems = expected_env(opts, env)
    if not problems:
        problems = check(want, env)
    if not problems and opts.gloo:
        problems = gloo_check(opts.timeout)
    rank, world = env.get("RANK", "?"), env.get("WORLD_SIZE", "?")
    if problems:
        for p in problems:
            print(f"check_env rank {rank}/{world}: MISMATCH {p}", file=sys.stderr, flush=True)
        return 1
    summary = " ".join(f"{v}={env.get(v, '')}" for v in CONTRACT_VARS[:6])
    print(f"check_env rank {rank}/{world}: ok, {len(CONTRACT_VARS)} variables checked ({summary})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
