"""The benchmarks' results as pictures (PNG, the peers side by side), next to benchmarks/RESULTS.md.

    python -m benchmarks.plots                  # from benchmarks/out/*.json, else RESULTS.md's tables
    python -m benchmarks.plots --from-results   # from the tables recorded in benchmarks/RESULTS.md
    python -m benchmarks.report --plots         # the tables, then these plots

Where it sits: beside :mod:`benchmarks.report`, which prints the tables the benchmarks recorded;
this module draws them. Both sources go through one reader of the Markdown tables the benchmarks
print (each benchmark's ``render``): the raw samples in ``benchmarks/out/<name>.json`` are
rendered to those tables first, and RESULTS.md holds the same tables for the runs it reports, so
a plot shows exactly the numbers of a table. Needs matplotlib (``pip install -e ".[bench]"``),
drawn with its Agg backend (no display).

Pictures, in ``benchmarks/plots/``:

- ``operator_scale.png``: the SPMDJob operator, JobSet and PyTorchJob at N = 1,024 and 4,096:
  time to the job's Running as a multiple of the no-operator floor of the same run, API requests
  per pod, and the controllers' peak memory. Each bar comes from the newest table that has that
  actor at that N; a bar from a run on a loaded machine is hatched.
- ``gang_restart.png``: when each step of a 1,024-proc gang restart happened, per
  podReplacementPolicy (medians of the newest run).
- ``launch_overhead.png``: seconds from launch to the end of a short gloo job against the number
  of procs, for the local runner, torchrun, Monarch and a plain ``subprocess`` launcher.
- ``node_loss.png``: a real node frozen under each system's job, seconds from the freeze until the
  job runs again and until every rank trains again (medians); a system that did not recover is a
  hatched bar to the cap. From ``benchmarks/out/node_loss.json`` (the medians of
  :func:`benchmarks.node_loss.render`'s table) or RESULTS.md's table of the systems.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

HERE: Final = Path(__file__).resolve().parent
RESULTS: Final = HERE / "RESULTS.md"
PLOTS_DIR: Final = HERE / "plots"
#: The peers, in the order they are drawn, with their colours (the floor is the reference).
PEERS: Final = (("spmdjob", "SPMDJob (this operator)", "#1f77b4"), ("jobset", "JobSet", "#2ca02c"),
                ("pytorchjob", "PyTorchJob", "#d62728"))
SIZES: Final = (1024, 4096)
#: Launchers of the launch-overhead benchmark, in the order they are drawn.
LAUNCHERS: Final = ("runner", "torchrun", "monarch", "monarch-upstream", "plain", "forkserver")


@dataclass
class Table:
    """One Markdown table the benchmarks printed, with where it was found.

    Attributes:
        header: the column names.
        rows: the cells of each row, as text.
        section: the benchmark it belongs to (``operator_scale``, ``gang_restart``, ``launch_overhead``,
            ``node_loss``).
        loaded: whether it was measured on a loaded machine (the text before it says so).
        source: where it comes from (a file, and the table's line).
    """

    header: list[str]
    rows: list[list[str]]
    section: str
    loaded: bool = False
    source: str = ""
    records: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.records = [dict(zip(self.header, row)) for row in self.rows]


def section_of(header: Sequence[str]) -> str | None:
    """Which benchmark printed a table with this header, or None."""
    if "actor" in header and "job Running s" in header:
        return "operator_scale"
    if "podReplacementPolicy" in header:
        return "gang_restart"
    if "launcher" in header and "median s" in header:
        return "launch_overhead"
    if "system" in header and "every rank training again s" in header:
        return "node_loss"
    return None


def read_tables(text: str, source: str = "") -> list[Table]:
    """Every benchmark table of a text (RESULTS.md, or what ``render`` printed), in order.

    A table is loaded when the paragraph or line just before it (or its code fence) says
    "loaded" (RESULTS.md marks the runs made while other suites ran so).
    """
    lines = text.splitlines()
    tables: list[Table] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|[-|: ]+\|", lines[i + 1].strip()):
            header = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            j = i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
                j += 1
            section = section_of(header)
            if section:
                before = _paragraph_before(lines, i)
                loaded = bool(re.search(r"\bloaded\b", before, re.I)) and not re.search(r"\bquiet\b", before, re.I)
                tables.append(Table(header, rows, section, loaded, f"{source}:{i + 1}"))
            i = j
        else:
            i += 1
    return tables


def _paragraph_before(lines: Sequence[str], index: int) -> str:
    """The text just before line ``index``: the lines up to the previous blank line, skipping a
    code fence and the lines a benchmark prints above its table."""
    j = index - 1
    while j >= 0 and (lines[j].startswith("```") or not lines[j].strip() or _printed_above_table(lines[j])):
        j -= 1
    out = []
    while j >= 0 and lines[j].strip() and not lines[j].startswith("```"):
        out.append(lines[j])
        j -= 1
    return " ".join(reversed(out))


def _printed_above_table(line: str) -> bool:
    return bool(re.match(r"(Operator scale|Gang restart|Launch overhead|\d+ CPUs)", line))


def number(cell: str) -> float | None:
    """The first number of a cell (``"18.65 (1.01x)"`` -> 18.65, ``"**11.0**"`` -> 11.0), or None (``"-"``)."""
    m = re.match(r"\s*\**(-?[0-9][0-9,]*(?:\.[0-9]+)?)", cell or "")
    return float(m.group(1).replace(",", "")) if m else None


def parts(cell: str) -> list[float]:
    """Every ``+``-separated number of a cell (``"76 + 116"`` -> [76, 116])."""
    return [v for v in (number(p) for p in (cell or "").split("+")) if v is not None]


# --- where the tables come from ---------------------------------------------------------------


def tables_from_results(path: Path = RESULTS) -> list[Table]:
    """The tables RESULTS.md records, newest first within each section (as it orders them)."""
    return read_tables(path.read_text(), path.name)


def tables_from_json(out_dir: Path) -> list[Table]:
    """The tables of every benchmarks/out/*.json, rendered by the benchmark that wrote it: those
    :mod:`benchmarks.report` prints, and node_loss.json (its report is its own: ``benchmarks.node_loss
    --render``)."""
    from benchmarks import node_loss, report

    renders = [(name, render) for name, _, render in report.SECTIONS]
    renders.append(("node_loss", lambda result: node_loss.render(result, timelines=False)))
    tables: list[Table] = []
    for name, render in renders:
        path = out_dir / f"{name}.json"
        if path.exists():
            tables.extend(read_tables(render(json.loads(path.read_text())), path.name))
    return tables


# --- the pictures -------------------------------------------------------------------------------


def newest(tables: Iterable[Table], section: str, actor: str, procs: int) -> tuple[dict[str, str], Table] | None:
    """The first row (in document order: the newest run) of ``actor`` at ``procs`` procs."""
    for table in tables:
        if table.section != section:
            continue
        for record in table.records:
            if record.get("actor") == actor and number(record.get("N", "")) == procs:
                return record, table
    return None


def floor_of(table: Table, procs: int) -> dict[str, str] | None:
    return next((r for r in table.records if r.get("actor") == "floor" and number(r.get("N", "")) == procs), None)


def operator_scale_figure(tables: Sequence[Table], path: Path) -> Path:
    """Job Running as a multiple of the floor, requests per pod and peak memory, the peers side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    width = 0.26
    for p, (actor, label, colour) in enumerate(PEERS):
        for s, procs in enumerate(SIZES):
            found = newest(tables, "operator_scale", actor, procs)
            if found is None:
                continue
            record, table = found
            floor = floor_of(table, procs)
            x = s + (p - 1) * width
            style = {"color": colour, "hatch": "//" if table.loaded else None, "edgecolor": "white",
                     "label": label if s == 0 else None}
            running, floor_running = number(record["job Running s"]), number((floor or {}).get("all Running s", ""))
            if running is not None and floor_running:
                ratio = running / floor_running
                axes[0].bar(x, ratio, width, **style)
                axes[0].annotate(f"{ratio:.2f}x\n{running:.0f} s", (x, ratio), ha="center", va="bottom", fontsize=8)
            requests = number(record["API requests"])
            if requests is not None:
                axes[1].bar(x, requests / procs, width, **style)
                axes[1].annotate(f"{requests / procs:.2f}", (x, requests / procs), ha="center", va="bottom", fontsize=8)
            memory = parts(record["peak RSS MiB"])
            bottom = 0.0
            for k, mib in enumerate(memory):
                axes[2].bar(x, mib, width, bottom=bottom, **{**style, "label": style["label"] if k == 0 else None,
                                                              "alpha": 1.0 if k == 0 else 0.55})
                bottom += mib
            if memory:
                axes[2].annotate(" + ".join(f"{m:.0f}" for m in memory), (x, bottom), ha="center", va="bottom",
                                 fontsize=8)
    titles = ("Time to the job's Running\n(x the no-operator floor of the same run)",
              "API requests per pod", "Peak memory of the controller, MiB\n(JobSet: manager + Job controller)")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(SIZES)), [f"N = {n:,}" for n in SIZES])
        ax.spines[["top", "right"]].set_visible(False)
        ax.margins(y=0.2)
    axes[0].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes[0].legend(frameon=False, fontsize=9, loc="upper left")
    fig.suptitle("Operator scale on kwok nodes: one job of N procs (hatched: a run on a loaded machine)", fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


#: The steps of a gang restart, in the order a restart goes through them.
RESTART_STEPS: Final = ("job Restarting s", "first new pod s", "all new pods created s", "old gang gone s",
                        "all new pods Running s", "job Running s")


def gang_restart_figure(tables: Sequence[Table], path: Path) -> Path:
    """When each step of a gang restart happened, per podReplacementPolicy (the newest run's medians)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = next(t for t in tables if t.section == "gang_restart")
    medians = [r for r in table.records if r.get("rep") == "median"]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 1.1 * len(medians)))
    markers = ("o", "s", "^", "x", "D", "*")
    for y, record in enumerate(medians):
        end = number(record["job Running s"]) or 0
        ax.barh(y, end, height=0.35, color="#1f77b4", alpha=0.25)
        for step, marker in zip(RESTART_STEPS, markers):
            when = number(record.get(step, ""))
            if when is not None:
                ax.plot(when, y, marker, color="#1f77b4", markersize=8, label=step.removesuffix(" s") if y == 0 else None)
        ax.annotate(f"{end:.1f} s", (end, y), xytext=(6, 0), textcoords="offset points", va="center", fontsize=9)
    ax.set_yticks(range(len(medians)), [r["podReplacementPolicy"] for r in medians])
    ax.set_xlabel("seconds after one rank's pod failed")
    ax.set_title("Gang restart of 1,024 procs on kwok nodes: when each step happened (median)", fontsize=11)
    ax.legend(frameon=False, fontsize=8, ncol=3, loc="lower right")
    ax.spines[["top", "right"]].set_visible(False)
    ax.margins(x=0.12, y=0.3)
    fig.tight_layout()
    return _save(fig, path)


def launch_overhead_figure(tables: Sequence[Table], path: Path) -> Path:
    """Median seconds to the end of a short gloo job against the procs, one line per launcher."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = next(t for t in tables if t.section == "launch_overhead")
    preinit = sorted({number(r["pre-init s"]) or 0 for r in table.records})
    fig, axes = plt.subplots(1, len(preinit), figsize=(6 * len(preinit), 4.2), squeeze=False)
    for ax, wait in zip(axes[0], preinit):
        for launcher in LAUNCHERS:
            points = sorted((number(r["P"]), number(r["median s"])) for r in table.records
                            if r["launcher"] == launcher and (number(r["pre-init s"]) or 0) == wait)
            if points:
                style = {"linewidth": 2.5} if launcher in ("runner", "torchrun") else {"linewidth": 1.2, "alpha": 0.8}
                ax.plot([p for p, _ in points], [m for _, m in points], marker="o", label=launcher, **style)
        ax.set_title(f"{wait:g} s of work before init_process_group", fontsize=10)
        ax.set_xlabel("procs (P)")
        ax.set_ylabel("median seconds, launch to the last rank's first all_reduce")
        ax.set_xticks(sorted({number(r["P"]) for r in table.records}))
        ax.spines[["top", "right"]].set_visible(False)
        ax.legend(frameon=False, fontsize=8)
    fig.suptitle("Launch overhead on this machine: the local runner (runner) against torchrun and Monarch", fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


#: The two figures of a lost node, by how their columns end (RESULTS.md: "job running again s";
#: benchmarks.node_loss: "running again s"), with their colours.
NODE_LOSS_STEPS: Final = (("running again s", "job running again", "#9ecae1"),
                          ("training again s", "every rank training again", "#1f77b4"))
#: The cap drawn (the dashed line) when no system's cell gives one (benchmarks.node_loss's --cap).
NODE_LOSS_CAP: Final = 720.0


def node_loss_medians(table: Table) -> list[tuple[str, list[str]]]:
    """Each system of a node-loss table with its two cells (running again, training again), in the
    table's order: every row of RESULTS.md's table, the "median of N" rows of the one
    :func:`benchmarks.node_loss.render` prints (its other rows are single runs)."""
    systems = []
    for record in table.records:
        system = record.get("system", "")
        if "run" in table.header:
            median = re.fullmatch(r"\*\*(.+): median of \d+\*\*", system)
            if median is None:
                continue
            system = median.group(1)
        cells = [next((v for k, v in record.items() if k.endswith(suffix)), "") for suffix, _, _ in NODE_LOSS_STEPS]
        systems.append((system.replace("**", "").replace("`", ""), cells))
    return systems


def not_recovered(cell: str) -> float | None:
    """The cap of a cell that says the job did not recover (``"did not recover in 720 s"`` -> 720), or None."""
    m = re.search(r"did not recover in ([0-9]+(?:\.[0-9]+)?)", cell or "")
    return float(m.group(1)) if m else None


def node_loss_figure(tables: Sequence[Table], path: Path) -> Path:
    """Seconds from a node's freeze until each system's job runs again and every rank trains again
    (the newest table's medians), a bar pair per system; one that did not recover: hatched, to the cap."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullLocator

    table = next(t for t in tables if t.section == "node_loss")
    systems = node_loss_medians(table)
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.75 * len(systems)))
    height = 0.38
    caps = [c for _, cells in systems for c in map(not_recovered, cells) if c is not None]
    cap = max(caps, default=NODE_LOSS_CAP)
    seconds_drawn = [cap]
    for y, (system, cells) in enumerate(systems):
        for k, ((_, label, colour), cell) in enumerate(zip(NODE_LOSS_STEPS, cells)):
            at = y + (k - 0.5) * height
            seconds, lost = number(cell), not_recovered(cell)
            if lost is not None:
                ax.barh(at, lost, height, color=colour, hatch="//", edgecolor="white")
                ax.annotate(f"did not recover in {lost:g} s", (lost, at), xytext=(4, 0), textcoords="offset points",
                            va="center", fontsize=8)
            elif seconds is not None:
                ax.barh(at, seconds, height, color=colour)
                ax.annotate(f"{seconds:.1f} s", (seconds, at), xytext=(4, 0), textcoords="offset points",
                            va="center", fontsize=8)
                seconds_drawn.append(seconds)
    ax.set_xscale("log")
    left = min(1.0, *(s / 2 for s in seconds_drawn))
    ax.set_xlim(left, cap * 6)
    ticks = [t for t in (1, 3, 10, 30, 100, 300) if left <= t < cap * 0.8] + [cap]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.axvline(cap, color="grey", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(systems)), [textwrap.fill(system, 44) for system, _ in systems], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds from the freeze (log scale; dashed: the {cap:g} s cap)")
    ax.set_title("A frozen node: seconds until the job trains again (medians)", fontsize=11)
    handles = [Patch(color=colour, label=label) for _, label, colour in NODE_LOSS_STEPS]
    handles.append(Patch(facecolor="grey", hatch="//", edgecolor="white", label="did not recover (drawn to the cap)"))
    ax.legend(handles=handles, frameon=False, fontsize=8, loc="upper right")
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    # No timestamps in the file: the same numbers give the same PNG.
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


FIGURES: Final = (("operator_scale", operator_scale_figure), ("gang_restart", gang_restart_figure),
                  ("launch_overhead", launch_overhead_figure), ("node_loss", node_loss_figure))


def draw(tables: Sequence[Table], out_dir: Path = PLOTS_DIR) -> list[Path]:
    """Every picture whose benchmark has a table; returns the files written."""
    have = {t.section for t in tables}
    return [figure(tables, out_dir / f"{name}.png") for name, figure in FIGURES if name in have]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from-results", action="store_true", help="draw from benchmarks/RESULTS.md's tables")
    ap.add_argument("--out-dir", type=Path, default=HERE / "out", help="the benchmarks' JSON (default benchmarks/out)")
    ap.add_argument("--plots-dir", type=Path, default=PLOTS_DIR, help="where the PNGs go (default benchmarks/plots)")
    args = ap.parse_args(argv)
    tables = [] if args.from_results else tables_from_json(args.out_dir)
    where = f"{args.out_dir}/*.json"
    if not tables:
        tables, where = tables_from_results(), str(RESULTS)
    written = draw(tables, args.plots_dir)
    for path in written:
        print(f"plots: wrote {path} (from {where})")
    return 0 if written else 1


if __name__ == "__main__":
    raise SystemExit(main())
