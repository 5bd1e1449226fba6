"""monarch_spmd: torchrun-style SPMD training on Monarch meshes, local processes and Kubernetes.

The package's public face. Importing it needs only the standard library: the env contract
(:mod:`monarch_spmd.payload.contract`) is exported here directly, while the Monarch pieces
(``SPMDActor``, ``setup_torch_elastic_env``, ``setup_torch_elastic_env_async``,
``SPMDScriptExit``) load :mod:`monarch_spmd.actor`, and with it ``torchmonarch``, on first use.

Keep it that way: the SPMDJob operator ships this file, ``contract.py`` and ``worker.py`` into
pods whose image has neither the project nor Monarch, so nothing but ``.contract`` and the
standard library may be imported here at module level.

Layers, lowest first (a layer never imports a higher one)::

    contract  ->  worker  ->  runner  ->  cli
              ->  actor (Monarch)
"""

from __future__ import annotations

from typing import Any

from .payload.contract import (
    DEFAULT_ROLE_NAME,
    MAX_DIMS,
    MAX_PROCS,
    Mesh,
    coords_of,
    format_mesh,
    parse_mesh,
    rank_of,
    torch_elastic_env,
    validate_mesh,
    world_size,
)

_FROM_ACTOR = frozenset(
    {"SPMDActor", "SPMDScriptExit", "setup_torch_elastic_env", "setup_torch_elastic_env_async"}
)

__all__ = [
    "DEFAULT_ROLE_NAME",
    "MAX_DIMS",
    "MAX_PROCS",
    "Mesh",
    "SPMDActor",
    "SPMDScriptExit",
    "coords_of",
    "format_mesh",
    "parse_mesh",
    "rank_of",
    "setup_torch_elastic_env",
    "setup_torch_elastic_env_async",
    "torch_elastic_env",
    "validate_mesh",
    "world_size",
]


def __getattr__(name: str) -> Any:
    """Loads the Monarch-dependent names from :mod:`monarch_spmd.actor` on first access."""
    if name in _FROM_ACTOR:
        from . import actor

        return getattr(actor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _FROM_ACTOR)
