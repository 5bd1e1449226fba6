"""Gang restart latency: one rank fails, how long until every rank runs again.

    python -m benchmarks.gang_restart [--procs 64] [--reps 3] [--kubeconfig PATH]

An SPMDJob of N procs runs on kwok nodes. Each repetition marks one rank's pod Failed with exit
code 1 through the pod status subresource, as a kubelet reports a crashed container, and measures
from just before that write until: the job's status first says Restarting, every pod of the next
attempt exists, every pod of the next attempt is Running, and the job's status says Running again.
The failed rank is different each time. The median over repetitions is reported; JSON goes to
``benchmarks/out/gang_restart.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import secrets
import statistics
import sys
import time
import traceback

from benchmarks import kube
from benchmarks.cluster import SpmdOperator, bench_cluster
from benchmarks.common import machine, machine_line, table, write_json
from benchmarks.operator_scale import CUSTOM, IMAGE, POD_SELECTOR, spmdjob

LABEL_RANK = "spmd.monarch.dev/rank"
LABEL_RESTART = "spmd.monarch.dev/restart"


class JobStatus:
    """Times at which the job's status first showed (phase, restarts)."""

    def __init__(self, pods: kube.PodTimes) -> None:
        self.pods = pods
        self.seen: dict[tuple[str, int], float] = {}
        self.last: dict = {}

    def on_event(self, obj: dict, t: float) -> None:
        st = obj.get("status") or {}
        with self.pods.changed:
            self.last = st
            self.seen.setdefault((st.get("phase"), int(st.get("restarts") or 0)), t)
            self.pods.changed.notify_all()


def attempt_pods(pods: kube.PodTimes, attempt: int) -> list[str]:
    return [n for n, l in pods.labels.items() if l.get(LABEL_RESTART) == str(attempt)]


def fail_pod(client: kube.Kube, ns: str, name: str, code: int = 1) -> None:
    """What a kubelet writes when the only container exits with `code` (restartPolicy Never)."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod = client.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    statuses = []
    for c in pod["spec"]["containers"]:
        statuses.append({
            "name": c["name"], "image": c.get("image", IMAGE), "imageID": "", "ready": False,
            "restartCount": 0, "started": False,
            "state": {"terminated": {"exitCode": code, "reason": "Error", "startedAt": now, "finishedAt": now,
                                     "message": "benchmark: simulated rank failure"}},
        })
    client.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {
        "phase": "Failed",
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": now}],
        "containerStatuses": statuses,
    }})


def run(cluster, n: int, reps: int, timeout: float, log_dir) -> dict:
    admin = cluster.admin
    ns = f"bench-restart-{n}-{secrets.token_hex(3)}"
    admin.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    ctl = SpmdOperator(cluster, log_dir / ns)
    out: dict = {"namespace": ns, "procs": n, "reps": []}
    watchers = []
    try:
        ctl.start()
        pods = kube.PodTimes()
        js = JobStatus(pods)
        g, v, p = CUSTOM["spmdjob"]
        watchers = [
            kube.Watcher(admin, f"/api/v1/namespaces/{ns}/pods", pods.on_event, {"labelSelector": POD_SELECTOR["spmdjob"]}),
            kube.Watcher(admin, f"/apis/{g}/{v}/namespaces/{ns}/{p}", js.on_event),
        ]
        for w in watchers:
            w.start()
            w.ready.wait(30)
        admin.create(f"/apis/{g}/{v}/namespaces/{ns}/{p}", spmdjob(ns, n, max_restarts=reps + 2))

        def all_running(attempt: int) -> bool:
            names = attempt_pods(pods, attempt)
            return len(names) >= n and all(x in pods.running for x in names) and (("Running", attempt) in js.seen)

        if not pods.wait(lambda: all_running(0), time.monotonic() + timeout):
            raise TimeoutError(f"attempt 0 never ran: {len(attempt_pods(pods, 0))}/{n} pods, status {js.last}")
        ranks = secrets.SystemRandom().sample(range(n), k=min(reps, n))
        for rep in range(reps):
            attempt, rank = rep, ranks[rep % len(ranks)]
            with pods.changed:
                victim = next(x for x in attempt_pods(pods, attempt) if pods.labels[x].get(LABEL_RANK) == str(rank))
            t0 = time.time()
            fail_pod(admin, ns, victim)
            nxt = attempt + 1
            deadline = time.monotonic() + timeout
            ok = pods.wait(lambda: all_running(nxt), deadline)
            with pods.changed:
                names = attempt_pods(pods, nxt)
                rec = {
                    "rep": rep, "rank": rank, "pod": victim, "ok": ok,
                    "restarting_s": (js.seen.get(("Restarting", nxt)) or js.seen.get(("Restarting", attempt)) or t0) - t0
                    if (("Restarting", nxt) in js.seen or ("Restarting", attempt) in js.seen) else None,
                    "all_created_s": (max(pods.created[x] for x in names) - t0) if len(names) >= n else None,
                    "all_running_s": (max(pods.running[x] for x in names) - t0) if ok else None,
                    "phase_running_s": (js.seen[("Running", nxt)] - t0) if ("Running", nxt) in js.seen else None,
                }
            if not ok:
                rec["error"] = f"attempt {nxt}: {len(names)}/{n} pods, status {js.last}"
            out["reps"].append(rec)
            print(f"  rep {rep + 1}/{reps}: rank {rank} failed -> all Running again in "
                  f"{rec['all_running_s'] if rec['all_running_s'] is not None else 'TIMEOUT'}", file=sys.stderr, flush=True)
            if not ok:
                break
        out["peak_rss_mib"] = ctl.peak_rss_mib()
    except Exception as e:  # noqa: BLE001 - recorded
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-3000:]
    finally:
        for w in watchers:
            w.stop()
        out["cleanup_s"] = kube.delete_namespace(admin, ns, timeout=max(120.0, n * 0.5), strip=(CUSTOM["spmdjob"],))
        ctl.stop()
    return out


def summarize(out: dict) -> dict:
    ok = [r for r in out["reps"] if r["ok"]]

    def med(key):
        xs = [r[key] for r in ok if r.get(key) is not None]
        return statistics.median(xs) if xs else None

    return {
        "procs": out["procs"], "reps": len(out["reps"]), "ok": len(ok),
        "median_restarting_s": med("restarting_s"), "median_all_created_s": med("all_created_s"),
        "median_all_running_s": med("all_running_s"), "median_phase_running_s": med("phase_running_s"),
        "min_all_running_s": min((r["all_running_s"] for r in ok), default=None),
        "max_all_running_s": max((r["all_running_s"] for r in ok), default=None),
    }


def render(result: dict) -> str:
    m, s = result["machine"], result["summary"]
    head = (f"Gang restart on kwok nodes: N = {s['procs']}, one rank's pod marked Failed (exit 1) -> "
            f"the whole next attempt Running; seconds\n{machine_line(m)}\n")
    rows = [[r["rep"] + 1, r["rank"], r["restarting_s"], r["all_created_s"], r["all_running_s"], r["phase_running_s"]]
            for r in result["runs"]["reps"]]
    rows.append(["median", "", s["median_restarting_s"], s["median_all_created_s"], s["median_all_running_s"],
                 s["median_phase_running_s"]])
    return head + table(["rep", "failed rank", "job Restarting s", "all new pods created s",
                         "all new pods Running s", "job Running s"], rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kubeconfig")
    ap.add_argument("--kwok-nodes", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per attempt")
    ap.add_argument("--state-dir")
    ap.add_argument("--json", help="output path (default benchmarks/out/gang_restart.json)")
    args = ap.parse_args(argv)
    with bench_cluster(args.kubeconfig, args.kwok_nodes, args.state_dir) as cluster:
        out = run(cluster, args.procs, args.reps, args.timeout, cluster.state_dir / "logs")
    result = {
        "benchmark": "gang_restart",
        "command": " ".join(["python", "-m", "benchmarks.gang_restart", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "params": {"procs": args.procs, "reps": args.reps, "timeout_s": args.timeout},
        "summary": summarize(out),
        "runs": out,
    }
    path = write_json("gang_restart", result, args.json)
    print(render(result))
    if out.get("error"):
        print(f"\nERROR: {out['error']}")
    print(f"\nJSON: {path}")
    return 0 if not out.get("error") and result["summary"]["ok"] == args.reps else 1


if __name__ == "__main__":
    raise SystemExit(main())
