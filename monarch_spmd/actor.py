"""SPMDActor and setup_torch_elastic_env: torchrun-style scripts over a real Monarch ProcMesh.

Where it sits: above :mod:`monarch_spmd.payload.contract` (which builds every variable), beside the worker;
nothing in the project below this module imports it, and ``import monarch_spmd`` loads it only on
first use of one of its names, because it needs ``torchmonarch``.

The API is that of the original ``monarch.spmd`` (torchmonarch 0.7.0): the same class, endpoints,
functions, signatures, defaults and return values, so both examples of its documentation run with
only the import path changed::

    from monarch.actor import this_host
    from monarch_spmd import SPMDActor, setup_torch_elastic_env

    proc_mesh = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    first_values = dict.fromkeys(proc_mesh._labels, 0)
    master_addr, master_port = spmd_actors.slice(**first_values).get_host_port.call_one(None).get()
    spmd_actors.main.call(master_addr, master_port, ["-m", "train", "--lr", "0.001"]).get()

Where it does better than the original (each point is also in the docstring concerned):

* the whole torchrun worker contract, including GROUP_*, TORCHELASTIC_* and the NCCL/OMP
  defaults, not eleven variables; ROLE_NAME is torchrun's ``default`` rather than ``rank``;
* ``sys.exit(0)`` (or ``sys.exit()``) in the script is success; ``sys.exit(n)`` raises
  :class:`SPMDScriptExit` carrying ``n``; neither kills the actor;
* ``sys.argv``, ``sys.path`` and ``os.environ`` are restored after ``main``; a script run by path
  finds the modules beside it, as under ``python path.py``;
* ``["-m"]`` alone, or an empty list, is a ValueError naming ``script_args``;
* a mesh without dimensions works (one proc);
* ``get_host_port`` returns an address other hosts can reach, never a bare host name that may
  resolve only locally, and a port free on that address, chosen below the kernel's ephemeral
  range so that no outgoing connection takes it before rank 0 binds it (:mod:`monarch_spmd.ports`);
* ``setup_torch_elastic_env`` checks "both or neither" of master address and port with a
  ValueError, not an ``assert`` that ``python -O`` removes.
"""

from __future__ import annotations

import ipaddress
import math
import os
import runpy
import socket
import sys
from typing import Any

from monarch.actor import Actor, current_rank, endpoint

from .payload import contract
from .ports import free_port

__all__ = ["SPMDActor", "SPMDScriptExit", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]

# Addresses used only to pick the outgoing interface: connect() on a UDP socket sends nothing.
_PROBE_TARGETS = {socket.AF_INET: "192.0.2.1", socket.AF_INET6: "2001:db8::1"}


class SPMDScriptExit(RuntimeError):
    """The training script called ``sys.exit`` with a failure code.

    Raised by :meth:`SPMDActor.main`; the caller sees it as ``ActorError.exception``. The actor
    (and its proc) stay alive.

    Attributes:
        code: the exit status, as the process would have exited with it (an int; a non-int
            argument to ``sys.exit`` counts as 1, as in Python).
        rank: the global rank of the proc whose script exited.
    """

    def __init__(self, code: int, rank: int = 0, detail: str = "") -> None:
        message = f"rank {rank}: the training script exited with code {code}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)
        self.code = code
        self.rank = rank
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        return (SPMDScriptExit, (self.code, self.rank, self.detail))


def _family(use_ipaddr: Any) -> list[socket.AddressFamily]:
    """The address families to try, in order, for ``get_host_port``'s ``use_ipaddr`` argument."""
    if use_ipaddr is None:
        return [socket.AF_INET, socket.AF_INET6]
    if isinstance(use_ipaddr, int) and use_ipaddr in (socket.AF_INET, socket.AF_INET6):
        return [socket.AddressFamily(use_ipaddr)]
    name = getattr(use_ipaddr, "name", None)  # monarch.tools.network.AddrType
    if name == "IPv4":
        return [socket.AF_INET]
    if name == "IPv6":
        return [socket.AF_INET6]
    if name == "Default":
        return [socket.AF_INET6, socket.AF_INET]
    raise ValueError(
        f"use_ipaddr: {use_ipaddr!r} is not valid; expected None, socket.AF_INET, socket.AF_INET6 "
        "or a monarch.tools.network.AddrType"
    )


def _routable(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified)


def reachable_address(use_ipaddr: Any = None) -> str:
    """An IP address of this host that other hosts can reach.

    For each family allowed by ``use_ipaddr`` (None: IPv4 then IPv6; ``socket.AF_INET`` /
    ``AddrType.IPv4``: IPv4 only; ``socket.AF_INET6`` / ``AddrType.IPv6``: IPv6 only;
    ``AddrType.Default``: IPv6 then IPv4, as Monarch orders it): first the host name's own
    addresses, skipping loopback and link-local ones; then the address of the interface holding
    the default route (found by connecting a UDP socket, which sends nothing). When the host has
    no such interface at all, the loopback address of the first family is returned: good for a
    single-host mesh only.
    """
    families = _family(use_ipaddr)
    hostname = socket.gethostname()
    for family in families:
        try:
            infos = socket.getaddrinfo(hostname, None, family, socket.SOCK_STREAM)
        except OSError:
            infos = []
        for info in infos:
            addr = str(info[4][0])
            if _routable(addr):
                return addr
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((_PROBE_TARGETS[family], 9))
                addr = str(s.getsockname()[0])
            if _routable(addr):
                return addr
        except OSError:
            pass
    return "127.0.0.1" if families[0] == socket.AF_INET else "::1"


def _check_script_args(script_args: Any) -> list[str]:
    if isinstance(script_args, (str, bytes)) or not hasattr(script_args, "__iter__"):
        raise ValueError(
            f"script_args: {script_args!r} is not valid; expected a list such as "
            "['-m', 'train', '--lr', '0.001'] or ['train.py', '--lr', '0.001']"
        )
    args = [str(a) for a in script_args]
    if not args:
        raise ValueError(
            "script_args: empty; no script or module specified (expected ['-m', MODULE, *ARGS] "
            "or [PATH, *ARGS])"
        )
    if args[0] == "-m" and (len(args) < 2 or not args[1]):
        raise ValueError("script_args: '-m' needs a module name, e.g. ['-m', 'train', '--lr', '0.001']")
    return args


def _check_master(master_addr: Any, master_port: Any) -> tuple[str, int] | None:
    """Checks a master address and port given together; returns them (the port as an int)."""
    if (master_addr is None) != (master_port is None):
        raise ValueError(
            "master_addr, master_port: give both or neither (neither: the proc at all-zero "
            f"coordinates is the master); got master_addr={master_addr!r}, master_port={master_port!r}"
        )
    if master_addr is None:
        return None
    if not isinstance(master_addr, str) or not master_addr.strip():
        raise ValueError(f"master_addr: {master_addr!r} is not valid; expected a host name or IP address")
    port = master_port
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"master_port: {master_port!r} is out of range; valid is 1..65535")
    return master_addr, port


def _restore_environ(saved: dict[str, str]) -> None:
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


class SPMDActor(Actor):
    """Actor that gives its proc torchrun's worker environment and runs SPMD training scripts in it.

    Rank and mesh come from Monarch's ``current_rank()`` when the actor is created: its extent's
    labels and sizes are the ordered mesh, the last dimension being the local ("per host") one.
    The variables are those of :func:`monarch_spmd.payload.contract.torch_elastic_env` (the full torchrun
    table: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
    ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
    TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE,
    TORCH_NCCL_ASYNC_ERROR_HANDLING and OMP_NUM_THREADS). A mesh without dimensions is one proc.

    Example::

        spmd_actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
        first_values = dict.fromkeys(proc_mesh._labels, 0)
        master_addr, master_port = spmd_actors.slice(**first_values).get_host_port.call_one(None).get()
        spmd_actors.main.call(master_addr, master_port, ["-m", "train", "--lr", "0.001"]).get()
    """

    def __init__(self) -> None:
        super().__init__()
        point = current_rank()
        labels = list(point.extent.labels)
        sizes = [int(s) for s in point.extent.sizes]
        # (Actor already defines ``sizes``, ``extent`` and ``size``; these names avoid them.)
        self.mesh_labels: list[str] = labels
        self.mesh_sizes: list[int] = sizes
        self.coords: list[int] = [int(point[label]) for label in labels]
        self.rank: int = int(point.rank)
        self.world_size: int = math.prod(sizes)
        self.local_world_size: int = sizes[-1] if sizes else 1
        self.local_rank: int = self.coords[-1] if self.coords else 0
        self.group_rank: int = self.rank // self.local_world_size
        self.group_world_size: int = self.world_size // self.local_world_size

    def _env(self, master_addr: str, master_port: int) -> dict[str, str]:
        # The contract sees the mesh as (groups, local): the same RANK, LOCAL_* and GROUP_* as the
        # full mesh, and Monarch's label names and dimension count need not fit the SPMDJob rules.
        mesh = [("group", self.group_world_size), ("local", self.local_world_size)]
        coords = [self.group_rank, self.local_rank]
        return contract.torch_elastic_env(mesh, coords, master_addr, master_port, base_env=os.environ)

    @endpoint
    def get_host_port(self, use_ipaddr: Any = None) -> tuple[str, int]:
        """Returns ``(address, port)`` for this proc to serve as the master.

        Better than the original, which returns the bare host name (often unresolvable from
        other hosts, or resolving to 127.0.0.1): the address is always an IP other hosts can reach
        (see :func:`reachable_address`; ``use_ipaddr`` picks the family: None, ``socket.AF_INET``,
        ``socket.AF_INET6`` or a ``monarch.tools.network.AddrType``), and the port is free on it.

        Raises:
            ValueError: for a ``use_ipaddr`` that is none of these.
        """
        addr = reachable_address(use_ipaddr)
        return addr, free_port(addr)

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Writes the torchrun variables into this proc's ``os.environ`` (they stay); returns None."""
        master = _check_master(master_addr, master_port)
        if master is None:
            raise ValueError("master_addr, master_port: both are needed by setup_env")
        os.environ.update(self._env(*master))

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Sets the torchrun variables and runs the training script in this proc, like torchrun.

        ``["-m", module, *rest]`` runs the module as ``__main__`` with ``sys.argv = [module,
        *rest]``; ``[path, *rest]`` runs the file with ``sys.argv = [path, *rest]`` and the file's
        folder first on ``sys.path``. Afterwards ``sys.argv``, ``sys.path`` and ``os.environ`` are
        restored to what they were before the call.

        Args:
            master_addr: address of the rank-0 proc.
            master_port: port of rank 0's TCPStore, 1..65535.
            script_args: ``["-m", MODULE, *ARGS]`` or ``[PATH, *ARGS]``.

        Returns:
            True when the script finished or called ``sys.exit(0)`` / ``sys.exit()``.

        Raises:
            ValueError: naming ``script_args`` when it is empty or is ``["-m"]`` alone, or naming
                ``master_addr`` / ``master_port`` when they are invalid.
            SPMDScriptExit: when the script called ``sys.exit(n)`` with a failure status; its
                ``code`` is ``n``. The actor stays alive for further calls.
        """
        args = _check_script_args(script_args)
        master = _check_master(master_addr, master_port)
        if master is None:
            raise ValueError("master_addr, master_port: both are needed by main")
        env = self._env(*master)
        saved_env = dict(os.environ)
        saved_argv = list(sys.argv)
        saved_path = list(sys.path)
        try:
            os.environ.update(env)
            if args[0] == "-m":
                sys.argv = [args[1], *args[2:]]
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(args)
                sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
                runpy.run_path(args[0], run_name="__main__")
        except SystemExit as e:
            code = e.code
            if code is None or code == 0:
                return True
            if isinstance(code, int) and not isinstance(code, bool):
                raise SPMDScriptExit(code, self.rank) from None
            raise SPMDScriptExit(1, self.rank, str(code)) from None
        finally:
            sys.argv = saved_argv
            sys.path[:] = saved_path
            _restore_environ(saved_env)
        return True


def _master_of(proc_mesh: Any, actors: Any) -> Any:
    """The actor at all-zero coordinates (the mesh itself when it has no dimensions)."""
    labels = list(proc_mesh._labels)
    return actors.slice(**dict.fromkeys(labels, 0)) if labels else actors


def setup_torch_elastic_env(
    proc_mesh: Any,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
) -> None:
    """Sets torchrun's environment variables (RANK, LOCAL_RANK, WORLD_SIZE, ...) in every proc.

    Spawns :class:`SPMDActor` on ``proc_mesh`` as ``"_SPMDActor"`` and calls its ``setup_env``
    everywhere. With neither ``master_addr`` nor ``master_port`` the proc at all-zero coordinates
    is the master, and its ``get_host_port(use_ipaddr)`` picks a reachable address and free port.

    Args:
        proc_mesh: a Monarch ProcMesh, e.g. ``this_host().spawn_procs(per_host={"gpus": 2})``.
        master_addr: address of the master, or None to pick one.
        master_port: port of the master, 1..65535, or None to pick one.
        use_ipaddr: the address family for the picked address (see ``SPMDActor.get_host_port``).

    Returns:
        None.

    Raises:
        ValueError: when only one of ``master_addr`` and ``master_port`` is given, or either is
            invalid (never an ``assert``).
    """
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    if master_addr is None:
        master_addr, master_port = _master_of(proc_mesh, actors).get_host_port.call_one(use_ipaddr).get()
    actors.setup_env.call(master_addr, master_port).get()


async def setup_torch_elastic_env_async(
    proc_mesh: Any,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
) -> None:
    """The awaitable twin of :func:`setup_torch_elastic_env`; same arguments, result and errors."""
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    if master_addr is None:
        master_addr, master_port = await _master_of(proc_mesh, actors).get_host_port.call_one(use_ipaddr)
    await actors.setup_env.call(master_addr, master_port)
