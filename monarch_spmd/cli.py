"""The ``monarch-spmd`` command: the top layer of the library, a thin dispatcher.

Subcommands::

    monarch-spmd run --mesh hosts=2,gpus=2 [options] -- -m train --lr 0.001
    monarch-spmd run -f job.yaml [options] [-- ARGV]       # the SPMDJob manifest kubectl applies
    monarch-spmd worker -- -m train --lr 0.001             # the in-pod worker (see worker.py)
    monarch-spmd logs JOB [--rank R] [-f]                   # every rank's log of an SPMDJob

Everything after the first ``--`` is the training argv, passed on untouched. ``run`` is
:mod:`monarch_spmd.runner`, ``worker`` is :mod:`monarch_spmd.payload.worker`, ``logs`` is
:mod:`monarch_spmd.logs`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import runner
from .payload import names, worker

USAGE = """usage: monarch-spmd {run,worker,logs,validate} ...

  run     run an SPMD job locally, one process per proc:
          monarch-spmd run --mesh hosts=2,gpus=2 -- -m train --lr 0.001
          monarch-spmd run -f job.yaml
  worker  the in-pod worker: monarch-spmd worker -- -m train ...
  logs    the logs of an SPMDJob's ranks: monarch-spmd logs JOB [--rank R] [-f]
  validate  check SPMDJob manifests offline as the API server would: monarch-spmd validate -f job.yaml
"""


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    args = list(argv)
    if "--" in args:
        i = args.index("--")
        return args[:i], args[i + 1 :]
    return args, []


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="monarch-spmd run",
        description="Run an SPMD job on this machine, one process per proc, with the env the "
        "SPMDJob operator gives pods. The training argv follows '--'.",
        usage="monarch-spmd run (--mesh NAME=SIZE,... | -f job.yaml) [options] [-- -m MODULE ARGS... | -- SCRIPT ARGS...]",
    )
    p.add_argument("manifest_pos", nargs="?", metavar="job.yaml", help="same as -f")
    p.add_argument("-f", "--filename", dest="manifest", help="an SPMDJob manifest (YAML)")
    p.add_argument("--mesh", help="ordered mesh, e.g. hosts=2,gpus=2 (the last dimension is local)")
    p.add_argument("--master-port", type=int, help="rank 0's port (default: a free one)")
    p.add_argument("--max-restarts", type=int, help="gang restarts after a failure (default: the manifest's restartPolicy.maxRestarts, else 0)")
    p.add_argument("--rendezvous-timeout", type=int, metavar="SECONDS",
                   help="seconds a worker waits for MASTER_ADDR to resolve (spec.rendezvousTimeoutSeconds)")
    p.add_argument("--local-rank-scope", choices=worker.LOCAL_RANK_SCOPES, help="mesh (default) or pod")
    p.add_argument("--pod-layout", choices=names.POD_LAYOUTS,
                   help="PerProc (default): one worker per proc; PerHost: one per host, running its procs")
    p.add_argument("--role-name", help="ROLE_NAME (default: default)")
    p.add_argument("--run-id", help="TORCHELASTIC_RUN_ID (default: <job name>-<random>)")
    p.add_argument(
        "--grace-period",
        type=float,
        default=runner.DEFAULT_GRACE_PERIOD,
        help="seconds between SIGTERM and SIGKILL when stopping ranks (default %(default)s)",
    )
    return p


def run_main(argv: Sequence[str]) -> int:
    """``monarch-spmd run``."""
    own, training = _split_argv(argv)
    parser = _run_parser()
    opts = parser.parse_args(own)
    manifest = opts.manifest or opts.manifest_pos
    if opts.manifest and opts.manifest_pos:
        parser.error("give the manifest once: either -f FILE or FILE")
    if not manifest and not training:
        parser.error("no training argv: add '-- -m MODULE ARGS...' or '-- SCRIPT ARGS...'")
    if opts.grace_period < 0:
        parser.error(f"--grace-period: {opts.grace_period} is not valid; expected 0 or more seconds")
    try:
        job = runner.job_from_args(
            opts.mesh,
            training,
            manifest,
            master_port=opts.master_port,
            max_restarts=opts.max_restarts,
            rendezvous_timeout=opts.rendezvous_timeout,
            local_rank_scope=opts.local_rank_scope,
            role_name=opts.role_name,
            pod_layout=opts.pod_layout,
        )
        return runner.run(job, grace_period=opts.grace_period, run_id=opts.run_id)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"monarch-spmd run: {e}", file=sys.stderr)
        return 2


def logs_main(argv: Sequence[str]) -> int:
    """``monarch-spmd logs``: :func:`monarch_spmd.logs.main`."""
    from . import logs

    return int(logs.main(list(argv)) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """The console script's entry point; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="", file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "run":
        return run_main(rest)
    if command == "worker":
        return worker.main(rest)
    if command == "logs":
        return logs_main(rest)
    if command == "validate":
        from . import validate  # needs PyYAML (the cli extra)

        return validate.main(rest)
    print(f"monarch-spmd: unknown command {command!r}\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
