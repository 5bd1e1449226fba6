"""One rule for finding the cluster, shared by ``monarch-spmd logs``/``status`` and :func:`proc_mesh`.

A kubeconfig (the one named, else $KUBECONFIG or ~/.kube/config) wins; without one, the pod's
service account (in-cluster). The default namespace is the kubeconfig context's, else the service
account's, else ``default``. Needs the ``kubernetes`` client (``pip install 'monarch-spmd[cli]'``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any, Final

SERVICE_ACCOUNT_NAMESPACE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class ConfigError(Exception):
    """No usable configuration; the message says what was tried and what to pass instead."""


def load(kubeconfig: str | None, *, how_to_name: str = "pass --kubeconfig PATH or set KUBECONFIG") -> tuple[Any, str]:
    """Returns ``(ApiClient, default namespace)``; raises :class:`ConfigError`.

    ``how_to_name`` ends the message when no configuration is found (the flag or argument that names one).
    """
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        config.load_kube_config(config_file=kubeconfig)
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        namespace = ((active or {}).get("context") or {}).get("namespace") or "default"
    except (ConfigException, OSError) as err:
        if kubeconfig:
            raise ConfigError(f"cannot load kubeconfig {kubeconfig}: {err}") from None
        try:
            config.load_incluster_config()
        except ConfigException:
            raise ConfigError(f"no Kubernetes configuration ({err}); {how_to_name}") from None
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
                namespace = f.read().strip() or "default"
        except OSError:
            namespace = "default"
    return client.ApiClient(), namespace


def run_command(prog: str, argv: Sequence[str], parse_args: Callable[[Sequence[str]], argparse.Namespace],
                run: Callable[[argparse.Namespace, IO[str], IO[str]], int], error: type[Exception]) -> int:
    """The shared body of the commands that read the cluster: parses ``argv``, runs, and turns
    ``error``, Ctrl-C and a missing client into a message and an exit code."""
    opts = parse_args(argv)
    try:
        return run(opts, sys.stdout, sys.stderr)
    except error as err:
        sys.stderr.write(f"{prog}: error: {err}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except ImportError as err:
        sys.stderr.write(f"{prog}: error: {err.name or err} is not installed; pip install 'monarch-spmd[cli]'\n")
        return 1
