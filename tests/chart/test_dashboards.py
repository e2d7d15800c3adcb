"""Dashboards ship as ConfigMaps the Grafana sidecar finds, with valid JSON querying Sluice metrics."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.chart.chartlib import CHART, Manifest, find, render

DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
# A metric name is a run of name characters followed by a selector, a range or a call's end.
METRIC = re.compile(r"\b(sluice_[a-z0-9_]+)\b")


def targets(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        found += panel.get("targets", [])
        for inner in panel.get("panels", []):  # collapsed rows keep their panels inside
            found += inner.get("targets", [])
    return found


def test_there_is_at_least_one_dashboard() -> None:
    assert DASHBOARDS, "charts/sluice/dashboards/*.json is empty"


@pytest.fixture(scope="module")
def configmaps() -> list[Manifest]:
    return [m for m in find(render(), "ConfigMap") if "-dashboard-" in m["metadata"]["name"]]


def test_one_labelled_configmap_per_dashboard_file(configmaps: list[Manifest]) -> None:
    assert len(configmaps) == len(DASHBOARDS)
    keys = set()
    for cm in configmaps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        (key,) = cm["data"]
        keys.add(key)
    assert keys == {p.name for p in DASHBOARDS}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_json_is_valid_and_shipped_unchanged(path: Any, configmaps: list[Manifest]) -> None:
    source = json.loads(path.read_text())
    (cm,) = [c for c in configmaps if path.name in c["data"]]
    assert json.loads(cm["data"][path.name]) == source
    assert source["uid"]
    assert source["title"]
    assert {v["name"] for v in source["templating"]["list"]} >= {"datasource", "namespace"}
    exprs = [t["expr"] for t in targets(source)]
    assert exprs, "a dashboard without queries"
    for expr in exprs:
        assert METRIC.search(expr), f"{path.name}: query reads no sluice_ metric: {expr}"
        assert "$namespace" in expr, f"{path.name}: query is not templated by namespace: {expr}"


def test_dashboards_can_be_turned_off_and_relabelled() -> None:
    off = render(sets=["monitoring.dashboards.enabled=false"])
    assert not [m for m in find(off, "ConfigMap") if "-dashboard-" in m["metadata"]["name"]]
    moved = render(sets=["monitoring.dashboards.namespace=grafana", "monitoring.dashboards.labels.team=ops"])
    cms = [m for m in find(moved, "ConfigMap") if "-dashboard-" in m["metadata"]["name"]]
    assert all(cm["metadata"]["namespace"] == "grafana" for cm in cms)
    assert all(cm["metadata"]["labels"]["team"] == "ops" for cm in cms)
