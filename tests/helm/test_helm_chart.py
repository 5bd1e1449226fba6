"""The Helm chart with the real helm binary, no cluster: lint, rendering with default, GPU and
namespaced values, the exact RBAC (per scope and per gang scheduler), the operator's security
context and probes, metrics (Service, optional ServiceMonitor), leader election and the
PodDisruptionBudget, values.schema.json refusing bad values, and the CRD copy matching its single
source."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from helm_support import (CHART, CRD_RULE, GANG_CLUSTER_RULES, GANG_RULES, KUBE_VERSION, LEADER_ARGS,
                          NAMESPACE_GET_RULE, NAMESPACED_RULES, NAMESPACES_RULE, ROOT, by_kind, is_test_hook, one,
                          rendered_test_job)

DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def operator_container(objects):
    deployment = one(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


@pytest.mark.parametrize(
    "args",
    [[], ["-f", str(CHART / "values-gpu.yaml")], ["--set", "watchNamespaces={team-a,team-b}"]],
    ids=["default", "gpu", "namespaced"],
)
def test_lint_strict(helm, args):
    result = helm("lint", "--strict", str(CHART), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


def component(obj) -> str:
    return obj["metadata"]["labels"].get("app.kubernetes.io/component", "")


def test_default_render_objects(render):
    objects = render()
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objects if component(o) != "test")
    assert kinds == [
        ("ClusterRole", "spmd-monarch-spmd"),
        ("ClusterRoleBinding", "spmd-monarch-spmd"),
        ("Deployment", "spmd-monarch-spmd"),
        ("Role", "spmd-monarch-spmd-leader-election"),
        ("RoleBinding", "spmd-monarch-spmd-leader-election"),
        ("Service", "spmd-monarch-spmd-metrics"),
        ("ServiceAccount", "spmd-monarch-spmd"),
    ]
    tests = sorted((o["kind"], o["metadata"]["name"], is_test_hook(o)) for o in objects if component(o) == "test")
    # Only the pod is a hook: `helm test --logs` reads the log of every test hook as a pod's.
    assert tests == [
        ("Pod", "spmd-monarch-spmd-test", True),
        ("Role", "spmd-monarch-spmd-test", False),
        ("RoleBinding", "spmd-monarch-spmd-test", False),
        ("ServiceAccount", "spmd-monarch-spmd-test", False),
    ]
    # No leftovers of the `helm create` skeleton.
    assert not {o["kind"] for o in objects} & {"Ingress", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "spmd"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "ops"


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses(render):
    objects = render()
    role = one(objects, "ClusterRole", "spmd-monarch-spmd")
    # kopf observes namespaces only when not cluster-wide (kopf/_core/reactor/observation.py).
    assert role["rules"] == [CRD_RULE, NAMESPACE_GET_RULE, *NAMESPACED_RULES]
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "spmd-monarch-spmd"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "spmd-monarch-spmd", "namespace": "ops"}]
    # The only other Role is the Lease's, in the release namespace.
    assert [r["metadata"]["name"] for r in by_kind(objects, "Role") if component(r) != "test"] == ["spmd-monarch-spmd-leader-election"]


def test_every_rbac_rule_says_who_needs_it():
    text = (CHART / "templates/rbac.yaml").read_text()
    lines = text.splitlines()
    rule_starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("- apiGroups:")]
    gang = sum(len(r) for r in GANG_RULES.values()) + sum(len(r) for r in GANG_CLUSTER_RULES.values())
    assert len(rule_starts) == len(NAMESPACED_RULES) + 3 + gang + 1  # + CRDs, namespaces x2; + the Lease
    first_line = r"\s*# (app|framework|leader)( \((gangScheduling\.[a-z]+|networkPolicy\.enabled)\))?: \S"
    for i in rule_starts:
        j = i - 1
        while j > 0 and lines[j - 1].lstrip().startswith("#") and not re.match(first_line, lines[j]):
            j -= 1  # a comment may run over several lines; its first line names who needs the rule
        assert re.match(first_line, lines[j]), f"rbac.yaml line {i + 1} has no comment above"


def test_namespaced_mode(render):
    objects = render("--set", "watchNamespaces={team-a,team-b}")
    _, container = operator_container(objects)
    assert container["command"] == ["python", "-m", "spmd_operator"]
    assert container["args"] == ["--namespace=team-a", "--namespace=team-b", "--liveness=http://0.0.0.0:8080/healthz", *LEADER_ARGS]
    cluster_role = one(objects, "ClusterRole")
    assert cluster_role["rules"] == [CRD_RULE, NAMESPACE_GET_RULE, NAMESPACES_RULE]
    roles = [o for o in by_kind(objects, "Role") if component(o) != "test" and not is_lease(o)]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert role["rules"] == NAMESPACED_RULES
    bindings = [o for o in by_kind(objects, "RoleBinding") if component(o) != "test" and not is_lease(o)]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "spmd-monarch-spmd", "namespace": "ops"}]


def is_lease(obj) -> bool:
    return obj["metadata"]["name"].endswith("-leader-election")


def test_rbac_and_service_account_can_be_brought_by_the_user(render):
    objects = render("--set", "rbac.create=false", "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=my-operator")
    assert not [o for o in objects if component(o) != "test" and o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount")]
    deployment, _ = operator_container(objects)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "my-operator"


def test_operator_deployment_defaults(render):
    deployment, container = operator_container(render())
    spec = deployment["spec"]
    # One leader-elected replica; a rollout surges the new pod beside the old leader.
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert container["command"] == ["python", "-m", "spmd_operator"]
    assert container["args"] == ["--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz", *LEADER_ARGS]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # the Lease holder
    assert "affinity" not in spec["template"]["spec"]
    assert container["image"] == "monarch-spmd/operator:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "spmd-monarch-spmd"
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert container["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}


def test_operator_security_context(render):
    deployment, container = operator_container(render())
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # A read-only root still gets a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert any(v["name"] == "tmp" and "emptyDir" in v for v in pod["volumes"])


def test_operator_probes_hit_kopf_health_endpoint(render):
    _, container = operator_container(render())
    assert container["ports"] == [
        {"name": "health", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
    ]
    _, moved = operator_container(render("--set", "healthPort=9091"))
    assert moved["args"][1] == "--liveness=http://0.0.0.0:9091/healthz"
    assert moved["ports"][0]["containerPort"] == 9091
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
        assert container[probe]["periodSeconds"] >= 1


def test_operator_placement_values(render):
    deployment, _ = operator_container(
        render(
            "--set", "nodeSelector.pool=system",
            "--set", "tolerations[0].key=dedicated,tolerations[0].operator=Exists,tolerations[0].effect=NoSchedule",
            "--set", "priorityClassName=system-cluster-critical",
        )
    )
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "system-cluster-critical"


def test_test_hook_runs_a_tiny_cpu_allreduce(render):
    objects = render()
    job = rendered_test_job(objects)
    assert job["apiVersion"] == "spmd.monarch.dev/v1alpha1" and job["kind"] == "SPMDJob"
    assert job["metadata"]["namespace"] == "ops"
    assert job["spec"] == {
        "mesh": [{"name": "procs", "size": 2}],
        "args": ["-m", "monarch_spmd.examples.allreduce"],
        "image": "monarch-spmd/worker-cpu:0.1.0",
        "gpusPerProc": 0,
        "restartPolicy": {"maxRestarts": 0},
        # Pod Security "restricted" (docs/pod-security.md): helm test passes in such a namespace.
        "template": {"spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "trainer", "securityContext": {"allowPrivilegeEscalation": False,
                                                                   "capabilities": {"drop": ["ALL"]}}}]}},
    }
    pod = one(objects, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == "spmd-monarch-spmd-test"
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python", "-c"]
    compile(container["args"][0], "helm-test", "exec")
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["SPMD_TEST_NAMESPACE"]["value"] == "ops"
    # The test's ServiceAccount may only create, read and delete SPMDJobs in its namespace.
    role = one([o for o in objects if component(o) == "test"], "Role")
    assert role["rules"] == [{"apiGroups": ["spmd.monarch.dev"], "resources": ["spmdjobs"], "verbs": ["create", "get", "delete"]}]


def test_tests_can_be_disabled(render):
    assert not [o for o in render("--set", "tests.enabled=false") if component(o) == "test"]


def test_gpu_values(render):
    objects = render("-f", str(CHART / "values-gpu.yaml"))
    spec = rendered_test_job(objects)["spec"]
    assert spec["gpusPerProc"] == 1
    assert spec["image"] == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    assert spec["args"] == ["/opt/spmd-test/main.py"]
    assert spec["mesh"] == [{"name": "hosts", "size": 2}, {"name": "gpus", "size": 1}]
    pod = spec["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    (trainer,) = pod["containers"]
    assert trainer["name"] == "trainer"
    assert trainer["volumeMounts"] == [{"name": "spmd-test", "mountPath": "/opt/spmd-test", "readOnly": True}]
    configmap = one(objects, "ConfigMap")
    assert component(configmap) == "test" and not is_test_hook(configmap)
    assert pod["volumes"] == [{"name": "spmd-test", "configMap": {"name": configmap["metadata"]["name"]}}]
    source = configmap["data"]["main.py"]
    compile(source, "main.py", "exec")
    assert 'init_process_group("nccl")' in source
    # The operator itself stays off GPU nodes and keeps its security context.
    deployment, container = operator_container(objects)
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "tolerations" not in deployment["spec"]["template"]["spec"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("release", ["x" * 53, "9lives", "a-release-name-that-is-rather-long-for-a-cluster"])
def test_names_stay_valid_for_long_and_odd_release_names(render, release):
    objects = render("--set", "replicaCount=2", "--set", "metrics.serviceMonitor.enabled=true", release=release)
    assert {"Service", "ServiceMonitor", "PodDisruptionBudget", "Role"} <= {o["kind"] for o in objects}
    for obj in objects:
        name = obj["metadata"]["name"]
        assert len(name) <= 63 and DNS_1123_LABEL.match(name), name
        if obj["kind"] == "Service":
            assert DNS_1035_LABEL.match(name), name  # a Service name starts with a letter
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), "two objects share a kind, namespace and name"
    job_name = rendered_test_job(objects, uid="f" * 36)["metadata"]["name"]
    assert len(job_name) <= 50 and DNS_1035_LABEL.match(job_name), job_name
    for obj in objects:
        for value in obj["metadata"]["labels"].values():
            assert len(value) <= 63


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "replicaCount=-1"], "/replicaCount"),
        (["--set", "replicaCount=4"], "/replicaCount"),
        (["--set", "replicaCount=1.5"], "/replicaCount"),
        (["--set", "metrics.port=80"], "/metrics/port"),
        (["--set", "metrics.port=70000"], "/metrics/port"),
        (["--set", "metrics.serviceMonitor.enabled=yes"], "/metrics/serviceMonitor/enabled"),
        (["--set", "metrics.serviceMonitor.interval=half-a-minute"], "/metrics/serviceMonitor/interval"),
        (["--set", "metrics.serviceMonitor.scrapeTimeout=10"], "/metrics/serviceMonitor/scrapeTimeout"),
        (["--set", "metrics.serviceMonitor.labels.bad key=x"], "/metrics/serviceMonitor/labels"),
        (["--set", "metrics.scrapeEverything=true"], "additional properties 'scrapeEverything' not allowed"),
        (["--set", "leaderElection.enabled=sometimes"], "/leaderElection/enabled"),
        (["--set", "leaderElection.leaseName=Not_A_Name"], "/leaderElection/leaseName"),
        (["--set", "leaderElection.leaseDurationSeconds=1"], "/leaderElection/leaseDurationSeconds"),
        (["--set", "leaderElection.renewDeadlineSeconds=0"], "/leaderElection/renewDeadlineSeconds"),
        (["--set", "leaderElection.retryPeriodSeconds=0.5"], "/leaderElection/retryPeriodSeconds"),
        (["--set", "gangScheduling.kueue.enabled=on"], "/gangScheduling/kueue/enabled"),
        (["--set", "gangScheduling.slurm.enabled=true"], "additional properties 'slurm' not allowed"),
        (["--set", "extraArgs={--metrics-port=1}"], "/extraArgs/0"),
        (["--set", "extraArgs={--no-leader-election}"], "/extraArgs/0"),
        (["--set", "extraArgs={--lease-name=x}"], "/extraArgs/0"),
        (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["--set", "image.repository=Not A Repo"], "/image/repository"),
        (["--set", "watchNamespaces={Team_A}"], "/watchNamespaces/0"),
        (["--set", "watchNamespaces={a,a}"], "/watchNamespaces"),
        (["--set", "podSecurityContext.runAsNonRoot=false"], "/podSecurityContext/runAsNonRoot"),
        (["--set", "securityContext.allowPrivilegeEscalation=true"], "/securityContext/allowPrivilegeEscalation"),
        (["--set", "securityContext.capabilities.add={NET_ADMIN}"], "/securityContext/capabilities/add"),
        (["--set", "healthPort=80"], "/healthPort"),
        (["--set", "resources.requests.cpu=lots"], "/resources/requests/cpu"),
        (["--set", "extraArgs={--namespace=x}"], "/extraArgs/0"),
        (["--set", "extraArgs={--liveness=http://0.0.0.0:9/healthz}"], "/extraArgs/0"),
        (["--set", "tests.mesh[0].size=0"], "/tests/mesh/0/size"),
        (["--set", "tests.gpusPerProc=-1"], "/tests/gpusPerProc"),
        (["--set", "tests.timeoutSeconds=5"], "/tests/timeoutSeconds"),
        (["--set", "ingress.enabled=true"], "additional properties 'ingress' not allowed"),
    ],
)
def test_schema_rejects_bad_values(helm, args, message):
    result = helm("template", "spmd", str(CHART), "--kube-version", KUBE_VERSION, *args)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("name", ["values.yaml", "values-gpu.yaml"])
def test_every_value_key_has_a_comment(name):
    """Each key has a comment line above it, except inside a value block (a commented key whose
    value is a mapping or list written out as the value, e.g. podSecurityContext)."""
    lines = (CHART / name).read_text().splitlines()
    ancestors: list[tuple[int, bool]] = []  # (indent, is a value block)
    for i, line in enumerate(lines):
        key = re.match(r"^(\s*)(- )?[A-Za-z][A-Za-z0-9.]*:", line)
        if not key:
            continue
        indent = len(key.group(1))
        while ancestors and ancestors[-1][0] >= indent:
            ancestors.pop()
        if not any(block for _, block in ancestors):
            assert i and lines[i - 1].strip().startswith("#"), f"{name} line {i + 1} ({line.strip()}) has no comment"
        following = lines[i + 1].strip() if i + 1 < len(lines) else ""
        ancestors.append((indent, not following.startswith("#")))


def test_schema_requires_and_constrains():
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    assert {"replicaCount", "image", "serviceAccount", "rbac", "tests", "metrics", "leaderElection",
            "gangScheduling"} <= set(schema["required"])
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])

    def check(value, node, path):  # every key of values.yaml is described by the schema, all the way down
        node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node
        if isinstance(value, dict) and "properties" in node:
            for key, sub in value.items():
                assert key in node["properties"], f"{path}.{key} is not in values.schema.json"
                check(sub, node["properties"][key], f"{path}.{key}")

    check(values, schema, "")


def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "monarch-spmd" and chart["type"] == "application"
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def test_crd_copy_matches_single_source():
    source = ROOT / "crds" / "spmd.monarch.dev_spmdjobs.yaml"
    copy = CHART / "crds" / "spmd.monarch.dev_spmdjobs.yaml"
    assert source.is_file(), f"{source} (the CRD's single source) is missing"
    assert copy.is_file() and copy.read_bytes() == source.read_bytes(), "run scripts/sync-crd.sh"
    assert [p.name for p in (CHART / "crds").iterdir()] == [source.name]
    result = subprocess.run(["bash", str(ROOT / "scripts/sync-crd.sh"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0 and "in sync" in result.stdout


def test_crd_upgrade_is_documented():
    for doc in (CHART / "README.md", CHART / "templates/NOTES.txt"):
        text = doc.read_text()
        assert "never" in text.lower() and "kubectl apply --server-side -f" in text, doc


def test_kind_e2e_script_parses():
    result = subprocess.run(["bash", "-n", str(ROOT / "scripts/kind-e2e.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    text = (ROOT / "scripts/kind-e2e.sh").read_text()
    for step in (
        "kind create cluster --name \"$CLUSTER\" --config kind-config.yaml",
        "images/operator.Dockerfile",
        "images/worker-cpu.Dockerfile",
        "kind load docker-image",
        "helm upgrade --install",
        "examples/$JOB.yaml",
        "--for=jsonpath='{.status.phase}'=Succeeded",
        "monarch-spmd logs",
        "--cleanup",
    ):
        assert step in text, step


def test_kind_config_has_one_control_plane_and_two_workers():
    config = yaml.safe_load((ROOT / "kind-config.yaml").read_text())
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert [n["role"] for n in config["nodes"]] == ["control-plane", "worker", "worker"]
