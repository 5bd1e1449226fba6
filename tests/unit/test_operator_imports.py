"""The operator's entry point loads kubernetes_asyncio without its 768 object models, and what it
loads still logs in from a kubeconfig and builds an API client (a process of its own, as the
operator runs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent("""
    import asyncio, sys
    sys.modules["kubernetes"] = None
    from spmd_operator.__main__ import _load_async_client_without_models
    _load_async_client_without_models()
    import kopf  # kopf's own login imports kubernetes_asyncio too
    from spmd_operator import kube
    models = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.models.")]
    apis = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.api.")]

    async def login():
        api = await kube.Kube.connect(kubeconfig=sys.argv[1])
        host = api._api.configuration.host
        await api.close()
        return host

    print(len(models), len(apis), asyncio.run(login()))
""")

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_the_operator_loads_the_client_without_its_models(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(config)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    models, apis, host = out.stdout.split()
    assert (models, apis) == ("0", "0"), "object models or API classes were imported"
    assert host == "https://127.0.0.1:6443"
