"""The in-pod worker: turns the MONARCH_SPMD_* inputs into torchrun's env and runs the training argv.

Where it sits: in the payload, one layer above :mod:`.contract` and :mod:`.names`, below
everything else. The SPMDJob operator runs it as every pod's command, the local runner
(:mod:`monarch_spmd.runner`) as every local process, so a job behaves the same on a laptop and on
a cluster. Like the whole payload it imports only the standard library and its siblings: the
operator ships the payload into pods (a ConfigMap mounted at ``/opt/monarch-spmd/payload``) whose
image does not contain the project.

Three ways to start it, all equivalent::

    python3 /opt/monarch-spmd/payload/worker.py -- -m train --lr 0.001
    python3 -m monarch_spmd.payload.worker -- train.py --lr 0.001
    monarch-spmd worker -- -m train --lr 0.001

Input variables (the operator sets them on each pod, the local runner on each process; their
names are constants of :mod:`.names`):

==================================  ==========================  =====================================
variable                            example                     meaning
==================================  ==========================  =====================================
MONARCH_SPMD_MESH (required)        ``hosts=2,gpus=2``          ordered mesh; the last dimension is
                                                                the local one
MONARCH_SPMD_COORDS (required)      ``1,0``                     this proc's coordinates, one per
                                                                dimension, in mesh order
MONARCH_SPMD_MASTER_ADDR (req.)     ``hello-master.ns.svc``     name or IP of the rank-0 proc
MONARCH_SPMD_MASTER_PORT (req.)     ``29500``                   port of rank 0's TCPStore, 1..65535
MONARCH_SPMD_RESTART_COUNT          ``0`` (default)             gang attempt ->
                                                                TORCHELASTIC_RESTART_COUNT
MONARCH_SPMD_MAX_RESTARTS           ``0`` (default)             -> TORCHELASTIC_MAX_RESTARTS
MONARCH_SPMD_RUN_ID                 ``none`` (default)          -> TORCHELASTIC_RUN_ID (the job uid)
MONARCH_SPMD_ROLE_NAME              ``default`` (default)       -> ROLE_NAME
MONARCH_SPMD_RENDEZVOUS_TIMEOUT     ``300`` (default)           seconds to wait for MASTER_ADDR to
                                                                resolve
MONARCH_SPMD_LOCAL_RANK_SCOPE       ``mesh`` (default), ``pod`` ``mesh``: LOCAL_RANK is the
                                                                coordinate on the last dimension.
                                                                ``pod``: every proc is its own
                                                                torchrun node (LOCAL_RANK=0,
                                                                LOCAL_WORLD_SIZE=1, RANK and
                                                                WORLD_SIZE unchanged), for one-GPU
                                                                pods (PerProc only)
MONARCH_SPMD_POD_LAYOUT             ``PerProc`` (default),      ``PerHost``: this worker is a host:
                                    ``PerHost``                 MONARCH_SPMD_COORDS has every
                                                                coordinate but the last, and the
                                                                worker runs the last dimension's
                                                                procs as local processes
MONARCH_SPMD_MODE                   ``Program`` (default),      ``Monarch``: this worker (PerHost)
                                    ``Monarch``                 is a Monarch host: it serves
                                                                Monarch's worker loop instead of
                                                                running an argv (see below)
MONARCH_SPMD_MONARCH_PORT           ``26600`` (default)         Monarch mode: the worker loop's port
MONARCH_SPMD_AGENT_PORT             unset (default), ``29400``  the restart-in-place coordinator's
                                                                port (member 0 listens, every agent
                                                                connects); unset: no restart in
                                                                place, the first failure ends the
                                                                worker with its code
MONARCH_SPMD_AGENT_ADDR             the master address          where agents reach the coordinator
MONARCH_SPMD_AGENT_TOKEN            unset, 43 URL-safe chars    the attempt's proof of membership:
                                                                the coordinator accepts only agents
                                                                and observers whose hello has it
MONARCH_SPMD_DISRUPTIONS            ``0`` (default)             restarts so far that do not count
                                                                against the maximum
MONARCH_SPMD_PERMANENT_EXIT_CODES   ``""`` (default), ``3,4``   restartPolicy.permanentExitCodes
MONARCH_SPMD_RETRYABLE_EXIT_CODES   ``""`` (default), ``1``     restartPolicy.retryableExitCodes
MONARCH_SPMD_PERMANENT_REASONS      ``""``, ``OOMKilled``       restartPolicy.permanentReasons
MONARCH_SPMD_BACKOFF_SECONDS        ``10`` (default)            back-off before the 2nd restart in a
                                                                row, doubling after
MONARCH_SPMD_MAX_BACKOFF_SECONDS    ``300`` (default)           the longest back-off
MONARCH_SPMD_BACKOFF_RESET_SECONDS  ``300`` (default)           a round that ran this long resets it
MONARCH_SPMD_JOIN_TIMEOUT           ``120`` (default)           seconds a round may stay open before
                                                                the gang is recreated (exit 75)
MONARCH_SPMD_MEMBER_FAILURE_LIMIT   ``3`` (default)             in-place restarts in a row caused by
                                                                one pod before the gang is recreated
MONARCH_SPMD_MIN_MEMBERS            unset (default), ``2``      an elastic gang: a round may start
                                                                with this many pods (torchrun's
                                                                --nnodes MIN); PerHost, 2 dimensions
MONARCH_SPMD_ELASTIC_WAIT           ``10`` (default)            seconds an elastic round waits for
                                                                the rest once MIN pods joined
MONARCH_SPMD_PROGRESS_TIMEOUT       ``0`` (default: off)        seconds without output from a rank
                                                                before it fails (NoProgress)
MONARCH_SPMD_STOP_GRACE             ``30`` (default)            seconds from SIGTERM to SIGKILL when
                                                                the agent stops its processes
MONARCH_SPMD_FAILURE_OUTPUT         ``Tail`` (default),         ``None``: no line of the processes'
                                    ``None``                    output in failure reports, the
                                                                termination message or heartbeats
MONARCH_SPMD_LOG_DIR                unset (default)             torchrun's ``--log-dir``
MONARCH_SPMD_REDIRECTS              ``0`` (default), ``3``      torchrun's ``--redirects``
MONARCH_SPMD_TEE                    ``0`` (default), ``0:3``    torchrun's ``--tee``
MONARCH_SPMD_AGENT_STORE            ``0`` (default), ``1``      ``1``: member 0's agent hosts the
                                                                TCPStore on MASTER_PORT for its
                                                                whole life and the ranks see
                                                                TORCHELASTIC_USE_AGENT_STORE=True,
                                                                as under torchrun (torchft needs
                                                                it; :mod:`.agentstore`)
MONARCH_SPMD_SPARE                  unset (default), ``0``      a hot spare's index: no coordinates;
                                                                it waits to take a lost member's
                                                                place (docs/restart-in-place.md)
MONARCH_SPMD_OBSERVER_WAIT          unset (default), ``10``     member 0: seconds to wait, once its
                                                                coordinator listens, for an observer
                                                                before joining (the local runner's)
==================================  ==========================  =====================================

None of these variables reaches the training processes: they get torchrun's variables over the
worker's environment without any MONARCH_SPMD_* variable.

What it does, in order:

1. reads and checks the inputs; a missing or invalid one is reported on stderr naming the
   variable and what would be valid, exit code 64 (``EX_USAGE``);
2. builds the env with :func:`.contract.torch_elastic_env` and prints one line with
   rank, world size and master to stderr (so pod logs show who is who);
3. waits until MASTER_ADDR resolves (the start-up DNS race other operators paper over with init
   containers; see :func:`wait_for_master`); if it does not within the rendezvous timeout it says
   so, naming address and timeout, and exits with 75 (``EX_TEMPFAIL``, retryable). It never waits
   for rank 0's port: every rank starts its program at once, as under torchrun;
4. becomes the pod's agent (:mod:`.agent`, torchrun's elastic agent): runs the argv
   (``-m module args...`` or ``path.py args...``) with ``sys.executable``, one process per proc
   of the pod, all at once, each leading its own process group, passes SIGTERM, SIGINT and
   SIGHUP on to them as they are, and exits with the first failure's exit code (128+N for a
   process killed by signal N), so it becomes the pod's exit code. With
   MONARCH_SPMD_AGENT_PORT set it restarts the processes in place instead, in rounds agreed with
   the other pods' agents (docs/restart-in-place.md), and serves torchrun's watchdog
   (TORCHELASTIC_ENABLE_FILE_TIMER) and the progress timeout in every mode.

In the PerHost layout step 4 runs one process per proc of the host, as torchrun's agent runs
``--nproc-per-node`` workers (:mod:`.procgroup`): each with its own environment from the contract
(LOCAL_RANK = its index on the last dimension), each output line prefixed with its rank; the
first to fail stops its siblings (SIGTERM, SIGKILL after the grace period) and the worker's last
line names it (``monarch-spmd worker: rank R exited with code C (local rank L) in restart N;
...``, also written to the termination message) so that the job's status names the rank, not
only the pod.

In Monarch mode (``MONARCH_SPMD_MODE=Monarch``, no argv) steps 3 and 4 are replaced: the worker
runs Monarch's worker loop as its child (``python -c`` :data:`MONARCH_BOOTSTRAP`: this module
never imports monarch; the image must have torchmonarch), listening on every interface at
MONARCH_SPMD_MONARCH_PORT and advertising the pod's IP (POD_IP), until the pod is deleted. A
Monarch client (``monarch_spmd.kubernetes.proc_mesh``) attaches to it and spawns the host's procs,
which inherit the pod's environment without the MONARCH_SPMD_* inputs (as procs on one machine).
Without torchmonarch the child exits 64 naming the interpreter, a permanent failure.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

if __name__ == "__main__" and not __package__:
    # Run as a file (the pod command, the ConfigMap mounted at /opt/monarch-spmd/payload): load
    # the payload package beside this file under a private name, so that no package of the image
    # (an older monarch_spmd, a module called "payload") can stand in for it, and run its worker.
    import importlib
    import importlib.util

    _here = os.path.dirname(os.path.abspath(__file__))
    _spec = importlib.util.spec_from_file_location(
        "_monarch_spmd_payload", os.path.join(_here, "__init__.py"), submodule_search_locations=[_here]
    )
    assert _spec is not None and _spec.loader is not None
    sys.modules[_spec.name] = _package = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_package)
    sys.exit(importlib.import_module(f"{_spec.name}.worker").main())

from . import agent, contract, counting, procgroup, rendezvous, stacks, timer
from .names import (
    AGENT_ADDR_VAR,
    AGENT_PORT_VAR,
    AGENT_TOKEN_VAR,
    BACKOFF_RESET_VAR,
    BACKOFF_VAR,
    COORDS_VAR,
    DISRUPTIONS_VAR,
    FAILURE_OUTPUT_NONE,
    FAILURE_OUTPUT_TAIL,
    FAILURE_OUTPUT_VAR,
    FAILURE_OUTPUTS,
    JOIN_TIMEOUT_VAR,
    LOG_DIR_VAR,
    MAX_BACKOFF_VAR,
    MEMBER_FAILURE_LIMIT_VAR,
    MIN_MEMBERS_VAR,
    ELASTIC_WAIT_VAR,
    PERMANENT_EXIT_CODES_VAR,
    PERMANENT_REASONS_VAR,
    PROGRESS_TIMEOUT_VAR,
    REDIRECTS_VAR,
    RETRYABLE_EXIT_CODES_VAR,
    STOP_GRACE_VAR,
    TEE_VAR,
    AGENT_STORE_VAR,
    EX_TEMPFAIL,
    EX_USAGE,
    DEFAULT_MONARCH_PORT,
    LOCAL_RANK_SCOPE_VAR,
    MASTER_ADDR_VAR,
    MODE_MONARCH,
    MODE_PROGRAM,
    MODE_VAR,
    MODES,
    MONARCH_PORT_VAR,
    PER_HOST,
    PER_PROC,
    POD_LAYOUT_VAR,
    POD_LAYOUTS,
    RESERVED_PREFIX,
    MASTER_PORT_VAR,
    MAX_RESTARTS_VAR,
    MESH_VAR,
    RENDEZVOUS_TIMEOUT_VAR,
    RESTART_COUNT_VAR,
    ROLE_NAME_VAR,
    RUN_ID_VAR,
    SPARE_VAR,
)

#: Every input variable, in the order of the docstring's table.
INPUT_VARS: Final = (
    MESH_VAR,
    COORDS_VAR,
    MASTER_ADDR_VAR,
    MASTER_PORT_VAR,
    RESTART_COUNT_VAR,
    MAX_RESTARTS_VAR,
    RUN_ID_VAR,
    ROLE_NAME_VAR,
    RENDEZVOUS_TIMEOUT_VAR,
    LOCAL_RANK_SCOPE_VAR,
    POD_LAYOUT_VAR,
    MODE_VAR,
    MONARCH_PORT_VAR,
    AGENT_PORT_VAR,
    AGENT_ADDR_VAR,
    AGENT_TOKEN_VAR,
    DISRUPTIONS_VAR,
    PERMANENT_EXIT_CODES_VAR,
    RETRYABLE_EXIT_CODES_VAR,
    PERMANENT_REASONS_VAR,
    BACKOFF_VAR,
    MAX_BACKOFF_VAR,
    BACKOFF_RESET_VAR,
    JOIN_TIMEOUT_VAR,
    MEMBER_FAILURE_LIMIT_VAR,
    MIN_MEMBERS_VAR,
    ELASTIC_WAIT_VAR,
    PROGRESS_TIMEOUT_VAR,
    STOP_GRACE_VAR,
    FAILURE_OUTPUT_VAR,
    LOG_DIR_VAR,
    REDIRECTS_VAR,
    TEE_VAR,
    AGENT_STORE_VAR,
)

DEFAULT_RUN_ID: Final = "none"
DEFAULT_RENDEZVOUS_TIMEOUT: Final = 300.0
SCOPE_MESH: Final = "mesh"
SCOPE_POD: Final = "pod"
LOCAL_RANK_SCOPES: Final = (SCOPE_MESH, SCOPE_POD)

#: Signals passed on to the training processes, as they are.
FORWARDED_SIGNALS: Final = agent.STOP_SIGNALS
#: Seconds from SIGTERM to SIGKILL when the agent stops its processes (torchrun's agent gives 30).
DEFAULT_STOP_GRACE: Final = 30.0

_PREFIX: Final = "monarch-spmd worker"


class WorkerInputError(ValueError):
    """An input variable or the argv is missing or invalid; the message names which."""


class RendezvousTimeout(RuntimeError):
    """MASTER_ADDR did not resolve, or MASTER_PORT did not accept, within the timeout."""


@dataclass(frozen=True)
class WorkerInputs:
    """The worker's inputs, parsed and checked (see the module docstring for their meaning)."""

    mesh: list[tuple[str, int]]
    coords: list[int]
    master_addr: str
    master_port: int
    restart_count: int = 0
    max_restarts: int = 0
    run_id: str = DEFAULT_RUN_ID
    role_name: str = contract.DEFAULT_ROLE_NAME
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT
    local_rank_scope: str = SCOPE_MESH
    pod_layout: str = PER_PROC
    mode: str = MODE_PROGRAM
    monarch_port: int = DEFAULT_MONARCH_PORT
    agent_port: int | None = None
    agent_addr: str | None = None
    agent_token: str | None = dataclasses.field(default=None, repr=False)
    disruptions: int = 0
    permanent_exit_codes: tuple[int, ...] = ()
    retryable_exit_codes: tuple[int, ...] = ()
    permanent_reasons: tuple[str, ...] = ()
    backoff: float = rendezvous.DEFAULT_BACKOFF
    max_backoff: float = rendezvous.DEFAULT_MAX_BACKOFF
    backoff_reset: float = rendezvous.DEFAULT_BACKOFF_RESET
    join_timeout: float = rendezvous.DEFAULT_JOIN_TIMEOUT
    member_failure_limit: int = rendezvous.DEFAULT_MEMBER_FAILURE_LIMIT
    #: An elastic gang's minimum of members (MONARCH_SPMD_MIN_MEMBERS); 0: a fixed size.
    min_members: int = 0
    elastic_wait: float = rendezvous.DEFAULT_ELASTIC_WAIT
    progress_timeout: float = 0.0
    stop_grace: float = DEFAULT_STOP_GRACE
    failure_output: str = FAILURE_OUTPUT_TAIL
    log_dir: str | None = None
    redirects: int | dict[int, int] = 0
    tee: int | dict[int, int] = 0
    #: Member 0's agent hosts the TCPStore on MASTER_PORT (MONARCH_SPMD_AGENT_STORE).
    agent_store: bool = False
    #: A hot spare's index (MONARCH_SPMD_SPARE): no coordinates until it takes a member's place.
    spare: int | None = None
    #: The hot spare these inputs' worker was before it took a member's place (its hello says so).
    was_spare: int | None = None

    @property
    def local_procs(self) -> int:
        """How many procs this worker runs: 1, or the last dimension's size in PerHost."""
        return self.mesh[-1][1] if self.pod_layout == PER_HOST else 1

    def proc_coords(self, local: int = 0) -> list[int]:
        """The coordinates of this worker's ``local``-th proc."""
        return [*self.coords, local] if self.pod_layout == PER_HOST else list(self.coords)

    @property
    def rank(self) -> int:
        """This proc's global rank (the first proc's, in PerHost)."""
        return contract.rank_of(self.mesh, self.proc_coords(0))

    @property
    def member(self) -> int:
        """This worker's member id in the gang: the index of its pod."""
        return self.rank // self.local_procs

    @property
    def members(self) -> int:
        """How many workers (pods) the gang has."""
        return contract.world_size(self.mesh) // self.local_procs

    def as_member(self, member: int) -> WorkerInputs:
        """These inputs for the worker of member ``member`` (a spare taking its place)."""
        dims = self.mesh[:-1] if self.pod_layout == PER_HOST else self.mesh
        coords = contract.coords_of(dims, member) if dims else []
        return dataclasses.replace(self, coords=coords, spare=None, was_spare=self.spare)

    def resized(self, group: int, count: int) -> WorkerInputs:
        """These inputs in an elastic round of ``count`` members where this worker is the
        ``group``-th: the mesh's first dimension (the members', PerHost) has ``count``
        coordinates and this worker the ``group``-th, as torchrun's re-rendezvous renumbers."""
        return dataclasses.replace(self, mesh=[(self.mesh[0][0], count), *self.mesh[1:]],
                                   coords=[group, *self.coords[1:]])

    def policy(self) -> counting.Policy:
        """The restart policy the coordinator decides with."""
        return counting.Policy(
            max_restarts=self.max_restarts, disruptions=self.disruptions,
            permanent_exit_codes=self.permanent_exit_codes, retryable_exit_codes=self.retryable_exit_codes,
            permanent_reasons=self.permanent_reasons, backoff=self.backoff, max_backoff=self.max_backoff,
            backoff_reset=self.backoff_reset, join_timeout=self.join_timeout,
            member_failure_limit=self.member_failure_limit, min_members=self.min_members,
            elastic_wait=self.elastic_wait, stop_grace=self.stop_grace)


def worker_input_env(
    mesh: contract.Mesh,
    coords: Sequence[int],
    master_addr: str,
    master_port: int,
    *,
    restart_count: int = 0,
    max_restarts: int = 0,
    run_id: str = DEFAULT_RUN_ID,
    role_name: str = contract.DEFAULT_ROLE_NAME,
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT,
    local_rank_scope: str = SCOPE_MESH,
    pod_layout: str = PER_PROC,
    mode: str = MODE_PROGRAM,
    monarch_port: int = DEFAULT_MONARCH_PORT,
    defaults: bool = True,
    keep: Collection[str] = (),
    **optional: Any,
) -> dict[str, str]:
    """The MONARCH_SPMD_* variables for one proc: what the operator and the local runner inject.

    The inverse of :func:`read_inputs`; the arguments mean what the table in the module docstring
    says (MONARCH_SPMD_MODE and MONARCH_SPMD_MONARCH_PORT only in Monarch mode). ``optional``
    takes the restart-in-place inputs by their :class:`WorkerInputs` names (``agent_port``,
    ``agent_addr``, ``disruptions``, ``permanent_exit_codes`` ... ``tee``); each is written only
    when given and not None. Values are checked by parsing the result back, so a bad argument
    raises :class:`WorkerInputError` naming the variable.

    ``defaults=False`` leaves out every input whose value is the worker's default (an absent
    variable means the same to :func:`read_inputs`), except the mesh, the coordinates, the master
    and the attempt (MONARCH_SPMD_RESTART_COUNT), which are always written, and the variables
    named in ``keep`` (a pod template that refers to one as ``$(NAME)``). The operator builds its
    pods so: thousands of pods carry the variables in every copy the API server stores, sends to
    each watcher and decodes.
    """
    env = {
        MESH_VAR: contract.format_mesh(mesh),
        COORDS_VAR: ",".join(str(c) for c in coords),
        MASTER_ADDR_VAR: master_addr,
        MASTER_PORT_VAR: str(master_port),
        RESTART_COUNT_VAR: str(restart_count),
        MAX_RESTARTS_VAR: str(max_restarts),
        RUN_ID_VAR: str(run_id),
        ROLE_NAME_VAR: role_name,
        RENDEZVOUS_TIMEOUT_VAR: _format_seconds(rendezvous_timeout),
        LOCAL_RANK_SCOPE_VAR: local_rank_scope,
        POD_LAYOUT_VAR: pod_layout,
    }
    if mode != MODE_PROGRAM:
        env[MODE_VAR] = mode
        env[MONARCH_PORT_VAR] = str(monarch_port)
    for key, value in optional.items():
        if key not in OPTIONAL_INPUTS:
            raise TypeError(f"worker_input_env: unknown input {key!r}; expected one of {', '.join(OPTIONAL_INPUTS)}")
        if value is not None:
            env[OPTIONAL_INPUTS[key]] = _format_input(value)
    inputs = read_inputs(env)
    if not defaults:
        for var in [v for v in env if v in _DEFAULTABLE and v not in keep]:
            if getattr(inputs, _DEFAULTABLE[var]) == _FIELD_DEFAULTS[_DEFAULTABLE[var]]:
                del env[var]
    return env


#: The optional inputs of :func:`worker_input_env`: WorkerInputs field -> variable.
OPTIONAL_INPUTS: Final = {
    "agent_port": AGENT_PORT_VAR,
    "agent_addr": AGENT_ADDR_VAR,
    "agent_token": AGENT_TOKEN_VAR,
    "disruptions": DISRUPTIONS_VAR,
    "permanent_exit_codes": PERMANENT_EXIT_CODES_VAR,
    "retryable_exit_codes": RETRYABLE_EXIT_CODES_VAR,
    "permanent_reasons": PERMANENT_REASONS_VAR,
    "backoff": BACKOFF_VAR,
    "max_backoff": MAX_BACKOFF_VAR,
    "backoff_reset": BACKOFF_RESET_VAR,
    "join_timeout": JOIN_TIMEOUT_VAR,
    "member_failure_limit": MEMBER_FAILURE_LIMIT_VAR,
    "min_members": MIN_MEMBERS_VAR,
    "elastic_wait": ELASTIC_WAIT_VAR,
    "progress_timeout": PROGRESS_TIMEOUT_VAR,
    "stop_grace": STOP_GRACE_VAR,
    "failure_output": FAILURE_OUTPUT_VAR,
    "log_dir": LOG_DIR_VAR,
    "redirects": REDIRECTS_VAR,
    "tee": TEE_VAR,
    "agent_store": AGENT_STORE_VAR,
}


#: The inputs :func:`worker_input_env` may leave out when they hold the default: variable -> field.
_DEFAULTABLE: Final = {
    MAX_RESTARTS_VAR: "max_restarts",
    RUN_ID_VAR: "run_id",
    ROLE_NAME_VAR: "role_name",
    RENDEZVOUS_TIMEOUT_VAR: "rendezvous_timeout",
    LOCAL_RANK_SCOPE_VAR: "local_rank_scope",
    POD_LAYOUT_VAR: "pod_layout",
    MODE_VAR: "mode",
    MONARCH_PORT_VAR: "monarch_port",
    **{var: field for field, var in OPTIONAL_INPUTS.items()},
}
_FIELD_DEFAULTS: Final = {f.name: f.default for f in dataclasses.fields(WorkerInputs)
                          if f.default is not dataclasses.MISSING}


def _format_input(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return _format_seconds(value)
    if isinstance(value, Mapping):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    if isinstance(value, (tuple, list, set, frozenset)):
        return ",".join(str(v) for v in value)
    return str(value)


def _format_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _int_var(environ: Mapping[str, str], name: str, default: int | None, low: int, high: int | None) -> int:
    raw = environ.get(name)
    valid = f"an integer in {low}..{high}" if high is not None else f"an integer of at least {low}"
    if raw is None or not raw.strip():
        if default is None:
            raise WorkerInputError(f"{name}: not set; expected {valid}")
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise WorkerInputError(f"{name}: {raw!r} is not {valid}") from None
    if value < low or (high is not None and value > high):
        raise WorkerInputError(f"{name}: {value} is out of range; expected {valid}")
    return value


def _seconds_var(environ: Mapping[str, str], name: str, default: float, *, zero: bool = False) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value != value or value == float("inf") or value < 0 or (value == 0 and not zero):
        valid = "0 (off) or more" if zero else "greater than 0"
        raise WorkerInputError(f"{name}: {raw!r} is not valid; expected a number of seconds {valid}")
    return value


def read_inputs(environ: Mapping[str, str]) -> WorkerInputs:
    """Parses and checks the MONARCH_SPMD_* variables of ``environ``.

    Raises:
        WorkerInputError: naming the variable and what would be valid.
    """
    raw_mesh = environ.get(MESH_VAR, "").strip()
    if not raw_mesh:
        raise WorkerInputError(f"{MESH_VAR}: not set; expected the ordered mesh, e.g. hosts=2,gpus=2")
    try:
        mesh = contract.parse_mesh(raw_mesh)
    except ValueError as e:
        raise WorkerInputError(f"{MESH_VAR}={raw_mesh!r}: {e}") from None

    layout = environ.get(POD_LAYOUT_VAR, "").strip() or PER_PROC
    if layout not in POD_LAYOUTS:
        raise WorkerInputError(f"{POD_LAYOUT_VAR}: {layout!r} is not valid; expected one of {', '.join(POD_LAYOUTS)}")
    # A PerHost worker has a coordinate on every dimension but the last (none for a 1-D mesh).
    want = len(mesh) - 1 if layout == PER_HOST else len(mesh)
    raw_coords = environ.get(COORDS_VAR, "").strip()
    spare = _int_var(environ, SPARE_VAR, -1, 0, rendezvous.MAX_SPARE_INDEX) if environ.get(SPARE_VAR, "").strip() else None
    if spare is not None and not raw_coords:
        raw_coords = ",".join("0" * want)  # none until it takes a member's place
    if not raw_coords and want:
        raise WorkerInputError(
            f"{COORDS_VAR}: not set; expected {want} comma-separated coordinates for mesh "
            f"{contract.format_mesh(mesh)} ({layout}), e.g. {','.join('0' * want)}"
        )
    try:
        coords = [int(c) for c in raw_coords.split(",")] if raw_coords else []
    except ValueError:
        raise WorkerInputError(
            f"{COORDS_VAR}: {raw_coords!r} is not a comma-separated list of integers"
        ) from None
    try:
        contract.rank_of(mesh, [*coords, 0] if layout == PER_HOST else coords)
    except ValueError as e:
        raise WorkerInputError(f"{COORDS_VAR}={raw_coords!r} ({layout}): {e}") from None

    master_addr = environ.get(MASTER_ADDR_VAR, "").strip()
    if not master_addr:
        raise WorkerInputError(f"{MASTER_ADDR_VAR}: not set; expected the host name or IP of rank 0")
    master_port = _int_var(environ, MASTER_PORT_VAR, None, 1, 65535)
    restart_count = _int_var(environ, RESTART_COUNT_VAR, 0, 0, None)
    max_restarts = _int_var(environ, MAX_RESTARTS_VAR, 0, 0, None)
    run_id = environ.get(RUN_ID_VAR, "").strip() or DEFAULT_RUN_ID
    role_name = environ.get(ROLE_NAME_VAR, "").strip() or contract.DEFAULT_ROLE_NAME

    raw_timeout = environ.get(RENDEZVOUS_TIMEOUT_VAR, "").strip()
    timeout = DEFAULT_RENDEZVOUS_TIMEOUT
    if raw_timeout:
        try:
            timeout = float(raw_timeout)
        except ValueError:
            timeout = -1.0
        if not timeout > 0 or timeout == float("inf"):
            raise WorkerInputError(
                f"{RENDEZVOUS_TIMEOUT_VAR}: {raw_timeout!r} is not valid; expected a number of "
                "seconds greater than 0"
            )

    scope = environ.get(LOCAL_RANK_SCOPE_VAR, "").strip() or SCOPE_MESH
    if scope not in LOCAL_RANK_SCOPES:
        raise WorkerInputError(
            f"{LOCAL_RANK_SCOPE_VAR}: {scope!r} is not valid; expected one of {', '.join(LOCAL_RANK_SCOPES)}"
        )
    mode = environ.get(MODE_VAR, "").strip() or MODE_PROGRAM
    if mode not in MODES:
        raise WorkerInputError(f"{MODE_VAR}: {mode!r} is not valid; expected one of {', '.join(MODES)}")
    if mode == MODE_MONARCH and layout != PER_HOST:
        raise WorkerInputError(f"{MODE_VAR}={mode} needs {POD_LAYOUT_VAR}={PER_HOST} (one Monarch host per worker)")
    monarch_port = _int_var(environ, MONARCH_PORT_VAR, DEFAULT_MONARCH_PORT, 1, 65535)
    agent_port = _int_var(environ, AGENT_PORT_VAR, 0, 1, 65535) or None
    if agent_port is not None and agent_port == master_port and (environ.get(AGENT_ADDR_VAR, "").strip() or master_addr) == master_addr:
        raise WorkerInputError(f"{AGENT_PORT_VAR}: {agent_port} is also {MASTER_PORT_VAR}, which rank 0's TCPStore "
                               "owns; give the coordinator another port (torchrun's rendezvous uses 29400)")
    min_members = _int_var(environ, MIN_MEMBERS_VAR, 0, 1, None) if environ.get(MIN_MEMBERS_VAR, "").strip() else 0
    if min_members:
        members = mesh[0][1]
        if layout != PER_HOST or len(mesh) != 2:
            raise WorkerInputError(f"{MIN_MEMBERS_VAR}: an elastic gang needs {POD_LAYOUT_VAR}={PER_HOST} and a mesh of "
                                   f"two dimensions (nodes, procs per node, as torchrun's); got "
                                   f"{contract.format_mesh(mesh)} ({layout})")
        if min_members > members:
            raise WorkerInputError(f"{MIN_MEMBERS_VAR}: {min_members} is more than the {members} pods of mesh "
                                   f"{contract.format_mesh(mesh)}; expected 1..{members}")
        if agent_port is None:
            raise WorkerInputError(f"{MIN_MEMBERS_VAR}: an elastic gang needs the gang's coordinator ({AGENT_PORT_VAR}: "
                                   "restart in place), which decides each round's members")
    failure_output = environ.get(FAILURE_OUTPUT_VAR, "").strip() or FAILURE_OUTPUT_TAIL
    if failure_output not in FAILURE_OUTPUTS:
        raise WorkerInputError(f"{FAILURE_OUTPUT_VAR}: {failure_output!r} is not valid; expected one of "
                               f"{', '.join(FAILURE_OUTPUTS)}")
    try:
        permanent_codes = rendezvous.parse_codes(environ.get(PERMANENT_EXIT_CODES_VAR, ""), PERMANENT_EXIT_CODES_VAR)
        retryable_codes = rendezvous.parse_codes(environ.get(RETRYABLE_EXIT_CODES_VAR, ""), RETRYABLE_EXIT_CODES_VAR)
        redirects = procgroup.parse_std(environ.get(REDIRECTS_VAR, "") or "0", REDIRECTS_VAR)
        tee = procgroup.parse_std(environ.get(TEE_VAR, "") or "0", TEE_VAR)
    except ValueError as e:
        raise WorkerInputError(str(e)) from None
    return WorkerInputs(
        mesh=mesh,
        coords=coords,
        master_addr=master_addr,
        master_port=master_port,
        restart_count=restart_count,
        max_restarts=max_restarts,
        run_id=run_id,
        role_name=role_name,
        rendezvous_timeout=timeout,
        local_rank_scope=scope,
        pod_layout=layout,
        mode=mode,
        monarch_port=monarch_port,
        agent_port=agent_port,
        agent_addr=environ.get(AGENT_ADDR_VAR, "").strip() or None,
        agent_token=_token_var(environ),
        disruptions=_int_var(environ, DISRUPTIONS_VAR, 0, 0, None),
        permanent_exit_codes=permanent_codes,
        retryable_exit_codes=retryable_codes,
        permanent_reasons=rendezvous.parse_reasons(environ.get(PERMANENT_REASONS_VAR, "")),
        backoff=_seconds_var(environ, BACKOFF_VAR, rendezvous.DEFAULT_BACKOFF, zero=True),
        max_backoff=_seconds_var(environ, MAX_BACKOFF_VAR, rendezvous.DEFAULT_MAX_BACKOFF, zero=True),
        backoff_reset=_seconds_var(environ, BACKOFF_RESET_VAR, rendezvous.DEFAULT_BACKOFF_RESET, zero=True),
        join_timeout=_seconds_var(environ, JOIN_TIMEOUT_VAR, rendezvous.DEFAULT_JOIN_TIMEOUT),
        member_failure_limit=_int_var(environ, MEMBER_FAILURE_LIMIT_VAR, rendezvous.DEFAULT_MEMBER_FAILURE_LIMIT, 1, None),
        min_members=min_members,
        elastic_wait=_seconds_var(environ, ELASTIC_WAIT_VAR, rendezvous.DEFAULT_ELASTIC_WAIT, zero=True),
        progress_timeout=_seconds_var(environ, PROGRESS_TIMEOUT_VAR, 0.0, zero=True),
        stop_grace=_seconds_var(environ, STOP_GRACE_VAR, DEFAULT_STOP_GRACE, zero=True),
        failure_output=failure_output,
        log_dir=environ.get(LOG_DIR_VAR, "").strip() or None,
        redirects=redirects,
        tee=tee,
        agent_store=_switch_var(environ, AGENT_STORE_VAR),
        spare=spare,
    )


def _switch_var(environ: Mapping[str, str], name: str) -> bool:
    raw = environ.get(name, "").strip()
    if raw.lower() in ("", "0", "false"):
        return False
    if raw.lower() in ("1", "true"):
        return True
    raise WorkerInputError(f"{name}: {raw!r} is not valid; expected 1 (on) or 0 (off)")


_TOKEN_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _token_var(environ: Mapping[str, str]) -> str | None:
    token = environ.get(AGENT_TOKEN_VAR, "").strip()
    if not token:
        return None
    if not 16 <= len(token) <= 256 or not set(token) <= _TOKEN_CHARS:
        raise WorkerInputError(f"{AGENT_TOKEN_VAR}: not valid; expected 16..256 URL-safe characters "
                               "(A-Z, a-z, 0-9, - and _)")
    return token


def build_env(inputs: WorkerInputs, base_env: Mapping[str, str], local: int = 0) -> dict[str, str]:
    """The torchrun variables for this worker's ``local``-th proc (only those; merge them over
    ``base_env`` yourself).

    With the ``pod`` local-rank scope the mesh seen by the contract is the whole world followed by
    a trailing one-proc dimension, so every proc is its own torchrun node: LOCAL_RANK=0,
    LOCAL_WORLD_SIZE=1, GROUP_RANK=RANK, while RANK and WORLD_SIZE are those of the real mesh.
    (Flattening first keeps a 4-dimension mesh within the contract's dimension limit.)
    """
    mesh: list[tuple[str, int]] = inputs.mesh
    coords: list[int] = inputs.proc_coords(local)
    if inputs.local_rank_scope == SCOPE_POD and inputs.pod_layout == PER_PROC:
        mesh = [("world", contract.world_size(inputs.mesh)), ("pod", 1)]
        coords = [inputs.rank, 0]
    return contract.torch_elastic_env(
        mesh,
        coords,
        inputs.master_addr,
        inputs.master_port,
        restart_count=inputs.restart_count,
        max_restarts=inputs.max_restarts,
        run_id=inputs.run_id,
        role_name=inputs.role_name,
        base_env=base_env,
        use_agent_store=inputs.agent_store,
    )


ARGV_HINT: Final = "expected ['-m', MODULE, ARGS...] or [SCRIPT, ARGS...]"


def argv_error(argv: Sequence[str]) -> str | None:
    """What is wrong with a training argv, or None: THE statement of the argv rule.

    A training argv is ``["-m", MODULE, ARGS...]`` (MODULE not empty) or ``[SCRIPT, ARGS...]``
    (SCRIPT not empty and not an option). :func:`command_for`, the SPMDJob spec
    (:mod:`monarch_spmd.spec`, whose CRD renders the same rule in CEL) and so the local runner
    and the operator all check it through this function.
    """
    args = list(argv)
    if not args:
        return f"empty; {ARGV_HINT}"
    if args[0] == "-m":
        if len(args) < 2 or not args[1]:
            return f"'-m' needs a module name after it, e.g. -m train --lr 0.001; {ARGV_HINT}"
        return None
    if not args[0] or args[0].startswith("-"):
        return f"{args[0]!r} is not a script path or '-m'; {ARGV_HINT}"
    return None


def command_for(argv: Sequence[str], python: str | None = None) -> list[str]:
    """The child command for a training argv: ``[python, "-m", mod, ...]`` or ``[python, path, ...]``.

    A leading ``--`` is dropped. Raises :class:`WorkerInputError` for what :func:`argv_error`
    refuses: an empty argv, ``-m`` without a module, an empty script or an option where the
    script should be.
    """
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    error = argv_error(args)
    if error:
        raise WorkerInputError(f"argv: {error}")
    return [python or sys.executable, *args]


def wait_for_master(addr: str, port: int, *, timeout: float, poll_interval: float = 0.5) -> None:
    """Waits until ``addr`` resolves; the only start-up race a rank must not run into.

    A headless Service's DNS record appears some time after its pod starts, and torch gives up at
    once on a name that does not resolve. A refused connection, on the other hand, torch's
    TCPStore client retries by itself until its own timeout, so no rank waits for rank 0's port:
    every rank starts its program as soon as the name resolves, as under torchrun, and work done
    before ``init_process_group`` runs on all ranks at once.

    Raises:
        RendezvousTimeout: with a message naming the address, port and timeout, and the last error.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
            return
        except OSError as e:
            last_error = str(e)
        if time.monotonic() >= deadline:
            raise RendezvousTimeout(
                f"MASTER_ADDR {addr!r} did not resolve within {_format_seconds(timeout)}s "
                f"({RENDEZVOUS_TIMEOUT_VAR}); last error: {last_error}"
            )
        time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))


def run_child(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Runs ``command`` with ``env``, forwarding FORWARDED_SIGNALS, and returns its exit code.

    A child killed by signal N gives 128+N, as a shell reports it.
    """
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child is None:
            pending.append(signum)
            return
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        child = subprocess.Popen(list(command), env=dict(env), preexec_fn=agent.parent_death_hook())
        for signum in pending:
            child.send_signal(signum)
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def _err(message: str) -> None:
    print(f"{_PREFIX}: {message}", file=sys.stderr, flush=True)


#: The last line a failed agent writes (also its termination message), which the operator reads.
failure_line = agent.failure_line


def _is_loopback(addr: str) -> bool:
    return addr == "localhost" or addr.startswith("127.") or addr == "::1"


def agent_settings(inputs: WorkerInputs, base: Mapping[str, str]) -> agent.Settings:
    """The agent's settings from the worker's inputs (see :mod:`.agent`)."""
    coordinator = None
    bind_any = True
    if inputs.agent_port is not None:
        addr = inputs.agent_addr or inputs.master_addr
        coordinator = (addr, inputs.agent_port)
        bind_any = not _is_loopback(addr)
    return agent.Settings(
        member=inputs.member,
        members=inputs.members,
        procs=inputs.local_procs,
        first_rank=inputs.rank,
        world_size=contract.world_size(inputs.mesh),
        first_round=inputs.restart_count,
        run_id=inputs.run_id,
        coordinator=coordinator,
        policy=inputs.policy(),
        grace=inputs.stop_grace,
        progress_timeout=inputs.progress_timeout,
        connect_timeout=inputs.rendezvous_timeout,
        prefix=inputs.pod_layout == PER_HOST,
        node=base.get("NODE_NAME") or socket.gethostname(),
        pod=base.get("POD_NAME") or "",
        log_dir=inputs.log_dir,
        redirects=inputs.redirects,
        tee=inputs.tee,
        watchdog=base.get(timer.ENABLE_VAR, "").strip() == "1",
        timer_file=base.get(timer.FILE_VAR) or None,
        bind_any=bind_any,
        output_in_failures=inputs.failure_output != FAILURE_OUTPUT_NONE,
        token=inputs.agent_token or "",
        spare=inputs.was_spare,
        store=(inputs.master_addr, inputs.master_port) if inputs.agent_store and inputs.member == 0 else None,
    )


def program_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment a training process inherits: the worker's, without any MONARCH_SPMD_* input."""
    return {k: v for k, v in base.items() if not k.startswith(RESERVED_PREFIX)}


def run_spare(inputs: WorkerInputs, base: Mapping[str, str]) -> WorkerInputs | int:
    """A hot spare: waits, connected to the coordinator, until it is given a lost member's place;
    returns that member's inputs (the worker then runs as that member, joining its next round),
    or the exit code when the gang ended first (0) or a signal stopped it."""
    assert inputs.spare is not None and inputs.agent_port is not None
    received: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _f: received.append(signum)) for s in agent.STOP_SIGNALS}
    try:
        _err(f"hot spare {inputs.spare} of mesh {contract.format_mesh(inputs.mesh)}, master "
             f"{inputs.master_addr}:{inputs.master_port}, pid {os.getpid()}: waiting to take a lost member's place")
        try:
            wait_for_master(inputs.master_addr, inputs.master_port, timeout=inputs.rendezvous_timeout)
        except RendezvousTimeout as e:
            _err(f"rendezvous timeout: {e}")
            return EX_TEMPFAIL
        addr = inputs.agent_addr or inputs.master_addr
        outcome = agent.wait_as_spare(addr, inputs.agent_port, spare=inputs.spare, token=inputs.agent_token or "",
                                      node=base.get("NODE_NAME") or socket.gethostname(),
                                      connect_timeout=inputs.rendezvous_timeout,
                                      interrupted=lambda: received[0] if received else None)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if outcome.member is None:
        _err(f"hot spare {inputs.spare}: {outcome.why}; exiting {outcome.code}")
        return outcome.code
    member = inputs.as_member(outcome.member)
    _err(f"hot spare {inputs.spare} takes the place of member {outcome.member} (ranks from {member.rank}, coords "
         f"{contract.format_mesh(zip([n for n, _ in inputs.mesh], member.coords))})")
    return member


def run_agent(inputs: WorkerInputs, command: Sequence[str], base: Mapping[str, str]) -> int:
    """Runs the pod's processes as its agent (see :mod:`.agent`); returns the exit code."""
    clean = program_env(base)

    def env_for(round_: int, local: int, group: tuple[int, int] | None = None) -> dict[str, str]:
        this = dataclasses.replace(inputs, restart_count=round_)
        if group is not None:
            this = this.resized(*group)
        return {**clean, **build_env(this, clean, local)}

    out = procgroup.Prefixer(procgroup.stream_writer(sys.stdout, sys.stderr))
    settings = agent_settings(inputs, base)
    if settings.progress_timeout > 0 or settings.watchdog:
        # A hang detector is armed: a hung rank's stack is taken before it ends (SIGABRT makes
        # faulthandler write it); the option changes neither the rank's argv nor its environment.
        command = stacks.with_faulthandler(command)
    return agent.Agent(settings, command, env_for, out).run()


#: The child a Monarch-mode worker runs (``python -c MONARCH_BOOTSTRAP ADDRESS``): Monarch's
#: worker loop, as Monarch's own Kubernetes pods run it. torchmonarch 0.7.0 has no TLS for it
#: (any other ``ca`` raises NotImplementedError). Without monarch it exits 64 (EX_USAGE).
MONARCH_BOOTSTRAP: Final = f"""\
import sys
try:
    from monarch.actor import run_worker_loop_forever
except ImportError as e:
    sys.stderr.write("{_PREFIX}: mode Monarch needs torchmonarch in the image: " + sys.executable
                     + " cannot import monarch (" + str(e) + "); install it (pip install torchmonarch) "
                     "or point spec.python at an interpreter that has it\\n")
    sys.exit({EX_USAGE})
run_worker_loop_forever(address=sys.argv[1], ca="trust_all_connections")
"""


def monarch_address(environ: Mapping[str, str], port: int) -> str:
    """The worker loop's address: the pod's IP (POD_IP) advertised, every interface bound.

    Monarch's form ``tcp://ADVERTISED:PORT@tcp://BIND:PORT``: clients and the other hosts dial the
    pod IP, and the loop also answers on loopback (``kubectl port-forward``). Without POD_IP (not
    in a pod) the address of the interface with the default route is advertised.
    """
    ip = environ.get("POD_IP", "").strip()
    if not ip:
        ip = "127.0.0.1"
        for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
            try:
                with socket.socket(family, socket.SOCK_DGRAM) as s:
                    s.connect((probe, 9))
                    ip = str(s.getsockname()[0])
                    break
            except OSError:
                continue
    if ":" in ip:
        return f"tcp://[{ip}]:{port}@tcp://[::]:{port}"
    return f"tcp://{ip}:{port}@tcp://0.0.0.0:{port}"


def run_monarch_host(inputs: WorkerInputs, base: Mapping[str, str]) -> int:
    """Serves this pod as a Monarch host until it is stopped; returns the worker loop's exit code."""
    address = monarch_address(base, inputs.monarch_port)
    names = [n for n, _ in inputs.mesh]
    host = contract.format_mesh(zip(names, inputs.coords)) or "the only host"
    first = inputs.rank
    _err(
        f"Monarch host {host} (ranks {first}..{first + inputs.local_procs - 1}/{contract.world_size(inputs.mesh)}) "
        f"of mesh {contract.format_mesh(inputs.mesh)}, restart {inputs.restart_count}/{inputs.max_restarts}, "
        f"pid {os.getpid()}, serving Monarch's worker loop at {address.split('@', 1)[0]}"
    )
    # The procs a client spawns inherit the loop's environment: without the worker's own inputs
    # (a Program-mode MASTER_ADDR, coordinates ...) they see what procs on one machine see, and
    # SPMDActor gives them the contract from their mesh coordinates.
    env = {k: v for k, v in base.items() if not k.startswith(RESERVED_PREFIX)}
    return run_child([sys.executable, "-c", MONARCH_BOOTSTRAP, address], env)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Runs the worker; returns the exit code (see the module docstring).

    Args:
        argv: the training argv, optionally after ``--`` (default ``sys.argv[1:]``).
        environ: the process environment (default ``os.environ``).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    base = dict(os.environ if environ is None else environ)
    try:
        inputs = read_inputs(base)
        if inputs.mode == MODE_MONARCH:
            if [a for a in args if a != "--"]:
                raise WorkerInputError(f"argv: {MODE_VAR}={MODE_MONARCH} runs Monarch's worker loop and takes no argv; "
                                       f"got {' '.join(args)}")
            return run_monarch_host(inputs, base)
        command = command_for(args)
        if inputs.spare is not None and inputs.agent_port is None:
            raise WorkerInputError(f"{SPARE_VAR}: a hot spare needs the gang's coordinator ({AGENT_PORT_VAR}: restart "
                                   "in place); without it there is no member's place to take")
        if inputs.spare is not None and inputs.members < 2:
            raise WorkerInputError(f"{SPARE_VAR}: mesh {contract.format_mesh(inputs.mesh)} ({inputs.pod_layout}) has "
                                   "one pod, whose loss is its coordinator's: a spare can take no place")
        env = build_env(inputs, base)
    except (WorkerInputError, ValueError) as e:
        _err(f"bad input: {e}")
        return EX_USAGE
    if inputs.spare is not None:
        taken = run_spare(inputs, base)
        if isinstance(taken, int):
            return taken
        inputs = taken
        env = build_env(inputs, base)
    rank = inputs.rank
    names = [n for n, _ in inputs.mesh]
    world, mesh = env["WORLD_SIZE"], contract.format_mesh(inputs.mesh)
    if inputs.pod_layout == PER_HOST:
        host = contract.format_mesh(zip(names, inputs.coords)) or "the only host"
        where = f"ranks {rank}..{rank + inputs.local_procs - 1}/{world} on {host} of mesh {mesh}"
    else:
        where = (f"rank {rank}/{world} coords {contract.format_mesh(zip(names, inputs.coords))} of mesh {mesh}, "
                 f"local rank {env['LOCAL_RANK']}/{env['LOCAL_WORLD_SIZE']}")
    try:  # the start line inside: a Ctrl-C right after it is still this wait's
        _err(
            f"{where}, master {inputs.master_addr}:{inputs.master_port}, "
            f"restart {inputs.restart_count}/{inputs.max_restarts}, pid {os.getpid()}, running {' '.join(command[1:])}"
        )
        wait_for_master(inputs.master_addr, inputs.master_port, timeout=inputs.rendezvous_timeout)
    except RendezvousTimeout as e:
        _err(f"rendezvous timeout: {e}")
        return EX_TEMPFAIL
    except KeyboardInterrupt:
        _err("interrupted while waiting for the master")
        return 128 + signal.SIGINT
    return run_agent(inputs, command, base)


if __name__ == "__main__":
    sys.exit(main())
