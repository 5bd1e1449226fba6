"""Unit tests of monarch_spmd.ports: rank 0's port is free and outside the ephemeral range."""

from __future__ import annotations

import socket

from monarch_spmd import ports


def test_port_is_free_and_below_the_ephemeral_range():
    lo, hi = ports.ephemeral_range()
    assert 0 < lo <= hi
    for _ in range(20):
        port = ports.free_port("127.0.0.1")
        assert ports.LOWEST <= port < lo
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free: binding succeeds


def test_a_port_in_use_is_never_returned():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        assert all(ports.free_port("127.0.0.1") != taken for _ in range(50))
        assert not ports._binds("127.0.0.1", taken)


def test_ipv6_loopback_gets_a_port_too():
    port = ports.free_port("::1")
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", port))
