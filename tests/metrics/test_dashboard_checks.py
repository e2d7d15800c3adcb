"""The checks the real-Prometheus test relies on, tested without any process: the metric-name
extractor must catch a dashboard that reads a metric nobody exports, and variables are filled in the
way Grafana fills them. Also the offset store's last-commit metric, which the lag-by-member panel joins on."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.registry import REGISTRY

from sluice.offsetstore.metrics import offset_store_metrics
from tests.metrics.dashboards import (
    Query,
    VariableQuery,
    dashboard_paths,
    exported_names,
    load,
    metric_names,
    queries,
    substitute,
    unexported,
    variable_queries,
)


def exposition() -> str:
    """Real exposition text from prometheus_client: a counter, a gauge and a histogram."""
    registry = CollectorRegistry()
    Counter("sluice_broker_records_in", "records", ["topic"], registry=registry).labels("t").inc()
    Gauge("sluice_broker_log_end_offset", "leo", ["topic", "partition"], registry=registry).labels(
        "t", "0"
    ).set(3)
    Histogram("sluice_broker_produce_flush_seconds", "flush", registry=registry).observe(0.001)
    return generate_latest(registry).decode()


def fake_dashboard(expr: str) -> dict[str, object]:
    return {
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": "topic",
                    "type": "query",
                    "query": {
                        "query": 'label_values(sluice_broker_log_end_offset{namespace=~"$namespace"}, topic)'
                    },
                },
            ]
        },
        "panels": [
            {
                "type": "row",
                "title": "r",
                "collapsed": True,
                "panels": [{"title": "p", "targets": [{"refId": "A", "expr": expr}]}],
            }
        ],
    }


def test_exported_names_are_the_sample_names() -> None:
    names = exported_names(exposition())
    assert {
        "sluice_broker_records_in_total",
        "sluice_broker_log_end_offset",
        "sluice_broker_produce_flush_seconds_bucket",
        "sluice_broker_produce_flush_seconds_count",
    } <= names
    assert not any(n.startswith("#") or "{" in n for n in names)


def test_metric_names_finds_every_sluice_metric_and_nothing_else() -> None:
    expr = (
        "sum by (le) (rate(sluice_broker_produce_flush_seconds_bucket"
        '{namespace=~"$namespace"}[$__rate_interval]))'
        " / on (topic) group_left sluice_broker_log_end_offset"
        '{topic="sluice_not_a_metric", x=~"$sluice_var"}'
    )
    assert metric_names(expr) == {
        "sluice_broker_produce_flush_seconds_bucket",
        "sluice_broker_log_end_offset",
    }


def test_a_dashboard_reading_a_metric_nobody_exports_fails() -> None:
    exported = exported_names(exposition())
    good = queries(
        "good.json", fake_dashboard('sum(rate(sluice_broker_records_in_total{namespace=~"$namespace"}[5m]))')
    )
    assert unexported(good, exported) == {}
    bad_expr = (
        "sum(rate(sluice_broker_records_in_total[5m]))"
        ' / sum(rate(sluice_does_not_exist_total{topic=~"$topic"}[5m]))'
    )
    bad = fake_dashboard(bad_expr)
    found = unexported(queries("bad.json", bad), exported)
    assert found == {"bad.json / 'p' / A": {"sluice_does_not_exist_total"}}
    # A variable's selector is checked the same way.
    variables = variable_queries("bad.json", bad)
    assert variables == [
        VariableQuery("bad.json", "topic", 'sluice_broker_log_end_offset{namespace=~"$namespace"}', "topic")
    ]
    assert unexported(variables, exported) == {}
    assert unexported([VariableQuery("v.json", "g", "sluice_does_not_exist", "group")], exported) == {
        "v.json / variable $g": {"sluice_does_not_exist"}
    }


def test_variables_are_filled_like_grafana_and_unknown_ones_fail() -> None:
    values = {"namespace": "ns", "topic": "(a|b)", "__rate_interval": "15s"}
    expr = 'rate(x{namespace=~"$namespace", topic=~"${topic}", t2=~"${topic:regex}", old=~"[[namespace]]"}'
    expr += "[$__rate_interval])"
    assert substitute(expr, values) == 'rate(x{namespace=~"ns", topic=~"(a|b)", t2=~"(a|b)", old=~"ns"}[15s])'
    with pytest.raises(KeyError, match="subscription"):
        substitute('x{subscription=~"$subscription"}', values)


def test_variable_queries_must_be_label_values() -> None:
    board = {"templating": {"list": [{"name": "v", "type": "query", "query": {"query": "query_result(up)"}}]}}
    with pytest.raises(ValueError, match="label_values"):
        variable_queries("x.json", board)
    var = {"name": "ns", "type": "query", "query": "label_values(namespace)"}
    plain = {"templating": {"list": [var]}}
    assert variable_queries("x.json", plain) == [VariableQuery("x.json", "ns", "", "namespace")]


@pytest.mark.parametrize("path", dashboard_paths(), ids=lambda p: p.name)
def test_chart_dashboards_parse(path: Path) -> None:
    """Every chart dashboard has queries, each reading a Sluice metric, and label_values variables."""
    board = load(path)
    found = queries(path.name, board)
    assert found
    assert all(isinstance(q, Query) and metric_names(q.expr) for q in found)
    assert {v.name for v in variable_queries(path.name, board)} >= {"namespace"}


def test_last_commit_metric_follows_the_committing_member() -> None:
    m = offset_store_metrics()
    key = {"group": "unit-g", "track": "default", "topic": "unit-t", "partition": "0"}
    name = "sluice_offset_store_last_commit_timestamp_seconds"
    m.committed("unit-g", "default", "unit-t", 0, "member-a", 5)
    assert REGISTRY.get_sample_value(name, {**key, "member": "member-a"})
    m.committed("unit-g", "default", "unit-t", 0, "member-b", 9)
    assert REGISTRY.get_sample_value(name, {**key, "member": "member-a"}) is None  # one series per partition
    assert REGISTRY.get_sample_value(name, {**key, "member": "member-b"})
    assert REGISTRY.get_sample_value("sluice_offset_store_committed_offset", key) == 9
