"""Simulated nodes for scale tests: kwok against the test control plane.

Part of the test cluster (devcluster/), beside nodeagent.py and above controlplane.py. kwok
fakes the lifecycle of the nodes it manages and of the pods bound to them: a pod on a kwok node
becomes Running, Ready and gets an IP (from 10.245.0.0/16, which nothing routes) without any
process being started. That is right for benchmarks and for tests that count objects (64-proc
jobs), never for running training.

kwok manages only nodes annotated `kwok.x-k8s.io/node: fake`; the process nodes are left alone.
Every fake node carries the taint KWOK_TAINT, so only pods with KWOK_TOLERATION land there:

    pod["spec"]["tolerations"] = [KWOK_TOLERATION]
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Final

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from devcluster.controlplane import die_with_parent, stop_process_group

KWOK_ANNOTATION: Final = "kwok.x-k8s.io/node"
KWOK_TAINT: Final = {"key": KWOK_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
KWOK_TOLERATION: Final = {"key": KWOK_ANNOTATION, "operator": "Exists", "effect": "NoSchedule"}
POD_CIDR: Final = "10.245.0.1/16"


def fake_node(name: str, cpu: str, memory: str, pods: int, gpus: int) -> dict[str, Any]:
    """The Node object of one kwok node."""
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "type": "kwok"},
        },
        "spec": {"taints": [KWOK_TAINT]},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


class KwokNodes:
    """The kwok controller plus `count` fake nodes named `<prefix><i>`.

    Args:
        bin_dir: folder holding the kwok binary.
        kubeconfig: admin kubeconfig of the cluster.
        state_dir: where kwok's log (kwok.log) and config go.
        count: how many fake nodes.
        cpu, memory, pods, gpus: capacity of each fake node (gpus is `nvidia.com/gpu`).
    """

    def __init__(self, bin_dir: Path, kubeconfig: Path, state_dir: Path, count: int = 4, *,
                 prefix: str = "kwok-node-", cpu: str = "64", memory: str = "512Gi",
                 pods: int = 1000, gpus: int = 8) -> None:
        self.bin_dir, self.kubeconfig, self.state_dir = Path(bin_dir), kubeconfig, Path(state_dir)
        self.names = [f"{prefix}{i}" for i in range(count)]
        self.capacity = {"cpu": cpu, "memory": memory, "pods": pods, "gpus": gpus}
        self.process: subprocess.Popen | None = None

    def stages(self) -> str:
        """kwok's configuration: no stages of our own, so kwok's defaults (pods become Running)."""
        return ""

    def start(self, timeout: float = 60.0) -> None:
        """Start kwok, create the nodes and wait until every one is Ready."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.state_dir / "kwok.yaml"
        cfg.write_text(self.stages())
        with open(self.state_dir / "kwok.log", "ab") as log:
            self.process = subprocess.Popen(
                [str(self.bin_dir / "kwok"), f"--kubeconfig={self.kubeconfig}",
                 f"--config={cfg}", "--manage-all-nodes=false",
                 f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                 f"--cidr={POD_CIDR}", "--node-lease-duration-seconds=40"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent)
        core = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        for name in self.names:
            try:
                core.create_node(fake_node(name, **self.capacity))
            except ApiException as err:
                if err.status != 409:
                    raise
        deadline = time.monotonic() + timeout
        while not all(self._ready(core, name) for name in self.names):
            if self.process.poll() is not None:
                raise RuntimeError(f"kwok exited with {self.process.returncode}; "
                                   f"see {self.state_dir / 'kwok.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"kwok nodes not Ready after {timeout}s")
            time.sleep(0.5)

    @staticmethod
    def _ready(core: client.CoreV1Api, name: str) -> bool:
        node = core.read_node(name)
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process)
            self.process = None
