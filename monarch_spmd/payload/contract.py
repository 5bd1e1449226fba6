"""The torchrun environment contract: one pure function and the mesh arithmetic it needs.

This is the bottom layer of the project. The Monarch actor (``monarch_spmd.actor``), the in-pod
worker (``monarch_spmd.payload.worker``), the local runner and the Kubernetes operator all build a proc's
environment with :func:`torch_elastic_env` and nothing else, so the three runtimes cannot drift.
Standard library only: the operator ships this file into pods whose image lacks the project.

A mesh is an ORDERED sequence of named dimensions, e.g. ``[("hosts", 2), ("gpus", 4)]``. The LAST
dimension is the local ("per host") one, decided by position as in the original monarch.spmd. A
proc has one coordinate per dimension; its rank is the row-major index of its coordinates.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Final

Mesh = Sequence[tuple[str, int]]

#: The largest number of procs a mesh may have (also enforced by the SPMDJob CRD).
MAX_PROCS: Final = 4096
#: The most dimensions a mesh may have (also enforced by the SPMDJob CRD).
MAX_DIMS: Final = 4
#: torchrun's default role name.
DEFAULT_ROLE_NAME: Final = "default"

_DIM_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def validate_mesh(mesh: Mesh) -> list[tuple[str, int]]:
    """Checks a mesh and returns it as a list of ``(name, size)`` pairs.

    Raises:
        ValueError: naming the field and what would be valid, for no dimensions, more than
            MAX_DIMS dimensions, a name that is not a DNS label (lowercase letters, digits, '-',
            starting with a letter, at most 63 characters), a duplicate name, a size below 1, or
            more than MAX_PROCS procs in all.
    """
    dims = [tuple(d) for d in mesh]
    if not dims:
        raise ValueError("mesh: needs at least one dimension, e.g. hosts=2,gpus=4")
    if len(dims) > MAX_DIMS:
        raise ValueError(f"mesh: has {len(dims)} dimensions; at most {MAX_DIMS} are allowed")
    seen: set[str] = set()
    out: list[tuple[str, int]] = []
    for i, dim in enumerate(dims):
        if len(dim) != 2:
            raise ValueError(f"mesh[{i}]: expected a (name, size) pair, got {dim!r}")
        name, size = dim
        if not isinstance(name, str) or not _DIM_NAME.match(name):
            raise ValueError(
                f"mesh[{i}].name: {name!r} is not a DNS label (lowercase letters, digits and '-', "
                "starting with a letter, ending with a letter or digit, at most 63 characters)"
            )
        if name in seen:
            raise ValueError(f"mesh[{i}].name: {name!r} appears twice; dimension names must be unique")
        seen.add(name)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh[{i}].size: {size!r} is not valid; a size is an integer of at least 1")
        out.append((name, size))
    total = math.prod(size for _, size in out)
    if total > MAX_PROCS:
        raise ValueError(f"mesh: {total} procs in all; at most {MAX_PROCS} are allowed")
    return out


def parse_mesh(text: str) -> list[tuple[str, int]]:
    """Parses ``"hosts=2,gpus=4"`` into ``[("hosts", 2), ("gpus", 4)]`` and validates it."""
    dims: list[tuple[str, int]] = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        name, sep, size = part.partition("=")
        if not sep or not size.strip().lstrip("-").isdigit():
            raise ValueError(f"mesh[{i}]: {part!r} is not NAME=SIZE (e.g. hosts=2,gpus=4)")
        dims.append((name.strip(), int(size)))
    return validate_mesh(dims)


def format_mesh(mesh: Mesh) -> str:
    """The inverse of :func:`parse_mesh`: ``"hosts=2,gpus=4"``."""
    return ",".join(f"{name}={size}" for name, size in mesh)


def world_size(mesh: Mesh) -> int:
    """The number of procs in the mesh."""
    return math.prod(size for _, size in mesh)


def _check_coords(mesh: Mesh, coords: Sequence[int]) -> None:
    if len(coords) != len(mesh):
        raise ValueError(
            f"coords: {len(coords)} coordinates given for a mesh of {len(mesh)} dimensions "
            f"({format_mesh(mesh)})"
        )
    for (name, size), c in zip(mesh, coords):
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < size:
            raise ValueError(f"coords.{name}: {c!r} is out of range; valid is 0..{size - 1}")


def rank_of(mesh: Mesh, coords: Sequence[int]) -> int:
    """The row-major index of ``coords`` in ``mesh``."""
    _check_coords(mesh, coords)
    rank = 0
    for (_, size), c in zip(mesh, coords):
        rank = rank * size + c
    return rank


def coords_of(mesh: Mesh, rank: int) -> list[int]:
    """The coordinates of ``rank`` in ``mesh`` (the inverse of :func:`rank_of`)."""
    n = world_size(mesh)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
        raise ValueError(f"rank: {rank!r} is out of range; valid is 0..{n - 1}")
    coords: list[int] = []
    for _, size in reversed(list(mesh)):
        rank, c = divmod(rank, size)
        coords.append(c)
    return coords[::-1]


def torch_elastic_env(
    mesh: Mesh,
    coords: Sequence[int],
    master_addr: str,
    master_port: int,
    *,
    restart_count: int = 0,
    max_restarts: int = 0,
    run_id: str = "none",
    role_name: str = DEFAULT_ROLE_NAME,
    base_env: Mapping[str, str] | None = None,
    use_agent_store: bool = False,
) -> dict[str, str]:
    """Builds the environment torchrun gives a worker, for the proc at ``coords`` of ``mesh``.

    ========================================  ==================================================
    variable                                  value
    ========================================  ==================================================
    RANK                                      row-major index of ``coords``
    WORLD_SIZE                                product of all sizes
    LOCAL_RANK                                coordinate on the last dimension
    LOCAL_WORLD_SIZE                          size of the last dimension
    GROUP_RANK                                RANK // LOCAL_WORLD_SIZE (the "host" index)
    GROUP_WORLD_SIZE                          WORLD_SIZE // LOCAL_WORLD_SIZE
    ROLE_RANK, ROLE_WORLD_SIZE                RANK, WORLD_SIZE (a single role)
    ROLE_NAME                                 ``role_name`` (torchrun's default: "default")
    MASTER_ADDR, MASTER_PORT                  the rank-0 proc's address and port
    TORCHELASTIC_RESTART_COUNT                ``restart_count`` (0 on the first attempt)
    TORCHELASTIC_MAX_RESTARTS                 ``max_restarts``
    TORCHELASTIC_RUN_ID                       ``run_id``, stable for the job
    TORCHELASTIC_USE_AGENT_STORE              "False" (default): rank 0 hosts the TCPStore when it
                                              calls init_process_group. "True" with
                                              ``use_agent_store``: rank 0's agent hosts it on
                                              MASTER_PORT and every rank is a client (torchrun's
                                              way; torchft's Manager needs it)
    TORCH_NCCL_ASYNC_ERROR_HANDLING           "1", unless ``base_env`` already sets it
    OMP_NUM_THREADS                           "1" when ``base_env`` does not set it and more than
                                              one proc shares a host (LOCAL_WORLD_SIZE > 1)
    ========================================  ==================================================

    All values are strings. The result holds only the variables above; merge it over the process
    environment yourself (``{**os.environ, **env}``).

    Args:
        mesh: ordered ``(name, size)`` dimensions; the last is the local one.
        coords: this proc's coordinate on each dimension, in mesh order.
        master_addr: address (or resolvable name) of the rank-0 proc.
        master_port: port of rank 0's TCPStore, 1..65535.
        restart_count: how many times the gang has been restarted before this attempt.
        max_restarts: the gang restart limit.
        run_id: a stable id of the job.
        role_name: the worker role's name.
        base_env: the environment the proc will inherit; decides the two "unless set" rows.
        use_agent_store: the agent of rank 0 hosts the TCPStore at MASTER_ADDR:MASTER_PORT
            (MONARCH_SPMD_AGENT_STORE, :mod:`.agentstore`); only then may the ranks be told so.

    Raises:
        ValueError: naming the field and the valid range, for a bad mesh, coordinates, address,
            port, restart count or limit.
    """
    dims = validate_mesh(mesh)
    rank = rank_of(dims, list(coords))
    if not isinstance(master_addr, str) or not master_addr.strip():
        raise ValueError("master_addr: must be a non-empty host name or IP address")
    if isinstance(master_port, bool) or not isinstance(master_port, int) or not 1 <= master_port <= 65535:
        raise ValueError(f"master_port: {master_port!r} is out of range; valid is 1..65535")
    for field, value in (("restart_count", restart_count), ("max_restarts", max_restarts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{field}: {value!r} is not valid; it is an integer of at least 0")
    if not role_name:
        raise ValueError("role_name: must be non-empty")
    base = base_env if base_env is not None else {}
    world = world_size(dims)
    local_world = dims[-1][1]
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(coords[-1]),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // local_world),
        "GROUP_WORLD_SIZE": str(world // local_world),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": role_name,
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": str(run_id),
        "TORCHELASTIC_USE_AGENT_STORE": str(bool(use_agent_store)),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    if "OMP_NUM_THREADS" in base:
        env["OMP_NUM_THREADS"] = base["OMP_NUM_THREADS"]
    elif local_world > 1:
        env["OMP_NUM_THREADS"] = "1"
    return env
