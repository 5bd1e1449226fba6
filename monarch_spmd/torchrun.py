"""torchrun's command line, read the way monarch-spmd runs it: the on-ramp for torchrun users.

Where it sits: below :mod:`monarch_spmd.cli` (``monarch-spmd run`` and ``monarch-spmd manifest``
parse with it), beside the runner; it imports only :mod:`.payload.contract`,
:mod:`.payload.names` and :mod:`.payload.procgroup` (torchrun's ``--redirects``/``--tee`` syntax).
Standard library only, and pure: the caller counts GPUs and CPUs, makes run ids and prints the
notes.

torchrun's world is ``--nnodes`` x ``--nproc-per-node``. It becomes the mesh ``[nodes=N, procs=P]``
with the PerHost layout: one worker per node, which starts the node's P procs exactly as
torchrun's agent does, so RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
ROLE_* and TORCHELASTIC_* are the values torchrun gives (tests/lib/test_torchrun_parity.py runs the same
script under both and compares them). What each flag of torchrun (torch 2.14) does here:

=====================================  ====================================================
flag                                   ``run`` (this machine) / ``manifest`` (an SPMDJob)
=====================================  ====================================================
``--nnodes N`` (or ``N:N``)            the mesh's ``nodes``. ``run`` starts every node on
                                       this machine, as N hosts of the mesh. An elastic range
                                       ``MIN:MAX``: ``nodes`` is MAX and its ``minSize`` MIN
                                       (rounds may run with MIN..MAX nodes)
``--nproc-per-node P``                 the mesh's ``procs``: an integer, or ``gpu`` (CUDA
                                       devices visible here; none is an error), ``cpu`` (CPUs
                                       this process may use, as torchrun counts them) or
                                       ``auto`` (gpu if any, else cpu); ``xpu`` is refused
``--standalone``                       one node, a fresh run id (refused with N > 1)
``--max-restarts``                     gang restarts (spec.restartPolicy.maxRestarts), 0..100
``--master-port``                      rank 0's port (spec.masterPort)
``--master-addr``                      ``run``: MASTER_ADDR, an address of this machine.
                                       ``manifest``: ignored, the attempt's Service
                                       ``<job>-<id>-m<attempt>``
``--node-rank``                        ``run``: every node runs here, so only 0 with one node.
                                       ``manifest``: ignored, each pod has its node's rank
``--rdzv-id``                          ``run``: TORCHELASTIC_RUN_ID, where torchrun uses it.
                                       ``manifest``: ignored, the run id is the job's uid
``--rdzv-backend/-endpoint/-conf``     ignored: every rank starts at once and rank 0 hosts
                                       the TCPStore at MASTER_ADDR:MASTER_PORT
``--role``                             ROLE_NAME
``-m``/``--module``, ``--run-path``    the script is a module / a path
``--shutdown-timeout``                 ``run``: seconds from SIGTERM to SIGKILL
``--log-dir``, ``--redirects``,        ``run``: each rank's stdout/stderr also (tee) or only
``--tee``                              (redirects) in files laid out as torchrun lays them
                                       out, ``DIR/<run id>_*/attempt_<N>/<local rank>/``
                                       ``stdout.log`` (a temp folder without ``--log-dir``).
                                       ``manifest``: ignored, a pod's log is its output
``--no-python``,                       refused, saying why
``--duplicate-*-filters``,
``--numa-binding``,
``--virtual-local-rank``,
``--print-completion``
other agent settings                   ignored, with a note saying why
(``--monitor-interval`` ...)
=====================================  ====================================================

The defaults that depend on torchrun's rendezvous follow it too: with one node and neither
``--master-port`` nor a rendezvous flag, or with ``--standalone``, torchrun uses its c10d
rendezvous on this machine, so MASTER_ADDR is ``localhost`` and the run id a fresh uuid (a given
``--rdzv-id`` is then ignored, by torchrun as here); otherwise MASTER_ADDR is ``--master-addr``
(default 127.0.0.1) and the run id ``--rdzv-id`` (default ``none``). Not mirrored, by design:
TORCHELASTIC_USE_AGENT_STORE is ``False`` (rank 0 hosts the store) unless ``--agent-store`` asks rank
0's worker to host it (docs/torchft.md), and
torchrun's agent-only TORCHELASTIC_ERROR_FILE and TORCHELASTIC_SIGNALS_TO_HANDLE are not set.
torchrun's ``PET_*`` environment defaults are not read.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .payload import contract, names, procgroup

#: The mesh's dimension names: torchrun's nodes, and the procs of each.
NODES_DIM: Final = "nodes"
PROCS_DIM: Final = "procs"
#: Where a launch goes: this machine (``monarch-spmd run``) or an SPMDJob (``monarch-spmd manifest``).
LOCAL: Final = "run"
CLUSTER: Final = "manifest"
#: torchrun's own defaults.
DEFAULT_MASTER_ADDR: Final = "127.0.0.1"
C10D_MASTER_ADDR: Final = "localhost"
DEFAULT_RUN_ID: Final = "none"
#: spec.restartPolicy.maxRestarts's bound (the local runner checks the same spec).
MAX_RESTARTS: Final = 100
MAX_GPUS_PER_PROC: Final = 16
#: A positional training script that is really a manifest (``monarch-spmd run job.yaml``).
MANIFEST_SUFFIXES: Final = (".yaml", ".yml", ".json")


class TorchrunError(ValueError):
    """A torchrun flag that cannot be honoured or is not valid; the message names the flag."""


@dataclass(frozen=True)
class Flag:
    """One flag of torchrun's command line.

    Attributes:
        names: its option strings as torchrun spells them.
        dest: the attribute argparse stores it in.
        metavar: the value's name, or None for a switch.
        help: one line for ``--help``.
        choices: the values torchrun's parser accepts, where it restricts them.
        shared: also an option of ``monarch-spmd run`` with ``--mesh`` (same meaning), so it
            does not make a command line torchrun's.
    """

    names: tuple[str, ...]
    dest: str
    metavar: str | None
    help: str
    choices: tuple[str, ...] | None = None
    shared: bool = False

    @property
    def name(self) -> str:
        """The name messages use: the first long option (``--module`` rather than ``-m``)."""
        return next(n for n in self.names if n.startswith("--"))


def _both(name: str) -> tuple[str, ...]:
    """``--a-b`` and torchrun's other spelling ``--a_b``."""
    under = "--" + name[2:].replace("-", "_")
    return (name, under) if under != name else (name,)


#: torchrun's flags (torch 2.14), in the order of its ``--help``.
FLAGS: Final[tuple[Flag, ...]] = (
    Flag(("--nnodes",), "nnodes", "N", "number of nodes (N), or MIN:MAX: an elastic job (mesh[0].minSize)"),
    Flag(_both("--nproc-per-node"), "nproc_per_node", "P", "procs per node: an integer, gpu, cpu or auto"),
    Flag(_both("--rdzv-backend"), "rdzv_backend", "BACKEND", "ignored: monarch-spmd forms the gang itself"),
    Flag(_both("--rdzv-endpoint"), "rdzv_endpoint", "HOST:PORT", "ignored: rank 0 hosts the store"),
    Flag(_both("--rdzv-id"), "rdzv_id", "ID", "TORCHELASTIC_RUN_ID where torchrun uses it"),
    Flag(_both("--rdzv-conf"), "rdzv_conf", "K=V,...", "ignored"),
    Flag(("--standalone",), "standalone", None, "one node with a fresh run id"),
    Flag(_both("--max-restarts"), "max_restarts", "N", "gang restarts after a failure, 0..100 (default 0, or a manifest's)", shared=True),
    Flag(_both("--monitor-interval"), "monitor_interval", "SECONDS", "ignored"),
    Flag(_both("--start-method"), "start_method", "METHOD", "ignored: ranks are processes of their own",
         choices=("spawn", "fork", "forkserver")),
    Flag(_both("--event-log-handler"), "event_log_handler", "NAME", "ignored"),
    Flag(("--role",), "role", "ROLE", "ROLE_NAME (default: default)"),
    Flag(("-m", "--module"), "module", None, "the script is a module, run as python -m"),
    Flag(_both("--no-python"), "no_python", None, "refused: the training program is run by Python"),
    Flag(_both("--run-path"), "run_path", None, "the script is a path (as without it)"),
    Flag(_both("--log-dir"), "log_dir", "DIR", "run: each rank's log files go here, as torchrun lays them out"),
    Flag(("-r", "--redirects"), "redirects", "STD", "run: send 1 stdout, 2 stderr, 3 both of each rank (or "
         "LOCAL_RANK:STD,...) to its log files only"),
    Flag(("-t", "--tee"), "tee", "STD", "run: copy 1 stdout, 2 stderr, 3 both of each rank (or LOCAL_RANK:STD,...) "
         "to its log files too"),
    Flag(_both("--log-line-prefix-template"), "log_line_prefix_template", "TEMPLATE", "ignored: lines are prefixed [rank N]"),
    Flag(_both("--local-ranks-filter"), "local_ranks_filter", "RANKS", "ignored: every rank's output is shown"),
    Flag(_both("--duplicate-stdout-filters"), "duplicate_stdout_filters", "FILTERS", "refused: writes files"),
    Flag(_both("--duplicate-stderr-filters"), "duplicate_stderr_filters", "FILTERS", "refused: writes files"),
    Flag(_both("--node-rank"), "node_rank", "N", "run: only 0 with one node (every node runs here)"),
    Flag(_both("--master-addr"), "master_addr", "ADDR", "run: MASTER_ADDR, an address of this machine"),
    Flag(_both("--master-port"), "master_port", "PORT", "rank 0's port (default: a free one)", shared=True),
    Flag(_both("--local-addr"), "local_addr", "ADDR", "ignored"),
    Flag(_both("--logs-specs"), "logs_specs", "NAME", "ignored"),
    Flag(_both("--numa-binding"), "numa_binding", "MODE", "refused: ranks are not bound to CPUs"),
    Flag(_both("--signals-to-handle"), "signals_to_handle", "SIGNALS", "ignored: SIGTERM, SIGINT and SIGHUP reach every rank"),
    Flag(_both("--shutdown-timeout"), "shutdown_timeout", "SECONDS", "run: seconds from SIGTERM to SIGKILL"),
    Flag(_both("--virtual-local-rank"), "virtual_local_rank", None, "refused: LOCAL_RANK is the proc's index on its node"),
    Flag(_both("--print-completion"), "print_completion", "SHELL", "refused: torchrun's own shell completion"),
)
BY_DEST: Final[Mapping[str, Flag]] = {f.dest: f for f in FLAGS}

#: Flags that tune torchrun's agent, which monarch-spmd's runner and worker replace: accepted and
#: ignored, with a note saying why (per target where the reason differs).
_IGNORED: Final[Mapping[str, str | Mapping[str, str | None]]] = {
    "rdzv_backend": "monarch-spmd forms the gang itself: every rank starts at once and rank 0 hosts the "
                    "TCPStore at MASTER_ADDR:MASTER_PORT",
    "rdzv_endpoint": "monarch-spmd forms the gang itself: every rank starts at once and rank 0 hosts the "
                     "TCPStore at MASTER_ADDR:MASTER_PORT",
    "rdzv_conf": "monarch-spmd has no rendezvous to configure (see --rendezvous-timeout for how long a "
                 "rank waits for MASTER_ADDR)",
    "monitor_interval": "the ranks are watched by monarch-spmd, which notices an exit at once",
    "start_method": "every rank is a process of its own, started as `python SCRIPT` (torchrun's spawn)",
    "event_log_handler": "monarch-spmd writes no torchelastic events",
    "log_dir": {LOCAL: None, CLUSTER: "every rank's output is its pod's log: monarch-spmd logs JOB [--rank R]"},
    "redirects": {LOCAL: None, CLUSTER: "every rank's output is its pod's log: monarch-spmd logs JOB [--rank R]"},
    "tee": {LOCAL: None, CLUSTER: "every rank's output is its pod's log: monarch-spmd logs JOB [--rank R]"},
    "log_line_prefix_template": "every line is prefixed [rank N]",
    "local_ranks_filter": {LOCAL: "every rank's output is shown",
                           CLUSTER: "monarch-spmd logs JOB --rank R shows one rank"},
    "local_addr": {LOCAL: "every rank runs on this machine", CLUSTER: "each pod has its own address"},
    "logs_specs": "every rank's output is streamed, each line prefixed [rank N]",
    "signals_to_handle": "SIGTERM, SIGINT and SIGHUP reach every rank",
}

#: Flags refused whatever their value, and why.
_REFUSED: Final[Mapping[str, str]] = {
    "no_python": "the worker always runs the training program with Python (`python SCRIPT` or "
                 "`python -m MODULE`; spec.python on Kubernetes); to launch another program, start it "
                 "from a Python script (os.execvp)",
    "duplicate_stdout_filters": "it copies lines into files; every rank's output is streamed, each line "
                                "prefixed [rank N]: filter it with grep",
    "duplicate_stderr_filters": "it copies lines into files; every rank's output is streamed, each line "
                                "prefixed [rank N]: filter it with grep",
    "numa_binding": "monarch-spmd does not bind ranks to CPUs; drop it, or bind in the script "
                    "(os.sched_setaffinity)",
    "virtual_local_rank": "LOCAL_RANK stays the proc's index on its node, torchrun's default, and every "
                          "proc sees the node's GPUs; drop it and pick the device with "
                          "torch.cuda.set_device(LOCAL_RANK)",
    "print_completion": "it prints torchrun's shell completion: run torchrun --print-completion",
}


def add_arguments(parser: argparse.ArgumentParser | Any, *, shared: bool = True) -> None:
    """Adds torchrun's flags to ``parser`` (an ArgumentParser or an argument group).

    Every flag defaults to None, so :func:`given` tells what the command line set; values stay
    strings and are checked by :func:`plan`, whose messages name the flag.

    Args:
        shared: also add the flags :attr:`Flag.shared` marks (leave them out when the parser
            defines them itself).
    """
    for f in FLAGS:
        if f.shared and not shared:
            continue
        if f.metavar is None:
            parser.add_argument(*f.names, dest=f.dest, action="store_const", const=True, default=None, help=f.help)
        else:
            parser.add_argument(*f.names, dest=f.dest, metavar=f.metavar, default=None, choices=f.choices, help=f.help)


def given(namespace: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """The torchrun flags a parsed command line set: ``{dest: value}``."""
    values = vars(namespace) if isinstance(namespace, argparse.Namespace) else dict(namespace)
    return {f.dest: values[f.dest] for f in FLAGS if values.get(f.dest) is not None}


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises :class:`TorchrunError` instead of exiting."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise TorchrunError(message)


def parser(prog: str = "torchrun") -> argparse.ArgumentParser:
    """torchrun's command line: its flags, then the training script and the script's arguments."""
    p = _Parser(prog=prog, add_help=False)
    add_arguments(p)
    p.add_argument("script", nargs="?")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


@dataclass(frozen=True)
class Launch:
    """A torchrun command line, parsed but not yet checked.

    Attributes:
        options: the flags given, ``{dest: value}`` (values as written).
        script: the training script (a module with ``-m``), or None.
        script_args: the script's arguments.
    """

    options: Mapping[str, Any] = field(default_factory=dict)
    script: str | None = None
    script_args: tuple[str, ...] = ()


def script_index(argv: Sequence[str], parse: argparse.ArgumentParser) -> int | None:
    """The index of the first positional word of ``argv`` (the training script), or None; also
    None when a ``--`` comes first. The options of ``parse`` say which flags take a value (the
    word after such a flag is not the script)."""
    args = list(argv)
    actions = parse._option_string_actions  # option string -> action: stable since argparse began
    longs = [o for o in actions if o.startswith("--")]
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return None
        if not word.startswith("-") or word == "-":
            return i
        action = actions.get(word)
        if action is None and word.startswith("--") and "=" not in word:
            matches = {id(actions[o]): actions[o] for o in longs if o.startswith(word)}  # abbreviations
            action = next(iter(matches.values())) if len(matches) == 1 else None
        i += 2 if action is not None and action.nargs != 0 else 1
    return None


def split_options(argv: Sequence[str], parse: argparse.ArgumentParser) -> tuple[list[str], list[str] | None]:
    """Splits ``argv`` at a ``--`` that comes before the training script, as torchrun reads one.

    ``torchrun --nproc-per-node 2 -- train.py --x`` runs ``train.py --x``; a ``--`` after the
    script (``torchrun train.py --a -- --b``) belongs to the script's arguments.

    Returns:
        ``(options, rest)``: the launcher's part and what follows the ``--`` (None when there is
        no such ``--``).
    """
    args = list(argv)
    if "--" not in args or script_index(args, parse) is not None:
        return args, None
    i = args.index("--")
    return args[:i], args[i + 1:]


def launcher_length(argv: Sequence[str]) -> int:
    """How many leading words of ``argv`` name torchrun itself: ``torchrun`` (1) or
    ``python[3] [-u] -m torch.distributed.run`` (3 or 4); 0 when it starts with neither.

    Raises:
        TorchrunError: for ``python -m torch.distributed.launch``, whose command line differs.
    """
    args = list(argv)
    if not args:
        return 0
    first = os.path.basename(args[0])
    if first == "torchrun":
        return 1
    if re.fullmatch(r"python(\d+(\.\d+)?)?", first):
        i = 1
        while i < len(args) and args[i] in ("-u", "-O", "-OO", "-B", "-E", "-s", "-I"):
            i += 1
        if i + 1 < len(args) and args[i] == "-m":
            if args[i + 1] == "torch.distributed.run":
                return i + 2
            if args[i + 1] == "torch.distributed.launch":
                raise TorchrunError("python -m torch.distributed.launch: not supported (it is deprecated and "
                                    "passes --local-rank to the script); write the command with torchrun "
                                    "(python -m torch.distributed.run) and read LOCAL_RANK from the environment")
    return 0


def starts_with_flag(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (what follows ``--``) starts with an option other than ``-m``: torchrun's
    flags written without the word torchrun (a training argv is ``-m MODULE ...`` or
    ``SCRIPT ...``, never an option)."""
    return bool(argv) and argv[0].startswith("-") and argv[0] not in ("-", "-m", "--")


def unknown_flag_error(word: str, own: argparse.ArgumentParser | None = None) -> TorchrunError:
    """The error for ``word``, an option of a torchrun command line that is none of :data:`FLAGS`,
    naming it and what to do; ``own`` is the command's parser (its options go before ``--``)."""
    flag = word.split("=", 1)[0]
    if own is not None and flag in own._option_string_actions:  # option string -> action, as in script_index
        return TorchrunError(f"{flag}: an option of {own.prog}, not of torchrun: give it before '--' (torchrun's "
                             "command line follows '--')")
    return TorchrunError(f"unrecognized arguments: {flag} (not a torchrun flag monarch-spmd knows: docs/torchrun.md "
                         "lists torch 2.14's and what each does here); check its spelling, drop it, or, if the "
                         "training script takes it, put it after the script")


def parse(argv: Sequence[str], *, own: argparse.ArgumentParser | None = None) -> Launch:
    """Parses a torchrun command line (``torchrun`` or ``python -m torch.distributed.run`` first,
    or neither): its flags, the script and the script's arguments.

    Every flag of :data:`FLAGS` is read in each spelling torchrun accepts (``--max-restarts 3``,
    ``--max_restarts=3``, ``-t3``), wherever the command line stands.

    Args:
        argv: the command line.
        own: the parser of the monarch-spmd command it came with, whose options an error for an
            unknown flag tells apart (they go before ``--``).

    Raises:
        TorchrunError: for a flag torchrun does not have (naming it and what to do), a missing
            value, or ``torch.distributed.launch``.
    """
    args = list(argv)
    args = args[launcher_length(args):]
    p = parser()
    head, rest = split_options(args, p)
    ns, unknown = p.parse_known_args(head)
    flags = [w for w in unknown if w.startswith("-")]
    if flags:
        raise unknown_flag_error(flags[0], own)
    if rest is not None:
        if not rest:
            raise TorchrunError("no training script after '--'")
        return Launch(given(ns), rest[0], tuple(rest[1:]))
    return Launch(given(ns), ns.script, tuple(ns.script_args))


@dataclass(frozen=True)
class Plan:
    """What a torchrun command line asks for, as monarch-spmd runs it.

    Attributes:
        nodes: torchrun's ``--nnodes`` (its MAX): the mesh's first dimension (one worker, or pod, each).
        min_nodes: the MIN of an elastic ``--nnodes MIN:MAX`` (mesh[0].minSize), or None.
        procs: ``--nproc-per-node``, resolved to a number: the mesh's last dimension.
        from_gpus: ``procs`` counts GPUs (``gpu``, or ``auto`` where GPUs are visible).
        argv: the training argv, ``["-m", MODULE, ...]`` or ``[SCRIPT, ...]``.
        max_restarts: gang restarts (torchrun's default 0).
        master_addr: MASTER_ADDR for a local run (None on the cluster, where it is the Service).
        master_port: rank 0's port, or None for a free one (the cluster: spec.masterPort's default).
        run_id: TORCHELASTIC_RUN_ID for a local run; None for a fresh one (a uuid, as torchrun's
            c10d rendezvous makes); on the cluster always None (the job's uid).
        role: ROLE_NAME, or None for torchrun's ``default``.
        grace_period: seconds between SIGTERM and SIGKILL (``--shutdown-timeout``), or None.
        notes: one line per flag accepted but ignored, naming it and saying why.
        log_dir, redirects, tee: ``--log-dir``, ``--redirects``, ``--tee`` for a local run (torchrun's
            syntax, checked); on the cluster None, "0", "0".
    """

    nodes: int
    procs: int
    from_gpus: bool
    argv: tuple[str, ...]
    min_nodes: int | None = None
    max_restarts: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    role: str | None = None
    grace_period: float | None = None
    notes: tuple[str, ...] = ()
    log_dir: str | None = None
    redirects: str = "0"
    tee: str = "0"

    @property
    def mesh(self) -> list[tuple[str, int]]:
        """``[("nodes", N), ("procs", P)]``."""
        return [(NODES_DIM, self.nodes), (PROCS_DIM, self.procs)]


def int_flag(flag: str, value: Any, low: int, high: int | None = None, what: str = "") -> int:
    """``value`` as an integer in ``low..high``; the error names ``flag`` and the valid range."""
    valid = f"an integer in {low}..{high}" if high is not None else f"an integer of at least {low}"
    try:
        number = int(str(value).strip())
    except ValueError:
        raise TorchrunError(f"{flag}: {value!r} is not valid; expected {valid}{what}") from None
    if number < low or (high is not None and number > high):
        raise TorchrunError(f"{flag}: {number} is not valid; expected {valid}{what}")
    return number


def parse_nnodes(value: str) -> tuple[int, int]:
    """torchrun's ``--nnodes``: ``N`` (or ``N:N``), or an elastic range ``MIN:MAX``; returns
    ``(MIN, MAX)``, equal for a fixed size. MAX is the mesh's first dimension, MIN its minSize.

    Raises:
        TorchrunError: naming ``--nnodes`` and what would be valid.
    """
    text = str(value).strip()
    parts = text.split(":")
    valid = "expected a number of nodes, e.g. --nnodes 2, or a range MIN:MAX, e.g. --nnodes 2:4"
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise TorchrunError(f"--nnodes: {text!r} is not valid; {valid}")
    low, high = (int(p) for p in (parts * 2)[:2])
    if low < 1 or high < low:
        raise TorchrunError(f"--nnodes: {text!r} is not valid; {valid} (1 <= MIN <= MAX)")
    return low, high


def parse_nproc_per_node(value: str, *, gpus: int, cpus: int) -> tuple[int, bool]:
    """torchrun's ``--nproc-per-node``, resolved as torchrun resolves it.

    Args:
        value: an integer, ``gpu`` (the CUDA devices visible), ``cpu`` (the CPUs this process may
            run on) or ``auto`` (``gpu`` when there is one, else ``cpu``).
        gpus: the number of CUDA devices visible here.
        cpus: the number of CPUs this process may run on.

    Returns:
        ``(procs per node, whether they count GPUs)``.

    Raises:
        TorchrunError: naming ``--nproc-per-node``: a bad value, ``gpu`` with no GPU, ``xpu``.
    """
    text = str(value).strip()
    valid = "expected an integer of at least 1, or gpu, cpu or auto"
    if re.fullmatch(r"[+-]?\d+", text):
        return int_flag("--nproc-per-node", text, 1, contract.MAX_PROCS), False
    if text == "gpu":
        if gpus < 1:
            raise TorchrunError("--nproc-per-node gpu: no CUDA device is visible here (torchrun says "
                                "'Cuda is not available'); give a number of procs, or cpu")
        return gpus, True
    if text == "cpu":
        return max(1, cpus), False
    if text == "auto":
        return (gpus, True) if gpus > 0 else (max(1, cpus), False)
    if text == "xpu":
        raise TorchrunError("--nproc-per-node xpu: not supported; monarch-spmd counts CUDA GPUs and CPUs: "
                            f"{valid}")
    raise TorchrunError(f"--nproc-per-node: {text!r} is not valid; {valid}")


def counts_devices(launch: Launch) -> bool:
    """Whether :func:`plan` needs the number of visible GPUs (``gpu`` or ``auto``)."""
    return str(launch.options.get("nproc_per_node", "")).strip() in ("gpu", "auto")


def training_argv(script: str | None, args: Sequence[str], module: bool) -> tuple[str, ...]:
    """The training argv of torchrun's script (a module with ``-m``) and its arguments.

    Raises:
        TorchrunError: no script, or a script that is an interpreter or launcher.
    """
    if not script:
        raise TorchrunError("no training script: give it after the flags, e.g. train.py --lr 0.1 or -m train")
    if module:
        return ("-m", script, *args)
    base = os.path.basename(script)
    if re.fullmatch(r"python(\d+(\.\d+)?)?", base) or base == "torchrun":
        raise TorchrunError(f"the training script is {script!r}: give the script itself (train.py ...) or "
                            "-m MODULE; every rank is run with Python already")
    if script.startswith("-"):
        raise TorchrunError(f"{script!r} is not a training script; give SCRIPT ARGS... or -m MODULE ARGS...")
    return (script, *args)


def _uses_c10d_here(opts: Mapping[str, Any], nodes: int) -> bool:
    """Whether torchrun would run its c10d rendezvous on this machine (``run()`` in torchrun's
    run.py): ``--standalone``, or one node with no port and no rendezvous flag."""
    if opts.get("standalone"):
        return True
    static = str(opts.get("rdzv_backend") or "static") == "static"
    return static and not opts.get("rdzv_endpoint") and opts.get("master_port") is None and nodes == 1


def plan(launch: Launch, target: str, *, gpus: int = 0, cpus: int = 1) -> Plan:
    """Checks a torchrun command line and says how monarch-spmd runs it (see the module docstring).

    Args:
        launch: the parsed command line.
        target: :data:`LOCAL` (``monarch-spmd run``) or :data:`CLUSTER` (``monarch-spmd manifest``).
        gpus: CUDA devices visible here (only read for ``gpu`` and ``auto``).
        cpus: CPUs this process may run on (only read for ``cpu`` and ``auto``).

    Raises:
        TorchrunError: naming the flag, for a refused flag or a value that is not valid.
    """
    if target not in (LOCAL, CLUSTER):
        raise ValueError(f"target: {target!r} is not valid; expected {LOCAL!r} or {CLUSTER!r}")
    opts = dict(launch.options)
    for dest, why in _REFUSED.items():
        if opts.get(dest) is not None:
            raise TorchrunError(f"{BY_DEST[dest].name}: not supported: {why}")
    std: dict[str, str] = {}
    for dest in ("redirects", "tee"):
        if opts.get(dest) is not None:
            try:
                procgroup.parse_std(str(opts[dest]), BY_DEST[dest].name)
            except ValueError as e:
                raise TorchrunError(str(e)) from None
            std[dest] = str(opts[dest]).strip()
    notes: list[str] = []
    for dest, why in _IGNORED.items():
        if opts.get(dest) is not None:
            reason = why if isinstance(why, str) else why[target]
            if reason is not None:
                notes.append(f"{BY_DEST[dest].name}: ignored: {reason}")
    log_dir = opts.get("log_dir") if target == LOCAL else None
    if log_dir is not None and not str(log_dir).strip():
        raise TorchrunError("--log-dir: empty; give a folder for the ranks' log files, e.g. --log-dir logs")

    min_nodes, nodes = parse_nnodes(opts["nnodes"]) if opts.get("nnodes") is not None else (1, 1)
    try:
        procs, from_gpus = parse_nproc_per_node(opts.get("nproc_per_node", "1"), gpus=gpus, cpus=cpus)
    except TorchrunError as e:
        if target == CLUSTER and str(opts.get("nproc_per_node")).strip() == "gpu":
            raise TorchrunError("--nproc-per-node gpu: this machine sees no CUDA device to count; give the number "
                                "of GPUs a node of the cluster has, e.g. --nproc-per-node 8, and --gpus-per-proc 1"
                                ) from None
        raise e from None
    if nodes * procs > contract.MAX_PROCS:
        raise TorchrunError(f"--nnodes {nodes} x --nproc-per-node {procs} is {nodes * procs} procs; at most "
                            f"{contract.MAX_PROCS} are allowed")
    if opts.get("standalone") and nodes > 1:
        raise TorchrunError(f"--standalone: runs one node; with --nnodes {nodes} drop --standalone")
    if target == CLUSTER and str(opts.get("nproc_per_node", "")).strip() in ("gpu", "cpu", "auto"):
        counted = "CUDA devices" if from_gpus else "CPUs"
        notes.append(f"--nproc-per-node {opts['nproc_per_node']}: {procs}, the {counted} of this machine; give "
                     "the number the cluster's nodes have if it differs")

    max_restarts = 0
    if opts.get("max_restarts") is not None:
        max_restarts = int_flag("--max-restarts", opts["max_restarts"], 0, MAX_RESTARTS,
                            " (spec.restartPolicy.maxRestarts)")
    master_port = None
    if opts.get("master_port") is not None:
        master_port = int_flag("--master-port", opts["master_port"], 1, 65535)
    node_rank = None
    if opts.get("node_rank") is not None:
        node_rank = int_flag("--node-rank", opts["node_rank"], 0)
    grace = None
    if opts.get("shutdown_timeout") is not None:
        grace = float(int_flag("--shutdown-timeout", opts["shutdown_timeout"], 0))
    role = opts.get("role")
    if role is not None and not str(role).strip():
        raise TorchrunError("--role: empty; give the role's name (ROLE_NAME), e.g. --role trainer")
    if opts.get("run_path"):
        notes.append("--run-path: the script runs in an interpreter of its own, with the same argv and "
                     "environment as under torchrun")
    argv = training_argv(launch.script, launch.script_args, bool(opts.get("module")))

    c10d = _uses_c10d_here(opts, nodes)
    rdzv_id = opts.get("rdzv_id")
    run_id: str | None = None
    master_addr: str | None = None
    if target == LOCAL:
        if node_rank is not None:
            if nodes > 1:
                raise TorchrunError(f"--node-rank: monarch-spmd run starts all {nodes} nodes on this machine, so "
                                    "there is no node to pick; drop --node-rank (to run the nodes on a cluster, "
                                    "use monarch-spmd manifest)")
            if node_rank != 0:
                raise TorchrunError(f"--node-rank: {node_rank} is not valid with one node; expected 0")
        if c10d and master_port is not None:  # --standalone: torchrun picks a port itself
            notes.append("--master-port: ignored with --standalone, as torchrun ignores it")
            master_port = None
        if c10d and rdzv_id is not None:
            notes.append("--rdzv-id: ignored, as torchrun ignores it here (it makes a fresh run id for its "
                         "rendezvous on this machine); give --master-port to keep it")
        run_id = None if c10d else str(rdzv_id if rdzv_id is not None else DEFAULT_RUN_ID)
        master_addr = opts.get("master_addr")
        if master_addr is not None and not str(master_addr).strip():
            raise TorchrunError("--master-addr: empty; give an address of this machine, e.g. 127.0.0.1")
        if c10d:
            if master_addr is not None:
                notes.append("--master-addr: ignored, as torchrun ignores it here (its rendezvous runs on this "
                             "machine, at localhost); give --master-port to use it")
            master_addr = C10D_MASTER_ADDR
        elif master_addr is None:
            master_addr = DEFAULT_MASTER_ADDR
    else:
        if node_rank is not None:
            notes.append("--node-rank: ignored: the operator starts every node, each pod with its own node "
                         "rank (GROUP_RANK)")
        if opts.get("master_addr") is not None:
            notes.append("--master-addr: ignored: MASTER_ADDR is the Service of the job's attempt, "
                         "<name>-<id>-m<attempt>.<namespace>.svc")
        if rdzv_id is not None:
            notes.append("--rdzv-id: ignored: TORCHELASTIC_RUN_ID is the SPMDJob's uid")
        if grace is not None:
            notes.append("--shutdown-timeout: ignored: set spec.template.spec.terminationGracePeriodSeconds "
                         "for the time from SIGTERM to SIGKILL")
            grace = None
        if opts.get("standalone") and master_port is not None:
            notes.append("--master-port: ignored with --standalone, as torchrun ignores it")
            master_port = None
    if target == CLUSTER:
        std = {}
    return Plan(nodes=nodes, min_nodes=min_nodes if min_nodes < nodes else None, procs=procs, from_gpus=from_gpus,
                argv=argv, max_restarts=max_restarts,
                master_addr=master_addr, master_port=master_port, run_id=run_id, role=role,
                grace_period=grace, notes=tuple(notes), log_dir=log_dir, redirects=std.get("redirects", "0"),
                tee=std.get("tee", "0"))


# --- the SPMDJob a torchrun command line stands for -----------------------------------------


def default_name(argv: Sequence[str]) -> str:
    """A job name from the training argv: the module or the script's stem, as a DNS-1035 label.

    ``-m torchtitan.train`` gives ``torchtitan-train``, ``scripts/train_llm.py`` gives ``train-llm``.
    """
    args = list(argv)
    stem = args[1] if args and args[0] == "-m" and len(args) > 1 else os.path.splitext(os.path.basename(args[0] if args else ""))[0]
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower())
    name = re.sub(r"^[^a-z]+", "", name)[:50].strip("-")
    return name or "torchrun-job"


#: The toleration of the NVIDIA device plugin's taint, which GPU nodes commonly carry.
GPU_TOLERATION: Final = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def manifest(run: Plan, *, name: str, image: str, namespace: str | None = None,
             gpus_per_proc: int | None = None, cpu: str | None = None, memory: str | None = None,
             shm_size: str | None = None) -> dict[str, Any]:
    """The SPMDJob manifest for ``run`` (a :data:`CLUSTER` plan), for ``kubectl apply``.

    The mesh is ``[nodes, procs]`` with podLayout PerHost (one pod per node, running its procs as
    torchrun's agent does); gpusPerProc is ``gpus_per_proc``, else 1 when the procs count GPUs,
    and with GPUs the pods tolerate the device plugin's taint (:data:`GPU_TOLERATION`); ``cpu``
    and ``memory`` are each pod's (each node's) requests, ``memory`` its limit too; ``shm_size``
    is spec.shmSize. maxRestarts is always written (torchrun's default 0 is not the SPMDJob's 3).
    """
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    body: dict[str, Any] = {
        "mesh": [{"name": n, "size": s, **({"minSize": run.min_nodes} if i == 0 and run.min_nodes else {})}
                 for i, (n, s) in enumerate(run.mesh)],
        "podLayout": names.PER_HOST,
        "image": image,
        "args": list(run.argv),
    }
    gpus = gpus_per_proc if gpus_per_proc is not None else (1 if run.from_gpus else 0)
    if gpus:
        body["gpusPerProc"] = gpus
    if run.master_port is not None:
        body["masterPort"] = run.master_port
    body["restartPolicy"] = {"maxRestarts": run.max_restarts}
    if shm_size:
        body["shmSize"] = shm_size
    trainer: dict[str, Any] = {"name": names.TRAINER_CONTAINER}
    if run.role is not None:
        trainer["env"] = [{"name": names.ROLE_NAME_VAR, "value": str(run.role)}]
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    if requests:
        trainer["resources"] = {"requests": requests, **({"limits": {"memory": memory}} if memory else {})}
    pod: dict[str, Any] = {}
    if len(trainer) > 1:
        pod["containers"] = [trainer]
    if gpus:
        pod["tolerations"] = [dict(GPU_TOLERATION)]
    if pod:
        body["template"] = {"spec": pod}
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": metadata, "spec": body}
