"""A benchmark-only local launcher: the plain-process floor, and a fork-server prototype.

    python -m benchmarks.fork_launcher --procs P --mode spawn -- -m MODULE ARGS...
    python -m benchmarks.fork_launcher --procs P --mode fork [--preimport torch ...] -- -m MODULE ARGS...

Not part of the library (the local runner, ``monarch_spmd/runner.py``, is unchanged); it exists to
measure what a local launcher could save, in ``benchmarks.launch_overhead``:

- ``--mode spawn`` (the launcher ``plain``): the floor of launching processes. P interpreters
  ``python -m MODULE`` started at once with torchrun's environment (from the payload's
  :func:`monarch_spmd.payload.contract.torch_elastic_env`), no agent, no worker in between, no
  output prefixing; each pays its own interpreter start and ``import torch``.
- ``--mode fork`` (the launcher ``forkserver``): the parent imports the heavy modules once
  (``--preimport``, default ``torch`` and ``torch.distributed``), then forks the P ranks; each child
  sets the same environment and runs the module with :func:`runpy.run_module` as ``__main__``. No
  rank starts an interpreter or imports torch again.

Fork safety, what the prototype relies on (``--check`` prints it): the parent imports with the
ranks' OMP_NUM_THREADS (1 when several procs share the host; otherwise numpy's OpenBLAS, which
torch imports, starts a thread pool at import), and after ``import torch`` it must still be
single-threaded, else it refuses to fork (exit 70) (forking a process with other threads copies their locks in
whatever state they were, and not the threads), and the parent must not have run a torch op
(GNU OpenMP's thread pool, created by the first parallel op, does not survive a fork: a child's
first parallel region would hang). No process group exists in the parent, so gloo's sockets and
threads are all created after the fork, in the ranks. CUDA is never initialized by the parent
(a CUDA context cannot be used across fork); a GPU launcher would have to keep it so.

Exit code: 0 when every rank exits 0, else the first failing rank's code (the others are sent
SIGTERM, then SIGKILL after 5 s).
"""

from __future__ import annotations

import argparse
import importlib
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback

from monarch_spmd.payload import contract
from monarch_spmd.ports import free_port

MASTER_ADDR = "127.0.0.1"
GRACE_SECONDS = 5.0


def threads() -> int:
    """Threads of this process now (from /proc)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def rank_env(procs: int, rank: int, port: int) -> dict[str, str]:
    return contract.torch_elastic_env([("procs", procs)], [rank], MASTER_ADDR, port,
                                      run_id=f"fork-launcher-{port}", base_env=os.environ)


def _run_child(argv: list[str]) -> int:
    """In a forked rank: run ``-m MODULE ARGS`` or ``SCRIPT ARGS`` as __main__; the exit code."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - the rank's failure, reported like the interpreter would
        traceback.print_exc()
        return 1


def fork_ranks(procs: int, argv: list[str], port: int) -> list[int]:
    pids = []
    for rank in range(procs):
        pid = os.fork()
        if pid == 0:  # the rank
            code = 1
            try:
                os.setpgid(0, 0)
                os.environ.update(rank_env(procs, rank, port))
                code = _run_child(argv)
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        pids.append(pid)
    return pids


def spawn_ranks(procs: int, argv: list[str], port: int) -> list[int]:
    return [subprocess.Popen([sys.executable, *argv], env={**os.environ, **rank_env(procs, rank, port)},
                             start_new_session=True).pid for rank in range(procs)]


def wait_all(pids: list[int]) -> int:
    """Waits for every rank; the first failure stops the others. Returns the exit code."""
    left, first, stop_at = set(pids), 0, None
    while left:
        if stop_at is not None and time.monotonic() > stop_at:
            for pid in left:
                _signal(pid, signal.SIGKILL)
            stop_at = None
        try:
            pid, status = os.waitpid(-1, os.WNOHANG if stop_at else 0)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
            continue
        if pid not in left:
            continue
        left.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code
        if code != 0 and first == 0:
            first = code
            for other in left:
                _signal(other, signal.SIGTERM)
            stop_at = time.monotonic() + GRACE_SECONDS
    return first


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, required=True)
    ap.add_argument("--mode", choices=["spawn", "fork"], required=True)
    ap.add_argument("--preimport", nargs="*", default=["torch", "torch.distributed"],
                    help="modules the fork parent imports before forking")
    ap.add_argument("--check", action="store_true", help="print the parent's thread count after the imports")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the program: -- -m MODULE ARGS or -- SCRIPT ARGS")
    port = free_port(MASTER_ADDR)
    if args.mode == "fork":
        # Import under what every rank's environment will say about threads (OMP_NUM_THREADS=1
        # when several procs share the host, as torchrun sets it): numpy's OpenBLAS, imported by
        # torch, starts its thread pool at import time unless told one thread.
        common = {k: v for k, v in rank_env(args.procs, 0, port).items() if k == "OMP_NUM_THREADS"}
        os.environ.update(common)
        before = threads()
        for name in args.preimport:
            importlib.import_module(name)
        after = threads()
        if args.check:
            print(f"fork-launcher: threads before imports {before}, after {after}", file=sys.stderr, flush=True)
        if after != 1:
            print(f"fork-launcher: the parent has {after} threads after importing {args.preimport}; "
                  "forking it is not safe", file=sys.stderr)
            return 70
        sys.stdout.flush()
        sys.stderr.flush()
        pids = fork_ranks(args.procs, command, port)
    else:
        pids = spawn_ranks(args.procs, command, port)
    return wait_all(pids)


if __name__ == "__main__":
    raise SystemExit(main())
