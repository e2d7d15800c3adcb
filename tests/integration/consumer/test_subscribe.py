"""``subscribe()`` on a running group consumer (issue 18, aiokafka's ``subscribe``): topics added are
assigned, topics left out are revoked through the normal rebalance path (commit, ``on_revoke``), a bad
subscription is refused as the constructor refuses it and leaves the consumer as it was, and the retry
topic stays subscribed."""

from __future__ import annotations

import time

import pytest

from sluice.client.consumer import Consumer
from sluice.codec.batch import Record
from sluice.errors import InvalidArgument, InvalidFilter, InvalidTopic, UnknownTopicOrPartition
from sluice.retry.levels import retry_topic
from tests.integration.consumer.conftest import Cluster
from tests.integration.consumer.test_consumer_basics import FAST, poll_until, produce

TopicPartition = tuple[str, int]


def poll_for(consumer: Consumer, seconds: float) -> list[Record]:
    got: list[Record] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got += consumer.poll(0.1)
    return got


def wait_assignment(consumer: Consumer, want: set[TopicPartition], timeout: float = 10.0) -> list[Record]:
    got: list[Record] = []
    deadline = time.monotonic() + timeout
    while consumer.assignment() != want:
        assert time.monotonic() < deadline, f"assignment {sorted(consumer.assignment())}, want {sorted(want)}"
        got += consumer.poll(0.1)
    return got


def test_subscribe_adds_a_topic_then_drops_one(cluster: Cluster) -> None:
    a, b = cluster.topic(2, "a"), cluster.topic(2, "b")
    produce(cluster, a, 10)
    produce(cluster, b, 6)
    client = cluster.client()
    revoked: list[list[TopicPartition]] = []
    c = client.consumer(
        "sub-1", [a], auto_offset_reset="earliest", enable_auto_commit=False, on_revoke=revoked.append, **FAST
    )
    assert {r.topic for r in poll_until(c, lambda g: len(g) >= 10)} == {a}

    c.subscribe([a, b])
    got = poll_until(c, lambda g: len(g) >= 6)
    assert sorted((r.topic, int(r.value[1:])) for r in got) == [(b, i) for i in range(6)]
    assert c.assignment() == {(t, p) for t in (a, b) for p in range(2)}
    assert revoked == []

    c.subscribe({b: "*"})
    wait_assignment(c, {(b, 0), (b, 1)})
    assert revoked == [[(a, 0), (a, 1)]]
    # Revoking committed what poll() had returned from a: 5 per partition.
    assert {tp: off for tp, off in client.admin.group_offsets("sub-1").items() if tp[0] == a} == {
        (a, 0): 5,
        (a, 1): 5,
    }
    produce(cluster, a, 4, start=10)
    produce(cluster, b, 2, start=6)
    got = poll_until(c, lambda g: len(g) >= 2) + poll_for(c, 1.0)
    assert sorted((r.topic, int(r.value[1:])) for r in got) == [(b, 6), (b, 7)]
    c.close()


def test_a_refused_subscribe_raises_and_keeps_the_old_subscription(cluster: Cluster) -> None:
    a = cluster.topic(2, "a")
    produce(cluster, a, 4)
    c = cluster.client().consumer("sub-2", [a], auto_offset_reset="earliest", **FAST)
    poll_until(c, lambda g: len(g) >= 4)
    with pytest.raises(InvalidArgument):
        c.subscribe([])  # the coordinator refuses an empty subscription: close() leaves the group
    with pytest.raises(InvalidTopic):
        c.subscribe(["bad name"])
    with pytest.raises(InvalidFilter):
        c.subscribe({a: "(("})
    with pytest.raises(UnknownTopicOrPartition):
        c.subscribe([a, f"missing-{a}"])
    produce(cluster, a, 2, start=4)
    got = poll_until(c, lambda g: len(g) >= 2)  # still a member, still reading a
    assert sorted(int(r.value[1:]) for r in got) == [4, 5]
    assert c.assignment() == {(a, 0), (a, 1)}
    c.close()


def test_the_retry_topic_stays_subscribed(cluster: Cluster) -> None:
    a, b = cluster.topic(1, "a"), cluster.topic(1, "b")
    c = cluster.client().consumer(
        "sub-3", [a], auto_offset_reset="earliest", retry=True, retry_delay_levels="50ms", **FAST
    )
    retry = retry_topic("sub-3")
    wait_assignment(c, {(a, 0), (retry, 0)})
    c.subscribe([b])
    wait_assignment(c, {(b, 0), (retry, 0)})
    c.close()
