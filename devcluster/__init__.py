"""The test cluster: a real Kubernetes control plane on this machine, for tests and for people.

Layers, lowest first: binaries.py (build or find etcd, kube-*, kubectl, kwok, helm),
controlplane.py (etcd + API server + controller-manager + scheduler on loopback, TLS),
podnetwork.py (pod bridge, network namespaces, hosts files as cluster DNS), nodeagent.py (nodes
whose pods run as local processes; podexec.py runs inside each pod), kwoknodes.py (simulated
nodes), localcluster.py (all of it as one object). `python -m devcluster up|down` runs it in
the background; tests/conftest.py's `cluster` fixture runs it for a test session.
"""

from devcluster.kwoknodes import KWOK_TAINT, KWOK_TOLERATION
from devcluster.localcluster import PROCESS_NODE, LocalCluster

__all__ = ["KWOK_TAINT", "KWOK_TOLERATION", "PROCESS_NODE", "LocalCluster"]
