"""A lost node, as the agents meet it: one worker in a network namespace of its own (its "node"),
frozen as a node freezes (its worker stopped with SIGSTOP, its link cut, so nothing it was sent is
ever acknowledged), the other on this host. docs/restart-in-place.md, "Failure cases and bounds".

Heartbeats flow every second each way, so towards a frozen node there is always data waiting to
be acknowledged, and TCP keepalive never fires then: the user timeout (rendezvous.USER_TIMEOUT_MS)
is what notices it. Before it the coordinator took 60 s (the heartbeat timeout).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid

import pytest

from monarch_spmd.payload import rendezvous

from .conftest import alive, free_port, worker_cmd, worker_inputs
from .test_agent import PROGRAMS, Events

#: Seconds from the freeze within which the loss must be noticed (the user timeout and a tick).
NOTICED_WITHIN = rendezvous.USER_TIMEOUT_MS / 1000 + 4


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Node:
    """A network namespace joined to this host by a veth pair: host side .1, node side .2."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.netns = f"spmd-node-{tag}"
        self.host_if, self.node_if = f"vh{tag}", f"vn{tag}"
        octet = int(tag[:2], 16) % 200 + 20
        self.host_ip, self.node_ip = f"10.251.{octet}.1", f"10.251.{octet}.2"
        ip("netns", "add", self.netns)
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.node_if)
        ip("link", "set", self.node_if, "netns", self.netns)
        ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        ip("-n", self.netns, "addr", "add", f"{self.node_ip}/30", "dev", self.node_if)
        ip("-n", self.netns, "link", "set", self.node_if, "up")
        ip("-n", self.netns, "link", "set", "lo", "up")

    def command(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *cmd]

    def freeze(self, worker_pid: int) -> float:
        """Stops the node's worker and cuts its link; returns when (monotonic)."""
        os.kill(worker_pid, signal.SIGSTOP)
        ip("-n", self.netns, "link", "set", self.node_if, "down")
        return time.monotonic()

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, timeout=30)


@pytest.fixture
def node():
    n = Node()
    yield n
    n.remove()


def _gang_env(master: str, agent_port: int, master_port: int, token: str, coords: str) -> dict[str, str]:
    return worker_inputs("hosts=2", coords, master_port, addr=master, MONARCH_SPMD_AGENT_PORT=str(agent_port),
                         MONARCH_SPMD_AGENT_TOKEN=token, MONARCH_SPMD_MAX_RESTARTS="0", MONARCH_SPMD_STOP_GRACE="3",
                         MONARCH_SPMD_BACKOFF_SECONDS="0", MONARCH_SPMD_JOIN_TIMEOUT="30")


def _sleepers() -> list[str]:
    # No rank fails (rank 99 does not exist); each sleeps, as a rank waiting in a collective does.
    return worker_cmd("-m", f"{PROGRAMS}.fail_once", "--rank", "99", "--sleep", "120", "--no-rendezvous")


def test_a_member_whose_node_freezes_is_lost_within_seconds_not_a_minute(spawn, node):
    agent_port, master_port, token = free_port(), free_port(), rendezvous.new_token()
    coordinator = spawn(_sleepers(), env=_gang_env(node.host_ip, agent_port, master_port, token, "0"))
    frozen = spawn(node.command(_sleepers()), env=_gang_env(node.host_ip, agent_port, master_port, token, "1"))
    events = Events(agent_port, token)
    try:
        events.wait(rendezvous.EV_ALL_RUNNING, round=0, timeout=120)
        frozen.wait_for(r"fail_once rank 1 pid \d+")
        worker = next(p for p in _children_named(frozen.proc.pid, "monarch_spmd.payload.worker"))
        began = node.freeze(worker)
        lost = events.wait(rendezvous.EV_LOST, member=1, timeout=NOTICED_WITHIN + 60)
        took = time.monotonic() - began
        assert took < NOTICED_WITHIN, f"the frozen member was noticed after {took:.1f}s"
        assert lost["reason"] == rendezvous.LOST_DISCONNECTED, lost
        failure = events.wait(rendezvous.EV_FAILURE, member=1)
        assert failure["reason"] == rendezvous.REASON_MEMBER_LOST
    finally:
        events.close()
        for pid in _children_named(frozen.proc.pid, ""):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def test_a_member_whose_coordinator_freezes_stops_its_own_ranks_within_seconds(spawn, node):
    """The member fences itself: its coordinator (rank 0's node) gone, it stops its ranks and
    exits 75 (the gang must be recreated), so no rank of it can meet a new gang's."""
    agent_port, master_port, token = free_port(), free_port(), rendezvous.new_token()
    coordinator = spawn(node.command(_sleepers()), env=_gang_env(node.node_ip, agent_port, master_port, token, "0"))
    member = spawn(_sleepers(), env=_gang_env(node.node_ip, agent_port, master_port, token, "1"))
    try:
        member.wait_for(r"fail_once rank 1 pid \d+", timeout=120)
        coordinator.wait_for(r"fail_once rank 0 pid \d+", timeout=120)
        rank = int(re.search(r"fail_once rank 1 pid (\d+)", member.text).group(1))
        worker = next(p for p in _children_named(coordinator.proc.pid, "monarch_spmd.payload.worker"))
        began = node.freeze(worker)
        code = member.finish(NOTICED_WITHIN + 60)
        took = time.monotonic() - began
        assert code == 75, member.text
        assert took < NOTICED_WITHIN + 3, f"the member fenced itself {took:.1f}s after its coordinator froze"
        assert "lost the coordinator" in member.text and "CoordinatorLost" in member.text, member.text
        assert not alive(rank), "its rank was stopped"
    finally:
        for pid in _children_named(coordinator.proc.pid, ""):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def _children_named(root: int, needle: str) -> list[int]:
    """``root`` and its descendants whose command line contains ``needle``."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            out.append(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out
