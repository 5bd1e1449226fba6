"""The ``monarch-spmd`` command: the top layer of the library, a thin dispatcher.

Subcommands::

    monarch-spmd run --mesh hosts=2,gpus=2 [options] -- -m train --lr 0.001
    monarch-spmd run -f job.yaml [options] [-- ARGV]       # the SPMDJob manifest kubectl applies
    monarch-spmd run --nproc-per-node 4 train.py --lr 0.1  # torchrun's flags (monarch_spmd.torchrun)
    monarch-spmd run --replica-groups 3 --nproc-per-node 2 train.py   # torchft (monarch_spmd.replicas)
    monarch-spmd manifest --image IMAGE -- torchrun --nnodes 2 --nproc-per-node 8 -m train
    monarch-spmd manifest ... --pods -- torchrun ...       # the pods the operator makes of it
    monarch-spmd pods -f job.yaml [-o yaml|json|table] [--dry-run=server]
    monarch-spmd worker -- -m train --lr 0.001             # the in-pod worker (see worker.py)
    monarch-spmd logs JOB [--rank R] [-f]                   # every rank's log of an SPMDJob
    monarch-spmd status [JOB] [-o wide|json|yaml] [-w]      # SPMDJobs and why each is in its phase
    monarch-spmd validate -f job.yaml|DIR                   # manifests checked offline
    monarch-spmd --version                                  # also: python -m monarch_spmd

``kubectl-spmd`` (:func:`kubectl_main`) is the same command as a kubectl plugin:
``kubectl spmd status|logs|validate ...``.

With ``--mesh`` or a manifest, everything after the first ``--`` is the training argv, passed on
untouched (but for torchrun's flags ahead of it). Otherwise ``run`` reads torchrun's command line
(:mod:`monarch_spmd.torchrun`): its flags, then the script and the script's arguments, ``--``
before the script allowed. torchrun's flags may also follow ``--``, with or without the word
torchrun, meaning what they mean before it. ``run`` is
:mod:`monarch_spmd.runner` (with ``--replica-groups``, :mod:`monarch_spmd.replicas`, which runs a
runner per group), ``manifest`` prints the SPMDJob of a torchrun command line,
``worker`` is :mod:`monarch_spmd.payload.worker`, ``logs`` is :mod:`monarch_spmd.logs`, ``pods``
(and ``manifest --pods``) is :mod:`monarch_spmd.podview`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import socket
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from . import replicas, runner, torchrun
from .payload import contract, names, worker

USAGE = """usage: monarch-spmd {run,manifest,pods,worker,logs,status,validate} ...
       monarch-spmd --version

  run     run an SPMD job locally, one process per proc:
          monarch-spmd run --mesh hosts=2,gpus=2 -- -m train --lr 0.001
          monarch-spmd run -f job.yaml
          monarch-spmd run --nnodes 2 --nproc-per-node 4 train.py --lr 0.1   (torchrun's flags)
  manifest  the SPMDJob of a torchrun command line, for kubectl apply:
          monarch-spmd manifest --image IMAGE -- torchrun --nnodes 2 --nproc-per-node 8 -m train
  pods    the pods the operator creates for an SPMDJob, or the API server's word on them:
          monarch-spmd pods -f job.yaml [-o yaml|json|table] [--dry-run=server]
  worker  the in-pod worker: monarch-spmd worker -- -m train ...
  logs    the logs of an SPMDJob's ranks: monarch-spmd logs JOB [--rank R] [-f]
  status  SPMDJobs and why each is in its phase: monarch-spmd status [JOB] [-n NS | -A] [-o wide|json|yaml] [-w]
  validate  check SPMDJob manifests offline as the API server would: monarch-spmd validate -f job.yaml|DIR

Each command's --help says more. Also as a kubectl plugin: kubectl spmd status|logs|validate ...
"""
#: The commands ``kubectl spmd`` offers (those that read the cluster or its manifests).
KUBECTL_COMMANDS = ("status", "logs", "validate")


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="monarch-spmd run",
        description="Run an SPMD job on this machine, one process per proc, with the env the "
        "SPMDJob operator gives pods. With --mesh or a manifest the training argv follows '--'; "
        "otherwise the command line is torchrun's: its flags, then SCRIPT ARGS... (or -m MODULE "
        "ARGS...), run as the mesh [nodes=NNODES, procs=NPROC_PER_NODE], one worker per node.",
        usage="monarch-spmd run (--mesh NAME=SIZE,... | -f job.yaml) [options] [-- -m MODULE ARGS... | -- SCRIPT ARGS...]\n"
        "       monarch-spmd run [torchrun's flags] [options] (SCRIPT | -m MODULE) ARGS...",
    )
    p.add_argument("-f", "--filename", dest="manifest", help="an SPMDJob manifest (YAML); also as the first positional")
    p.add_argument("--mesh", help="ordered mesh, e.g. hosts=2,gpus=2 (the last dimension is local)")
    p.add_argument("--rendezvous-timeout", type=int, metavar="SECONDS",
                   help="seconds a worker waits for MASTER_ADDR to resolve (spec.rendezvousTimeoutSeconds)")
    p.add_argument("--local-rank-scope", choices=worker.LOCAL_RANK_SCOPES, help="mesh (default) or pod")
    p.add_argument("--pod-layout", choices=names.POD_LAYOUTS,
                   help="PerProc (default with --mesh): one worker per proc; PerHost (default with torchrun's "
                   "flags): one per host, running its procs")
    p.add_argument("--role-name", help="ROLE_NAME (default: default)")
    p.add_argument("--run-id", help="TORCHELASTIC_RUN_ID (default: <job name>-<random>; with torchrun's flags, "
                   "as torchrun makes it)")
    p.add_argument(
        "--grace-period",
        type=float,
        help=f"seconds between SIGTERM and SIGKILL when stopping ranks (default {runner.DEFAULT_GRACE_PERIOD:g})",
    )
    p.add_argument("--progress-timeout", type=float, metavar="SECONDS",
                   help="when no rank writes anything for this long the gang is hung: the rank to blame fails "
                   "(reason NoProgress) and the gang restarts "
                   "(spec.restartPolicy.progressTimeoutSeconds; default off)")
    p.add_argument("--elastic-wait", type=int, metavar="SECONDS",
                   help="an elastic job (--nnodes MIN:MAX): how long a round with at least MIN nodes waits for "
                   "the others before it starts without them, as torchrun's last call "
                   f"(spec.restartPolicy.elasticWaitSeconds; default {runner.DEFAULT_ELASTIC_WAIT})")
    p.add_argument("--agent-store", action="store_true",
                   help="rank 0's worker hosts the TCPStore on the master port for the whole run and every rank "
                   "is its client (TORCHELASTIC_USE_AGENT_STORE=True), as under torchrun: for programs that open "
                   "the store without init_process_group, such as torchft's Manager (docs/torchft.md)")
    groups = p.add_argument_group(
        "replica groups (torchft)",
        "G copies of the job, each its own torchrun world with its own master port and agent store, kept "
        "together by one torchft Lighthouse: a group that fails drops out while the others train on "
        "(docs/torchft.md). Give these before the training script.")
    groups.add_argument("--replica-groups", type=int, metavar="G",
                        help="run G replica groups (REPLICA_GROUP_ID, NUM_REPLICA_GROUPS, TORCHFT_LIGHTHOUSE in "
                        "every rank's environment); needs torchft (pip install 'monarch-spmd[torchft]')")
    groups.add_argument("--min-replicas", type=int, metavar="M",
                        help="the Lighthouse's --min_replicas and the fewest groups the run goes on with, 1..G "
                        f"(default {replicas.DEFAULT_MIN_REPLICAS})")
    groups.add_argument("--lighthouse-port", type=int, metavar="PORT",
                        help="the Lighthouse's port on 127.0.0.1 (default: a free one)")
    flags = p.add_argument_group(
        "torchrun's flags",
        "torchrun's command line (torch 2.14), read as torchrun reads it; --max-restarts and --master-port "
        "also go with --mesh and -f. They may also come after '--' (with or without the word torchrun). See "
        "the README's 'Coming from torchrun'.")
    torchrun.add_arguments(flags)
    p.add_argument("script", nargs="?", metavar="SCRIPT | job.yaml", help="the training script (with -m, a module), "
                   "or an SPMDJob manifest")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    return p


def _training(opts: argparse.Namespace, tail: list[str] | None) -> tuple[list[str], bool]:
    """The training argv (``["-m", MODULE, ...]`` or ``[SCRIPT, ...]``) and whether it came after
    ``--`` (where it is written as the argv: ``-- -m train`` or ``-- train.py``)."""
    module = bool(opts.module)
    if tail is not None:
        if module and tail and tail[0] != "-m":
            return ["-m", *tail], True
        return list(tail), True
    if opts.script is None:
        return [], False
    return (["-m"] if module else []) + [opts.script, *opts.script_args], False


def _launch(flags: dict[str, Any], training: Sequence[str]) -> torchrun.Launch:
    """A :class:`torchrun.Launch` from flags parsed already and a training argv."""
    args = list(training)
    if args and args[0] == "-m":
        return torchrun.Launch({**flags, "module": True}, args[1] if len(args) > 1 else None, tuple(args[2:]))
    return torchrun.Launch(flags, args[0] if args else None, tuple(args[1:]))


def _conflict(opts: argparse.Namespace, flags: dict[str, Any], pairs: Sequence[tuple[str, str, str]]) -> str | None:
    """An error for an option of monarch-spmd given with the torchrun flag that says the same."""
    for ours, dest, what in pairs:
        if getattr(opts, ours) is not None and dest in flags:
            flag = torchrun.BY_DEST[dest].name
            return f"--{ours.replace('_', '-')} and {flag}: both set {what}; give one"
    return None


def visible_cuda_devices() -> int:
    """The CUDA devices this process sees, as torchrun counts them (``torch.cuda.device_count()``).

    Without torch: the NVIDIA driver's devices (/proc/driver/nvidia/gpus), at most as many as
    CUDA_VISIBLE_DEVICES lists before its first invalid entry.
    """
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is not None:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    try:
        present = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    listed = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        listed += 1
    return min(present, listed)


def usable_cpus() -> int:
    """The CPUs this process may run on, as torchrun counts them (its ``--nproc-per-node cpu``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def local_address_error(addr: str) -> str | None:
    """Why ``addr`` cannot be rank 0's address on this machine, or None (it binds here)."""
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except OSError as e:
        return f"{addr!r} does not resolve ({e})"
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind((sockaddr[0], 0))
                return None
        except OSError:
            continue
    return f"{addr!r} is not an address of this machine"


def _note(prog: str, message: str) -> None:
    print(f"{prog} {message}", file=sys.stderr, flush=True)


def run_main(argv: Sequence[str]) -> int:
    """``monarch-spmd run``: a mesh, a manifest or torchrun's command line, run locally."""
    argv = list(argv)
    parser = _run_parser()
    own, tail = torchrun.split_options(argv, parser)
    opts = parser.parse_args(own)
    flags = torchrun.given(opts)
    if opts.replica_groups is not None or opts.min_replicas is not None or opts.lighthouse_port is not None:
        return _run_replica_groups(parser, argv, opts, flags)
    manifest = opts.manifest
    training, after_dashes = _training(opts, tail)
    if not after_dashes and opts.script and not opts.module and opts.script.endswith(torchrun.MANIFEST_SUFFIXES):
        # `run job.yaml [options] [-- ARGV]`: the manifest, not a script; options may follow it.
        if manifest:
            parser.error("give the manifest once: either -f FILE or FILE")
        i = torchrun.script_index(argv, parser)
        if i is not None and argv[i] == opts.script:
            return run_main(["-f", opts.script, *argv[:i], *argv[i + 1:]])
    if opts.grace_period is not None and opts.grace_period < 0:
        parser.error(f"--grace-period: {opts.grace_period} is not valid; expected 0 or more seconds")
    if opts.progress_timeout is not None and not 0 < opts.progress_timeout < float("inf"):
        parser.error(f"--progress-timeout: {opts.progress_timeout} is not valid; expected a number of seconds above 0")
    try:
        if tail is not None and torchrun.starts_with_flag(tail):
            # torchrun's flags after '--' without the word torchrun: read as they are before it.
            after = torchrun.parse(tail, own=parser)
            twice = [d for d in after.options if d in flags]
            if twice:
                parser.error(f"{torchrun.BY_DEST[twice[0]].name}: given before '--' and after it; give it once")
            flags = {**flags, **after.options}
            module = bool(opts.module or after.options.get("module"))
            training = (["-m"] if module else []) + ([after.script, *after.script_args] if after.script else [])
        if torchrun.launcher_length(training):
            if opts.mesh or manifest or flags:
                what = "--mesh" if opts.mesh else "-f" if manifest else "flags before it"
                parser.error(f"the training argv starts with torchrun ({training[0]}) and {what} are given too: "
                             "give torchrun's command line alone (monarch-spmd run torchrun ...), or the script")
            launch = torchrun.parse(training, own=parser)
            flags = dict(launch.options)
        else:
            launch = _launch(flags, training)
        if opts.mesh or manifest:
            mixed = [d for d in flags if not torchrun.BY_DEST[d].shared and d != "module"]
            if mixed:
                mesh = f"--mesh {opts.mesh}" if opts.mesh else f"the manifest {manifest}"
                parser.error(f"{torchrun.BY_DEST[mixed[0]].name} and {mesh}: both give the job's shape (torchrun's "
                             "--nnodes x --nproc-per-node is the mesh [nodes, procs]); use one or the other")
            return _run_mesh(opts, flags, manifest, training)
        return _run_torchrun(parser, opts, launch)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"monarch-spmd run: {e}", file=sys.stderr)
        return 2


#: ``run``'s own flags that a replica group's runner must not get again (with their value).
_GROUP_FLAGS = ("--replica-groups", "--min-replicas", "--lighthouse-port")


def _without(argv: Sequence[str], parser: argparse.ArgumentParser, drop: Sequence[str]) -> list[str]:
    """``argv`` without the options ``drop`` (and their values) ahead of the training script."""
    args = list(argv)
    end = torchrun.script_index(args, parser)
    if end is None:
        end = args.index("--") if "--" in args else len(args)
    kept: list[str] = []
    i = 0
    while i < end:
        word = args[i]
        if word in drop:
            i += 2
            continue
        if word.split("=", 1)[0] in drop:
            i += 1
            continue
        kept.append(word)
        i += 1
    return kept + args[end:]


def _run_replica_groups(parser: argparse.ArgumentParser, argv: Sequence[str], opts: argparse.Namespace,
                        flags: dict[str, Any]) -> int:
    """``monarch-spmd run --replica-groups G ...``: :mod:`monarch_spmd.replicas`."""
    if opts.replica_groups is None:
        given = "--min-replicas" if opts.min_replicas is not None else "--lighthouse-port"
        parser.error(f"{given} goes with --replica-groups G")
    master_port = flags.get("master_port")
    port_flags = [o for a in parser._actions if a.dest == "master_port" for o in a.option_strings]
    job_args = _without(argv, parser, [*_GROUP_FLAGS, *port_flags])
    again = parser.parse_args(torchrun.split_options(job_args, parser)[0])
    if again.replica_groups is not None or again.min_replicas is not None or again.lighthouse_port is not None \
            or "master_port" in torchrun.given(again):
        parser.error("give --replica-groups, --min-replicas, --lighthouse-port and --master-port each once, before "
                     "the training script, spelled out")
    try:
        options = replicas.check(replicas.Options(
            groups=opts.replica_groups,
            min_replicas=replicas.DEFAULT_MIN_REPLICAS if opts.min_replicas is None else opts.min_replicas,
            lighthouse_port=opts.lighthouse_port,
            master_port=None if master_port is None else torchrun.int_flag("--master-port", master_port, 1, 65535)))
        grace = runner.DEFAULT_GRACE_PERIOD if opts.grace_period is None else opts.grace_period
        return replicas.run(options, job_args, grace_period=grace)
    except ValueError as e:  # ReplicaGroupsError too: nothing was started
        print(f"monarch-spmd run: {e}", file=sys.stderr)
        return 2


def _run_mesh(opts: argparse.Namespace, flags: dict[str, Any], manifest: str | None, training: list[str]) -> int:
    """``monarch-spmd run --mesh ...`` or ``-f job.yaml``: the job as the operator would run it."""
    if not manifest and not training:
        raise ValueError("no training argv: add '-- -m MODULE ARGS...' or '-- SCRIPT ARGS...'")
    master_port = flags.get("master_port")
    max_restarts = flags.get("max_restarts")
    job = runner.job_from_args(
        opts.mesh,
        training,
        manifest,
        master_port=None if master_port is None else torchrun.int_flag("--master-port", master_port, 1, 65535),
        max_restarts=None if max_restarts is None else torchrun.int_flag("--max-restarts", max_restarts, 0, torchrun.MAX_RESTARTS),
        rendezvous_timeout=opts.rendezvous_timeout,
        local_rank_scope=opts.local_rank_scope,
        role_name=opts.role_name,
        pod_layout=opts.pod_layout,
        elastic_wait=opts.elastic_wait,
    )
    grace = runner.DEFAULT_GRACE_PERIOD if opts.grace_period is None else opts.grace_period
    return runner.run(job, grace_period=grace, run_id=opts.run_id, progress_timeout=opts.progress_timeout,
                      agent_store=opts.agent_store)


def _run_torchrun(parser: argparse.ArgumentParser, opts: argparse.Namespace, launch: torchrun.Launch) -> int:
    """``monarch-spmd run`` with torchrun's command line: the mesh [nodes, procs], PerHost."""
    flags = dict(launch.options)
    if not launch.script:
        parser.error("no training script: give torchrun's flags, then SCRIPT ARGS... or -m MODULE ARGS..., "
                     "or use --mesh / -f job.yaml")
    conflict = _conflict(opts, flags, (("run_id", "rdzv_id", "TORCHELASTIC_RUN_ID"),
                                       ("role_name", "role", "ROLE_NAME"),
                                       ("grace_period", "shutdown_timeout", "the time from SIGTERM to SIGKILL")))
    if conflict:
        parser.error(conflict)
    gpus = visible_cuda_devices() if torchrun.counts_devices(launch) else 0
    plan = torchrun.plan(launch, torchrun.LOCAL, gpus=gpus, cpus=usable_cpus())
    if flags.get("master_addr") is not None and plan.master_addr == flags["master_addr"]:
        error = local_address_error(plan.master_addr)
        if error:
            raise ValueError(f"--master-addr: {error}; monarch-spmd run starts every node on this machine, so "
                             "rank 0 listens here: give 127.0.0.1 (the default) or a name of this machine")
    for message in plan.notes:
        _note("[monarch-spmd]", message)
    job = runner.job_from_args(
        contract.format_mesh(plan.mesh),
        plan.argv,
        master_port=plan.master_port,
        max_restarts=plan.max_restarts,
        rendezvous_timeout=opts.rendezvous_timeout,
        local_rank_scope=opts.local_rank_scope,
        role_name=opts.role_name or plan.role,
        pod_layout=opts.pod_layout or names.PER_HOST,
        min_nodes=plan.min_nodes,
        elastic_wait=opts.elastic_wait,
    )
    grace = opts.grace_period if opts.grace_period is not None else plan.grace_period
    logs = None
    if plan.log_dir is not None or plan.redirects != "0" or plan.tee != "0":
        logs = runner.LogOptions(log_dir=plan.log_dir, redirects=plan.redirects, tee=plan.tee)
    return runner.run(
        job,
        grace_period=runner.DEFAULT_GRACE_PERIOD if grace is None else grace,
        run_id=opts.run_id or plan.run_id or str(uuid.uuid4()),  # torchrun's c10d rendezvous: a fresh uuid
        master_addr=plan.master_addr,
        logs=logs,
        progress_timeout=opts.progress_timeout,
        agent_store=opts.agent_store,
    )


# --- manifest ----------------------------------------------------------------------------------

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
EXAMPLE_IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
#: A CPU quantity as people write one: 8, 0.5, 500m.
_CPU = re.compile(r"^[0-9]+(\.[0-9]+)?m?$")
#: ``manifest``'s /dev/shm without --memory (PyTorch's DataLoader workers and NCCL use it).
DEFAULT_SHM_SIZE = "8Gi"
_MEMORY_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
                 "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def half_memory(quantity: str) -> str:
    """Half a memory quantity (``64Gi`` -> ``32Gi``, ``1G`` -> ``500M``, ``3Mi`` -> ``1536Ki``),
    in the largest binary or decimal unit that holds it exactly (bytes otherwise)."""
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", quantity).groups()  # type: ignore[union-attr]
    whole, _, fraction = number.partition(".")
    scale = 10 ** len(fraction)
    half = int(whole + fraction) * _MEMORY_UNITS[unit] // scale // 2
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki", "E", "P", "T", "G", "M", "k"):
        if half >= _MEMORY_UNITS[suffix] and half % _MEMORY_UNITS[suffix] == 0:
            return f"{half // _MEMORY_UNITS[suffix]}{suffix}"
    return str(half)


def shm_default(memory: str | None) -> str:
    """``manifest``'s spec.shmSize without --shm-size: half of --memory within the spec's range
    (spec.SHM_SIZE_MIN..SHM_SIZE_MAX), else DEFAULT_SHM_SIZE."""
    from . import quantity, spec

    if not memory:
        return DEFAULT_SHM_SIZE
    half = half_memory(memory)
    value = quantity.parse(half)
    if value is not None and value < quantity.parse(spec.SHM_SIZE_MIN):
        return spec.SHM_SIZE_MIN
    if value is not None and value > quantity.parse(spec.SHM_SIZE_MAX):
        return spec.SHM_SIZE_MAX
    return half


def with_spares(body: dict[str, Any], spares: int) -> dict[str, Any]:
    """``manifest``'s spec with ``spares: N`` after its restartPolicy (whose in-place mode the
    spares need, and which the manifest always writes), where a reader looks for it."""
    out: dict[str, Any] = {}
    for key, value in body.items():
        out[key] = value
        if key == "restartPolicy":
            out["spares"] = spares
    out.setdefault("spares", spares)
    return out


def _manifest_parser() -> argparse.ArgumentParser:
    from . import spec

    p = argparse.ArgumentParser(
        prog="monarch-spmd manifest",
        description="Print the SPMDJob that runs a torchrun command line on Kubernetes (kubectl apply -f -): "
        "the mesh [nodes=NNODES, procs=NPROC_PER_NODE] with podLayout PerHost, one pod per node running "
        "its procs as torchrun's agent does. The torchrun command line follows '--', with or without the "
        "word torchrun (or python -m torch.distributed.run). Notes on ignored flags go to stderr.",
        usage="monarch-spmd manifest --image IMAGE (--gpus-per-proc N | --nproc-per-node gpu [--node-gpus N]) "
        "[--cpu CPU] [--memory SIZE] [--shm-size SIZE] [--spares N] [--name NAME] [--namespace NS] [--pods] "
        "-- [torchrun] [torchrun's flags] (SCRIPT | -m MODULE) ARGS...",
        epilog="The GPU choice is explicit: --gpus-per-proc 1 gives every proc a GPU (a node's pod holds "
        "--nproc-per-node of them), --gpus-per-proc 0 runs on CPUs only; --nproc-per-node gpu means one proc "
        "per GPU of a node (--node-gpus, else the GPUs of this machine) and gpusPerProc 1. With GPUs the pods "
        "tolerate the nvidia.com/gpu NoSchedule taint. The YAML runs on a cluster as it is; it also passes "
        "monarch-spmd validate.",
    )
    p.add_argument("--image", help=f"the container image of every node (required): python3, your code and its "
                   f"dependencies, e.g. {EXAMPLE_IMAGE} with your code added")
    p.add_argument("--name", help="the job's name, a DNS-1035 label (default: the module or script's name, "
                   "e.g. train for -m train or train.py)")
    p.add_argument("--namespace", help="metadata.namespace (default: none written; kubectl's namespace)")
    p.add_argument("--gpus-per-proc", metavar="N", help="spec.gpusPerProc, 0..16: required unless --nproc-per-node "
                   "is gpu (then 1)")
    p.add_argument("--node-gpus", metavar="N", help="the GPUs of a cluster node, what --nproc-per-node gpu (or auto) "
                   "counts (default: this machine's)")
    p.add_argument("--cpu", help="CPU request of each node's pod, e.g. 32 or 500m (default: none)")
    p.add_argument("--memory", metavar="SIZE", help="memory request and limit of each node's pod, e.g. 256Gi "
                   "(default: none)")
    p.add_argument("--shm-size", metavar="SIZE", help=f"spec.shmSize, the size of /dev/shm, 1Mi..1Ti (default: half "
                   f"of --memory within that range, else {DEFAULT_SHM_SIZE})")
    p.add_argument("--spares", metavar="N", help=f"spec.spares: hot spare pods, 0..{spec.MAX_SPARES}, created with the "
                   "nodes' pods and like them (the same resources and GPUs), each ready to take a lost node's place "
                   "(not rank 0's) at once; needs --nnodes 2 or more (default: 0)")
    p.add_argument("--pods", action="store_true", help="print the pods the operator creates for the SPMDJob "
                   "instead (built by its own pod builder; each with its procs' torchrun variables; hot spares "
                   "too), as monarch-spmd pods -f job.yaml does")
    flags = p.add_argument_group("torchrun's flags", "may also come after '--' (see monarch-spmd run --help)")
    torchrun.add_arguments(flags)
    p.add_argument("script", nargs="?", metavar="SCRIPT", help="the training script (with -m, a module)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    return p


def manifest_main(argv: Sequence[str]) -> int:
    """``monarch-spmd manifest``: prints the SPMDJob YAML of a torchrun command line."""
    args = list(argv)
    parser = _manifest_parser()
    own, tail = torchrun.split_options(args, parser)
    opts = parser.parse_args(own)
    flags = torchrun.given(opts)
    try:
        if tail is not None:
            if flags:
                parser.error(f"{torchrun.BY_DEST[next(iter(flags))].name} before '--': give torchrun's command "
                             "line once, after '--'")
            launch = torchrun.parse(tail, own=parser)
        else:
            training, _ = _training(opts, None)
            if torchrun.launcher_length(training):
                if flags:
                    parser.error(f"{torchrun.BY_DEST[next(iter(flags))].name} before {training[0]}: give torchrun's "
                                 "command line once")
                launch = torchrun.parse(training, own=parser)
            else:
                launch = _launch(flags, training)
        if not launch.script:
            parser.error("no torchrun command line: add '-- torchrun --nnodes N --nproc-per-node P SCRIPT ARGS...'")
        if not opts.image:
            parser.error(f"--image: required: the container image every node runs, with python3, your training "
                         f"code and its dependencies (e.g. {EXAMPLE_IMAGE} with your code added)")
        gpus_per_proc = None
        if opts.gpus_per_proc is not None:
            gpus_per_proc = torchrun.int_flag("--gpus-per-proc", opts.gpus_per_proc, 0, torchrun.MAX_GPUS_PER_PROC,
                                              " (spec.gpusPerProc)")
        if opts.namespace is not None and (len(opts.namespace) > 63 or not _NAMESPACE.match(opts.namespace)):
            raise ValueError(f"--namespace: {opts.namespace!r} is not valid; a namespace is a DNS label of at most "
                             "63 characters (lowercase letters, digits and '-')")
        from . import spec

        if opts.cpu is not None and (not _CPU.match(opts.cpu) or not re.search(r"[1-9]", opts.cpu)):
            raise ValueError(f"--cpu: {opts.cpu!r} is not valid; expected a CPU quantity above 0 such as 8, 0.5 or 500m")
        for flag, value in (("--memory", opts.memory), ("--shm-size", opts.shm_size)):
            if value is not None and (not spec.MEMORY_QUANTITY.matches(value) or not re.search(r"[1-9]", value)):
                raise ValueError(f"{flag}: {value!r} is not valid; expected a memory quantity above 0 such as 512Mi, "
                                 "64Gi or 1G")
        if opts.shm_size is not None:
            from . import quantity

            size = quantity.parse(opts.shm_size)
            if size is None or not quantity.parse(spec.SHM_SIZE_MIN) <= size <= quantity.parse(spec.SHM_SIZE_MAX):
                raise ValueError(f"--shm-size: {opts.shm_size!r} is not valid; expected a memory quantity from "
                                 f"{spec.SHM_SIZE_MIN} to {spec.SHM_SIZE_MAX} (spec.shmSize)")
        spares = 0
        if opts.spares is not None:
            spares = torchrun.int_flag("--spares", opts.spares, 0, spec.MAX_SPARES, " (spec.spares)")
        node_gpus = None
        if opts.node_gpus is not None:
            node_gpus = torchrun.int_flag("--node-gpus", opts.node_gpus, 1, contract.MAX_PROCS)
            if not torchrun.counts_devices(launch):
                raise ValueError("--node-gpus: only counts for --nproc-per-node gpu (or auto); drop it, or give "
                                 "--nproc-per-node gpu")
        gpus = 0
        if torchrun.counts_devices(launch):
            gpus = node_gpus if node_gpus is not None else visible_cuda_devices()
            if gpus == 0 and str(launch.options.get("nproc_per_node")).strip() == "gpu":
                raise ValueError("--nproc-per-node gpu: one proc per GPU of a cluster node, but this machine has no "
                                 "GPU to count: give --node-gpus N (the GPUs of a node, e.g. 8), or --nproc-per-node 8 "
                                 "--gpus-per-proc 1")
        plan = torchrun.plan(launch, torchrun.CLUSTER, gpus=gpus, cpus=usable_cpus())
        if node_gpus is not None:
            plan = dataclasses.replace(plan, notes=tuple(n for n in plan.notes if not n.startswith("--nproc-per-node ")))
        if gpus_per_proc is None and not plan.from_gpus:
            raise ValueError(f"--gpus-per-proc: required with --nproc-per-node {launch.options.get('nproc_per_node', 1)}: "
                             "give 1 for a GPU per proc, 0 for CPUs only (or --nproc-per-node gpu for one proc per GPU "
                             "of a node)")

        name = opts.name if opts.name is not None else torchrun.default_name(plan.argv)
        error = spec.job_name_error(name)
        if error:
            raise ValueError(f"--name: {error}")
        if not spec.IMAGE_REFERENCE.matches(opts.image) or len(opts.image) > spec.MAX_IMAGE_LENGTH:
            raise ValueError(f"--image: {opts.image!r} is not valid; an image reference is printable ASCII "
                             f"without spaces, e.g. {EXAMPLE_IMAGE}")
        if spares and plan.mesh[0][1] < 2:
            raise ValueError(f"--spares: {spares} is not allowed with one node: a hot spare takes the place of a lost "
                             "node's pod other than rank 0's; give --nnodes 2 or more, or no --spares")
        shm_size = opts.shm_size or shm_default(opts.memory)
        doc = torchrun.manifest(plan, name=name, image=opts.image, namespace=opts.namespace,
                                gpus_per_proc=gpus_per_proc, cpu=opts.cpu, memory=opts.memory, shm_size=shm_size)
        if spares:
            doc["spec"] = with_spares(doc["spec"], spares)
        _, errors = spec.check_manifest(doc, require_image=True)
        if errors:  # every input was checked above: this would be a bug here, said plainly
            raise ValueError("the SPMDJob would be refused: " + "; ".join(str(e) for e in errors))
    except (ValueError, RuntimeError) as e:
        print(f"monarch-spmd manifest: {e}", file=sys.stderr)
        return 2
    try:
        import yaml
    except ImportError:
        print("monarch-spmd manifest: printing YAML needs PyYAML: pip install 'monarch-spmd[cli]'", file=sys.stderr)
        return 2
    for message in plan.notes:
        _note("monarch-spmd manifest:", message)
    if opts.pods:
        from . import podview

        try:
            sys.stdout.write(podview.render_yaml(podview.build(doc)))
        except podview.PodsError as e:
            print(f"monarch-spmd manifest: {e}", file=sys.stderr)
            return 2
        return 0
    command = shlex.join(args)
    if "\n" not in command and "\r" not in command:  # a comment is one line
        sys.stdout.write(f"# monarch-spmd manifest {command}\n")
    sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return 0


def version() -> str:
    """The installed distribution's version (``monarch-spmd --version``)."""
    from importlib import metadata

    try:
        return metadata.version("monarch-spmd")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _worker_parser() -> argparse.ArgumentParser:
    """``monarch-spmd worker --help``: what the in-pod worker reads. The worker itself parses no
    options (its argv is the training argv), so this parser only prints help."""
    inputs = ", ".join((names.MESH_VAR, names.COORDS_VAR, names.MASTER_ADDR_VAR, names.MASTER_PORT_VAR,
                        names.RESTART_COUNT_VAR, names.MAX_RESTARTS_VAR, names.RUN_ID_VAR, names.ROLE_NAME_VAR,
                        names.RENDEZVOUS_TIMEOUT_VAR, names.LOCAL_RANK_SCOPE_VAR, names.POD_LAYOUT_VAR))
    return argparse.ArgumentParser(
        prog="monarch-spmd worker",
        usage="monarch-spmd worker [--] (-m MODULE | SCRIPT) ARGS...",
        description="The worker every SPMDJob pod (and every local proc of monarch-spmd run) starts: it reads "
        f"its inputs from the environment ({inputs}), computes the torchrun environment of its proc(s) "
        "(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_* ...), waits until MASTER_ADDR resolves, "
        "then runs the training argv and exits with its exit code. Everything after the optional '--' is "
        "the training argv. You do not start it yourself: the operator and monarch-spmd run do.",
        epilog=f"Exit codes: the training program's (128+N when killed by signal N); {names.EX_USAGE} for bad "
        f"input; {names.EX_TEMPFAIL} when MASTER_ADDR never resolved. docs/interfaces.md lists every input.",
    )


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
    if args[0] in ("-V", "--version", "version"):
        print(f"monarch-spmd {version()}")
        return 0
    command, rest = args[0], args[1:]
    if command == "run":
        return run_main(rest)
    if command == "manifest":
        return manifest_main(rest)
    if command == "pods":
        from . import podview

        return podview.main(rest)
    if command == "worker":
        if rest[:1] in (["-h"], ["--help"]):  # before '--' and a training argv: help, not a script
            _worker_parser().print_help()
            return 0
        return worker.main(rest)
    if command == "logs":
        return logs_main(rest)
    if command == "status":
        from . import status

        return status.main(rest)
    if command == "validate":
        from . import validate  # needs PyYAML (the cli extra)

        return validate.main(rest)
    print(f"monarch-spmd: unknown command {command!r}\n{USAGE}", end="", file=sys.stderr)
    return 2


KUBECTL_USAGE = """usage: kubectl spmd {status,logs,validate} ...
       kubectl spmd --version

  status    SPMDJobs and why each is in its phase: kubectl spmd status [JOB] [-n NS | -A] [-o wide|json|yaml] [-w]
  logs      the logs of an SPMDJob's ranks: kubectl spmd logs JOB [--rank R] [-f]
  validate  check SPMDJob manifests offline: kubectl spmd validate -f job.yaml|DIR

The kubectl plugin of monarch-spmd (the console script kubectl-spmd on PATH); each command's
--help says more. monarch-spmd run and monarch-spmd manifest are not kubectl commands.
"""


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl-spmd``: kubectl finds it on PATH and runs it for ``kubectl spmd ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(KUBECTL_USAGE, end="", file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] in KUBECTL_COMMANDS or args[0] in ("-V", "--version", "version"):
        return main(args)
    print(f"kubectl spmd: unknown command {args[0]!r}\n{KUBECTL_USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
