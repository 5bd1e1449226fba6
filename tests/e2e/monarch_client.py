"""A Monarch client, run by tests/e2e/test_monarch_mode.py as its own process (as a user runs one).

``python -m tests.e2e.monarch_client SCENARIO JOB NAMESPACE``; every finding is one line
``RESULT <json>`` on stdout, progress lines ``STEP <name>`` come as they happen. Its own process
because Monarch's client is process-wide and starts once: a pytest process that ran local
Monarch tests first has a client on Unix sockets, which no pod reaches.

Scenarios:
    runs: proc_mesh on the job, setup_torch_elastic_env and a gloo all_reduce across the pods, the
        procs' env and whereabouts, then SPMDActor.main of tests/programs/check_env.py twice.
    lost: proc_mesh, a long call (``STEP calling``; the test deletes a pod meanwhile), the error
        it ends with and how long it took, then proc_mesh_async (the new attempt) and an all_reduce.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from monarch.actor import Actor, current_rank, endpoint

from monarch_spmd import SPMDActor, setup_torch_elastic_env
from monarch_spmd.kubernetes import proc_mesh, proc_mesh_async

CHECK_ENV = str(Path(__file__).resolve().parents[1] / "programs" / "check_env.py")
CONTRACT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


class Host(Actor):
    """Says where it runs and runs gloo from the env it was given."""

    @endpoint
    def where(self) -> dict[str, Any]:
        point = current_rank()
        return {"coords": {k: int(point[k]) for k in point.extent.labels}, "pod": socket.gethostname(),
                "pid": os.getpid(), "env": {k: os.environ.get(k) for k in CONTRACT},
                "inputs": sorted(k for k in os.environ if k.startswith("MONARCH_SPMD_"))}

    @endpoint
    def allreduce(self) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
        try:
            value = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(value)
            return float(value.item())
        finally:
            dist.destroy_process_group()

    @endpoint
    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return socket.gethostname()


def say(kind: str, value: Any) -> None:
    print(f"{kind} {json.dumps(value)}", flush=True)


def values(value_mesh: Any) -> list[Any]:
    return [v for _, v in value_mesh.items()]


def runs(job: str, namespace: str) -> None:
    t0 = time.monotonic()
    mesh = proc_mesh(job, namespace, timeout=120)
    say("RESULT", {"sizes": dict(mesh.sizes), "labels": list(mesh._labels), "attach_seconds": time.monotonic() - t0})
    setup_torch_elastic_env(mesh)
    hosts = mesh.spawn("host", Host)
    say("RESULT", {"where": values(hosts.where.call().get())})
    say("RESULT", {"allreduce": values(hosts.allreduce.call().get())})
    spmd = mesh.spawn("_SPMDActor", SPMDActor)
    addr, port = spmd.slice(hosts=0, gpus=0).get_host_port.call_one(None).get()
    for run in range(2):
        t = time.monotonic()
        done = values(spmd.main.call(addr, port, [CHECK_ENV, "--mesh", "hosts=2,gpus=2", "--master-addr", addr,
                                                 "--master-port", str(port)]).get())
        say("RESULT", {"main": run, "returned": done, "seconds": time.monotonic() - t})


def lost(job: str, namespace: str) -> None:
    mesh = proc_mesh(job, namespace, timeout=120)
    hosts = mesh.spawn("host", Host)
    say("RESULT", {"before": sorted({v["pod"] for v in values(hosts.where.call().get())})})
    say("STEP", "calling")
    t = time.monotonic()
    try:
        hosts.sleep.call(120).get()
        say("RESULT", {"error": None})
    except Exception as e:  # what the user sees
        say("RESULT", {"error": type(e).__name__, "message": str(e)[:2000], "seconds": time.monotonic() - t})
    t = time.monotonic()
    again = asyncio.run(proc_mesh_async(job, namespace, timeout=180))
    say("RESULT", {"again_seconds": time.monotonic() - t, "sizes": dict(again.sizes)})
    setup_torch_elastic_env(again)
    hosts = again.spawn("host", Host)
    say("RESULT", {"after": sorted({v["pod"] for v in values(hosts.where.call().get())}),
                   "allreduce": values(hosts.allreduce.call().get())})


def main(argv: list[str]) -> int:
    scenario, job, namespace = argv
    {"runs": runs, "lost": lost}[scenario](job, namespace)
    say("STEP", "done")
    sys.stdout.flush()
    os._exit(0)  # skip Monarch's shutdown at exit: it waits on hosts a test may have taken away


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
