"""Command line of the SPMDJob operator: ``python -m spmd_operator [--namespace NS ...] [--all-namespaces]``.

Where it sits: the top of ``spmd_operator``; it only parses flags and starts kopf with the
handlers of :mod:`spmd_operator.handlers`. The Helm chart's Deployment, the operator image and the
end-to-end tests all start the operator with this one command. Equivalent kopf invocation::

    kopf run -m spmd_operator.handlers --standalone -A --liveness=http://0.0.0.0:8080/healthz

(under ``kopf run`` there is no leader election and no metrics server: use this command for
more than one replica.)

Credentials come from the usual places, found by kopf: the in-cluster service account, or the
kubeconfig named by $KUBECONFIG (default ~/.kube/config) and its current context.
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
        help="how often each job re-reads itself and its children from the API server (default 60)",
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


def _load_async_client_without_models() -> None:
    """Loads the parts of ``kubernetes_asyncio`` the operator and kopf's login use (its
    Configuration, ApiClient, REST client and config loaders) without the package's ``__init__``
    files, which import every API class and all 768 object models (about 35 MiB the operator never
    uses: it sends and reads raw JSON). Falls back to the plain import if the package's layout is
    not the one expected.
    """
    import importlib
    import importlib.util
    import types

    if "kubernetes_asyncio" in sys.modules:
        return
    spec = importlib.util.find_spec("kubernetes_asyncio")
    if spec is None or not spec.submodule_search_locations:
        return
    root = list(spec.submodule_search_locations)[0]
    before = set(sys.modules)

    def package(name: str, path: str) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__path__ = [path]
        module.__spec__ = importlib.util.spec_from_loader(name, loader=None, is_package=True)
        module.__spec__.submodule_search_locations = [path]
        sys.modules[name] = module
        return module

    try:
        top = package("kubernetes_asyncio", root)
        client = package("kubernetes_asyncio.client", os.path.join(root, "client"))
        top.client = client  # type: ignore[attr-defined]
        client.models = package("kubernetes_asyncio.client.models", os.path.join(root, "client", "models"))  # type: ignore[attr-defined]
        for sub in ("exceptions", "configuration", "rest", "api_client"):
            setattr(client, sub, importlib.import_module(f"kubernetes_asyncio.client.{sub}"))
        client.Configuration = client.configuration.Configuration  # type: ignore[attr-defined]
        client.ApiClient = client.api_client.ApiClient  # type: ignore[attr-defined]
        client.ApiException = client.exceptions.ApiException  # type: ignore[attr-defined]
        top.config = importlib.import_module("kubernetes_asyncio.config")  # type: ignore[attr-defined]
    except Exception:  # another layout: forget the partial load and import the package whole
        for name in set(sys.modules) - before:
            del sys.modules[name]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the operator until it is stopped (SIGTERM/SIGINT); returns the exit code."""
    _load_async_client_without_models()  # first: parse_args already imports the client (leader)
    args = parse_args(argv)
    # kopf recognises the objects of three client libraries when they are installed, and imports
    # them whole to do so (the synchronous `kubernetes` client alone is 30 MiB and a second of
    # start-up). The operator passes none of their objects to kopf: keep kopf from loading them.
    for unused in ("kubernetes", "pykube"):
        sys.modules.setdefault(unused, None)  # type: ignore[arg-type]
    import kopf

    from . import handlers  # noqa: F401  (registers the handlers)
    from .controller import DEFAULT_RESYNC_SECONDS
    from .kube import DEFAULT_CONCURRENCY
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
        metrics_port=DEFAULT_PORT if args.metrics_port is None else args.metrics_port,
        leader_election=election,
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
