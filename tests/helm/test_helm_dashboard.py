"""The chart's opt-in Grafana dashboard, rendered by the real helm binary: off by default; on, a
ConfigMap with the label Grafana's dashboard sidecar looks for (kube-prometheus-stack's
grafana_dashboard: "1") holding dashboards/monarch-spmd.json as it is; bad values refused by the
schema. (tests/unit/test_dashboard.py checks its queries against the operator's metrics.)"""

from __future__ import annotations

import json

from helm_support import CHART, by_kind, one


def test_the_dashboard_is_off_by_default(render):
    assert not [o for o in by_kind(render(), "ConfigMap") if "grafana_dashboard" in o["metadata"].get("labels", {})]


def test_the_dashboard_configmap_carries_the_sidecars_label_and_the_json(render):
    objects = render("--set", "metrics.dashboard.enabled=true", "--set", "metrics.dashboard.annotations.grafana_folder=Training")
    configmap = one([o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")], "ConfigMap")
    meta = configmap["metadata"]
    assert meta["labels"]["grafana_dashboard"] == "1" and meta["namespace"] == "ops"
    assert meta["annotations"] == {"grafana_folder": "Training"}
    assert json.loads(configmap["data"]["monarch-spmd.json"]) == json.loads(
        (CHART / "dashboards" / "monarch-spmd.json").read_text())
    elsewhere = render("--set", "metrics.dashboard.enabled=true", "--set", "metrics.dashboard.namespace=monitoring",
                       "--set", "metrics.dashboard.labels.grafana_dashboard=yes")
    moved = [o for o in by_kind(elsewhere, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")][0]
    assert moved["metadata"]["namespace"] == "monitoring" and moved["metadata"]["labels"]["grafana_dashboard"] == "yes"


def test_bad_dashboard_values_are_refused(helm):
    for bad in ("metrics.dashboard.namespace=Not_A_Namespace", "metrics.dashboard.enabled=maybe",
                "metrics.dashboard.colour=blue"):
        result = helm("template", "spmd", str(CHART), "--set", bad)
        assert result.returncode != 0 and "values don't meet the specifications of the schema" in result.stderr, bad
