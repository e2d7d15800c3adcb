"""The delayed-delivery alerts (charts/sluice/alerts/delayed-delivery.yaml) under a real `promtool test
rules`: synthetic scheduler series that must make each alert fire (after its `for`, not before) with the
labels and annotations an operator reads, beside series that must not (a healthy namespace)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.chart.chartlib import CHART, ROOT
from tests.chart.test_alert_rules import promtool
from tests.chart.test_operations_alerts import TEMPLATE, Case, series

RULES = CHART / "alerts" / "delayed-delivery.yaml"
RUNBOOK = ROOT / "docs" / "operations.md"
NS = "shop"


def _rules() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def _lateness(namespace: str, per_minute: dict[str, str]) -> list[dict[str, str]]:
    """The lateness histogram's cumulative buckets: ``per_minute`` maps ``le`` to its counter values."""
    out = []
    for le, values in per_minute.items():
        s = series("sluice_scheduler_lateness_seconds_bucket", values, le=le)
        s["series"] = s["series"].replace(f'namespace="{NS}"', f'namespace="{namespace}"')
        out.append(s)
    return out


def expected(case: Case) -> dict[str, Any]:
    rule = _rules()[case.alert]
    labels = {"namespace": NS, **case.labels}

    def fill(m: re.Match[str]) -> str:
        return case.value if m.group(1) == "value" else labels[m.group(2)]

    return {
        "exp_labels": {**labels, **rule["labels"]},
        "exp_annotations": {k: TEMPLATE.sub(fill, v) for k, v in rule["annotations"].items()},
    }


CASES = [
    Case(
        "SluiceDelayedDeliveryLate",
        [
            # On time for 5 minutes, then every record 1-2.5 s late (600 records a minute).
            *_lateness(NS, {"0.1": "0+600x5 3000x30", "1.0": "0+600x5 3000x30", "2.5": "0+600x35"}),
            *_lateness(NS, {"+Inf": "0+600x35"}),
            # Another namespace delivering on time throughout.
            *_lateness("ok", {"0.1": "0+600x35", "1.0": "0+600x35", "2.5": "0+600x35", "+Inf": "0+600x35"}),
        ],
        quiet_at="12m",
        fires_at="25m",
        labels={},
        value="2.485s",
    ),
    Case(
        "SluiceDelayedDeliveryStalled",
        [
            series("sluice_scheduler_overdue_seconds", "0x5 0+60x20", job="scheduler", instance="s0"),
            # Due records taken within a second: no stall.
            series("sluice_scheduler_overdue_seconds", "0.2x25", job="scheduler", instance="s1"),
        ],
        quiet_at="9m",
        fires_at="14m",
        labels={},
        value="8m 0s",
    ),
    Case(
        "SluiceSchedulerErrors",
        [
            series("sluice_scheduler_errors_total", "0x5 0+1x20", job="scheduler", stage="deliver"),
            series("sluice_scheduler_errors_total", "0x25", job="scheduler", stage="read"),
        ],
        quiet_at="7m",
        fires_at="20m",
        labels={"stage": "deliver"},
        value="10",
    ),
]


def test_every_alert_has_a_case_and_a_runbook_section() -> None:
    assert {c.alert for c in CASES} == set(_rules())
    headings = set(re.findall(r"^### (Sluice\w+)", RUNBOOK.read_text(), re.M))
    assert set(_rules()) <= headings


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": f"{c.alert} #{i}",
                "interval": c.interval,
                "input_series": c.inputs,
                "alert_rule_test": [
                    {"eval_time": c.quiet_at, "alertname": c.alert, "exp_alerts": []},
                    {"eval_time": c.fires_at, "alertname": c.alert, "exp_alerts": [expected(c)]},
                ],
            }
            for i, c in enumerate(CASES)
        ],
    }
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
