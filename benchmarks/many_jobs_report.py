"""The many-jobs benchmark's results: one row per load and actor, issue 23's targets met or
missed, and the tables ``python -m benchmarks.many_jobs`` prints (``benchmarks.report`` too).

Where it sits: above nothing but ``benchmarks.common``; ``benchmarks.many_jobs`` calls it with
the runs it recorded, ``benchmarks.report`` with the JSON they were written to.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import machine_line, table

#: The control plane's processes, in the order the cores table shows them.
PLANE = ("kube-apiserver", "etcd", "kube-scheduler", "kwok", "kube-controller-manager")
#: How many of the API server's busiest (verb, resource) entries of a start-up the report names.
STARTUP_TOP = 12


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (scenario, actor) of the load runs, with ratios to the floor of the same
    scenario (all jobs Running against the floor's)."""
    rows = []
    floors = {r["scenario"]: r for r in runs if r["actor"] == "floor" and r["scenario"] != "fairness"}
    for r in runs:
        if r["scenario"] == "fairness":
            continue
        idle = r.get("idle") or {}
        rss = r.get("rss_mib") or {}
        row = {k: r.get(k) for k in ("scenario", "actor", "jobs", "pods", "ok", "error", "created_s",
                                     "pods_running_s", "jobs_running_s", "job_running_p50_s", "job_running_p90_s",
                                     "rss_after_vs_start", "job_controller_counted", "recycles", "floor_services")}
        base = floors.get(r["scenario"], {}).get("jobs_running_s")
        row["jobs_running_vs_floor"] = (r["jobs_running_s"] / base) if (r.get("jobs_running_s") and base) else None
        reqs = r.get("requests") or {}
        row["start_requests"] = (reqs.get("start") or {}).get("total")
        row["delete_requests"] = (reqs.get("delete") or {}).get("total")
        row["idle_s"] = idle.get("seconds")
        row["idle_requests"] = idle.get("requests")
        row["idle_writes"] = idle.get("writes")
        row["idle_per_job_per_10min"] = idle.get("per_job_per_10min")
        row["idle_by_verb"] = (reqs.get("idle") or {}).get("by_verb")
        row["idle_cpu_percent"] = idle.get("cpu_percent")
        row["rss_start_mib"], row["rss_peak_mib"] = rss.get("start"), rss.get("peak")
        row["rss_idle_mib"], row["rss_after_delete_mib"] = rss.get("idle_end"), rss.get("after_delete")
        row["processes"] = r.get("processes")
        row["children_gone_s"] = (r.get("delete") or {}).get("children_gone_s")
        row["startup_cores"] = r.get("startup_cores")
        row["startup_apiserver_top"] = r.get("startup_apiserver_top")
        rows.append(row)
    return rows


def _find(rows: list[dict], scenario: str, actor: str) -> dict:
    return next((r for r in rows if r["scenario"] == scenario and r["actor"] == actor and r["ok"]), {})


def _verdict(value, limit, *, below: bool = True) -> bool | None:
    if value is None or limit is None:
        return None
    return value <= limit if below else value >= limit


def targets(result: dict) -> list[dict]:
    """Issue 23's targets, each ``{"target", "measured", "met"}`` (met None: not measured)."""
    rows, fair = result["results"], {r["actor"]: r for r in result.get("fairness", []) if r.get("ok")}
    out: list[dict] = []

    def add(target: str, measured: str | None, met: bool | None) -> None:
        out.append({"target": target, "measured": measured or "not measured", "met": met})

    for scenario in ("many", "mixed"):
        spmd = _find(rows, scenario, "spmdjob")
        if not spmd:
            continue
        what = f"{spmd['jobs']:,} jobs ({spmd['pods']:,} pods)"
        ratio = spmd.get("jobs_running_vs_floor")
        floor = _find(rows, scenario, "floor").get("jobs_running_s")
        add(f"{what}: all Running <= 1.1x the floor",
            None if ratio is None else f"{ratio:.2f}x ({spmd['jobs_running_s']:.1f} s against {floor:.1f} s)",
            _verdict(ratio, 1.1))
        peers = {a: _find(rows, scenario, a).get("jobs_running_s") for a in ("pytorchjob", "jobset")}
        if all(v is not None for v in peers.values()):
            add(f"{what}: all Running ahead of both peers",
                f"{spmd['jobs_running_s']:.1f} s against PyTorchJob {peers['pytorchjob']:.1f} s, JobSet {peers['jobset']:.1f} s",
                spmd["jobs_running_s"] < min(peers.values()))
        else:
            add(f"{what}: all Running ahead of both peers", None, None)
        if spmd.get("idle_per_job_per_10min") is not None:
            add(f"{what}: idle API requests <= 1 per job per 10 min",
                f"{spmd['idle_per_job_per_10min']:.2f} ({spmd['idle_requests']:,} in {spmd['idle_s']:.0f} s)",
                spmd["idle_per_job_per_10min"] <= 1.0)
            add(f"{what}: idle writes 0", f"{spmd['idle_writes']}", spmd["idle_writes"] == 0)
        ptj = _find(rows, scenario, "pytorchjob")
        add(f"{what}: peak RSS <= the PyTorchJob controller's",
            None if not ptj else f"{spmd['rss_peak_mib']:.0f} MiB against {ptj['rss_peak_mib']:.0f} MiB",
            None if not ptj else spmd["rss_peak_mib"] <= ptj["rss_peak_mib"])
        if spmd.get("rss_after_vs_start") is not None:
            add(f"{what}: RSS after the deletion within 10% of the start",
                f"{spmd['rss_after_delete_mib']:.0f} MiB against {spmd['rss_start_mib']:.0f} MiB "
                f"({spmd['rss_after_vs_start']:.2f}x)", spmd["rss_after_vs_start"] <= 1.1)
    scale = result.get("scale")
    if scale:
        add("one 4,096-proc job: pods created <= 1.2x the floor (operator_scale)",
            f"{scale['created_vs_floor']:.2f}x ({scale['created_s']:.2f} s against {scale['floor_created_s']:.2f} s)",
            scale["created_vs_floor"] <= 1.2)
    if "spmdjob" in fair and "floor" in fair:
        s, f = fair["spmdjob"], fair["floor"]
        ratio = s["large"]["created_s"] / f["large"]["created_s"]
        add(f"one {s['large_procs']:,}-proc job: pods created <= 1.2x the floor (fairness run)",
            f"{ratio:.2f}x ({s['large']['created_s']:.2f} s against {f['large']['created_s']:.2f} s)", ratio <= 1.2)
    if "spmdjob" in fair:
        s = fair["spmdjob"]
        add(f"fairness: a {s['small_procs']}-proc job {s['delay_s']:g} s after a {s['large_procs']:,}-proc one: "
            "its pods created <= 2 s later than alone",
            f"{s['created_delay_s']:+.2f} s ({s['small']['created_s']:.2f} s against {s['small_alone']['created_s']:.2f} s)",
            s["created_delay_s"] <= 2.0)
        if "floor" in fair:
            extra = s["running_delay_s"] - fair["floor"]["running_delay_s"]
            add("fairness: its Running delayed <= 2 s more than the floor's (the scheduler's share)",
                f"{extra:+.2f} s (delayed {s['running_delay_s']:.2f} s; the floor's {fair['floor']['running_delay_s']:.2f} s)",
                extra <= 2.0)
    return out


def scale_target(path: str | Path) -> dict | None:
    """The SPMDJob's pods-created time against the floor's at the largest N of an
    ``operator_scale`` JSON (its own run: the re-run at 4,096 the targets table quotes)."""
    data = json.loads(Path(path).read_text())
    rows = [r for r in data["results"] if r["actor"] == "spmdjob" and r.get("created_vs_floor")]
    if not rows:
        return None
    row = max(rows, key=lambda r: r["procs"])
    floor = next(r for r in data["results"] if r["actor"] == "floor" and r["procs"] == row["procs"])
    return {"procs": row["procs"], "created_s": row["created_s"], "floor_created_s": floor["created_s"],
            "created_vs_floor": row["created_vs_floor"], "command": data.get("command"),
            "commit": (data.get("machine") or {}).get("commit")}


def _s(v, digits: int = 2) -> str | None:
    return None if v is None else f"{v:.{digits}f}"


def _rss(row: dict, key: str) -> str | None:
    """RSS of the actor; JobSet's as manager + Job controller when that ran apart."""
    procs = row.get("processes") or {}
    if row.get("actor") == "jobset" and "job-controller" in procs:
        per = {"rss_start_mib": "rss_start_mib", "rss_peak_mib": "peak_mib", "rss_idle_mib": "rss_idle_mib",
               "rss_after_delete_mib": "rss_after_delete_mib"}[key]
        vals = [procs[n].get(per) for n in procs]
        return None if None in vals else " + ".join(f"{v:.0f}" for v in vals)
    return None if row.get(key) is None else f"{row[key]:.0f}"


def render(result: dict) -> str:
    p = result["params"]
    op = result.get("operator") or {}
    dirty = " plus uncommitted changes" if op.get("uncommitted_changes") else ""
    setting = [f"{k}={v}" for k, v in (op.get("env") or {}).items()] + list(op.get("flags") or [])
    flags = f" with {' '.join(setting)}" if setting else ""
    head = (f"Many jobs on kwok nodes: seconds from the first submission (ratio to the floor's all jobs Running); "
            f"requests counted by the API server\n{machine_line(result['machine'])}; "
            f"operator at {op.get('commit')}{dirty}{flags}\n")
    rows = result["results"]
    start_rows, idle_rows = [], []
    for r in rows:
        what = f"{r['scenario']}: {r['jobs']} jobs, {r['pods']} pods"
        ratio = r.get("jobs_running_vs_floor")
        start_rows.append([
            what, r["actor"] + (" + Services" if r.get("floor_services") else ""), _s(r.get("created_s")),
            _s(r.get("pods_running_s")),
            None if r.get("jobs_running_s") is None else (
                f"{r['jobs_running_s']:.2f}" + (f" ({ratio:.2f}x)" if ratio is not None and r["actor"] != "floor" else "")),
            _s(r.get("job_running_p50_s")), r.get("start_requests"), _s(r.get("children_gone_s")),
            r.get("delete_requests"), "ok" if r["ok"] else f"FAILED: {(r.get('error') or '')[:80]}",
        ])
        if r["actor"] != "floor" and r.get("idle_s") is not None:
            verbs = r.get("idle_by_verb") or {}
            others = sum(v for k, v in verbs.items() if k not in ("get", "list", "watch"))
            after = _rss(r, "rss_after_delete_mib")
            if after is not None and r.get("rss_after_vs_start") is not None:
                after += f" ({r['rss_after_vs_start']:.2f}x)"
            if r.get("recycles"):
                after += f", started afresh {r['recycles']:.0f}x"
            idle_rows.append([
                what, r["actor"], f"{r['idle_s']:.0f}", r.get("idle_requests"), _s(r.get("idle_per_job_per_10min")),
                verbs.get("get", 0), verbs.get("list", 0), verbs.get("watch", 0), others, r.get("idle_writes"),
                _s(r.get("idle_cpu_percent"), 1), _rss(r, "rss_start_mib"), _rss(r, "rss_peak_mib"),
                _rss(r, "rss_idle_mib"), after,
            ])
    out = [head]
    if start_rows:
        out.append("Start-up and deletion (requests: the actor's, start-up = submission to all jobs Running; "
                   "children gone: from the first deletion)")
        out.append(table(["load", "actor", "all pods created s", "all pods Running s", "all jobs Running s",
                          "job Running median s", "start-up requests", "all children gone s", "deletion requests",
                          "ok"], start_rows))
    if idle_rows:
        out.append("\nIdle with every job Running (requests by verb as the API server counted them; CPU and "
                   "resident memory of the controller's processes, MiB)")
        out.append(table(["load", "actor", "idle s", "requests", "per job per 10 min", "GET", "LIST", "WATCH",
                          "other", "writes", "CPU %", "RSS start", "RSS peak", "RSS idle", "RSS after deletion"],
                         idle_rows))
    cores = [r for r in rows if r.get("startup_cores")]
    if cores:
        out.append("\nCores used from the first submission to all jobs Running, by process (CPU seconds over "
                   f"wall seconds; the machine has {result['machine'].get('cpus')})")
        out.append(table(["load", "actor", *PLANE, "controller", "all"], [
            [f"{r['scenario']}: {r['jobs']} jobs, {r['pods']} pods", r["actor"],
             *(_s(r["startup_cores"].get(name)) for name in (*PLANE, "controller")),
             _s(sum(r["startup_cores"].values()))] for r in cores]))
    busiest = [r for r in rows if r.get("startup_apiserver_top")]
    if busiest:
        out.append("\nThe API server's busiest requests during the start-up, every client (verb resource: count, "
                   "per job)")
        for r in busiest:
            entries = ", ".join(f"{k}: {v} ({v / r['jobs']:.1f})" for k, v in r["startup_apiserver_top"][:STARTUP_TOP])
            out.append(f"{r['scenario']} {r['actor']}: {entries}")
    fair = result.get("fairness") or []
    if fair:
        frows = []
        for f in fair:
            if not f.get("ok"):
                frows.append([f["actor"], None, None, None, None, None, None, None, f"FAILED: {(f.get('error') or '')[:80]}"])
                continue
            a, s, big = f["small_alone"], f["small"], f["large"]
            frows.append([f["actor"], f"{_s(a['created_s'])} / {_s(a['running_s'])}",
                          f"{_s(s['first_pod_s'])} / {_s(s['created_s'])} / {_s(s['running_s'])}",
                          f"{f['created_delay_s']:+.2f}", f"{f['running_delay_s']:+.2f}",
                          _s(big["created_s"]), _s(big["pods_running_s"]), _s(big["running_s"]), "ok"])
        f0 = fair[0]
        out.append(f"\nFairness: a {f0['small_procs']}-proc job submitted {f0['delay_s']:g} s after a {f0['large_procs']}-proc one "
                   "(seconds from its own submission), against the same job alone")
        out.append(table(["actor", "alone: pods created / Running s", "after the large job: first pod / created / Running s",
                          "created later by s", "Running later by s", "large: pods created s", "large: pods Running s",
                          "large: job Running s", "ok"], frows))
    tgt = result.get("targets") or []
    if tgt:
        out.append("\nTargets (issue 23)")
        out.append(table(["target", "measured", ""],
                         [[t["target"], t["measured"], {True: "met", False: "missed", None: "-"}[t["met"]]] for t in tgt]))
    notes = []
    if any(r["actor"] == "jobset" for r in rows):
        if any(r["actor"] == "jobset" and r.get("job_controller_counted") is False for r in rows):
            notes.append("jobset: the JobSet manager alone (the cluster's own Job controller made the pods, uncounted)")
        else:
            notes.append("jobset: requests of the JobSet manager and its Job controller together; RSS manager + Job controller")
    trouble = [f"{r.get('scenario')} {r['actor']}" for r in result.get("runs", []) + result.get("fairness", [])
               if (r.get("watch") or {}).get("relists") or (r.get("watch") or {}).get("broken")]
    if trouble:
        notes.append("the benchmark's own watch broke or listed again in: " + ", ".join(trouble)
                     + " (what changed meanwhile is timed when it was seen again)")
    loads = [x["load1"] for r in result.get("runs", []) for x in r.get("samples") or [] if x.get("load1") is not None]
    if loads:
        notes.append(f"load average (1 min) while the trials ran: {min(loads):.1f} to {max(loads):.1f} "
                     f"on {result['machine'].get('cpus')} CPUs")
    if p.get("settle_s"):
        notes.append(f"idle starts {p['settle_s']:g} s after all jobs are Running")
    return "\n".join(out) + "".join(f"\n{n}" for n in notes)
