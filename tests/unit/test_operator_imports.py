"""The operator's entry point (``main``, as ``python -m spmd_operator`` runs it) uses no client
library: it speaks plain JSON over aiohttp with the credentials of its own kopf login handler,
registered in a plain kopf registry (kopf's default one would offer the client libraries' logins
as fallbacks). Its image installs none (test_images.py); where one is installed (this test's
environment has the CLI's), only kopf's optional type support imports it. What it loads logs in
from a kubeconfig, including one whose user runs an exec credential plugin (a process of its own,
running the operator against a server that is not there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent("""
    import asyncio, os, sys, threading, time
    from spmd_operator import __main__ as entry

    def report():  # once the operator runs (it keeps retrying a server that is not there)
        try:
            check()
        except BaseException as e:
            print("report failed:", repr(e), flush=True)
        os._exit(0)

    def check():
        time.sleep(float(sys.argv[1]))
        from spmd_operator import kube
        import kopf
        from spmd_operator import handlers
        assert kopf.get_default_registry() is handlers.REGISTRY
        logins = sorted(str(h.id) for h in handlers.REGISTRY._activities.get_all_handlers()
                        if h.activity.value == "authentication")
        info = kube.login()
        print(",".join(logins), info.server, info.token, flush=True)

    threading.Thread(target=report, daemon=True).start()
    entry.main(["--all-namespaces", "--no-leader-election", "--metrics-port", "0", "--liveness", ""])
""")

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""

PLUGIN = ("import json, os; print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
          "'kind': 'ExecCredential', 'status': {'token': os.environ['TOKEN_FROM'] + '-token', "
          "'expirationTimestamp': '2099-01-01T00:00:00Z'}}))")


def exec_kubeconfig() -> str:
    """A kubeconfig whose user runs a credential plugin (JSON is YAML)."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": ["-c", PLUGIN],
            "env": [{"name": "TOKEN_FROM", "value": "plugin"}]}}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    })


def run_operator(config: Path) -> list[str]:
    env = {**os.environ, "KUBECONFIG": str(config)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    out = subprocess.run([sys.executable, "-c", PROGRAM, "3"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_operator_logs_in_with_its_own_handler_only(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    logins, server, token = run_operator(config)
    assert logins == "login", f"login handlers: {logins} (a client library's login would be a fallback)"
    assert (server, token) == ("https://127.0.0.1:9", "abc")


def test_an_exec_credential_plugin_is_run_for_a_token(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(exec_kubeconfig())
    _, server, token = run_operator(config)
    assert (server, token) == ("https://127.0.0.1:9", "plugin-token")


def test_in_a_pod_the_server_is_the_address_the_kubelet_gives(tmp_path: Path, monkeypatch) -> None:
    """kopf's service-account login names https://kubernetes.default.svc, which needs cluster DNS;
    client-go uses KUBERNETES_SERVICE_HOST/PORT, and so does the operator."""
    import kopf

    from spmd_operator import kube

    monkeypatch.setattr(kopf, "login_with_service_account",
                        lambda settings: kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert kube.login().server == "https://10.0.0.1:443"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert kube.login().server == "https://[fd00::1]:443"
