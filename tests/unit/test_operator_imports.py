"""The operator's entry point (``main``, as ``python -m spmd_operator`` runs it) loads
kubernetes_asyncio without its 768 object models, and what it loads still logs in from a
kubeconfig and builds an API client (a process of its own, running the operator against a
server that is not there)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent("""
    import asyncio, os, sys, threading, time
    from spmd_operator import __main__ as entry

    def report():  # once the operator runs (it keeps retrying a server that is not there)
        time.sleep(float(sys.argv[2]))
        from spmd_operator import kube
        models = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.models.")]
        apis = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.api.")]

        async def login():
            api = await kube.Kube.connect(kubeconfig=os.environ["KUBECONFIG"])
            host = api._api.configuration.host
            await api.close()
            return host

        print(len(models), len(apis), asyncio.run(login()), flush=True)
        os._exit(0)

    threading.Thread(target=report, daemon=True).start()
    entry.main(["--all-namespaces", "--no-leader-election", "--metrics-port", "0"])
""")

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_the_operator_loads_the_client_without_its_models(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    env = {**os.environ, "KUBECONFIG": str(config)}
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(config), "3"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    models, apis, host = out.stdout.split()
    assert (models, apis) == ("0", "0"), "object models or API classes were imported"
    assert host == "https://127.0.0.1:9"
