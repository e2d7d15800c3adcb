"""Every query of every chart dashboard, evaluated by a real Prometheus scraping the real services.

`sluice up` runs the whole stack on loopback; a Prometheus (Debian package) scrapes each service's
/metrics every second, adding the `namespace` label the Prometheus Operator would add; the SDK
workload (tests/metrics/workload.py) produces, fetches, consumes with a group (a rebalance, a fenced
member), consumes a push subscription with nacks (redeliveries, dead letters) and a blocked consumer,
and makes every service refuse a request. Then, with the workload still running, each panel query
(its template variables filled in as Grafana would) must return data, each variable query must find
the workload's topic, group and subscriptions, and no query may read a metric no service exports.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sluice.server.metrics import sluice_version
from tests.metrics.alerts import declared_names, signals
from tests.metrics.alerts import rules as alert_rules
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
from tests.metrics.prometheus import Prometheus, Target, has_number, run_prometheus
from tests.metrics.workload import BLOCKED_SUBSCRIPTION, GROUP, SUBSCRIPTION, TOPIC, Workload, scrape

NAMESPACE = "sluice-test"
SERVICES = ("coordinator", "broker", "offset-store", "dispatcher", "scheduler")
BOOTSTRAP = re.compile(r"Bootstrap: (\S+)")
# The scheduler serves no gRPC: its line has "(delayed delivery)" where the others have an address.
SERVICE_LINE = re.compile(
    r"^\s+(?P<service>[a-z-]+)\s+(?:\S+:\d+|\(delayed delivery\))\s+metrics http://(?P<metrics>[^/\s]+)/metrics"
)
# Grafana's values for the variables: a multi-value selection becomes a regex alternation.
VALUES = {
    "namespace": NAMESPACE,
    "topic": TOPIC,
    "group": GROUP,
    "subscription": f"({SUBSCRIPTION}|{BLOCKED_SUBSCRIPTION})",
    "__rate_interval": "15s",
    "__interval": "1s",
    "__range": "1m",
}
EXPECTED_VARIABLE_VALUES = {
    "namespace": {NAMESPACE},
    "topic": {TOPIC},
    "group": {GROUP},
    "subscription": {SUBSCRIPTION, BLOCKED_SUBSCRIPTION},
}
DASHBOARDS = {p.name: load(p) for p in dashboard_paths()}


@dataclass(frozen=True)
class Stack:
    bootstrap: str
    metrics: dict[str, str]  # service -> host:port


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`sluice up --port 0` with every service, a process each and brokers flushing on every produce (as the
    chart runs them; the combined mode's every metrics port serves the one process's registry, docs/cli.md),
    and the coordinator refreshing consumer lag every second."""
    tmp = tmp_path_factory.mktemp("stack")
    env = dict(os.environ, SLUICE_COORDINATOR_GROUP_LAG_INTERVAL="1s")
    argv = [
        sys.executable,
        "-m",
        "sluice",
        "up",
        "--data-dir",
        str(tmp / "data"),
        "--port",
        "0",
        "--flush",
        "always",
        "--processes",
        "separate",
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp, env=env
    )
    stdout = proc.stdout
    assert stdout is not None
    seen: list[str] = []
    metrics: dict[str, str] = {}
    drain = threading.Thread(target=lambda: seen.extend(stdout), daemon=True)
    try:
        bootstrap = ""
        for line in stdout:  # the banner comes once every service printed its ready line
            seen.append(line)
            if m := BOOTSTRAP.search(line):
                bootstrap = m.group(1)
            elif bootstrap and (m := SERVICE_LINE.match(line)):
                metrics[m.group("service")] = m.group("metrics")
            elif bootstrap and line.startswith("Logs:"):
                break
        if not bootstrap:
            raise RuntimeError("sluice up exited before it was ready:\n" + "".join(seen))
        assert set(metrics) == set(SERVICES), f"sluice up did not start every service:\n{''.join(seen)}"
        drain.start()  # keep reading, so a chatty stack never blocks on a full pipe
        yield Stack(bootstrap, metrics)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if drain.is_alive():
            drain.join(10)
        stdout.close()


@dataclass(frozen=True)
class Observed:
    prometheus: Prometheus
    started: float  # Unix time the scrapes began
    exported: set[str]  # sample names the services' /metrics returned after the workload


@pytest.fixture(scope="module")
def observed(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    targets = [Target(service, address) for service, address in stack.metrics.items()]
    with run_prometheus(tmp_path_factory.mktemp("prometheus"), targets, {"namespace": NAMESPACE}) as prom:
        prom.wait_targets_up(len(targets))
        started = time.time()
        workload = Workload(stack.bootstrap, stack.metrics)
        try:
            workload.scenario()
            workload.start()
            workload.wait_for_dead_letters()
            # The rebalances above may all fall between two scrapes of a loaded machine; one more, once
            # Prometheus holds the group's rebalance count, is one its rate() must see.
            selector = f'namespace="{NAMESPACE}", group="{GROUP}"'
            rebalances = f"sluice_coordinator_rebalance_duration_seconds_count{{{selector}}}"
            prom.wait_until(rebalances)
            workload.join_and_leave()
            prom.wait_until(f"increase({rebalances}[15s]) > 0")
            # A few scrapes after the last series appeared, so rate() has two samples of it at
            # several steps of the range queries.
            prom.wait_scraped_after(time.time() + 3, f'namespace="{NAMESPACE}"', len(targets))
            exported: set[str] = set()
            for address in stack.metrics.values():
                exported |= exported_names(scrape(address))
            yield Observed(prom, started, exported)
        finally:
            workload.stop()


def all_queries() -> list[Query]:
    return [q for name, d in DASHBOARDS.items() for q in queries(name, d)]


def all_variable_queries() -> list[VariableQuery]:
    return [v for name, d in DASHBOARDS.items() for v in variable_queries(name, d)]


def test_the_chart_has_the_three_dashboards() -> None:
    assert {"overview.json", "consumer-groups.json", "push-subscriptions.json"} <= set(DASHBOARDS)
    for name, dashboard in DASHBOARDS.items():
        variables = {v["name"] for v in dashboard["templating"]["list"]}
        assert "namespace" in variables, name
        for q in queries(name, dashboard):
            assert "$__rate_interval" in q.expr or "rate(" not in q.expr, f"{q.where}: use $__rate_interval"


def test_every_dashboard_query_returns_data(observed: Observed) -> None:
    """Instant (what a stat panel shows, now) and range (what a graph draws since the workload began):
    the instant result must not be empty and the range must hold at least one number."""
    failures = []
    end = time.time()
    for q in all_queries():
        expr = substitute(q.expr, VALUES)
        instant = observed.prometheus.query(expr, at=end)
        if not instant:
            failures.append(f"{q.where}: empty instant result for {expr}")
            continue
        series = observed.prometheus.query_range(expr, observed.started, end)
        if not has_number(series):
            failures.append(f"{q.where}: no number over the workload's time range (only NaN) for {expr}")
    assert not failures, "\n".join(failures)


def test_every_variable_query_finds_the_workload(observed: Observed) -> None:
    failures = []
    for v in all_variable_queries():
        selector = substitute(v.selector, VALUES)
        found = set(observed.prometheus.label_values(v.label, selector, observed.started, time.time()))
        missing = EXPECTED_VARIABLE_VALUES[v.name] - found
        if missing:
            failures.append(
                f"{v.dashboard} ${v.name}: label_values({selector}, {v.label}) lacks {missing}: {found}"
            )
    assert not failures, "\n".join(failures)


def test_dashboards_read_only_metrics_the_services_export(observed: Observed) -> None:
    missing = unexported([*all_queries(), *all_variable_queries()], observed.exported)
    assert not missing, f"dashboards read metrics no service exports: {missing}"


def panel_expr(dashboard: str, title: str, ref_id: str = "A") -> str:
    (query,) = [
        q for q in queries(dashboard, DASHBOARDS[dashboard]) if q.panel == title and q.ref_id == ref_id
    ]
    return substitute(query.expr, VALUES)


def peak(observed: Observed, expr: str) -> tuple[float, list[dict[str, str]]]:
    """The largest number a graph of ``expr`` shows over the workload, and the series' labels."""
    series = observed.prometheus.query_range(expr, observed.started, time.time())
    values = [float(v) for s in series for _, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]
    return max(values, default=0.0), [s["metric"] for s in series]


@pytest.mark.parametrize(
    ("dashboard", "title"),
    [
        ("push-subscriptions.json", "Blocked consumers by subscription"),
        ("push-subscriptions.json", "Redelivery rate"),
        ("push-subscriptions.json", "Dead-letter rate"),
        ("push-subscriptions.json", "Permits outstanding by subscription"),
        ("consumer-groups.json", "Rebalance duration"),
        ("consumer-groups.json", "Members by group"),
        ("overview.json", "Produce flush latency"),
        ("overview.json", "Fetch: records/s by topic"),
        ("overview.json", "Log size by partition"),
    ],
)
def test_the_dashboards_show_what_the_workload_did(observed: Observed, dashboard: str, title: str) -> None:
    """Not only data, but the events: a blocked consumer, redeliveries, dead letters, a rebalance."""
    value, _ = peak(observed, panel_expr(dashboard, title))
    assert value > 0, f"{dashboard} / {title!r} never showed more than 0"


def test_lag_is_attributed_to_members(observed: Observed) -> None:
    _, labels = peak(observed, panel_expr("consumer-groups.json", "Lag by member"))
    assert {lbl["group"] for lbl in labels} == {GROUP}
    assert all(lbl.get("member") for lbl in labels), labels


# Alerts whose measured series exist only once the trouble they watch for has happened (an internal error,
# a Redis failure: tests/metrics/test_alerts_real_events.py, a throttled principal, a memory budget paused, an
# unclean election): against the healthy workload their signals are empty. promtool unit-tests them
# (tests/chart/test_operations_alerts.py); here they must run and read only declared metrics.
EVENT_ONLY = {
    "SluiceInternalErrors",
    "SluiceRedisUnavailable",
    "SluiceQuotaThrottling",
    "SluiceBrokerMemoryPaused",
    "SluiceDispatcherMemoryPaused",
    "SluiceUncleanLeaderElection",
}


def test_every_alert_expression_evaluates_against_the_scrape(stack: Stack, observed: Observed) -> None:
    """Each rule's expression runs in the real Prometheus; each metric it reads is one a service declares;
    and, but for the EVENT_ONLY alerts, what it compares to its threshold returns data now."""
    declared = set(observed.exported)
    for address in stack.metrics.values():
        declared |= declared_names(scrape(address))
    failures = []
    for rule in alert_rules():
        where = f"{rule.file} / {rule.alert}"
        observed.prometheus.query(rule.expr)  # raises on a query Prometheus refuses
        if unknown := metric_names(rule.expr) - declared:
            failures.append(f"{where}: reads metrics no service declares: {unknown}")
        if rule.alert in EVENT_ONLY:
            continue
        for measured in signals(rule.expr):
            if not observed.prometheus.query(measured):
                failures.append(f"{where}: no data for {measured!r}")
    assert not failures, "\n".join(failures)


def test_every_service_reports_its_build(observed: Observed) -> None:
    """sluice_build_info{service, version, python} = 1 from each of the four processes, with the installed
    version (what the Resources dashboard's version panels and the upgrade notes count)."""
    series = observed.prometheus.query(f'sluice_build_info{{namespace="{NAMESPACE}"}}')
    assert {s["metric"]["job"]: s["metric"]["service"] for s in series} == {s: s for s in SERVICES}
    assert {s["metric"]["version"] for s in series} == {sluice_version()}
    assert sluice_version() != "unknown"
    assert all(s["value"][1] == "1" for s in series)
