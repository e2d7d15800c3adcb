"""Bad input to reconsume_later: typed errors, nothing written, the consumer goes on."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from sluice.client.consumer import Consumer
from sluice.codec.batch import Record
from sluice.errors import DelayLevelOutOfRange, InvalidArgument, ReconsumeRefused, RecordNotOwned
from sluice.retry.levels import dlq_topic, retry_topic
from tests.integration.retry.conftest import CFG, RetryCluster, read_all

LEVELS = "100ms 200ms 300ms 400ms"


def _first(consumer: Consumer) -> Record:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = consumer.poll(0.1)
        if got:
            return got[0]
    raise AssertionError("nothing came")


def test_bad_input_is_refused_and_writes_nothing(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "rb"), cluster.group()
    client = cluster.client()
    with client.producer(topic) as p:
        p.send(b"a").result(10)
    consumer = client.consumer(group, [topic], retry_delay_levels=LEVELS, **CFG)
    # Ordinary topics, visible to every tool: one retry partition per level, one DLQ partition.
    topics = {t.name: len(t.partitions) for t in client.admin.list_topics()}
    assert topics[retry_topic(group)] == 4
    assert topics[dlq_topic(group)] == 1
    record = _first(consumer)
    with pytest.raises(DelayLevelOutOfRange, match=r"levels are 1\.\.4"):
        consumer.reconsume_later(record, delay_level=5)
    with pytest.raises(InvalidArgument, match="not both"):
        consumer.reconsume_later(record, delay_level=1, delay=timedelta(seconds=1))
    not_handed = record._replace(offset=record.offset + 1)
    with pytest.raises(RecordNotOwned, match="not handed out"):
        consumer.reconsume_later(not_handed)
    foreign = record._replace(topic="elsewhere")
    with pytest.raises(RecordNotOwned, match="not assigned"):
        consumer.reconsume_later(foreign)
    with pytest.raises(InvalidArgument, match="Record"):
        consumer.reconsume_later("a record")  # type: ignore[arg-type]
    assert read_all(client, retry_topic(group), partitions=4) == []
    # Still usable: an explicit delay in the past is due at once.
    outcome = consumer.reconsume_later(record, delay=timedelta(seconds=-5))
    assert outcome.level == 1
    again = _first(consumer)
    assert again.value == b"a"
    assert again.topic == retry_topic(group)
    consumer.close()


def test_orderly_and_non_retry_consumers_refuse(cluster: RetryCluster) -> None:
    topic = cluster.topic(1, "ro")
    client = cluster.client()
    with client.producer(topic) as p:
        p.send(b"a").result(10)
    plain = {k: v for k, v in CFG.items() if k != "retry"}
    ordered = client.consumer(cluster.group(), [topic], orderly=True, **plain)
    record = _first(ordered)
    with pytest.raises(ReconsumeRefused, match="ordered processing"):
        ordered.reconsume_later(record)
    ordered.close()
    no_retry = client.consumer(cluster.group(), [topic], **plain)
    record = _first(no_retry)
    with pytest.raises(InvalidArgument, match="retry=True"):
        no_retry.reconsume_later(record)
    no_retry.close()


def test_explicit_delay_overrides_the_level(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "re"), cluster.group()
    client = cluster.client()
    with client.producer(topic) as p:
        p.send(b"a").result(10)
    consumer = client.consumer(group, [topic], retry_delay_levels="100ms 200ms 5s 5s", **CFG)
    record = _first(consumer)
    failed = time.time()
    outcome = consumer.reconsume_later(record, delay=timedelta(milliseconds=700))
    assert outcome.level == 3  # the smallest level at least as long holds it
    again = _first(consumer)
    waited = time.time() - failed
    assert 0.7 <= waited <= 0.9 + 0.2, waited
    failed = time.time()
    consumer.reconsume_later(again, delay_level=1)
    _first(consumer)
    assert time.time() - failed <= 0.1 + 0.3
    consumer.close()


def test_in_flight_min_mode_marks_the_record_done_and_commits_past_it(cluster: RetryCluster) -> None:
    """commit_mode="in-flight-min": reconsume_later is the record's done(); the partition commits past it
    while the retry comes back from the retry topic."""
    topic, group = cluster.topic(1, "rm"), cluster.group()
    client = cluster.client()
    with client.producer(topic) as p:
        p.send(b"a")
        p.send(b"b").result(10)
    consumer = client.consumer(group, [topic], commit_mode="in-flight-min", retry_delay_levels=LEVELS, **CFG)
    got: list[Record] = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        got += consumer.poll(0.1)
    a, b = got
    consumer.reconsume_later(a)
    with pytest.raises(RecordNotOwned, match="not in flight"):
        consumer.reconsume_later(a)  # done already
    consumer.done(b)
    again = _first(consumer)
    assert again.value == b"a"
    assert again.topic == retry_topic(group)
    consumer.done(again)
    consumer.commit()
    assert consumer.committed([(topic, 0)]) == {(topic, 0): 2}
    consumer.close()
