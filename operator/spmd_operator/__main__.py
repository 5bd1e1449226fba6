"""Command line of the SPMDJob operator: ``python -m spmd_operator [--namespace NS ...] [--all-namespaces]``.

Where it sits: the top of ``spmd_operator``; it only parses flags and starts kopf with the
handlers of :mod:`spmd_operator.handlers`. The Helm chart's Deployment, the operator image and the
end-to-end tests all start the operator with this one command. Equivalent kopf invocation::

    kopf run -m spmd_operator.handlers --standalone -A --liveness=http://0.0.0.0:8080/healthz

Credentials come from the usual places, found by kopf: the in-cluster service account, or the
kubeconfig named by $KUBECONFIG (default ~/.kube/config) and its current context.
"""

from __future__ import annotations

import argparse
import os
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
        help="how often each job re-reads itself and its children from the API server (default 60)",
    )
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
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the operator until it is stopped (SIGTERM/SIGINT); returns the exit code."""
    args = parse_args(argv)
    import kopf

    from . import handlers  # noqa: F401  (registers the handlers)
    from .controller import DEFAULT_RESYNC_SECONDS
    from .kube import DEFAULT_CONCURRENCY

    kopf.configure(verbose=args.verbose, debug=args.debug)
    memo = kopf.Memo(
        concurrency=args.concurrency or DEFAULT_CONCURRENCY,
        namespaces=[] if args.all_namespaces else list(args.namespace),
        resync_seconds=args.resync_seconds or DEFAULT_RESYNC_SECONDS,
    )
    kopf.run(
        standalone=True,
        clusterwide=args.all_namespaces,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
        memo=memo,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
