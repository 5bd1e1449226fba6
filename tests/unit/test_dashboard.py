"""The chart's Grafana dashboard asks only for what the operator exports: every PromQL query of
helm/monarch-spmd/dashboards/monarch-spmd.json is parsed for its metric names and label names,
which must be those the operator's own registry (operator/spmd_operator/metrics.py) exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from spmd_operator.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "monarch-spmd" / "dashboards" / "monarch-spmd.json"
#: PromQL's words that are not metric names.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
            "unless", "inf", "nan"}
#: Labels Prometheus adds to every series it scrapes from a ServiceMonitor's target (not the operator's own).
TARGET_LABELS = {"job", "instance", "pod", "service", "endpoint", "container"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",), "gaugehistogram": ("_bucket", "_gcount", "_gsum")}


def exported() -> dict[str, set[str]]:
    """Every series name the operator's registry exports, with its label names."""
    metrics = Metrics()
    labels: dict[str, tuple[str, ...]] = {}
    for value in vars(metrics).values():
        if hasattr(value, "_labelnames") and hasattr(value, "_name"):
            labels[value._name] = tuple(value._labelnames)
    out: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        names = set(getattr(family, "_labelnames", ()) or labels.get(family.name, ()))
        names |= {k for sample in family.samples for k in sample.labels}
        for suffix in SUFFIXES[family.type]:
            out[family.name + suffix] = names | ({"le"} if suffix == "_bucket" else set())
    return out


def queries(node: object) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets and templating queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, str) and value.startswith("label_values("):
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


def parse(expr: str) -> list[tuple[str, set[str], set[str]]]:
    """``(metric, labels matched in its selector, labels grouped by)`` for each metric an
    expression names. A small PromQL reader: strings, ranges and Grafana's $variables removed;
    a name followed by ``(`` is a function or an aggregation."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\$\w+", "0", text)
    label_values = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", text.strip())
    if label_values:
        return [(label_values.group(1), {label_values.group(2)}, set())]
    grouped = {label.strip() for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text)
               for label in group.split(",") if label.strip()}
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    found = []
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?", text):
        name, matchers, call = m.groups()
        if call or name in KEYWORDS:
            continue
        matched = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers or ""))
        found.append((name, matched, grouped))
    return found


def test_the_dashboard_has_queries_on_the_operators_metrics():
    found = [m for q in queries(json.loads(DASHBOARD.read_text())) for m in parse(q)]
    assert len(found) >= 15
    assert {name for name, _, _ in found} >= {"spmdjob_jobs", "spmdjob_leader", "spmdjob_gang_restarts_total",
                                              "spmdjob_time_to_running_seconds_bucket"}


def test_every_query_names_an_exported_metric_and_its_labels():
    metrics = exported()
    dashboard = json.loads(DASHBOARD.read_text())
    for query in queries(dashboard):
        names = parse(query)
        assert names, f"no metric in {query!r}"
        for name, matched, grouped in names:
            assert name in metrics, f"{query!r}: {name} is not exported (exported: {sorted(metrics)})"
            unknown = (matched | grouped) - metrics[name] - TARGET_LABELS
            # A label grouped by in an outer aggregation may come from another metric of the query.
            other = set().union(*(metrics[n] for n, _, _ in names if n in metrics))
            assert not (matched - metrics[name] - TARGET_LABELS), f"{query!r}: {name} has no label {matched - metrics[name]}"
            assert not (unknown - other), f"{query!r}: no metric of it has label(s) {unknown - other}"


@pytest.mark.parametrize("query, expected", [
    ('sum by (phase) (max by (namespace, phase) (spmdjob_jobs{namespace=~"$namespace"}))',
     [("spmdjob_jobs", {"namespace"}, {"phase", "namespace"})]),
    ("histogram_quantile(0.9, sum by (le) (rate(spmdjob_time_to_running_seconds_bucket[$__rate_interval])))",
     [("spmdjob_time_to_running_seconds_bucket", set(), {"le"})]),
    ("label_values(spmdjob_jobs, namespace)", [("spmdjob_jobs", {"namespace"}, set())]),
    ('sum(rate(a_total[5m])) / on(x) group_left b{y!="z"} offset 5m', [("a_total", set(), {"x"}), ("b", {"y"}, {"x"})]),
])
def test_the_promql_reader(query, expected):
    assert parse(query) == expected


def test_a_misspelt_metric_or_label_would_be_caught():
    metrics = exported()
    (name, _, _), = parse("sum(rate(spmdjob_gang_restart_total[5m]))")
    assert name not in metrics
    (name, matched, _), = parse('spmdjob_jobs{phaze="Running"}')
    assert matched - metrics[name] == {"phaze"}
