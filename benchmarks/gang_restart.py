"""Gang restart latency: one rank fails, how long until every rank runs again.

    python -m benchmarks.gang_restart [--procs 1024] [--reps 3]
        [--policies Failed TerminatingOrFailed] [--kubeconfig PATH]

An SPMDJob of N procs runs on kwok nodes, one job per ``restartPolicy.podReplacementPolicy``
(``Failed``, the default: the next attempt's pods are created once every pod of the failed one is
gone; ``TerminatingOrFailed``: at once), each in its own namespace with a fresh operator. Each
repetition marks one rank's pod Failed with exit code 1 through the pod status subresource, as a
kubelet reports a crashed container, and measures from just before that write until: the job's
status first says Restarting, the last pod of the failed attempt is gone (its DELETED event), every
pod of the next attempt exists, every pod of the next attempt is Running, and the job's status
says Running again. The failed rank is different each time. Medians over repetitions are
reported per policy; JSON goes to ``benchmarks/out/gang_restart.json``.
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
from benchmarks.cluster import KWOK_PODS_PER_NODE, SpmdOperator, bench_cluster
from benchmarks.common import machine, machine_line, table, write_json
from benchmarks.operator_scale import CUSTOM, IMAGE, POD_SELECTOR, spmdjob

LABEL_RANK = "spmd.monarch.dev/rank"
LABEL_RESTART = "spmd.monarch.dev/restart"
POLICIES = ("Failed", "TerminatingOrFailed")


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


def run(cluster, n: int, reps: int, timeout: float, log_dir, policy: str = "Failed") -> dict:
    admin = cluster.admin
    ns = f"bench-restart-{n}-{secrets.token_hex(3)}"
    admin.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    ctl = SpmdOperator(cluster, log_dir / ns)
    out: dict = {"namespace": ns, "procs": n, "policy": policy, "reps": []}
    watchers = []
    try:
        ctl.start()
        pods = kube.PodTimes()
        js = JobStatus(pods)
        g, v, p = CUSTOM["spmdjob"]
        watchers = [
            kube.Watcher(admin, f"/api/v1/namespaces/{ns}/pods", pods.on_event, {"labelSelector": POD_SELECTOR["spmdjob"]},
                         on_deleted=pods.on_deleted),
            kube.Watcher(admin, f"/apis/{g}/{v}/namespaces/{ns}/{p}", js.on_event),
        ]
        for w in watchers:
            w.start()
            w.ready.wait(30)
        body = spmdjob(ns, n, max_restarts=reps + 2)
        body["spec"]["restartPolicy"]["podReplacementPolicy"] = policy
        admin.create(f"/apis/{g}/{v}/namespaces/{ns}/{p}", body)

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
            old = attempt_pods(pods, attempt)
            pods.wait(lambda: all(x in pods.deleted for x in old), time.monotonic() + 10.0)
            with pods.changed:
                names = attempt_pods(pods, nxt)
                rec = {
                    "rep": rep, "rank": rank, "pod": victim, "ok": ok,
                    "old_gone_s": (max(pods.deleted[x] for x in old) - t0) if all(x in pods.deleted for x in old) else None,
                    "first_created_s": (min(pods.created[x] for x in names) - t0) if names else None,
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
        "procs": out["procs"], "policy": out.get("policy", "Failed"), "reps": len(out["reps"]), "ok": len(ok),
        "median_restarting_s": med("restarting_s"), "median_old_gone_s": med("old_gone_s"),
        "median_first_created_s": med("first_created_s"), "median_all_created_s": med("all_created_s"),
        "median_all_running_s": med("all_running_s"), "median_phase_running_s": med("phase_running_s"),
        "min_all_running_s": min((r["all_running_s"] for r in ok), default=None),
        "max_all_running_s": max((r["all_running_s"] for r in ok), default=None),
    }


def _runs(result: dict) -> list[dict]:
    """Each policy's run (older results hold one run, of the Failed policy)."""
    runs = result["runs"]
    return runs if isinstance(runs, list) else [runs]


def _summaries(result: dict) -> list[dict]:
    s = result["summary"]
    return s if isinstance(s, list) else [s]


def render(result: dict) -> str:
    m = result["machine"]
    sums = _summaries(result)
    n = sums[0]["procs"] if sums else "?"
    head = (f"Gang restart on kwok nodes: N = {n}, one rank's pod marked Failed (exit 1) -> "
            f"the whole next attempt Running; seconds\n{machine_line(m)}\n")
    rows = []
    for run, s in zip(_runs(result), sums):
        policy = s.get("policy", "Failed")
        for r in run["reps"]:
            rows.append([policy, r["rep"] + 1, r["rank"], r["restarting_s"], r.get("old_gone_s"),
                         r.get("first_created_s"), r["all_created_s"], r["all_running_s"], r["phase_running_s"]])
        rows.append([policy, "median", "", s["median_restarting_s"], s.get("median_old_gone_s"),
                     s.get("median_first_created_s"), s["median_all_created_s"], s["median_all_running_s"],
                     s["median_phase_running_s"]])
    out = head + table(["podReplacementPolicy", "rep", "failed rank", "job Restarting s", "old gang gone s",
                        "first new pod s", "all new pods created s", "all new pods Running s", "job Running s"], rows)
    by = {s.get("policy", "Failed"): s for s in sums}
    a, b = by.get("Failed"), by.get("TerminatingOrFailed")
    if a and b and a.get("median_all_running_s") and b.get("median_all_running_s"):
        out += (f"\nthe wait for the old gang (Failed vs TerminatingOrFailed, medians): "
                f"{a['median_all_running_s'] - b['median_all_running_s']:+.2f} s to all Running, "
                f"{a['median_phase_running_s'] - b['median_phase_running_s']:+.2f} s to job Running")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES),
                    help="spec.restartPolicy.podReplacementPolicy values, one job each")
    ap.add_argument("--kubeconfig")
    ap.add_argument("--kwok-nodes", type=int, default=None,
                    help=f"kwok nodes of {KWOK_PODS_PER_NODE} pods (default: room for two gangs, at least 2)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per attempt")
    ap.add_argument("--state-dir")
    ap.add_argument("--json", help="output path (default benchmarks/out/gang_restart.json)")
    args = ap.parse_args(argv)
    if args.kwok_nodes is None:
        args.kwok_nodes = max(2, -(-2 * args.procs // KWOK_PODS_PER_NODE) + 1)
    outs = []
    with bench_cluster(args.kubeconfig, args.kwok_nodes, args.state_dir) as cluster:
        for policy in args.policies:
            outs.append(run(cluster, args.procs, args.reps, args.timeout, cluster.state_dir / "logs", policy))
    result = {
        "benchmark": "gang_restart",
        "command": " ".join(["python", "-m", "benchmarks.gang_restart", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "params": {"procs": args.procs, "reps": args.reps, "policies": args.policies, "timeout_s": args.timeout,
                   "kwok_nodes": args.kwok_nodes},
        "summary": [summarize(o) for o in outs],
        "runs": outs,
    }
    path = write_json("gang_restart", result, args.json)
    print(render(result))
    for o in outs:
        if o.get("error"):
            print(f"\nERROR ({o['policy']}): {o['error']}")
    print(f"\nJSON: {path}")
    return 0 if all(not o.get("error") and summarize(o)["ok"] == args.reps for o in outs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
