"""Where a record's time goes is visible (docs/latency.md): a record produced and fetched through a real
broker feeds the broker's stage histograms, its event-loop lag probe, and the SDK's client-side stages."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable

from sluice import Client
from sluice.client import stages
from sluice.codec.batch import Record

from .conftest import Cluster


def _count(cluster: Cluster, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"http://{cluster.broker.metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf"^{name}_count[{{]{labels}[}}] (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_produced_and_followed_record_feeds_every_stage(
    cluster: Cluster, client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    before = {name: s["count"] for name, s in stages.snapshot().items()}
    produced = _count(cluster, "sluice_broker_stage_seconds", 'stage="produce"')
    answered = _count(cluster, "sluice_broker_stage_seconds", 'stage="follow_answer"')
    fetcher = client.fetcher({(topic, 0): 0}, max_wait_ms=200)
    try:
        assert fetcher.fetch() == []  # the fetch is followed on the broker from now on
        producer = client.producer(topic, linger=0)
        producer.send(b"v").result(10)
        got: list[Record] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = fetcher.fetch()
        assert [r.value for r in got] == [b"v"]
        producer.close()
    finally:
        fetcher.close()
    after = {name: s["count"] for name, s in stages.snapshot().items()}
    assert all(after[name] > before[name] for name in stages.STAGES), (before, after)
    assert _count(cluster, "sluice_broker_stage_seconds", 'stage="produce"') > produced
    assert _count(cluster, "sluice_broker_stage_seconds", 'stage="follow_answer"') > answered
    assert _count(cluster, "sluice_event_loop_lag_seconds", 'service="broker"') > 0
