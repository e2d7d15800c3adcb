"""The delayed-delivery alerts (charts/sluice/alerts/delayed-delivery.yaml) under a real `promtool test
rules`: synthetic scheduler series that must make each alert fire (after its `for`, not before) with the
labels and annotations an operator reads, beside series that must not (a healthy namespace)."""

from __future__ import annotations

from pathlib import Path

from tests.chart.alert_cases import NS, Case, rules_of, run_promtool, runbook_headings, series
from tests.chart.chartlib import CHART

RULES = CHART / "alerts" / "delayed-delivery.yaml"


def _lateness(namespace: str, per_minute: dict[str, str]) -> list[dict[str, str]]:
    """The lateness histogram's cumulative buckets: ``per_minute`` maps ``le`` to its counter values."""
    out = []
    for le, values in per_minute.items():
        s = series("sluice_scheduler_lateness_seconds_bucket", values, le=le)
        s["series"] = s["series"].replace(f'namespace="{NS}"', f'namespace="{namespace}"')
        out.append(s)
    return out


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
    assert {c.alert for c in CASES} == set(rules_of(RULES))
    assert set(rules_of(RULES)) <= runbook_headings()


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    run_promtool(RULES, CASES, tmp_path)
