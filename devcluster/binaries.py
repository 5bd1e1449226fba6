"""Where the test cluster's binaries come from.

Lowest layer of the test cluster (devcluster/): finds the folder holding etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kubectl, kwok and helm, building them once per machine
with build-binaries.sh (into ~/.cache/monarch-spmd/...) when no folder has them yet.

A folder named by MONARCH_SPMD_K8S_BIN or KUBEBUILDER_ASSETS (the envtest convention) is used
as is when it holds every binary.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Final

BUILD_SCRIPT: Final = Path(__file__).with_name("build-binaries.sh")
NEEDED: Final = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)


def has_all(folder: Path) -> bool:
    """True when `folder` holds every binary the cluster needs, executable."""
    return all(os.access(folder / name, os.X_OK) for name in NEEDED)


def ensure_binaries(quiet: bool = False) -> Path:
    """Return the bin folder, building the binaries first if this machine has none yet.

    The first build takes tens of minutes on a small machine; later calls return at once.
    Build progress goes to stderr unless `quiet`.
    """
    for var in ("MONARCH_SPMD_K8S_BIN", "KUBEBUILDER_ASSETS"):
        folder = os.environ.get(var)
        if folder and has_all(Path(folder)):
            return Path(folder)
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if quiet else sys.stderr,
        text=True,
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines or not has_all(Path(lines[-1])):
        raise RuntimeError(
            f"{BUILD_SCRIPT.name} failed (exit {result.returncode}); run it by hand to see why"
        )
    return Path(lines[-1])
