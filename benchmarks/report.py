"""Print the latest tables of every benchmark from benchmarks/out/*.json, as Markdown.

    python -m benchmarks.report            # the tables
    python -m benchmarks.report --plots    # and the pictures of them (benchmarks/plots/*.png)

Used to refresh benchmarks/RESULTS.md after a full run: each section gives the command that made
it, the machine and the table the benchmark printed; ``--plots`` draws the same tables as PNGs
next to RESULTS.md (:mod:`benchmarks.plots`, the ``bench`` extra's matplotlib).
"""

from __future__ import annotations

import argparse
import json

from benchmarks import gang_restart, launch_overhead, many_jobs_report, operator_scale
from benchmarks.common import OUT_DIR

SECTIONS = (
    ("launch_overhead", "Launch overhead", launch_overhead.render),
    ("operator_scale", "Operator scale", operator_scale.render),
    # Written by runs given --json benchmarks/out/operator_scale_<what>.json (RESULTS.md):
    ("operator_scale_final1024", "Operator scale, final, N = 1,024: SPMDJob, PyTorchJob, the floor", operator_scale.render),
    ("operator_scale_final4096", "Operator scale, final, N = 4,096: SPMDJob, the floor", operator_scale.render),
    ("gang_restart_final", "Gang restart, final", gang_restart.render),
    ("operator_scale_spmdjob", "Operator scale, SPMDJob against the floor", operator_scale.render),
    ("operator_scale_jobset", "Operator scale, JobSet against the floor", operator_scale.render),
    ("operator_scale_pytorchjob", "Operator scale, PyTorchJob against the floor", operator_scale.render),
    ("operator_scale_profile", "Operator scale, the profiled run", operator_scale.render),
    ("gang_restart", "Gang restart", gang_restart.render),
    ("many_jobs", "Many jobs at once", many_jobs_report.render),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plots", action="store_true", help="also draw benchmarks/plots/*.png from the same results")
    args = ap.parse_args(argv)
    for name, title, render in SECTIONS:
        path = OUT_DIR / f"{name}.json"
        if not path.exists():
            if "_" not in name.removeprefix("operator_scale"):
                print(f"## {title}\n\n(no results: run `python -m benchmarks.{name}`)\n")
            continue
        data = json.loads(path.read_text())
        print(f"## {title}\n\n`{data['command']}`\n\n```\n{render(data)}\n```\n")
    if args.plots:
        from benchmarks import plots

        return plots.main([])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
