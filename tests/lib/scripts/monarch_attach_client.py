"""Attaches to local Monarch-mode workers as monarch_spmd.kubernetes does to pods; prints JSON.

``python monarch_attach_client.py [--async] MESH ADDRESS...`` (MESH like ``dp=1,hosts=2,gpus=1``):
builds the JobHosts a job of that mesh would have, attaches with ``monarch_spmd.kubernetes.attach``
(``attach_async`` and ``setup_torch_elastic_env_async`` with --async; client on 127.0.0.1), runs
setup_torch_elastic_env and prints, per proc, its Monarch
coordinates, its worker's pid and the torchrun variables it got. Its own process: Monarch's client
is process-wide and starts once.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from monarch.actor import Actor, current_rank, endpoint

from monarch_spmd import parse_mesh, setup_torch_elastic_env, setup_torch_elastic_env_async
from monarch_spmd.kubernetes import JobHosts, attach, attach_async


class Where(Actor):
    @endpoint
    def where(self) -> dict:
        point = current_rank()
        return {"coords": [int(point[k]) for k in point.extent.labels], "labels": list(point.extent.labels),
                "host_pid": os.getppid(),
                "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "WORLD_SIZE")}}


async def shaped_async(hosts: JobHosts) -> dict:
    procs = await attach_async(hosts, timeout=120, client_address="127.0.0.1")
    await setup_torch_elastic_env_async(procs)
    where = await procs.spawn("where", Where).where.call()
    return {"sizes": dict(procs.sizes), "procs": [v for _, v in where.items()]}


def main(argv: list[str]) -> int:
    use_async = argv[0] == "--async"
    argv = argv[1:] if use_async else argv
    mesh = tuple(parse_mesh(argv[0]))
    addresses = tuple(argv[1:])
    hosts = JobHosts(name="local", namespace="ns", uid="u", restart=0, mesh=mesh,
                     pods=tuple(f"pod-{i}" for i in range(len(addresses))), addresses=addresses)
    if use_async:
        out = asyncio.run(shaped_async(hosts))
    else:
        procs = attach(hosts, timeout=120, client_address="127.0.0.1")
        setup_torch_elastic_env(procs)
        out = {"sizes": dict(procs.sizes),
               "procs": [v for _, v in procs.spawn("where", Where).where.call().get().items()]}
    print(json.dumps(out), flush=True)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
