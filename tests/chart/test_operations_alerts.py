"""The operations alerts (charts/sluice/alerts/operations.yaml) under a real `promtool test rules`: for each
alert, synthetic series that must make it fire (after its `for`, not before) with the labels and the
annotations an operator will read, beside series that must not (another job, a healthy subscription, a
slowly filling disk). docs/operations.md has the runbook of each; every alert must have one."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.chart.alert_cases import Case, rules_of, run_promtool, runbook_headings, series
from tests.chart.chartlib import CHART

RULES = CHART / "alerts" / "operations.yaml"
MiB = 1024**2
GiB = 1024**3
CASES = [
    Case(
        "SluiceServiceDown",
        [
            series("up", "1 1 0x10", job="broker", instance="b0"),
            series("up", "1x12", job="broker", instance="b1"),
            series("up", "0x12", job="someone-elses", instance="x"),
        ],
        quiet_at="3m",
        fires_at="5m",
        labels={"job": "broker", "instance": "b0"},
    ),
    Case(
        "SluiceNoCoordinatorLeader",
        [
            series("sluice_coordinator_election_leader", "1 1 0x10", job="coordinator", instance="c0"),
            series("sluice_coordinator_election_leader", "0x12", job="coordinator", instance="c1"),
        ],
        quiet_at="2m",
        fires_at="4m",
        labels={},
    ),
    Case(
        "SluiceInternalErrors",
        [
            series(
                "sluice_internal_errors_total", "0x5 1x10", job="broker", service="broker", method="Produce"
            ),
            series("sluice_internal_errors_total", "0x15", job="broker", service="broker", method="Fetch"),
        ],
        quiet_at="4m",
        fires_at="7m",
        labels={"job": "broker", "method": "Produce"},
    ),
    Case(
        "SluiceProduceErrorRate",
        [
            series("sluice_broker_rpc_requests_total", "0+90x40", method="Produce", code="OK"),
            series("sluice_broker_rpc_requests_total", "0x5 0+10x35", method="Produce", code="STORAGE_FULL"),
            series("sluice_broker_rpc_errors_total", "0x5 0+10x35", method="Produce", code="STORAGE_FULL"),
            # Fetch errors are not produce errors.
            series("sluice_broker_rpc_requests_total", "0+100x40", method="Fetch", code="OK"),
            series("sluice_broker_rpc_errors_total", "0+100x40", method="Fetch", code="NOT_LEADER"),
        ],
        quiet_at="12m",
        fires_at="30m",
        labels={},
        value="10%",
    ),
    Case(
        "SluiceConsumerLagGrowing",
        [
            series("sluice_coordinator_consumer_lag_seconds", "0+60x40", group="g", topic="t", partition="0"),
            series("sluice_coordinator_consumer_lag_seconds", "0+1x40", group="g", topic="t", partition="1"),
            # Far behind, but not falling further: a backlog being worked off is no page.
            series(
                "sluice_coordinator_consumer_lag_seconds", "3600x40", group="steady", topic="t", partition="0"
            ),
        ],
        quiet_at="15m",
        fires_at="30m",
        labels={"group": "g", "topic": "t"},
        value="30m 0s",
    ),
    Case(
        "SluiceDeadLettersGrowing",
        [
            series("sluice_dispatcher_dlq_messages_total", "0x5 6x10", topic="t", subscription="s"),
            series("sluice_dispatcher_dlq_messages_total", "4x15", topic="t", subscription="old"),
        ],
        quiet_at="5m",
        fires_at="8m",
        labels={"topic": "t", "subscription": "s"},
        value="6",
    ),
    Case(
        "SluiceRedeliveryStorm",
        [
            series("sluice_dispatcher_redeliveries_total", "0+120x30", topic="t", subscription="s"),
            series("sluice_dispatcher_dispatched_messages_total", "0+180x30", topic="t", subscription="s"),
            # 0.5/s redelivered of 10/s: nacks happen.
            series("sluice_dispatcher_redeliveries_total", "0+30x30", topic="t", subscription="ok"),
            series("sluice_dispatcher_dispatched_messages_total", "0+600x30", topic="t", subscription="ok"),
        ],
        quiet_at="9m",
        fires_at="15m",
        labels={"topic": "t", "subscription": "s"},
    ),
    Case(
        "SluiceQuotaThrottling",
        [
            series(
                "sluice_quota_throttle_seconds_total", "0+45x30", resource="produce_bytes", entity="user:a"
            ),
            series(
                "sluice_quota_throttle_seconds_total", "0+6x30", resource="produce_bytes", entity="user:b"
            ),
        ],
        quiet_at="14m",
        fires_at="20m",
        labels={"resource": "produce_bytes", "entity": "user:a"},
    ),
    Case(
        "SluiceBrokerDiskFilling",
        [
            # 100 MiB less a minute from 100 GiB: the 1 GiB minimum is 17 hours away.
            series(
                "sluice_broker_disk_free_bytes", f"{100 * GiB}-{100 * MiB}x80", instance="b0", log_dir="/data"
            ),
            series("sluice_broker_disk_min_free_bytes", f"{GiB}x80", instance="b0", log_dir="/data"),
            # 1 MiB less a minute: 1.4 GiB a day, no alert.
            series("sluice_broker_disk_free_bytes", f"{100 * GiB}-{MiB}x80", instance="b1", log_dir="/data"),
            series("sluice_broker_disk_min_free_bytes", f"{GiB}x80", instance="b1", log_dir="/data"),
        ],
        quiet_at="20m",
        fires_at="60m",
        labels={"instance": "b0", "log_dir": "/data"},
    ),
    Case(
        "SluiceRedisUnavailable",
        [
            series(
                "sluice_offset_store_rpc_errors_total",
                "0x3 0+5x10",
                method="CommitOffsets",
                code="STORAGE_ERROR",
            ),
            series(
                "sluice_offset_store_rpc_errors_total",
                "0+5x14",
                method="CommitOffsets",
                code="UNKNOWN_MEMBER",
            ),
            series("sluice_dispatcher_cursor_flushes_total", "0+10x14", result="ok"),
        ],
        quiet_at="4m",
        fires_at="8m",
        labels={},
    ),
    Case(
        "SluiceRedisUnavailable",
        [
            series("sluice_dispatcher_cursor_flushes_total", "0x3 0+1x10", result="error"),
            series("sluice_dispatcher_cursor_flushes_total", "0+10x14", result="ok"),
        ],
        quiet_at="4m",
        fires_at="8m",
        labels={},
    ),
    Case(
        "SluiceBrokerMemoryPaused",
        [
            series("sluice_broker_memory_paused_total", "0+120x30", instance="b0", pool="produce"),
            series("sluice_broker_memory_paused_total", "0+10x30", instance="b0", pool="fetch"),
        ],
        quiet_at="9m",
        fires_at="15m",
        labels={"instance": "b0", "pool": "produce"},
    ),
    Case(
        "SluiceDispatcherMemoryPaused",
        [
            series("sluice_dispatcher_memory_budget_paused_subscriptions", "0 0 3x20", instance="d0"),
            series("sluice_dispatcher_memory_budget_paused_subscriptions", "0x22", instance="d1"),
        ],
        quiet_at="11m",
        fires_at="13m",
        labels={"instance": "d0"},
        value="3",
    ),
]


def test_every_alert_has_a_case_and_a_runbook_section() -> None:
    names = set(rules_of(RULES))
    assert {c.alert for c in CASES} == names
    headings = runbook_headings()
    shipped = {
        r["alert"]
        for f in (CHART / "alerts").glob("*.yaml")
        for g in yaml.safe_load(f.read_text())["groups"]
        for r in g["rules"]
    }
    assert shipped <= headings, (
        f"alerts without a runbook section in docs/operations.md: {shipped - headings}"
    )


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    run_promtool(RULES, CASES, tmp_path)
