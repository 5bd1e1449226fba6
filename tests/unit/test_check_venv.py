"""scripts/check-venv.py: .ci/run keeps its virtualenv only while nothing but what the project's
extra requires is installed in it; a package installed by hand, one under another extra, or one
missing, makes it make a new one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import packaging
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-venv.py"


def dist(site: Path, name: str, *requires: str) -> None:
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0",
             *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder of installed distributions: demo-proj[test] needs alpha (which needs delta) and
    beta; gamma only under another extra; epsilon only on Python 2; pip and setuptools seeded."""
    site = tmp_path / "site"
    dist(site, "demo-proj", "alpha>=1", 'beta; extra == "test"', 'gamma; extra == "other"')
    dist(site, "alpha", "delta", 'epsilon; python_version < "3"')
    for name in ("beta", "delta", "pip", "setuptools"):
        dist(site, name)
    # The script's one import beyond the standard library, beside the fake distributions.
    shutil.copytree(Path(packaging.__file__).parent, site / "packaging")
    return site


def check(site: Path) -> subprocess.CompletedProcess[str]:
    # -S: no site-packages, so the folder's distributions are all there is.
    return subprocess.run([sys.executable, "-S", str(SCRIPT), "--project", "demo-proj"],
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


def test_what_the_extra_requires_and_nothing_else_passes(site: Path):
    result = check(site)
    assert result.returncode == 0, result.stderr


def test_a_package_installed_by_hand_is_named(site: Path):
    dist(site, "cryptography")
    result = check(site)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "check-venv: installed but not required by demo-proj[test]: cryptography")


def test_a_package_of_another_extra_is_named(site: Path):
    dist(site, "gamma")
    result = check(site)
    assert result.returncode == 1
    assert "not required by demo-proj[test]: gamma" in result.stderr


def test_a_missing_requirement_is_named(site: Path):
    shutil.rmtree(site / "delta-1.0.dist-info")
    result = check(site)
    assert result.returncode == 1
    assert result.stderr.strip() == "check-venv: not installed: delta"


def test_without_the_project_nothing_is_kept(site: Path):
    shutil.rmtree(site / "demo_proj-1.0.dist-info")
    result = check(site)
    assert result.returncode == 1
    assert "check-venv: not installed: demo-proj" in result.stderr
