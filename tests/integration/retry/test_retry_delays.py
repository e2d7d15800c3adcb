"""reconsume_later end to end: delays per level, the DLQ after max_reconsume_times, across restarts."""

from __future__ import annotations

import time
from typing import Any

from sluice import Client
from sluice.client.consumer import Consumer
from sluice.codec.batch import Record
from sluice.retry.levels import H_COUNT, dlq_topic, retry_info, retry_topic
from tests.integration.retry.conftest import CFG, RetryCluster, read_all

#: Level 3 is the first retry's: 1 s, then 1.5 s, then 2 s.
LEVELS = "100ms 200ms 1s 1500ms 2s 2500ms 3s"
#: 18 short levels: 16 retries take about a second of waiting.
FAST = " ".join(["50ms"] * 18)
TOLERANCE = 0.2


def _produce(client: Client, topic: str, value: bytes) -> tuple[int, int]:
    with client.producer(topic) as p:
        md = p.send(value, key=b"k", headers={"app": b"1"}).result(10)
    return md.partition, md.offset


def _next(consumer: Consumer, value: bytes, timeout: float = 30.0) -> tuple[Record, float]:
    """The next record with ``value`` and when poll() returned it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in consumer.poll(0.05):
            if r.value == value:
                return r, time.time()
    raise AssertionError(f"{value!r} did not come within {timeout}s")


def test_three_failures_come_back_at_the_configured_delays(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(2, "rd"), cluster.group()
    client = cluster.client()
    consumer = client.consumer(group, [topic], retry_delay_levels=LEVELS, **CFG)
    part, off = _produce(client, topic, b"v1")
    record, _ = _next(consumer, b"v1")
    assert (record.topic, record.partition, record.offset) == (topic, part, off)
    expected = [1.0, 1.5, 2.0]
    lateness = []
    for i, delay in enumerate(expected):
        failed_at = time.time()
        outcome = consumer.reconsume_later(record)
        assert outcome.topic == retry_topic(group)
        assert outcome.level == 3 + i
        assert not outcome.deduplicated
        record, got_at = _next(consumer, b"v1")
        waited = got_at - failed_at
        lateness.append(waited - delay)
        assert abs(waited - delay) <= TOLERANCE, f"retry {i + 1}: came after {waited:.3f}s, expected {delay}s"
        info = retry_info(record.headers)
        assert info is not None
        assert (info.topic, info.partition, info.offset, info.count) == (
            topic,
            part,
            off,
            i + 1,
        )
        assert record.headers["app"] == b"1"
        assert record.key == b"k"
    consumer.commit()  # success: nothing comes again
    assert all(r.value != b"v1" for r in consumer.poll(1.5))
    consumer.close()
    print("lateness per retry (s):", [round(x, 3) for x in lateness])


def _fail_until_dlq(consumer: Consumer, value: bytes, between: Any = None) -> int:
    """Fail ``value`` every time it comes until it is dead-lettered; the retries written."""
    written = 0
    for i in range(40):
        record, _ = _next(consumer, value)
        if between is not None:
            between(i)
        outcome = consumer.reconsume_later(record)
        written += not outcome.deduplicated
        if outcome.dead_lettered:
            return written
    raise AssertionError("never dead-lettered")


def test_seventeen_failures_land_in_the_dlq_with_the_original_coordinates(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "rq"), cluster.group()
    client = cluster.client()
    consumer = client.consumer(group, [topic], retry_delay_levels=FAST, **CFG)
    part, off = _produce(client, topic, b"v2")
    assert _fail_until_dlq(consumer, b"v2") == 17
    dead = read_all(client, dlq_topic(group))
    assert len(dead) == 1
    info = retry_info(dead[0].headers)
    assert info is not None
    assert (info.topic, info.partition, info.offset) == (topic, part, off)
    assert dead[0].headers[H_COUNT] == b"17"
    assert dead[0].value == b"v2"
    assert all(r.value != b"v2" for r in consumer.poll(1.0)), "a dead letter is not consumed again"
    consumer.close()


def test_retry_and_dlq_survive_coordinator_and_broker_restarts(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "rr"), cluster.group()
    client = cluster.client()
    cfg = {**CFG, "retry_delay_levels": "100ms 200ms 1s 1s 1s " + " ".join(["100ms"] * 13)}
    consumer = client.consumer(group, [topic], **cfg)
    _produce(client, topic, b"v3")
    record, _ = _next(consumer, b"v3")
    failed_at = time.time()
    due = consumer.reconsume_later(record).due_ms / 1000
    consumer.commit()
    consumer.close()
    cluster.restart_coordinator()
    cluster.restart_broker()
    consumer = cluster.client().consumer(group, [topic], **cfg)
    record, got_at = _next(consumer, b"v3", timeout=60)
    assert got_at >= due - 0.05, f"came {due - got_at:.3f}s early (failed at {failed_at:.3f})"
    assert retry_info(record.headers).count == 1  # type: ignore[union-attr]

    def restart_once(i: int) -> None:
        if i == 8:  # halfway to the DLQ: both restart under a live consumer
            cluster.restart_coordinator()
            cluster.restart_broker()

    consumer.reconsume_later(record)
    assert _fail_until_dlq(consumer, b"v3", restart_once) == 15  # counts 3..16, then the DLQ
    dead = read_all(consumer_client := cluster.client(), dlq_topic(group))
    assert [r.value for r in dead] == [b"v3"]
    retried = read_all(consumer_client, retry_topic(group), partitions=18)
    assert len(retried) == 16, "every retry written once"
    consumer.close()
