"""The chart's side of operating the operator, rendered by the real helm binary (no cluster):
the metrics Service and the optional ServiceMonitor, leader election (flags, the Lease's Role,
the rollout strategy), the PodDisruptionBudget and anti-affinity for more than one replica, the
gang schedulers' RBAC rules per value, the checks across values, and NOTES.txt."""

from __future__ import annotations

import shutil

import pytest
import yaml

from helm_support import (CHART, CRD_RULE, GANG_CLUSTER_RULES, GANG_RULES, KUBE_VERSION, LEASE_RULE, NAMESPACE_GET_RULE,
                          NAMESPACED_RULES, NAMESPACES_RULE, by_kind, one)

OPERATOR_SELECTOR = {
    "app.kubernetes.io/name": "monarch-spmd",
    "app.kubernetes.io/instance": "spmd",
    "app.kubernetes.io/component": "operator",
}


def operator_pod_template(objects):
    return one(objects, "Deployment")["spec"]["template"]


def selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


# --- metrics -------------------------------------------------------------------------------------


def test_metrics_service_selects_the_operator_pods_and_nothing_else(render):
    objects = render()
    service = one(objects, "Service")
    assert service["metadata"]["name"] == "spmd-monarch-spmd-metrics"
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"] == OPERATOR_SELECTOR
    template = operator_pod_template(objects)
    assert selects(service["spec"]["selector"], template["metadata"]["labels"])
    (container,) = template["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert "--metrics-port=9090" in container["args"]
    # The `helm test` pod shares the release's selector labels, but is never behind the Service.
    test_pod = one([o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == "test"], "Pod")
    assert not selects(service["spec"]["selector"], test_pod["metadata"]["labels"])


def test_metrics_port_moves_service_and_container_together(render):
    objects = render("--set", "metrics.port=9500", "--set-string", "metrics.service.annotations.prometheus\\.io/scrape=true")
    service = one(objects, "Service")
    assert service["spec"]["ports"][0]["port"] == 9500
    assert service["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    (container,) = operator_pod_template(objects)["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9500, "protocol": "TCP"} in container["ports"]
    assert "--metrics-port=9500" in container["args"]


def test_metrics_port_zero_turns_metrics_off(render):
    objects = render("--set", "metrics.port=0")
    assert not by_kind(objects, "Service")
    (container,) = operator_pod_template(objects)["spec"]["containers"]
    assert [p["name"] for p in container["ports"]] == ["health"]
    assert "--metrics-port=0" in container["args"]  # the operator's own default is 9090: say 0


@pytest.mark.parametrize("args", [[], ["--set", "replicaCount=2"], ["--set", "watchNamespaces={a,b}"],
                                  ["-f", str(CHART / "values-gpu.yaml")]], ids=["default", "ha", "namespaced", "gpu"])
def test_no_prometheus_operator_api_unless_asked_for(helm, args):
    """A cluster without the Prometheus operator's CRDs must install the chart: not one mention."""
    result = helm("template", "spmd", str(CHART), "-n", "ops", "--kube-version", KUBE_VERSION, *args)
    assert result.returncode == 0, result.stderr
    assert "monitoring.coreos.com" not in result.stdout
    assert "ServiceMonitor" not in result.stdout


def test_service_monitor_when_enabled(render):
    objects = render("--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=kps",
                     "--set", "metrics.serviceMonitor.interval=15s", "--set", "metrics.serviceMonitor.scrapeTimeout=5s")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "ops"
    assert monitor["metadata"]["labels"]["release"] == "kps"  # for Prometheus's serviceMonitorSelector
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "scheme": "http", "honorLabels": True, "interval": "15s",
         "scrapeTimeout": "5s"}
    ]
    service = one(objects, "Service")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert [s for s in by_kind(objects, "Service") if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])] == [service]


# --- leader election, replicas, disruption budget ------------------------------------------------


def test_leader_election_flags_follow_the_values(render):
    objects = render("--set", "leaderElection.leaseName=ops-lease", "--set", "leaderElection.leaseDurationSeconds=30",
                     "--set", "leaderElection.renewDeadlineSeconds=20", "--set", "leaderElection.retryPeriodSeconds=5")
    (container,) = operator_pod_template(objects)["spec"]["containers"]
    assert container["args"][2:] == [
        "--metrics-port=9090", "--leader-election", "--leader-election-namespace=ops", "--lease-name=ops-lease",
        "--lease-duration=30", "--renew-deadline=20", "--retry-period=5",
        "--network-policy", "--operator-pod-labels=app.kubernetes.io/name=monarch-spmd,app.kubernetes.io/instance=spmd",
    ]


def test_network_policy_value_turns_the_jobs_isolation_and_its_rbac_off(render):
    objects = render("--set", "networkPolicy.enabled=false")
    (container,) = operator_pod_template(objects)["spec"]["containers"]
    assert not [a for a in container["args"] if "network-policy" in a or "operator-pod-labels" in a]
    rules = one(objects, "ClusterRole", "spmd-monarch-spmd")["rules"]
    assert all("networkpolicies" not in r["resources"] for r in rules)


def test_lease_role_is_the_release_namespace_only(render):
    objects = render("--set", "watchNamespaces={team-a,team-b}")
    role = one(objects, "Role", "spmd-monarch-spmd-leader-election")
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"] == [LEASE_RULE]
    binding = one(objects, "RoleBinding", "spmd-monarch-spmd-leader-election")
    assert binding["metadata"]["namespace"] == "ops"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "spmd-monarch-spmd-leader-election"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "spmd-monarch-spmd", "namespace": "ops"}]
    # Nowhere else: not in the ClusterRole, not in the watched namespaces' Roles.
    for obj in [*by_kind(objects, "ClusterRole"), *by_kind(objects, "Role")]:
        if obj is not role:
            assert all("coordination.k8s.io" not in r["apiGroups"] for r in obj["rules"]), obj["metadata"]


def test_without_leader_election_one_replica_replaced_with_recreate(render, helm):
    objects = render("--set", "leaderElection.enabled=false")
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--no-leader-election" in container["args"]
    assert not [a for a in container["args"] if a.startswith(("--lease", "--leader-election", "--renew", "--retry"))]
    assert not [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("leader-election")]
    result = helm("template", "spmd", str(CHART), "--kube-version", KUBE_VERSION,
                  "--set", "leaderElection.enabled=false", "--set", "replicaCount=2")
    assert result.returncode != 0
    assert "replicaCount 2 needs leaderElection.enabled" in result.stderr


@pytest.mark.parametrize("replicas", [0, 1])
def test_no_disruption_budget_for_one_replica(render, replicas):
    objects = render("--set", f"replicaCount={replicas}")
    assert not by_kind(objects, "PodDisruptionBudget")
    assert one(objects, "Deployment")["spec"]["replicas"] == replicas


@pytest.mark.parametrize("replicas", [2, 3])
def test_more_replicas_get_a_disruption_budget_and_spread(render, replicas):
    objects = render("--set", f"replicaCount={replicas}")
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == replicas
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1" and pdb["metadata"]["namespace"] == "ops"
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": OPERATOR_SELECTOR}}
    template = deployment["spec"]["template"]
    assert selects(pdb["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])
    anti = template["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti == [{"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                         "labelSelector": {"matchLabels": OPERATOR_SELECTOR}}}]


def test_users_affinity_replaces_the_default_spread(render):
    objects = render("--set", "replicaCount=2", "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
                     "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists")
    affinity = operator_pod_template(objects)["spec"]["affinity"]
    assert list(affinity) == ["nodeAffinity"]


@pytest.mark.parametrize(
    "values, message",
    [
        (["leaderElection.renewDeadlineSeconds=10"],
         "leaderElection.renewDeadlineSeconds (10) must be less than leaderElection.leaseDurationSeconds (10)"),
        (["leaderElection.retryPeriodSeconds=7"],
         "leaderElection.retryPeriodSeconds (7) must be less than leaderElection.renewDeadlineSeconds (7)"),
        (["metrics.port=8080"], "metrics.port (8080) must differ from healthPort (8080)"),
        (["metrics.port=0", "metrics.serviceMonitor.enabled=true"], "metrics.serviceMonitor.enabled needs metrics.port"),
    ],
)
def test_checks_across_values_name_the_keys(helm, values, message):
    sets = [a for v in values for a in ("--set", v)]
    result = helm("template", "spmd", str(CHART), "--kube-version", KUBE_VERSION, *sets)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


# --- RBAC per gang scheduler ---------------------------------------------------------------------


def gang_values(*names: str) -> list[str]:
    return [a for n in names for a in ("--set", f"gangScheduling.{n}.enabled=true")]


def test_no_gang_scheduler_rules_by_default(render):
    text = yaml.safe_dump_all(render())
    for group in ("kueue.x-k8s.io", "scheduling.volcano.sh", "scheduling.x-k8s.io"):
        assert group not in text


@pytest.mark.parametrize("name", sorted(GANG_RULES))
def test_each_gang_scheduler_adds_only_its_rules_cluster_wide(render, name):
    role = one(render(*gang_values(name)), "ClusterRole")
    assert role["rules"] == [CRD_RULE, NAMESPACE_GET_RULE, *GANG_CLUSTER_RULES[name], *NAMESPACED_RULES, *GANG_RULES[name]]


@pytest.mark.parametrize("name", sorted(GANG_RULES))
def test_each_gang_scheduler_adds_only_its_rules_per_namespace(render, name):
    objects = render("--set", "watchNamespaces={team-a}", *gang_values(name))
    cluster_role = one(objects, "ClusterRole")
    # Kueue's ResourceFlavors are cluster-scoped: they stay in the ClusterRole.
    assert cluster_role["rules"] == [CRD_RULE, NAMESPACE_GET_RULE, *GANG_CLUSTER_RULES[name], NAMESPACES_RULE]
    role = one(objects, "Role", "spmd-monarch-spmd")
    assert role["metadata"]["namespace"] == "team-a"
    assert role["rules"] == [*NAMESPACED_RULES, *GANG_RULES[name]]


def test_all_gang_schedulers_together(render):
    role = one(render(*gang_values("kueue", "volcano", "coscheduling")), "ClusterRole")
    assert role["rules"] == [CRD_RULE, NAMESPACE_GET_RULE, *GANG_CLUSTER_RULES["kueue"], *NAMESPACED_RULES,
                             *GANG_RULES["kueue"], *GANG_RULES["volcano"], *GANG_RULES["coscheduling"]]


# --- NOTES.txt -----------------------------------------------------------------------------------


@pytest.fixture
def notes(helm, tmp_path):
    """NOTES.txt rendered by helm without a cluster: a copy of the chart in which a template wraps
    it in a YAML document (helm prints NOTES only for install and upgrade, which need one)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    body = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes.tpl").write_text('{{- define "notes-under-test" -}}\n' + body + "\n{{- end }}\n")
    (chart / "templates" / "notes-under-test.yaml").write_text(
        'notes: |\n{{ include "notes-under-test" . | indent 2 }}\n')

    def run(*args: str) -> str:
        result = helm("template", "spmd", str(chart), "-n", "ops", "--kube-version", KUBE_VERSION,
                      "--show-only", "templates/notes-under-test.yaml", *args)
        assert result.returncode == 0, result.stderr
        return yaml.safe_load(result.stdout)["notes"]

    return run


def test_notes_mention_metrics_and_high_availability(notes):
    text = notes()
    assert "One replica, leader of the Lease spmd-monarch-spmd" in text
    assert "--set replicaCount=2" in text
    assert "kubectl -n ops get lease spmd-monarch-spmd" in text
    assert "port-forward service/spmd-monarch-spmd-metrics 9090" in text
    assert "--set metrics.serviceMonitor.enabled=true" in text
    assert "monarch-spmd status -A" in text
    ha = notes("--set", "replicaCount=2", "--set", "metrics.serviceMonitor.enabled=true")
    assert "2 replicas: the one holding the Lease spmd-monarch-spmd acts" in ha
    assert "within 12s" in ha and "PodDisruptionBudget" in ha
    assert "The ServiceMonitor spmd-monarch-spmd asks the Prometheus operator" in ha
    off = notes("--set", "metrics.port=0", "--set", "leaderElection.enabled=false")
    assert "Metrics are off" in off and "Leader election is off" in off
