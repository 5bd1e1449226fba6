"""A lost node: SPMDJob (InPlace, RecreatePods) against JobSet and PyTorchJob on a frozen real node.

    python -m benchmarks.node_loss [--runs 3] [--systems inplace,recreatepods,jobset+pytorchjob]
        [--cap 720] [--state-dir DIR] [--json PATH] [--render JSON]

The test cluster of tests/realnode (devcluster: a real control plane and two real kubelet nodes
whose pods run in containers, CoreDNS as cluster DNS), started here as the ``real_cluster``
fixture starts it, with the SPMDJob operator installed by ``helm install`` of the chart as a pod
of one real node (the ``installed_chart`` fixture's values). Root is needed, as for the tests.

Each job is the 2-rank gloo training loop of tests/realnode/test_node_loss.py (TRAIN: an
all_reduce and a line a step, 60 s gloo timeout) on the stock image (Debian's python3-torch), its
two pods spread over the two nodes (preferred pod anti-affinity). Once both ranks train, the node
that does not hold the operator's pod is frozen as that test freezes it
(``devcluster.realnode.RealNodes.freeze``: kubelet, containerd and shims SIGSTOPped, containers
frozen, the pods' bridge down), and two figures are taken from the freeze:

- **running again**: the job's controller reports it running in a new attempt. SPMDJob:
  ``status.phase`` Running with ``status.restarts`` >= 1; JobSet: ``status.restarts`` >= 1 and
  every child Job ready (``replicatedJobsStatus[].ready``); PyTorchJob: a ``Running`` condition
  whose last transition is after the freeze (it left Running and came back);
- **training again**: every rank prints a step line from a new process (a line of attempt >= 1,
  i.e. ``TORCHELASTIC_RESTART_COUNT`` >= 1, or from a container started after the freeze).

The systems (``--systems``: comma-separated groups; the systems of a group joined by ``+`` run
their jobs side by side under the same freeze, which is how the peers' 12-minute caps fit in an
hour; their controllers are separate processes and their pods idle while they wait):

- ``inplace``: SPMDJob, restartPolicy mode InPlace (the default), maxRestarts 0 (as the test);
- ``elastic``: SPMDJob, InPlace, maxRestarts 0, made elastic as torchrun's ``--nnodes 1:2``
  (mesh nodes 2, minSize 1, procs 1, PerHost, elasticWaitSeconds ELASTIC_WAIT, one pod per node):
  rank 1 on the node frozen, the gang goes on with rank 0 alone; "training again" is rank 0
  stepping in the new round (the only rank there is);
- ``recreatepods``: SPMDJob, restartPolicy mode RecreatePods, maxRestarts 1;
- ``jobset``: JobSet v0.12.0 (benchmarks/build-jobset.sh, run by benchmarks.cluster's
  JobSetOperator with its webhooks): one replicated job of 2 single-pod Jobs (backoffLimit 0),
  failurePolicy maxRestarts 1, headless Service with DNS hostnames; RANK the job index,
  MASTER_ADDR the first pod's DNS name (``<jobset>-workers-0-0.<jobset>``), the restart attempt
  as TORCHELASTIC_RESTART_COUNT (all from the downward API, as JobSet users write it);
- ``pytorchjob``: Kubeflow PyTorchJob v1.9.3 (benchmarks/build-pytorchjob.sh, run by
  benchmarks.cluster's PyTorchJobOperator): Master 1 + Worker 1, restartPolicy OnFailure (the
  containers restart in their pods; ExitCode would fail the job, the gloo timeout exits 1). The
  worker's init container (it waits for the master's DNS name) uses the stock image and
  ``getent hosts`` instead of alpine's nslookup: nothing is pulled on these nodes.

A run that has not recovered ``--cap`` seconds after the freeze is recorded as not recovered
(or as Failed, when its controller gave the job up first), with what its controller, Jobs and
pods showed. Runs go round the groups (run 1 of each, then run 2 ...), each row written to the
JSON as it ends, so a run cut short keeps a balanced part (``--render JSON`` prints its report).
After each run the node is thawed, the namespace deleted, and the next run waits for the node to
be Ready and untainted. Every run's timeline (the
lost node's Ready condition and taints, each job's status and pods, on change) is printed after
the table and kept in the JSON (``benchmarks/out/node_loss.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import OUT_DIR, REPO, machine, machine_line, table, write_json
from benchmarks.inplace_cluster import wait_for

DEFAULT_SYSTEMS = "spare,elastic,inplace,recreatepods,jobset+pytorchjob"
SYSTEMS = ("spare", "elastic", "inplace", "recreatepods", "jobset", "pytorchjob")
#: The elastic job's restartPolicy.elasticWaitSeconds (torchrun's last call is 30 s by default).
ELASTIC_WAIT = 5
LABELS = {"spare": "SPMDJob InPlace, a hot spare", "elastic": f"SPMDJob InPlace, elastic 1:2 (shrinks; wait {ELASTIC_WAIT}s)",
          "inplace": "SPMDJob InPlace", "recreatepods": "SPMDJob RecreatePods",
          "jobset": "JobSet v0.12.0", "pytorchjob": "PyTorchJob v1.9.3"}
CAP_SECONDS = 720
START_SECONDS = 300  # a job's both ranks training, from its creation
POLL = 1.0
NAME = "lost"
JOBSET_RJOB = "workers"
STEP = re.compile(r"rank (\d+) attempt (\d+) step \d+ sum")
# The PyTorchJob worker's init container: training-operator's own template with the stock image
# and getent instead of alpine's nslookup (nothing can be pulled on these nodes).
PYTORCH_INIT_TEMPLATE = """\
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits:
      cpu: 100m
      memory: 20Mi
    requests:
      cpu: 50m
      memory: 10Mi
  command: ['sh', '-c', 'err=1;for i in $(seq {{.MaxTries}}); do if getent hosts {{.MasterAddr}}; then err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err']
"""


# --- the jobs -------------------------------------------------------------------------------------


def _spread(labels: dict[str, str]) -> dict[str, Any]:
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": labels}}}]}}


def _script_volume(name: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the ConfigMap with TRAIN, the pod volume, the container mount), as the test mounts it."""
    from tests.realnode.test_node_loss import TRAIN

    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-train"},
          "data": {"train.py": TRAIN}}
    return (cm, {"name": "train", "configMap": {"name": f"{name}-train"}},
            {"name": "train", "mountPath": "/opt/train", "readOnly": True})


def spmd_objects(mode: str) -> list[dict[str, Any]]:
    """The test's SPMDJob (tests/realnode/test_node_loss.py) with restartPolicy.mode `mode`."""
    from tests.realnode.conftest import JOB_LABEL, STOCK_IMAGE, spmdjob
    from tests.realnode.test_node_loss import TRAIN

    policy = {"maxRestarts": 0} if mode == "InPlace" else {"maxRestarts": 1, "mode": mode}
    job, extra = spmdjob(NAME, 2, ["/opt/train/train.py"], STOCK_IMAGE, script=TRAIN,
                         restartPolicy=policy, rendezvousTimeoutSeconds=120)
    job["spec"]["template"]["spec"].update(affinity=_spread({JOB_LABEL: NAME}),
                                           terminationGracePeriodSeconds=5)
    return [*extra, job]


def spare_objects() -> list[dict[str, Any]]:
    """The test's SPMDJob with one hot spare (tests/realnode/test_node_loss.py): the ranks spread
    over the two nodes; the spare goes anywhere (placed_ok moves it beside rank 0)."""
    from tests.realnode.test_node_loss import SPREAD_RANKS

    objects = spmd_objects("InPlace")
    job = objects[-1]
    job["spec"]["spares"] = 1
    job["spec"]["template"]["spec"]["affinity"] = SPREAD_RANKS(NAME)
    return objects


def elastic_objects() -> list[dict[str, Any]]:
    """The test's SPMDJob made elastic, torchrun's --nnodes 1:2 --nproc-per-node 1: mesh nodes 2
    (minSize 1) x procs 1, PerHost, one pod per node (a required anti-affinity), so the pod made in
    place of the lost one waits for the lost node and the gang goes on with rank 0 alone."""
    from tests.realnode.conftest import JOB_LABEL

    objects = spmd_objects("InPlace")
    job = objects[-1]
    job["spec"]["podLayout"] = "PerHost"
    job["spec"]["mesh"] = [{"name": "nodes", "size": 2, "minSize": 1}, {"name": "procs", "size": 1}]
    job["spec"]["restartPolicy"]["elasticWaitSeconds"] = ELASTIC_WAIT
    ranked = {"matchLabels": {JOB_LABEL: NAME}, "matchExpressions": [{"key": "spmd.monarch.dev/rank",
                                                                       "operator": "Exists"}]}
    job["spec"]["template"]["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": ranked}]}}
    return objects


def jobset_objects() -> list[dict[str, Any]]:
    from tests.realnode.conftest import ON_REAL_NODES, STOCK_IMAGE

    cm, volume, mount = _script_volume(NAME)
    label = "metadata.labels['{}']".format

    def env(name: str, value: str | None = None, field: str | None = None) -> dict[str, Any]:
        return {"name": name, "value": value} if field is None else {
            "name": name, "valueFrom": {"fieldRef": {"fieldPath": field}}}

    pod = {**ON_REAL_NODES, "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
           "affinity": _spread({"jobset.sigs.k8s.io/jobset-name": NAME}), "volumes": [volume],
           "containers": [{
               "name": "trainer", "image": STOCK_IMAGE, "imagePullPolicy": "IfNotPresent",
               "command": ["python3", "/opt/train/train.py"], "volumeMounts": [mount],
               "env": [env("MASTER_ADDR", f"{NAME}-{JOBSET_RJOB}-0-0.{NAME}"),
                       env("MASTER_PORT", "29500"), env("WORLD_SIZE", "2"),
                       env("RANK", field=label("jobset.sigs.k8s.io/job-index")),
                       env("TORCHELASTIC_RESTART_COUNT", field=label("jobset.sigs.k8s.io/restart-attempt")),
                       env("PYTHONUNBUFFERED", "1")]}]}
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": NAME},
              "spec": {"network": {"enableDNSHostnames": True}, "failurePolicy": {"maxRestarts": 1},
                       "replicatedJobs": [{"name": JOBSET_RJOB, "replicas": 2, "template": {"spec": {
                           "parallelism": 1, "completions": 1, "backoffLimit": 0,
                           "template": {"spec": pod}}}}]}}
    return [cm, jobset]


def pytorchjob_objects() -> list[dict[str, Any]]:
    from tests.realnode.conftest import ON_REAL_NODES, STOCK_IMAGE

    cm, volume, mount = _script_volume(NAME)

    def replica() -> dict[str, Any]:
        return {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": {
            **ON_REAL_NODES, "terminationGracePeriodSeconds": 5, "volumes": [volume],
            "affinity": _spread({"training.kubeflow.org/job-name": NAME}),
            "containers": [{"name": "pytorch", "image": STOCK_IMAGE, "imagePullPolicy": "IfNotPresent",
                            "command": ["python3", "/opt/train/train.py"], "volumeMounts": [mount],
                            # No restart count reaches a container restarted in its pod: new
                            # processes are told by their container's start time.
                            "env": [{"name": "TORCHELASTIC_RESTART_COUNT", "value": "0"}]}]}}}

    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": NAME},
           "spec": {"pytorchReplicaSpecs": {"Master": replica(), "Worker": replica()}}}
    return [cm, job]


# --- what each controller says --------------------------------------------------------------------


def _true_conditions(status: dict[str, Any]) -> list[str]:
    return [c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"]


def _after(stamp: str | None, wall: float) -> bool:
    """Whether an API timestamp (1 s resolution) is at or after the freeze's second."""
    if not stamp:
        return False
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() >= math.floor(wall)


class System:
    """One job under the freeze: its objects, how its controller says it runs, its ranks' pods."""

    name = ""
    group = version = plural = ""
    container = "trainer"

    def __init__(self, cluster: Any, namespace: str) -> None:
        from kubernetes import client

        self.cluster, self.namespace = cluster, namespace
        api = cluster.api_client()
        self.core, self.custom, self.batch = client.CoreV1Api(api), client.CustomObjectsApi(api), client.BatchV1Api(api)
        self.running_at: float | None = None
        self.training_at: float | None = None
        self.lost_rank: int | None = None
        self.failed_at: float | None = None
        self.timeline: list[tuple[float, str]] = []
        self.last = ""

    def objects(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def selector(self) -> str:
        raise NotImplementedError

    def rank(self, pod: Any) -> int:
        raise NotImplementedError

    def running(self, job: dict[str, Any], wall: float) -> bool:
        raise NotImplementedError

    def describe(self, job: dict[str, Any]) -> str:
        raise NotImplementedError

    def placed_ok(self, pods: list[Any], lost_node: str) -> bool:
        """Whether the pods stand where this system's measurement needs them (any spread will do)."""
        return True

    def failed(self, job: dict[str, Any]) -> bool:
        """Whether the controller gave the job up (a terminal Failed)."""
        return "Failed" in _true_conditions(job.get("status") or {})

    def job(self) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(self.group, self.version, self.namespace,
                                                        self.plural, NAME)

    def pods(self) -> list[Any]:
        return self.core.list_namespaced_pod(self.namespace, label_selector=self.selector()).items

    def started(self, pod: Any) -> str | None:
        for c in pod.status.container_statuses or []:
            if c.name == self.container and c.state and c.state.running:
                return c.state.running.started_at.isoformat()
        return None

    def stepping(self, pod: Any, wall: float | None, skip_node: str | None) -> bool:
        """Whether the pod's current container prints steps (from a new process when `wall`)."""
        if pod.status.phase != "Running" or pod.metadata.deletion_timestamp or pod.spec.node_name == skip_node:
            return False
        started = self.started(pod)
        if started is None:
            return False
        try:
            log = self.core.read_namespaced_pod_log(pod.metadata.name, self.namespace, container=self.container,
                                                    tail_lines=20, _request_timeout=10)
        except Exception:  # noqa: BLE001 - a pod going away, a node not answering: not stepping
            return False
        lines = STEP.findall(log)
        if not lines:
            return False
        return wall is None or int(lines[-1][1]) >= 1 or _after(started, wall)

    def training_ranks(self, pods: list[Any], wall: float | None, skip_node: str | None) -> set[int]:
        return {self.rank(p) for p in pods if self.stepping(p, wall, skip_node)}

    def pod_line(self, pods: list[Any]) -> str:
        out = []
        for p in sorted(pods, key=lambda p: (self.rank(p), p.metadata.creation_timestamp)):
            node = (p.spec.node_name or "-").replace("real-node-", "n")
            state = p.status.phase or "?"
            for c in p.status.container_statuses or []:
                if c.name == self.container:
                    if c.state and c.state.waiting:
                        state += f"/{c.state.waiting.reason}"
                    if c.restart_count:
                        state += f"/restarts={c.restart_count}"
            ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            out.append(f"r{self.rank(p)}{self.attempt_tag(p)}@{node}:{state}{'' if ready else '/notready'}"
                       f"{'/deleting' if p.metadata.deletion_timestamp else ''}")
        return " ".join(out)

    def attempt_tag(self, pod: Any) -> str:
        return ""

    #: The ranks that train again after the loss (an elastic job's smaller gang: fewer).
    ranks_after = frozenset({0, 1})

    def poll(self, t: float, wall: float, lost_node: str) -> None:
        job, pods = self.job(), self.pods()
        if self.running_at is None and self.running(job, wall):
            self.running_at = t
        if self.training_at is None and self.training_ranks(pods, wall, lost_node) == self.ranks_after:
            self.training_at = t
        if self.failed_at is None and self.failed(job):
            self.failed_at = t
        line = f"{self.describe(job)} | pods {self.pod_line(pods)}"
        if line != self.last:
            self.timeline.append((round(t, 1), line))
            self.last = line

    @property
    def done(self) -> bool:
        """Recovered, or given up by its controller."""
        return (self.running_at is not None and self.training_at is not None) or self.failed_at is not None


class SpmdSystem(System):
    group, version, plural = "spmd.monarch.dev", "v1alpha1", "spmdjobs"
    mode = "InPlace"

    def objects(self) -> list[dict[str, Any]]:
        return spmd_objects(self.mode)

    def selector(self) -> str:
        return f"spmd.monarch.dev/job={NAME}"

    def rank(self, pod: Any) -> int:
        return int(pod.metadata.labels.get("spmd.monarch.dev/rank", -1))

    def attempt_tag(self, pod: Any) -> str:
        return f"a{pod.metadata.labels.get('spmd.monarch.dev/restart', '?')}"

    def running(self, job: dict[str, Any], wall: float) -> bool:
        status = job.get("status") or {}
        return status.get("phase") == "Running" and int(status.get("restarts") or 0) >= 1

    def failed(self, job: dict[str, Any]) -> bool:
        return (job.get("status") or {}).get("phase") == "Failed"

    def describe(self, job: dict[str, Any]) -> str:
        s = job.get("status") or {}
        failure = s.get("failure") or {}
        return (f"phase={s.get('phase')} restarts={s.get('restarts', 0)} disruptions={s.get('disruptions', 0)}"
                + (f" failure={failure.get('reason')}" if failure else ""))


class InPlace(SpmdSystem):
    name, mode = "inplace", "InPlace"


class RecreatePods(SpmdSystem):
    name, mode = "recreatepods", "RecreatePods"


class Spare(SpmdSystem):
    """InPlace with one hot spare: rank 1 on the node to freeze, rank 0 and the ready spare on the
    other; the spare's pod becomes rank 1's (relabelled) when it takes its place."""

    name, mode = "spare", "InPlace"

    def objects(self) -> list[dict[str, Any]]:
        return spare_objects()

    def placed_ok(self, pods: list[Any], lost_node: str) -> bool:
        """Rank 1 on the node to freeze and a ready spare beside rank 0 (one beside rank 1 is
        deleted, and the operator makes another, until one lands there: at most 2 minutes)."""
        from tests.realnode.test_node_loss import _spare_placed

        try:
            zero, one, _ = wait_for(lambda: _spare_placed(self.cluster, self.namespace, NAME), 120,
                                    "a ready spare beside rank 0", interval=POLL)
        except TimeoutError:
            return False
        return one["node"] == lost_node

    def describe(self, job: dict[str, Any]) -> str:
        spares = (job.get("status") or {}).get("spares") or {}
        return f"{super().describe(job)} spares={spares.get('ready', 0)}/{spares.get('used', 0)}"


class Elastic(SpmdSystem):
    """An elastic job (nodes 1:2): rank 1 on the node to freeze (rank 0's loss would recreate the
    gang); the gang goes on with rank 0 alone, in a new round (TORCHELASTIC_RESTART_COUNT 1)."""

    name, mode = "elastic", "InPlace"
    ranks_after = frozenset({0})

    def objects(self) -> list[dict[str, Any]]:
        return elastic_objects()

    def placed_ok(self, pods: list[Any], lost_node: str) -> bool:
        return any(self.rank(p) == 1 and p.spec.node_name == lost_node for p in pods)

    def describe(self, job: dict[str, Any]) -> str:
        size = (job.get("status") or {}).get("size") or {}
        return f"{super().describe(job)} size={size.get('pods', '?')}"


class JobSetSystem(System):
    name = "jobset"
    group, version, plural = "jobset.x-k8s.io", "v1alpha2", "jobsets"

    def objects(self) -> list[dict[str, Any]]:
        return jobset_objects()

    def selector(self) -> str:
        return f"jobset.sigs.k8s.io/jobset-name={NAME}"

    def rank(self, pod: Any) -> int:
        return int(pod.metadata.labels.get("jobset.sigs.k8s.io/job-index", -1))

    def attempt_tag(self, pod: Any) -> str:
        return f"a{pod.metadata.labels.get('jobset.sigs.k8s.io/restart-attempt', '?')}"

    def running(self, job: dict[str, Any], wall: float) -> bool:
        s = job.get("status") or {}
        ready = sum(int(r.get("ready") or 0) for r in s.get("replicatedJobsStatus") or [])
        return int(s.get("restarts") or 0) >= 1 and ready >= 2

    def describe(self, job: dict[str, Any]) -> str:
        s = job.get("status") or {}
        rjobs = " ".join(f"{r['name']}:ready={r.get('ready', 0)},active={r.get('active', 0)},failed={r.get('failed', 0)}"
                         for r in s.get("replicatedJobsStatus") or [])
        jobs = []
        for j in self.batch.list_namespaced_job(self.namespace, label_selector=self.selector()).items:
            conds = [c.type for c in j.status.conditions or [] if c.status == "True"]
            jobs.append(f"{j.metadata.name.removeprefix(NAME + '-')}"
                        f"(a{j.metadata.labels.get('jobset.sigs.k8s.io/restart-attempt')}"
                        f"{',deleting' if j.metadata.deletion_timestamp else ''}{',' + '+'.join(conds) if conds else ''})")
        return f"restarts={s.get('restarts', 0)} conditions={'+'.join(_true_conditions(s)) or '-'} {rjobs} jobs {' '.join(jobs)}"


class PyTorchJobSystem(System):
    name = "pytorchjob"
    group, version, plural = "kubeflow.org", "v1", "pytorchjobs"
    container = "pytorch"

    def objects(self) -> list[dict[str, Any]]:
        return pytorchjob_objects()

    def selector(self) -> str:
        return f"training.kubeflow.org/job-name={NAME}"

    def rank(self, pod: Any) -> int:
        labels = pod.metadata.labels
        index = int(labels.get("training.kubeflow.org/replica-index", 0))
        return index if labels.get("training.kubeflow.org/replica-type") == "master" else 1 + index

    def running(self, job: dict[str, Any], wall: float) -> bool:
        return any(c["type"] == "Running" and c.get("status") == "True" and _after(c.get("lastTransitionTime"), wall)
                   for c in (job.get("status") or {}).get("conditions") or [])

    def describe(self, job: dict[str, Any]) -> str:
        s = job.get("status") or {}
        replicas = " ".join(f"{k}:{','.join(f'{a}={b}' for a, b in v.items() if a != 'selector')}"
                            for k, v in sorted((s.get("replicaStatuses") or {}).items()))
        return f"conditions={'+'.join(_true_conditions(s)) or '-'} {replicas}"


KINDS: dict[str, type[System]] = {"spare": Spare, "elastic": Elastic, "inplace": InPlace, "recreatepods": RecreatePods,
                                  "jobset": JobSetSystem, "pytorchjob": PyTorchJobSystem}


def parse_systems(text: str) -> list[list[str]]:
    groups = [[s.strip() for s in g.split("+") if s.strip()] for g in text.split(",") if g.strip()]
    unknown = sorted({s for g in groups for s in g} - set(SYSTEMS))
    if unknown or not groups:
        raise argparse.ArgumentTypeError(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    return groups


# --- the cluster and the controllers --------------------------------------------------------------


@contextlib.contextmanager
def real_cluster(state_dir: Path) -> Iterator[Any]:
    """The tests' real-node cluster (REAL_NODES nodes) with the chart installed, as the
    ``real_cluster`` and ``installed_chart`` fixtures make them."""
    import yaml

    from devcluster import LocalCluster
    from devcluster.binaries import ensure_binaries
    from tests.conftest import REAL_NODES
    from tests.realnode.conftest import CHART, OPERATOR_NAMESPACE, RELEASE, chart_values, helm

    with LocalCluster(state_dir / "cluster", kwok_nodes=0, real_nodes=REAL_NODES,
                      bin_dir=ensure_binaries()) as lc:
        values = state_dir / "values.yaml"
        values.write_text(yaml.safe_dump(chart_values()))
        install = helm(lc, "install", RELEASE, str(CHART), "-n", OPERATOR_NAMESPACE, "--create-namespace",
                       "-f", str(values), "--wait", "--timeout", "5m")
        if install.returncode != 0:
            raise RuntimeError(f"helm install failed:\n{install.stdout}{install.stderr}")
        try:
            yield lc
        finally:
            helm(lc, "uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait", timeout=120)


def _pytorchjob_operator_class() -> type:
    from benchmarks.cluster import PyTorchJobOperator

    class OnRealNodes(PyTorchJobOperator):
        """The PyTorchJob operator with the worker's init container on the stock image."""

        def command(self):
            from tests.realnode.conftest import STOCK_IMAGE

            cmd, env = super().command()
            self.log_dir.mkdir(parents=True, exist_ok=True)
            template = self.log_dir / "pytorch-init-container.yaml"
            template.write_text(PYTORCH_INIT_TEMPLATE)
            return [*cmd, f"--pytorch-init-container-image={STOCK_IMAGE}",
                    f"--pytorch-init-container-template-file={template}"], env

    return OnRealNodes


@contextlib.contextmanager
def peer_controllers(lc: Any, systems: set[str], state_dir: Path) -> Iterator[None]:
    """JobSet's manager (with its webhooks) and the PyTorchJob operator, as the other benchmarks
    run them (benchmarks.cluster), when the systems include them."""
    from benchmarks.cluster import bench_cluster
    from benchmarks.inplace_cluster import jobset_operator

    with contextlib.ExitStack() as stack:
        if "jobset" in systems:
            stack.enter_context(jobset_operator(lc.kubeconfig, lc.bin_dir, state_dir))
        if "pytorchjob" in systems:
            c = stack.enter_context(bench_cluster(lc.kubeconfig, state_dir=state_dir / "pytorchjob",
                                                  bin_dir=lc.bin_dir))
            ctl = _pytorchjob_operator_class()(c, state_dir / "pytorchjob-logs")
            ctl.start()
            stack.callback(ctl.stop)
        yield


# --- one run --------------------------------------------------------------------------------------


def _node_line(core: Any, node: str) -> str:
    n = core.read_node(node)
    ready = next((c.status for c in n.status.conditions or [] if c.type == "Ready"), "?")
    taints = ",".join(f"{t.key.removeprefix('node.kubernetes.io/')}:{t.effect}" for t in n.spec.taints or []
                      if not t.key.startswith("monarch-spmd"))
    return f"Ready={ready} taints={taints or '-'}"




def _node_healthy(core: Any, node: str) -> bool:
    n = core.read_node(node)
    ready = any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    return ready and not any(t.key.startswith("node.kubernetes.io/") for t in n.spec.taints or [])


def new_namespace(lc: Any) -> str:
    from tests.realnode.conftest import _has_default_account, wait_until
    from kubernetes import client

    name = f"nl-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(lc.api_client())
    core.create_namespace({"metadata": {"name": name}})
    wait_until(lambda: _has_default_account(core, name), 30, f"ServiceAccount default in {name}")
    return name


def delete_namespace(lc: Any, name: str, timeout: float = 300) -> None:
    from kubernetes import client

    core = client.CoreV1Api(lc.api_client())
    try:
        core.delete_namespace(name)
    except client.ApiException:
        return

    def gone() -> bool:
        try:
            core.read_namespace(name)
            return False
        except client.ApiException as err:
            return err.status == 404

    try:
        wait_for(gone, timeout, f"namespace {name} deleted", interval=POLL)
    except TimeoutError as err:
        print(f"  warning: {err}", file=sys.stderr)


def run_group(lc: Any, names: list[str], run: int, cap: float, log: Any) -> list[dict[str, Any]]:
    """One freeze under the jobs of `names`, side by side; a row per system."""
    from kubernetes import client

    from tests.realnode.conftest import apply, operator_pod

    core = client.CoreV1Api(lc.api_client())
    real = lc.real
    for attempt in range(8):
        ns = new_namespace(lc)
        systems = [KINDS[n](lc, ns) for n in names]
        began = time.monotonic()
        for s in systems:
            apply(lc, ns, *s.objects())
        def both_training(s: System) -> list[Any] | None:
            pods = s.pods()
            return pods if s.training_ranks(pods, None, None) == {0, 1} else None

        try:
            training = {s.name: wait_for(lambda s=s: both_training(s), START_SECONDS, f"{s.name}: both ranks training", interval=POLL)
                        for s in systems}
        except TimeoutError:
            for s in systems:
                log(f"  {s.name}: {s.describe(s.job())} | pods {s.pod_line(s.pods())}")
            raise
        healthy = operator_pod(lc).spec.node_name
        lost_node = next(n for n in real.names if n != healthy)
        placed = {}
        for s in systems:
            pods = [p for p in training[s.name] if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
            placed[s.name] = {p.spec.node_name: s.rank(p) for p in sorted(pods, key=s.rank)}  # a rank over a spare
        if all(len(p) == 2 for p in placed.values()) and all(s.placed_ok(training[s.name], lost_node) for s in systems):
            break
        log(f"  run {run}: pods not spread over both nodes as needed ({placed}); again")
        delete_namespace(lc, ns)
    else:
        raise RuntimeError("the scheduler did not spread the pods over both nodes as needed in eight tries")
    for s in systems:
        s.lost_rank = placed[s.name][lost_node]
    log(f"  run {run} ({'+'.join(names)}): started in {time.monotonic() - began:.0f}s; freezing {lost_node} "
        f"(ranks lost: {', '.join(f'{s.name} {s.lost_rank}' for s in systems)}; the operator's node {healthy} stays)")
    lost = real.names.index(lost_node)
    node_timeline: list[tuple[float, str]] = []
    wall = time.time()
    t0 = time.monotonic()
    real.freeze(lost)
    try:
        while True:
            t = time.monotonic() - t0
            line = _node_line(core, lost_node)
            if not node_timeline or node_timeline[-1][1] != line:
                node_timeline.append((round(t, 1), line))
            for s in systems:
                if not s.done:
                    try:
                        s.poll(t, wall, lost_node)
                    except client.ApiException as err:
                        s.timeline.append((round(t, 1), f"API error {err.status}"))
            if all(s.done for s in systems) or t > cap:
                break
            time.sleep(max(0.0, POLL - (time.monotonic() - t0 - t)))
    finally:
        real.thaw(lost)
    ended = time.monotonic() - t0
    rows = []
    for s in systems:
        rows.append({"system": s.name, "run": run, "lost_rank": s.lost_rank, "lost_node": lost_node,
                     "running_again_s": s.running_at, "training_again_s": s.training_at,
                     "failed_s": s.failed_at, "cap_s": cap, "timeline": s.timeline, "node_timeline": node_timeline,
                     "last": s.last})
        log(f"  run {run} {s.name}: running again {_cell(s.running_at, cap)} s, training again "
            f"{_cell(s.training_at, cap)} s" + (f", Failed at {s.failed_at:.0f} s" if s.failed_at is not None else "")
            + f" (polled until {ended:.0f}s)")
    delete_namespace(lc, ns)
    wait_for(lambda: _node_healthy(core, lost_node), 180, f"{lost_node} Ready and untainted after the thaw", interval=POLL)
    return rows


# --- the report -----------------------------------------------------------------------------------


def _cell(x: float | None, cap: float, failed: float | None = None) -> str:
    if x is not None:
        return f"{x:.1f}"
    return f"no (Failed at {failed:.0f})" if failed is not None else f"not in {cap:.0f}"


def _median_cell(xs: list[float | None], cap: float) -> str:
    if not xs:
        return "-"
    m = statistics.median([math.inf if x is None else x for x in xs])
    return f"{m:.1f}" if math.isfinite(m) else f"did not recover in {cap:.0f} s"


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name in SYSTEMS:
        mine = [r for r in rows if r["system"] == name]
        if mine:
            cap = mine[0]["cap_s"]
            out.append({"system": name, "runs": len(mine),
                        "running_again": _median_cell([r["running_again_s"] for r in mine], cap),
                        "training_again": _median_cell([r["training_again_s"] for r in mine], cap)})
    return out


def render(result: dict[str, Any], timelines: bool = True) -> str:
    rows = result["rows"]
    lines = [f"# A lost node ({result['machine']['date']}, commit {result['machine']['commit']})", "",
             machine_line(result["machine"]), "",
             f"kube-controller-manager flags: {' '.join(result['controller_manager_flags'])}", "",
             table(["system", "run", "rank lost", "running again s", "every rank training again s"],
                   [[LABELS[r["system"]], r["run"], r["lost_rank"],
                     _cell(r["running_again_s"], r["cap_s"], r.get("failed_s")),
                     _cell(r["training_again_s"], r["cap_s"], r.get("failed_s"))] for r in rows]
                   + [[f"**{LABELS[s['system']]}: median of {s['runs']}**", "", "", s["running_again"],
                       s["training_again"]] for s in summarize(rows)])]
    if timelines:
        lines += ["", "```text"]
        for r in rows:
            lines += [f"{LABELS[r['system']]}, run {r['run']} (lost {r['lost_node']}, rank {r['lost_rank']}): "
                      f"s from the freeze"]
            lines += [f"    {t:6.1f}  node: {line}" for t, line in r["node_timeline"]]
            lines += [f"    {t:6.1f}  {line}" for t, line in r["timeline"]] + [""]
        lines[-1] = "```"
    return "\n".join(lines)


def controller_manager_flags(lc: Any) -> list[str]:
    """kube-controller-manager's flags as the test cluster passes them, less paths and ports."""
    args = lc.control_plane.args.get("kube-controller-manager", [])
    return [a for a in args if "/" not in a and "port" not in a]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--systems", type=parse_systems, default=parse_systems(DEFAULT_SYSTEMS),
                   help=f"comma-separated groups; '+' runs systems under the same freeze (default {DEFAULT_SYSTEMS})")
    p.add_argument("--cap", type=float, default=CAP_SECONDS, help="seconds a run may take to recover")
    p.add_argument("--state-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=OUT_DIR / "node_loss.json")
    p.add_argument("--no-timelines", action="store_true", help="the table only")
    p.add_argument("--render", type=Path, default=None, metavar="JSON",
                   help="print the report of a JSON this benchmark wrote (e.g. of a cut run) and exit")
    args = p.parse_args(argv)
    if args.render:
        print(render(json.loads(args.render.read_text()), timelines=not args.no_timelines))
        return 0

    sys.path.insert(0, str(REPO))
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="spmd-node-loss-"))
    state.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": machine(), "argv": sys.argv[1:] if argv is None else argv,
                              "cap_s": args.cap, "rows": [], "errors": []}

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    all_systems = {s for g in args.systems for s in g}
    with real_cluster(state) as lc:
        result["controller_manager_flags"] = controller_manager_flags(lc)
        log(f"cluster up in {lc.start_seconds:.0f}s; state in {state}")
        with peer_controllers(lc, all_systems, state):
            for run in range(1, args.runs + 1):  # run 1 of every group first: a cut run stays balanced
                for group in args.systems:
                    try:
                        result["rows"] += run_group(lc, group, run, args.cap, log)
                    except Exception as err:  # noqa: BLE001 - the other runs still count
                        result["errors"].append({"systems": group, "run": run, "error": repr(err)})
                        log(f"  run {run} ({'+'.join(group)}) failed:\n{traceback.format_exc()}")
                    write_json("node_loss", result, args.json)
    result["summary"] = summarize(result["rows"])
    write_json("node_loss", result, args.json)
    print(render(result, timelines=not args.no_timelines))
    for e in result["errors"]:
        print(f"\nrun {e['run']} of {'+'.join(e['systems'])} failed: {e['error']}")
    if not args.state_dir:
        shutil.rmtree(state / "cluster" / "etcd", ignore_errors=True)
    return 0 if result["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
