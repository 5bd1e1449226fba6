"""The operator-scale floor: N pods created directly by a parallel client, no operator.

Run by ``benchmarks.operator_scale`` as its own process (like the operators it is compared with,
so it does not share an interpreter with the benchmark's watchers):

    python -m benchmarks.floor_client --kubeconfig K --namespace NS --count N [--threads 32] [--bodies operator]

It loads, builds every pod body, prints ``ready``, waits for one line on stdin (the start
signal, sent right after the caller took its start timestamp), creates the pods from a thread
pool and prints one JSON line: ``{"created": N, "errors": [...], "submit_s": s, "peak_rss_mib": m}``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import resource
import sys
import time

from benchmarks import kube


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--bodies", choices=("plain", "operator"), default="plain",
                    help="operator: the pods the SPMDJob operator builds for the same job")
    args = ap.parse_args(argv)

    from benchmarks.operator_scale import floor_pod, operator_pod

    client = kube.Kube(args.kubeconfig, pool=args.threads)
    path = f"/api/v1/namespaces/{args.namespace}/pods"
    bodies = [floor_pod(args.namespace, i) if args.bodies == "plain" else operator_pod(args.namespace, i, args.count)
              for i in range(args.count)]
    errors: list[str] = []

    def create(body: dict) -> None:
        try:
            client.create(path, body)
        except Exception as e:  # noqa: BLE001 - reported
            errors.append(f"{body['metadata']['name']}: {e}")

    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.time()
    with cf.ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(create, bodies))
    out = {"created": args.count - len(errors), "errors": errors[:10], "submit_s": time.time() - t0,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print(json.dumps(out), flush=True)
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
