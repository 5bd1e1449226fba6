"""The launch benchmark's Monarch launcher: one driver process that spawns a local proc mesh,
sets up SPMDActor on it and runs ``benchmarks.first_allreduce`` through ``SPMDActor.main``.

    python -m benchmarks.monarch_driver --procs 4 --impl project --out DIR [--preinit S]

``--impl project`` uses this project's ``monarch_spmd.actor.SPMDActor``; ``--impl upstream`` uses
the original ``monarch.spmd.SPMDActor`` shipped in torchmonarch. Both follow the same steps a user
writes: spawn procs, spawn the actor, ask the all-zero proc for a host and port, call ``main``.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--procs", type=int, required=True)
    parser.add_argument("--impl", choices=["project", "upstream"], default="project")
    parser.add_argument("--out", required=True)
    parser.add_argument("--preinit", type=float, default=0.0, help="passed to the workload")
    args = parser.parse_args(argv)

    from monarch.actor import this_host

    if args.impl == "project":
        from monarch_spmd.actor import SPMDActor
    else:
        from monarch.spmd import SPMDActor

    procs = this_host().spawn_procs(per_host={"procs": args.procs})
    actors = procs.spawn("_SPMDActor", SPMDActor)
    first = dict.fromkeys(procs._labels, 0)
    addr, port = actors.slice(**first).get_host_port.call_one(None).get()
    script = ["-m", "benchmarks.first_allreduce", "--out", args.out]
    if args.preinit:
        script += ["--preinit", f"{args.preinit:g}"]
    actors.main.call(addr, port, script).get()
    sys.stdout.flush()
    # Tear the mesh down without waiting on graceful actor shutdown: the measurement is over.
    try:
        procs.stop().get()
    except Exception:  # noqa: BLE001 - best effort, the timing is already recorded
        pass
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
