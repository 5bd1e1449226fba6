"""Every third-party module the tree imports is declared by pyproject.toml.

Where it sits: a check of the project's packaging, run by scripts/test.sh right after
`pip install -e ".[test]"` (and by tests/unit/test_declared_imports.py). It reads every Python
file of the tree (git's tracked and untracked files, nothing ignored), takes each absolute
import's top-level name, drops the standard library and the project's own modules, and asks the
running interpreter's installed metadata (importlib.metadata.packages_distributions) which
distribution provides the rest. Each such distribution must be named by the extras asked for
(default `test`, following `monarch-spmd[a,b]` self-references) or by `dependencies`: a module
that arrives only as someone else's dependency, or that a machine-wide Python happens to have,
fails here, not at collection on a fresh machine.

Usage: python scripts/check-imports.py [--root DIR] [--extra NAME ...]
Exit 0 when every import is declared; 1 with one line per undeclared module otherwise.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

SKIPPED_DIRS = frozenset({".git", "__pycache__", "build", "dist", "node_modules"})


@dataclass
class Problem:
    """One undeclared module: its name, the files importing it, the distributions providing it."""

    module: str
    files: list[str] = field(default_factory=list)
    distributions: list[str] = field(default_factory=list)

    def line(self, extras: Iterable[str]) -> str:
        where = ", ".join(self.files[:3]) + (f" and {len(self.files) - 3} more" if len(self.files) > 3 else "")
        wanted = ",".join(extras)
        if not self.distributions:
            return (f"check-imports: `{self.module}` (imported by {where}) is provided by no installed "
                    f"distribution: declare the one that provides it in pyproject.toml and install .[{wanted}]")
        return (f"check-imports: `{self.module}` (imported by {where}) comes from "
                f"{' or '.join(self.distributions)}, which neither `dependencies` nor the extras "
                f"[{wanted}] of pyproject.toml declare: add it there")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(project: dict, extras: Iterable[str]) -> set[str]:
    """Normalized names of the distributions `dependencies` and the extras require, following
    the project's references to its own extras (`monarch-spmd[monarch,cli]`)."""
    own = normalize(project["name"])
    groups = project.get("optional-dependencies", {})
    names: set[str] = set()
    seen: set[str] = set()
    todo = [None, *extras]  # None: the plain dependencies
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        if extra is not None and extra not in groups:
            raise SystemExit(f"check-imports: pyproject.toml has no extra {extra!r} "
                             f"(it has: {', '.join(sorted(groups))})")
        for spec in project.get("dependencies", []) if extra is None else groups[extra]:
            req = Requirement(spec)
            if normalize(req.name) == own:
                todo.extend(sorted(req.extras))
            else:
                names.add(normalize(req.name))
    return names


def python_files(root: Path) -> list[Path]:
    """The tree's Python files: git's tracked and untracked ones, nothing ignored; every file
    under `root` but caches and build output where `root` is not a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", "*.py"],
                             cwd=root, capture_output=True, text=True, check=True).stdout
        return sorted(root / line for line in out.splitlines() if (root / line).is_file())
    except (OSError, subprocess.CalledProcessError):
        return sorted(p for p in root.rglob("*.py")
                      if not SKIPPED_DIRS.intersection(p.relative_to(root).parts)
                      and not any(part.endswith(".egg-info") for part in p.parts))


def imported_names(path: Path) -> set[str]:
    """Top-level names of the file's absolute imports (relative ones are the file's package)."""
    tree = ast.parse(path.read_bytes(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def is_local(name: str, path: Path, root: Path, own_packages: set[str]) -> bool:
    """The project's own module: a package pyproject maps, or a module or package beside the
    file or in a folder above it up to the root (what a script's or pytest's sys.path finds)."""
    if name in own_packages:
        return True
    folder = path.parent
    while True:
        if (folder / f"{name}.py").is_file() or (folder / name).is_dir():
            return True
        if folder == root or root not in folder.parents:
            return False
        folder = folder.parent


def check(root: Path, extras: Iterable[str]) -> list[Problem]:
    """The undeclared third-party modules that the tree under `root` imports."""
    extras = list(extras)
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    wanted = declared(pyproject["project"], extras)
    setuptools = pyproject.get("tool", {}).get("setuptools", {})
    own = {normalize(pyproject["project"]["name"]).replace("-", "_")}
    own.update(setuptools.get("package-dir", {}))
    own.discard("")
    providers = importlib.metadata.packages_distributions()
    problems: dict[str, Problem] = {}
    for path in python_files(root):
        rel = str(path.relative_to(root))
        for name in sorted(imported_names(path)):
            if name == "__future__" or name in sys.stdlib_module_names or is_local(name, path, root, own):
                continue
            dists = sorted({d for d in providers.get(name, [])})
            if any(normalize(d) in wanted for d in dists):
                continue
            problems.setdefault(name, Problem(name, distributions=dists)).files.append(rel)
    return [problems[name] for name in sorted(problems)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the project's folder (default: this checkout)")
    parser.add_argument("--extra", action="append", dest="extras",
                        help="an extra whose requirements count as declared (default: test); repeatable")
    args = parser.parse_args(argv)
    extras = args.extras or ["test"]
    problems = check(args.root.resolve(), extras)
    for problem in problems:
        print(problem.line(extras), file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
