"""kind-config.yaml as kind itself reads it.

kind cannot create clusters on the machines this suite runs on (its node containers need
`docker run --privileged`, which needs every capability, and root here lacks CAP_SYS_RESOURCE;
see README's kind section), so scripts/kind-e2e.sh cannot run here. What can run is kind's own
config loading and validation (v0.33.0, strict decoding: a misspelt field fails), through
scripts/kind-config-check.sh.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "kind-config-check.sh"


def kind_check(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CHECK), *map(str, paths)], capture_output=True, text=True,
                          timeout=600, check=False)


def test_kind_config_loads_with_kinds_own_loader():
    result = kind_check(ROOT / "kind-config.yaml")
    assert result.returncode == 0, result.stderr
    assert 'cluster "monarch-spmd", nodes [control-plane worker worker]' in result.stdout


def test_a_misspelt_field_fails_the_check(tmp_path):
    text = (ROOT / "kind-config.yaml").read_text().replace("  - role: worker\n",
                                                           "  - role: worker\n    labls: {}\n", 1)
    bad = tmp_path / "kind-config.yaml"
    bad.write_text(text)
    result = kind_check(bad)
    assert result.returncode == 1
    assert "field labls not found" in result.stderr, result.stderr


def test_an_unknown_role_fails_the_check(tmp_path):
    bad = tmp_path / "kind-config.yaml"
    bad.write_text((ROOT / "kind-config.yaml").read_text().replace("role: worker", "role: wroker", 1))
    result = kind_check(bad)
    assert result.returncode == 1 and "wroker" in result.stderr, result.stderr
