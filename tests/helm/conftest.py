"""Fixtures for the Helm chart tests: the real helm binary (built once per machine by
devcluster/build-binaries.sh, like the test cluster's other binaries), a renderer, and for the
tests on the test cluster the chart's CRD applied."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from helm_support import CHART, CRD_NAME, KUBE_VERSION, wait_established
from devcluster.binaries import ensure_binaries


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    """The folder with helm and kubectl (built on first use, cached under ~/.cache)."""
    return ensure_binaries()


@pytest.fixture(scope="session")
def helm(bin_dir: Path) -> Callable[..., subprocess.CompletedProcess]:
    """Runs the real helm binary; returns the completed process (never raises on failure)."""

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(bin_dir / "helm"), *args], capture_output=True, text=True, timeout=timeout, check=False
        )

    return run


Rendered = list[dict[str, Any]]


@pytest.fixture(scope="session")
def render(helm) -> Callable[..., Rendered]:
    """`helm template` of the chart; returns the objects, or fails the test with helm's message."""

    def run(*args: str, release: str = "spmd", namespace: str = "ops") -> Rendered:
        result = helm("template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION, *args)
        assert result.returncode == 0, result.stderr
        return [d for d in yaml.safe_load_all(result.stdout) if d]

    return run


@pytest.fixture
def crd(cluster) -> str:
    """The chart's CRD applied (as `helm install` would on a fresh cluster) and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    wait_established(cluster, f"crd/{CRD_NAME}")
    return CRD_NAME
