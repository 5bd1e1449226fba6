"""scripts/check-imports.py: every third-party module the tree imports is declared by an extra of
pyproject.toml, so a fresh virtualenv with `pip install -e ".[test]"` runs the whole suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-imports.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def demo_tree(root: Path) -> None:
    """A project whose `test` extra reaches pyyaml through its own `cli` extra."""
    write(root / "pyproject.toml", """
        [project]
        name = "demo-proj"
        version = "0"
        dependencies = []
        [project.optional-dependencies]
        cli = ["PyYAML>=6"]
        test = ["demo-proj[cli]"]
        [tool.setuptools]
        package-dir = { "demo_operator" = "operator/demo_operator" }
        """)
    write(root / "operator/demo_operator/__init__.py", "")
    write(root / "tools/sibling.py", "")
    write(root / "tools/run.py", """
        from __future__ import annotations
        import json, os.path
        import yaml
        import sibling
        from demo_operator import x
        from demo_proj import y
        from . import relative
        """)


def test_this_tree_declares_every_module_it_imports():
    result = run()
    assert result.returncode == 0, result.stderr


def test_declared_stdlib_and_own_modules_pass(tmp_path: Path):
    demo_tree(tmp_path)
    result = run("--root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_an_installed_but_undeclared_module_is_named_with_its_distribution(tmp_path: Path):
    # pytest is installed here (it runs this test) but the demo project does not declare it: the
    # case of a module a machine-wide Python or another package's dependency happens to bring.
    demo_tree(tmp_path)
    write(tmp_path / "tests/test_x.py", "import pytest\nfrom _pytest import nodes\n")
    result = run("--root", str(tmp_path))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("check-imports: `_pytest` (imported by tests/test_x.py) comes from pytest")
    assert lines[1].startswith("check-imports: `pytest` (imported by tests/test_x.py) comes from pytest")
    assert "[test]" in lines[1] and "add it there" in lines[1]


def test_a_module_nothing_installed_provides_is_named(tmp_path: Path):
    demo_tree(tmp_path)
    write(tmp_path / "a.py", "import no_such_module_anywhere_zz\n")
    write(tmp_path / "b/c.py", "from no_such_module_anywhere_zz.sub import thing\n")
    result = run("--root", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "check-imports: `no_such_module_anywhere_zz` (imported by a.py, b/c.py) is provided by no "
        "installed distribution: declare the one that provides it in pyproject.toml and install .[test]"
    ]


def test_only_the_extras_asked_for_count(tmp_path: Path):
    # yaml is declared by `cli`; asking for a project's plain dependencies alone finds it missing.
    demo_tree(tmp_path)
    write(tmp_path / "pyproject.toml", (tmp_path / "pyproject.toml").read_text()
          .replace('[project.optional-dependencies]', '[project.optional-dependencies]\nnone = []'))
    result = run("--root", str(tmp_path), "--extra", "none")
    assert result.returncode == 1
    assert "`yaml` (imported by tools/run.py) comes from PyYAML" in result.stderr


def test_an_unknown_extra_is_refused_naming_the_ones_there_are(tmp_path: Path):
    demo_tree(tmp_path)
    result = run("--root", str(tmp_path), "--extra", "tset")
    assert result.returncode == 1
    assert "pyproject.toml has no extra 'tset' (it has: cli, test)" in result.stderr
