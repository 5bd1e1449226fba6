"""Is this environment still what `pip install -e ".[EXTRA]"` made of it, with nothing added?

Where it sits: .ci/run keeps its virtualenv between runs (keyed by pyproject.toml and the Python
it is made from) only while this says yes; otherwise it makes a new one. It walks the
requirements of the installed project (with EXTRA, default `test`) through every installed
distribution's own requirements, markers evaluated, and names every installed distribution
outside that closure (pip and setuptools, which a new virtualenv starts with, aside): a package
installed by hand, or left behind by a requirement since dropped, is what would let the suite see
more than pyproject.toml declares.

Usage: python scripts/check-venv.py [--project NAME] [--extra EXTRA]
Exit 0 when nothing is outside the closure; 1 naming what is, or what is missing.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import sys

SEEDED = frozenset({"pip", "setuptools"})


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(project: str, extras: frozenset[str]) -> tuple[set[str], set[str]]:
    """(names required from `project[extras]` on, names required but not installed)."""
    from packaging.requirements import Requirement  # a requirement of the test extra

    required: set[str] = set()
    missing: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(normalize(project), extras)]
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        required.add(name)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            missing.add(name)
            continue
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in wanted | {""}):
                continue
            todo.append((normalize(req.name), frozenset(req.extras)))
    return required, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", default="monarch-spmd")
    parser.add_argument("--extra", default="test")
    args = parser.parse_args(argv)
    try:
        required, missing = closure(args.project, frozenset({args.extra}))
    except ImportError as err:  # packaging itself missing: not what the install made
        print(f"check-venv: {err}", file=sys.stderr)
        return 1
    installed = {normalize(d.metadata["Name"]) for d in md.distributions() if d.metadata["Name"]}
    extra = sorted(installed - required - SEEDED)
    if missing:
        print(f"check-venv: not installed: {', '.join(sorted(missing))}", file=sys.stderr)
    if extra:
        print(f"check-venv: installed but not required by {args.project}[{args.extra}]: "
              f"{', '.join(extra)}", file=sys.stderr)
    return 1 if missing or extra else 0


if __name__ == "__main__":
    sys.exit(main())
