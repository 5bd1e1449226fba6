"""Choosing rank 0's port: a TCP port that is free now and that nothing else will take first.

Where it sits: beside :mod:`monarch_spmd.payload.contract` at the bottom of the library (standard library
only); the Monarch actor's ``get_host_port`` and the local runner use it.

Binding port 0 and closing the socket, as torchrun and the original monarch.spmd do, returns a
port from the kernel's ephemeral range (``net.ipv4.ip_local_port_range``). Between that choice
and rank 0's TCPStore binding the port, any outgoing connection on the machine may be given the
same port, and rank 0 then fails with EADDRINUSE while the other ranks wait out their timeout.
Ports below the ephemeral range are only ever taken by an explicit bind, so :func:`free_port`
picks one of those at random and checks that it binds.
"""

from __future__ import annotations

import random
import socket
from typing import Final

#: Ports from here up to the start of the ephemeral range are candidates.
LOWEST: Final = 20000
_RANGE_FILE: Final = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default 32768..60999 where it cannot be read)."""
    try:
        with open(_RANGE_FILE) as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _binds(addr: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
        return True


def free_port(addr: str = "127.0.0.1", *, tries: int = 200) -> int:
    """A TCP port free on ``addr`` now, outside the ephemeral range when possible.

    Args:
        addr: the address rank 0 will listen on (IPv4 or IPv6).
        tries: random candidates to try before falling back to a port the kernel picks.
    """
    lo, _ = ephemeral_range()
    if lo - LOWEST >= 100:
        rng = random.SystemRandom()
        for _ in range(tries):
            port = rng.randrange(LOWEST, lo)
            if _binds(addr, port):
                return port
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])
