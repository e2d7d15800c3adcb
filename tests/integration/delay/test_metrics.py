"""The scheduler's /metrics and /healthz (docs/metrics.md, "Scheduler"), read from the real process."""

from __future__ import annotations

import time
import urllib.request
from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.delay.conftest import DelayCluster, collect

DUE_SOON = 300
FAR = 7


def _scrape(address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def _wait_metric(address: str, name: str, want: float, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    m = _scrape(address)
    while m.get(name) != want and time.monotonic() < deadline:
        time.sleep(0.2)
        m = _scrape(address)
    return m


def test_metrics_count_deliveries_lateness_and_pending_across_a_restart(delay_cluster: DelayCluster) -> None:
    client = delay_cluster.client()
    topic = delay_cluster.topic(1)
    producer = client.producer(topic)
    for i in range(DUE_SOON):
        producer.send(str(i).encode(), deliver_after=timedelta(milliseconds=500 + i))
    for i in range(FAR):
        producer.send(b"far", deliver_after=timedelta(hours=1 + i))
    producer.flush(30)
    producer.close()
    assert len(collect(client, topic, 1, DUE_SOON, timeout=30)) == DUE_SOON
    address = delay_cluster.scheduler.metrics
    m = _wait_metric(address, "sluice_scheduler_delivered_records_total", DUE_SOON, 10)
    assert m["sluice_scheduler_delivered_records_total"] == DUE_SOON
    assert m["sluice_scheduler_due_records_total"] == DUE_SOON
    assert m["sluice_scheduler_read_records_total"] == DUE_SOON + FAR
    assert m["sluice_scheduler_lateness_seconds_count"] == DUE_SOON
    # Every record was acknowledged within 30 s of its due time (the histogram's +Inf is all of them).
    assert m["sluice_scheduler_lateness_seconds_bucket{le=30.0}"] == DUE_SOON
    assert m["sluice_scheduler_append_batch_records_sum"] == DUE_SOON
    assert m["sluice_scheduler_pending_records"] == FAR  # the far ones, on disk
    assert m["sluice_scheduler_in_memory_records"] == 0
    assert m["sluice_scheduler_overdue_seconds"] == 0
    assert m["sluice_scheduler_errors_total{stage=deliver}"] == 0
    with urllib.request.urlopen(f"http://{address}/healthz", timeout=10) as r:
        assert r.status == 200
    # A new process counts the pending records from its bucket files.
    delay_cluster.restart_scheduler()
    m = _scrape(delay_cluster.scheduler.metrics)
    assert m["sluice_scheduler_pending_records"] == FAR
    assert m["sluice_scheduler_delivered_records_total"] == 0
