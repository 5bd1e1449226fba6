"""monarch_spmd.kubernetes.attach against real Monarch-mode workers running as local processes.

Each worker is the in-pod worker (``python -m monarch_spmd.payload.worker`` with the inputs the
operator gives a Monarch-mode pod, POD_IP 127.0.0.1, its own port), serving Monarch's worker loop.
The client reshapes Monarch's one-dimensional host mesh into the job's host dimensions, whatever
their names, and spawns the last dimension on each host. The same over a real cluster:
tests/e2e/test_monarch_mode.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from monarch_spmd import parse_mesh
from monarch_spmd.payload import contract
from monarch_spmd.payload import worker

from .conftest import free_port, script

pytestmark = pytest.mark.monarch


def start_workers(mesh: str) -> tuple[list[subprocess.Popen], list[str]]:
    dims = parse_mesh(mesh)
    hosts = contract.world_size(dims) // dims[-1][1]
    procs, addresses = [], []
    for index in range(hosts):
        port = free_port()
        coords = contract.coords_of(dims[:-1], index) if len(dims) > 1 else []
        env = {**os.environ, "POD_IP": "127.0.0.1",
               **worker.worker_input_env(dims, coords, "unused", 1, pod_layout="PerHost", mode="Monarch",
                                         monarch_port=port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "monarch_spmd.payload.worker"], env=env,
                                      stderr=subprocess.PIPE, text=True))
        addresses.append(f"tcp://127.0.0.1:{port}")
    for address in addresses:
        deadline = time.monotonic() + 60
        port = int(address.rpartition(":")[2])
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"no worker loop at {address}"
                time.sleep(0.2)
    return procs, addresses


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        return int(f.read().rpartition(")")[2].split()[1])


def stop(procs: list[subprocess.Popen]) -> list[int]:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    return [p.wait(30) for p in procs]


@pytest.mark.parametrize(("mesh", "labels", "how"), [
    ("dp=1,hosts=2,gpus=1", ["dp", "hosts", "gpus"], []),           # the job's own "hosts", not first
    ("gpus=2", ["gpus"], []),                                       # one host: no host dimension at all
    ("a=2,b=1,c=2", ["a", "b", "c"], ["--async"]),                  # attach_async
])
def test_attach_shapes_the_mesh_as_the_job_and_puts_each_host_in_its_worker(mesh, labels, how):
    procs, addresses = start_workers(mesh)
    try:
        done = subprocess.run([sys.executable, script("monarch_attach_client.py"), *how, mesh, *addresses],
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-4000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        # Each proc's parent is a worker loop, whose parent is the worker of host GROUP_RANK.
        worker_of = {parent_pid(proc["host_pid"]): proc for proc in out["procs"]}
        for host, p in enumerate(procs):
            assert worker_of[p.pid]["env"]["GROUP_RANK"] == str(host)
    finally:
        codes = stop(procs)
    dims = parse_mesh(mesh)
    assert out["sizes"] == dict(dims)
    for proc in out["procs"]:
        assert proc["labels"] == labels
        rank = contract.rank_of(dims, proc["coords"])
        host = rank // dims[-1][1]
        assert proc["env"]["RANK"] == str(rank) and proc["env"]["GROUP_RANK"] == str(host)
        assert proc["env"]["LOCAL_RANK"] == str(proc["coords"][-1])
    assert len(out["procs"]) == contract.world_size(dims)
    assert codes == [128 + signal.SIGTERM] * len(procs), "SIGTERM (a pod deleted) stops the loop"


def test_a_worker_whose_python_lacks_monarch_exits_64_naming_it(tmp_path):
    # A bare venv: this machine's Python without its site-packages, as an image without torchmonarch.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    python = str(tmp_path / "venv" / "bin" / "python")
    env = {"PATH": os.environ["PATH"], "POD_IP": "127.0.0.1",
           **worker.worker_input_env([("hosts", 1), ("gpus", 1)], [0], "unused", 1, pod_layout="PerHost",
                                     mode="Monarch", monarch_port=free_port())}
    # The worker file as the pod runs it from its ConfigMap: standard library only.
    done = subprocess.run([python, worker.__file__], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == worker.EX_USAGE, done.stderr
    assert "serving Monarch's worker loop" in done.stderr
    assert f"mode Monarch needs torchmonarch in the image: {python} cannot import monarch" in done.stderr
