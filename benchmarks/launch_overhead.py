"""Launch overhead: from launcher start to the first completed all_reduce on P local procs.

    python -m benchmarks.launch_overhead [--procs 2 4 8] [--reps 5] [--preinit 0 5] [--launchers ...]

Every launcher runs the same module, ``benchmarks.first_allreduce``: each rank records when its
program started, joins a gloo group, does one all_reduce and writes the wall-clock time right
after it. The start timestamp is taken just before the launcher command is spawned, so the figure
includes interpreter start, imports, process spawning and rendezvous: what a user waits for.
Two cases (``--preinit``): 0, the ranks call ``init_process_group`` at once; S > 0, every rank
first imports torch and works S seconds (a sleep) before ``init_process_group``, as training
scripts build their model first: then the first all_reduce waits for the LAST rank to start, and
the start skew (max - min of the ranks' start times) is its own column. Launchers, in one run,
interleaved (each repetition visits every (case, P, launcher), in a rotated order):

- ``runner``: this project's local runner, ``python -m monarch_spmd.cli run --mesh procs=P -- -m ...``
- ``torchrun``: ``python -m torch.distributed.run --standalone --nproc-per-node P -m ...``
- ``monarch``: a driver process that spawns a local Monarch proc mesh and runs the module through
  this project's ``monarch_spmd.actor.SPMDActor`` (``benchmarks/monarch_driver.py``)
- ``monarch-upstream``: the same driver with torchmonarch's own ``monarch.spmd.SPMDActor``
- ``plain``: the floor of launching processes: P ``python -m ...`` started at once by a minimal
  benchmark-only launcher with torchrun's environment (``benchmarks/fork_launcher.py --mode spawn``)
- ``forkserver``: a prototype, benchmark-only: one parent imports torch, then forks the P ranks,
  each running the module with ``runpy`` (``benchmarks/fork_launcher.py --mode fork``)

The latency of one run is the LAST rank's all_reduce time minus the start timestamp. The table
shows the median over repetitions and its ratio to torchrun's median for the same case and P,
when the last rank started (median) and the start skew (median and max). JSON goes to
``benchmarks/out/launch_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import PY, REPO, machine, machine_line, median, python_env, table, write_json

LAUNCHERS = ("runner", "torchrun", "monarch", "monarch-upstream", "plain", "forkserver")
MODULE = "benchmarks.first_allreduce"


def command(launcher: str, procs: int, out: str, preinit: float = 0.0) -> list[str]:
    script = ["-m", MODULE, "--out", out] + (["--preinit", f"{preinit:g}"] if preinit else [])
    if launcher == "runner":
        return [PY, "-m", "monarch_spmd.cli", "run", "--mesh", f"procs={procs}", "--", *script]
    if launcher == "torchrun":
        return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}", *script]
    if launcher in ("monarch", "monarch-upstream"):
        impl = "project" if launcher == "monarch" else "upstream"
        return [PY, "-m", "benchmarks.monarch_driver", "--procs", str(procs), "--impl", impl, "--out", out,
                *(["--preinit", f"{preinit:g}"] if preinit else [])]
    if launcher in ("plain", "forkserver"):
        mode = "spawn" if launcher == "plain" else "fork"
        return [PY, "-m", "benchmarks.fork_launcher", "--procs", str(procs), "--mode", mode, "--", *script]
    raise ValueError(f"unknown launcher {launcher!r}; known: {', '.join(LAUNCHERS)}")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_once(launcher: str, procs: int, timeout: float, preinit: float = 0.0) -> dict:
    """One launch; returns a record with ``ok``, ``latency_s``, ``skew_s`` and ``exit_s`` (or ``error``)."""
    out = tempfile.mkdtemp(prefix=f"launch-{launcher}-{procs}-")
    cmd = command(launcher, procs, out, preinit)
    rec: dict = {"launcher": launcher, "procs": procs, "preinit_s": preinit, "ok": False}
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=python_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        rec["returncode"] = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        output, _ = proc.communicate()
        rec["returncode"] = None
        rec["error"] = f"timed out after {timeout:.0f}s"
    rec["exit_s"] = time.time() - t0
    _kill_group(proc)  # stragglers (e.g. mesh procs) of a launcher that has already exited
    ranks = []
    for r in range(procs):
        p = Path(out, f"rank-{r}.json")
        if p.exists():
            ranks.append(json.loads(p.read_text()))
    shutil.rmtree(out, ignore_errors=True)
    rec["ranks_done"] = len(ranks)
    good = len(ranks) == procs and all(
        x["world_size"] == procs and x["sum"] == float(procs) for x in ranks
    )
    if good:
        rec["latency_s"] = max(x["t_first_allreduce"] for x in ranks) - t0
        starts = [x["t_start"] for x in ranks]
        rec["first_start_s"], rec["last_start_s"] = min(starts) - t0, max(starts) - t0
        rec["skew_s"] = max(starts) - min(starts)
        rec["ok"] = rec.get("returncode") == 0
    if not rec["ok"]:
        rec.setdefault(
            "error",
            f"exit code {rec.get('returncode')}, {len(ranks)}/{procs} ranks completed the all_reduce",
        )
        rec["output_tail"] = (output or b"").decode(errors="replace")[-3000:]
    return rec


def summarize(runs: list[dict], launchers: list[str], procs_list: list[int],
              preinits: list[float] | None = None) -> list[dict]:
    rows = []
    for pre, p in [(pre, p) for pre in (preinits or [0.0]) for p in procs_list]:
        case = [r for r in runs if r.get("preinit_s", 0.0) == pre and r["procs"] == p]
        base = median([r["latency_s"] for r in case if r["launcher"] == "torchrun" and r["ok"]])
        for l in launchers:
            mine = [r for r in case if r["launcher"] == l]
            lat = [r["latency_s"] for r in mine if r["ok"]]
            ex = [r["exit_s"] for r in mine if r["ok"]]
            skew = [r["skew_s"] for r in mine if r["ok"] and r.get("skew_s") is not None]
            med = median(lat)
            rows.append({
                "launcher": l,
                "procs": p,
                "preinit_s": pre,
                "median_skew_s": median(skew),
                "max_skew_s": max(skew) if skew else None,
                "median_last_start_s": median([r["last_start_s"] for r in mine if r["ok"] and "last_start_s" in r]),
                "reps": len(mine),
                "ok": len(lat),
                "median_s": med,
                "min_s": min(lat) if lat else None,
                "max_s": max(lat) if lat else None,
                "median_exit_s": median(ex),
                "ratio_vs_torchrun": (med / base) if (med is not None and base) else None,
                "samples_s": lat,
                "errors": [r.get("error") for r in mine if not r["ok"]],
            })
    return rows


def render(result: dict) -> str:
    m = result["machine"]
    head = (
        f"Launch overhead: launcher start -> last rank's first gloo all_reduce, median of "
        f"{result['params']['reps']} (os.cpu_count() = {m['cpus']}: procs share {m['cpus']} cores)\n"
        f"{machine_line(m)}\n"
    )
    rows = [
        [f"{r.get('preinit_s', 0.0):g}", r["procs"], r["launcher"], f"{r['ok']}/{r['reps']}", r["median_s"],
         r["min_s"], r["max_s"], r["median_exit_s"], r.get("median_last_start_s"), r.get("median_skew_s"),
         r.get("max_skew_s"), None if r["ratio_vs_torchrun"] is None else f"{r['ratio_vs_torchrun']:.2f}x"]
        for r in result["results"]
    ]
    return head + table(
        ["pre-init s", "P", "launcher", "ok", "median s", "min s", "max s", "exit s", "last start s",
         "skew s", "max skew s", "vs torchrun"], rows
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--launchers", nargs="+", choices=LAUNCHERS, default=list(LAUNCHERS))
    ap.add_argument("--preinit", type=float, nargs="+", default=[0.0, 5.0],
                    help="cases: seconds each rank works before init_process_group (0: none)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per launch")
    ap.add_argument("--json", help="output path (default benchmarks/out/launch_overhead.json)")
    args = ap.parse_args(argv)
    if "torchrun" not in args.launchers:
        args.launchers.append("torchrun")  # the baseline every ratio needs

    runs: list[dict] = []
    triples = [(pre, p, l) for pre in args.preinit for p in args.procs for l in args.launchers]
    for rep in range(args.reps):
        k = rep * max(1, len(triples) // args.reps) % len(triples)
        for pre, p, l in triples[k:] + triples[:k]:  # rotate so no launcher always runs first
            rec = run_once(l, p, args.timeout, pre)
            rec["rep"] = rep
            runs.append(rec)
            status = (f"{rec['latency_s']:.2f}s, skew {rec['skew_s']:.2f}s" if rec["ok"]
                      else f"FAILED ({rec.get('error')})")
            print(f"  rep {rep + 1}/{args.reps} pre-init {pre:g}s P={p} {l}: {status}", file=sys.stderr, flush=True)

    result = {
        "benchmark": "launch_overhead",
        "command": " ".join(["python", "-m", "benchmarks.launch_overhead", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "params": {"procs": args.procs, "reps": args.reps, "launchers": args.launchers, "preinit_s": args.preinit,
                   "timeout_s": args.timeout},
        "results": summarize(runs, args.launchers, args.procs, args.preinit),
        "runs": runs,
    }
    path = write_json("launch_overhead", result, args.json)
    print(render(result))
    print(f"\nJSON: {path}")
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
