"""Shared helpers for the benchmarks: machine description, tables, JSON output."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "benchmarks" / "out"


def mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - not installed
        return None


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
            timeout=10, check=True,
        ).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "mem_gib": mem_total_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "torchmonarch": _version("torchmonarch"),
        "kopf": _version("kopf"),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
    }


def machine_line(m: dict) -> str:
    return (
        f"{m['cpus']} CPUs ({m['cpu_model']}), {m['mem_gib']} GiB RAM, Python {m['python']}, "
        f"{m['date']}"
    )


def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt(x, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A GitHub-flavoured Markdown table (readable as plain text too)."""
    rows = [[fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def write_json(name: str, data: dict, path: str | os.PathLike | None = None) -> Path:
    p = Path(path) if path else OUT_DIR / f"{name}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, p)
    return p


def python_env() -> dict[str, str]:
    """The environment for child launchers: the repository importable from any cwd."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


PY = sys.executable
