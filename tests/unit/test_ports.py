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


def test_a_port_in_use_is_never_returned(monkeypatch):
    # A candidate range of 100 ports with 99 of them held: every pick must be the one left.
    base = 21000
    monkeypatch.setattr(ports, "LOWEST", base)
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (base + 100, 60999))
    held = []
    try:
        for port in range(base, base + 100):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        free = held.pop()
        left = free.getsockname()[1]
        free.close()
        picks = {ports.free_port("127.0.0.1", tries=2000) for _ in range(5)}
    finally:
        for s in held:
            s.close()
    assert picks == {left}


def test_ipv6_loopback_gets_a_port_too():
    port = ports.free_port("::1")
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", port))
