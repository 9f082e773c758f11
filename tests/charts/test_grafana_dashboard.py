"""The Grafana dashboard the chart ships (charts/mtrl-operator/dashboards/mtrl-runs.json):
valid against Grafana's own dashboard schema, every query valid PromQL that selects only series
the operator exports, with labels they carry, and packaged as a ConfigMap for the Grafana chart's
dashboard sidecar only when grafanaDashboard.enabled.

Grafana's schema comes from hack/dashboardcheck: grafana-foundation-sdk's Go types, which Grafana
Labs generates from the CUE kinds in the Grafana repository (the dashboard kind, each panel
plugin's options and each data source's query), decoded strictly; PromQL is parsed by
Prometheus's own parser. Its header says what it checks beyond the SDK."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from prometheus_client.metrics import MetricWrapperBase

from mtrl_operator import metrics
from tests.charts.test_chart import CHART, render

REPO = CHART.parents[1]
DASHBOARD = CHART / "dashboards" / "mtrl-runs.json"
BUILD_SCRIPT = REPO / "hack" / "build-dashboardcheck.sh"
SIDECAR_LABEL = {"grafana_dashboard": "1"}
# The series each metric type exposes (prometheus_client's exposition; _created unless disabled).
SERIES_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
                   "histogram": ("_bucket", "_count", "_sum", "_created")}

Check = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


@pytest.fixture(scope="module")
def dashboardcheck() -> Path:
    """The checker, built once per machine (hack/build-dashboardcheck.sh caches it)."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def check(dashboardcheck: Path, tmp_path: Path) -> Check:
    """Runs the checker on a dashboard: (exit status, its report)."""
    def run(board: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        path = tmp_path / "dashboard.json"
        path.write_text(json.dumps(board))
        out = subprocess.run([str(dashboardcheck), str(path)], capture_output=True, text=True,
                             check=False, timeout=60)
        assert out.returncode in (0, 1), out.stderr
        return out.returncode, json.loads(out.stdout)
    return run


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def exported_series() -> dict[str, set[str]]:
    """Every series name mtrl_operator.metrics exports, with the label names it carries."""
    collectors = [c for c in vars(metrics).values() if isinstance(c, MetricWrapperBase)]
    collectors += metrics.RUN_FIGURES.values()
    series: dict[str, set[str]] = {}
    for collector in collectors:
        # prometheus_client keeps a metric's label names only in this attribute.
        label_names = set(collector._labelnames)
        for family in collector.describe():
            for suffix in SERIES_SUFFIXES[family.type]:
                series[family.name + suffix] = label_names | ({"le"} if suffix == "_bucket" else set())
    return series


def unknown_series(queries: Iterable[dict[str, Any]]) -> list[str]:
    """What the dashboard's queries select that the operator does not export."""
    series = exported_series()
    wrong = []
    for query in queries:
        for selector in query["selectors"]:
            name = selector["metric"]
            if name not in series:
                wrong.append(f"{query['at']}: no metric {name}")
            elif missing := set(selector["labels"]) - series[name]:
                wrong.append(f"{query['at']}: {name} has no label {sorted(missing)}")
    return wrong


def test_the_dashboard_is_valid_for_grafana(check: Check) -> None:
    status, report = check(dashboard())
    assert report["problems"] == [] and status == 0


def test_every_query_selects_series_the_operator_exports(check: Check) -> None:
    _, report = check(dashboard())
    assert unknown_series(report["queries"]) == []
    shown = {s["metric"] for q in report["queries"] for s in q["selectors"]}
    per_run = {gauge.describe()[0].name for gauge in metrics.RUN_FIGURES.values()}
    assert per_run <= shown, per_run - shown
    assert {"mtrl_runs", "mtrl_reconcile_seconds_bucket", "mtrl_cloud_api_errors_total"} <= shown


def _panel(board: dict[str, Any], title: str) -> dict[str, Any]:
    panels: list[dict[str, Any]] = [p for p in board["panels"] if p["title"] == title]
    (panel,) = panels
    return panel


@pytest.mark.parametrize(("change", "reported"), [
    (lambda b: _panel(b, "Reward mean").update(colour="red"), "unexpected field 'colour'"),
    (lambda b: _panel(b, "Reward mean")["gridPos"].update(w="12"), "gridPos.w: json: cannot"),
    (lambda b: _panel(b, "Reward mean")["gridPos"].update(w=30), "gridPos.w: must be <= 24"),
    (lambda b: _panel(b, "Reward mean").update(type="timeserie"), 'panel type "timeserie"'),
    (lambda b: _panel(b, "Reward mean")["options"]["legend"].update(showLegend="yes"),
     "options.legend.showLegend"),
    (lambda b: _panel(b, "Reward mean")["targets"][0].update(query="up"), "unexpected field 'query'"),
    (lambda b: _panel(b, "Reward mean")["targets"][0].update(expr="rate(mtrl_run_step[5m]"),
     "parse error"),
    (lambda b: b["templating"]["list"][1].update(type="qurey"), 'unknown variable type "qurey"'),
    (lambda b: b.pop("schemaVersion"), "schemaVersion: required field is missing"),
], ids=["unknown-field", "wrong-type", "out-of-grid", "unknown-panel-type", "wrong-option-type",
        "unknown-query-field", "bad-promql", "unknown-variable-type", "no-schema-version"])
def test_the_checker_rejects_what_grafana_would_not_load(
        check: Check, change: Callable[[dict[str, Any]], None], reported: str) -> None:
    board = copy.deepcopy(dashboard())
    change(board)
    status, report = check(board)
    assert status == 1 and any(reported in p for p in report["problems"]), report["problems"]


@pytest.mark.parametrize(("expr", "reported"), [
    ('mtrl_run_steps{namespace=~"$namespace"}', "no metric mtrl_run_steps"),
    ('mtrl_run_step{namespace=~"$namespace", runs=~"$run"}', "has no label ['runs']"),
    ("sum by (phase) (mtrl_run_step)", "has no label ['phase']"),
    ("histogram_quantile(0.9, sum by (le) (rate(mtrl_reconcile_errors_total_bucket[5m])))",
     "no metric mtrl_reconcile_errors_total_bucket"),
], ids=["unknown-metric", "unknown-label", "unknown-grouping-label", "not-a-histogram"])
def test_a_query_of_a_series_not_exported_is_caught(check: Check, expr: str, reported: str) -> None:
    board = copy.deepcopy(dashboard())
    _panel(board, "Reward mean")["targets"][0]["expr"] = expr
    status, report = check(board)
    assert status == 0  # valid PromQL: only the comparison with metrics.py can tell
    assert any(reported in w for w in unknown_series(report["queries"]))


def _dashboard_configmaps(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "ConfigMap"
            and SIDECAR_LABEL.items() <= d["metadata"].get("labels", {}).items()]


def test_the_chart_ships_the_dashboard_for_grafanas_sidecar_when_enabled() -> None:
    (configmap,) = _dashboard_configmaps(render('grafanaDashboard={"enabled":true}'))
    assert configmap["metadata"]["namespace"] == "mtrl-system"
    assert configmap["data"] == {"mtrl-runs.json": DASHBOARD.read_text()}
    kubernetes_validate.validate(configmap, "1.34.0", strict=True)

    elsewhere = render('grafanaDashboard={"enabled":true,"namespace":"monitoring",'
                       '"annotations":{"grafana_folder":"MTRL"}}')
    (configmap,) = _dashboard_configmaps(elsewhere)
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "MTRL"}


def test_the_chart_ships_no_dashboard_by_default() -> None:
    assert _dashboard_configmaps(render()) == []
