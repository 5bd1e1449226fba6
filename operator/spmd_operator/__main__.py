"""Command line of the SPMDJob operator: ``python -m spmd_operator [--namespace NS ...] [--all-namespaces]``.

Where it sits: the top of ``spmd_operator``; it only parses flags and starts kopf with the
handlers of :mod:`spmd_operator.handlers`. The Helm chart's Deployment, the operator image and the
end-to-end tests all start the operator with this one command. Equivalent kopf invocation::

    kopf run -m spmd_operator.handlers --standalone -A --liveness=http://0.0.0.0:8080/healthz

(under ``kopf run`` there is no leader election and no metrics server: use this command for
more than one replica.)

Credentials come from the usual places, found by kopf's login (:func:`spmd_operator.kube.login`):
the in-cluster service account, or the kubeconfig named by $KUBECONFIG (default ~/.kube/config)
and its current context (tokens, client certificates, basic auth, exec credential plugins).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line (see ``python -m spmd_operator --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m spmd_operator",
        description="Run the SPMDJob operator.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], metavar="NS",
        help="watch this namespace (repeatable; glob patterns allowed, e.g. 'team-*')",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument(
        "--liveness", default=DEFAULT_LIVENESS, metavar="URL",
        help=f"health endpoint for liveness/readiness probes (default {DEFAULT_LIVENESS}; '' disables it)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=None, metavar="N",
        help="API requests in flight at once when creating or deleting pods (default 48)",
    )
    parser.add_argument(
        "--resync-seconds", type=float, default=None, metavar="S",
        help="how often each job runs a pass from the informers' caches, without API requests (default 60)",
    )
    parser.add_argument(
        "--check-seconds", type=float, default=None, metavar="S",
        help="how often each job GETs its own object from the API server (default 1800; each check at a random "
             "point of the second half of the period)",
    )
    parser.add_argument(
        "--payload-grace-seconds", type=float, default=None, metavar="S",
        help="how long a namespace's payload ConfigMap (the worker every pod mounts) outlives the last "
             "unfinished job there before the operator deletes it (default 300)",
    )
    parser.add_argument(
        "--memory-recycle-factor", type=float, default=None, metavar="F",
        help="start the operator afresh in its own process (exec, same pid; running jobs are not touched) once its "
             "resident memory is F times what it was at its start, at least --memory-recycle-min-mib over it, and at "
             "most a quarter of the jobs it held at its peak are left: gives back what a burst of jobs left "
             "fragmented (default 1.5; 0 turns it off)",
    )
    parser.add_argument(
        "--memory-recycle-min-mib", type=int, default=None, metavar="MIB",
        help="the least excess over the start, in MiB, for --memory-recycle-factor (default 32; 0: none)",
    )
    parser.add_argument(
        "--network-policy", action=argparse.BooleanOptionalAction, default=False,
        help="give every job a NetworkPolicy that lets in only its own pods and this operator (its pods in "
             "$POD_NAMESPACE, selected by --operator-pod-labels) on the agent port: enforced where the network "
             "plugin enforces NetworkPolicy (default off; the chart turns it on)",
    )
    parser.add_argument(
        "--operator-pod-labels", default="", metavar="K=V,...",
        help="labels that select this operator's pods, for --network-policy (default: every pod of its namespace)",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=None, metavar="PORT",
        help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics (default 9090; 0 turns them off)",
    )
    election = parser.add_argument_group("leader election (a coordination.k8s.io Lease; only the leader writes)")
    election.add_argument("--leader-election", action=argparse.BooleanOptionalAction, default=True,
                          help="elect a leader among replicas (default on)")
    election.add_argument("--leader-election-namespace", metavar="NS",
                          help="the Lease's namespace (default: $POD_NAMESPACE, else 'default')")
    election.add_argument("--lease-name", default=None, metavar="NAME", help="the Lease's name (default spmdjob-operator)")
    election.add_argument("--lease-duration", type=float, default=None, metavar="S",
                          help="seconds a Lease lasts without renewal (default 10)")
    election.add_argument("--renew-deadline", type=float, default=None, metavar="S",
                          help="seconds the leader tries to renew before it stops leading (default 7)")
    election.add_argument("--retry-period", type=float, default=None, metavar="S",
                          help="seconds between tries to take or renew the Lease (default 2)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    parser.add_argument("--debug", action="store_true", help="log every API call and event")
    args = parser.parse_args(argv)
    if not args.namespace and not args.all_namespaces:
        own = os.environ.get("POD_NAMESPACE")
        if not own:
            parser.error("give --namespace NS (repeatable) or --all-namespaces")
        args.namespace = [own]
    if args.concurrency is not None and args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if args.resync_seconds is not None and not args.resync_seconds > 0:
        parser.error("--resync-seconds must be greater than 0")
    if args.check_seconds is not None and not args.check_seconds > 0:
        parser.error("--check-seconds must be greater than 0")
    if args.payload_grace_seconds is not None and not args.payload_grace_seconds >= 0:
        parser.error(f"--payload-grace-seconds: {args.payload_grace_seconds} is negative; valid is 0 or more")
    if args.memory_recycle_factor is not None and not args.memory_recycle_factor >= 0:
        parser.error(f"--memory-recycle-factor: {args.memory_recycle_factor} is negative; valid is 0 (off) or more")
    if args.memory_recycle_min_mib is not None and args.memory_recycle_min_mib < 0:
        parser.error(f"--memory-recycle-min-mib: {args.memory_recycle_min_mib} is negative; valid is 0 or more")
    args.operator_labels = {}
    for part in filter(None, (p.strip() for p in args.operator_pod_labels.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            parser.error(f"--operator-pod-labels: {part!r} is not KEY=VALUE; expected e.g. "
                         "app.kubernetes.io/name=monarch-spmd,app.kubernetes.io/instance=spmd")
        args.operator_labels[key.strip()] = value.strip()
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        parser.error(f"--metrics-port: {args.metrics_port} is out of range; valid is 0..65535 (0 turns metrics off)")
    from .leader import DEFAULT_LEASE_NAME, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, Timings

    try:
        args.timings = Timings(args.lease_duration or LEASE_DURATION, args.renew_deadline or RENEW_DEADLINE,
                               args.retry_period or RETRY_PERIOD)
    except ValueError as e:
        parser.error(str(e))
    args.lease_name = args.lease_name or DEFAULT_LEASE_NAME
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the operator until it is stopped (SIGTERM/SIGINT); returns the exit code."""
    args = parse_args(argv)
    import kopf

    from . import handlers  # registers the handlers in its registry
    from .controller import DEFAULT_CHECK_SECONDS, DEFAULT_PAYLOAD_GRACE_SECONDS, DEFAULT_RESYNC_SECONDS
    from .kube import DEFAULT_CONCURRENCY
    from .memory import DEFAULT_FACTOR, DEFAULT_MIN_EXCESS_MIB
    from .metrics import DEFAULT_PORT

    kopf.configure(verbose=args.verbose, debug=args.debug)
    election = None
    if args.leader_election:
        election = {
            "namespace": args.leader_election_namespace or os.environ.get("POD_NAMESPACE") or "default",
            "name": args.lease_name,
            "identity": os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
            "timings": args.timings,
        }
    memo = kopf.Memo(
        concurrency=args.concurrency or DEFAULT_CONCURRENCY,
        namespaces=[] if args.all_namespaces else list(args.namespace),
        resync_seconds=args.resync_seconds or DEFAULT_RESYNC_SECONDS,
        check_seconds=args.check_seconds or DEFAULT_CHECK_SECONDS,
        payload_grace_seconds=(DEFAULT_PAYLOAD_GRACE_SECONDS if args.payload_grace_seconds is None
                               else args.payload_grace_seconds),
        metrics_port=DEFAULT_PORT if args.metrics_port is None else args.metrics_port,
        memory_recycle_factor=DEFAULT_FACTOR if args.memory_recycle_factor is None else args.memory_recycle_factor,
        memory_recycle_min_mib=(DEFAULT_MIN_EXCESS_MIB if args.memory_recycle_min_mib is None
                                else args.memory_recycle_min_mib),
        leader_election=election,
        isolation=(os.environ.get("POD_NAMESPACE") or None, args.operator_labels) if args.network_policy else None,
    )
    kopf.run(
        standalone=True,
        clusterwide=args.all_namespaces,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
        memo=memo,
        registry=handlers.REGISTRY,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
