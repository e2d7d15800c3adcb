"""Subscription admin and idle subscriptions through the SDK, on a topic split over two dispatchers.

Each dispatcher knows the subscription on its own partitions only; the SDK asks both and merges.
Idle subscriptions are unloaded after 300 ms (``--idle-subscription-linger``) and listed from the
registry in the offset store, by both dispatchers and after a restart.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from sluice import Client
from sluice.client.push import PushConsumer
from sluice.errors import SubscriptionInUse, UnknownSubscription
from tests.integration.push.conftest import PushCluster, run_push_cluster
from tests.integration.push.helpers import drain, nothing_more, produce

LINGER_S = 0.3


@pytest.fixture(scope="module")
def two() -> Iterator[PushCluster]:
    args = ("--idle-subscription-linger", "300ms", "--subscription-refresh-interval", "200ms")
    with run_push_cluster(dispatchers=2, dispatcher_args=args) as c:
        yield c


@pytest.fixture
def client(two: PushCluster) -> Iterator[Client]:
    with Client(two.bootstrap, request_timeout=10) as c:
        yield c


def split_topic(client: Client) -> str:
    """A 4-partition topic with partitions on both dispatchers."""
    for _ in range(20):
        name = f"adm-{uuid.uuid4().hex[:8]}"
        client.admin.create_topic(name, partitions=4)
        owners = {p.dispatcher_id for p in client.metadata([name], refresh=True).topic(name).partitions}
        if owners == {"d1", "d2"}:
            return name
    raise AssertionError("no topic split over both dispatchers")


def consumer(client: Client, topic: str, subscription: str, queue: int) -> PushConsumer:
    return client.push_consumer(
        topic, subscription, "shared", initial_position="earliest", receiver_queue_size=queue
    )


def wait_for(pred: Callable[[], object], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_idle_subscription_on_two_dispatchers_survives_a_restart(two: PushCluster, client: Client) -> None:
    topic = split_topic(client)
    produce(client, topic, 40, key=lambda i: b"k%d" % i)
    with client.push_consumer(
        topic, "idle2", "shared", initial_position="earliest", receiver_queue_size=0
    ) as pc:
        drain(pc, 10)
    time.sleep(10 * LINGER_S)
    (info,) = client.admin.list_subscriptions(topic)
    assert (info.subscription, info.consumers, info.backlog, info.dispatchers) == (
        "idle2",
        0,
        30,
        ("d1", "d2"),
    )
    assert info.last_active_ms > 0

    two.restart_dispatcher(kill=True)  # d1, kill -9
    wait_for(lambda: [s.backlog for s in client.admin.list_subscriptions(topic)] == [30], "the restart")
    produce(client, topic, 8, key=lambda i: b"late%d" % i)
    assert client.admin.describe_subscription(topic, "idle2").backlog == 38


def test_peek_and_skip_agree_across_dispatchers(two: PushCluster, client: Client) -> None:
    topic = split_topic(client)
    produce(client, topic, 20, key=lambda i: b"k%d" % i)
    with client.push_consumer(
        topic, "sk", "shared", initial_position="earliest", receiver_queue_size=0
    ) as pc:
        drain(pc, 2)
    before = client.admin.peek_subscription(topic, "sk", 20)
    assert len(before) == 18
    assert client.admin.peek_subscription(topic, "sk", 20) == before, "peek moves nothing"
    peeked = [(m.partition, m.offset) for m in client.admin.peek_subscription(topic, "sk", 5)]
    assert peeked == [(m.partition, m.offset) for m in before[:5]]
    change = client.admin.skip_subscription(topic, "sk", 5)
    assert sorted(change.skipped) == sorted(peeked)
    after = client.admin.peek_subscription(topic, "sk", 20)
    assert after == before[5:]
    assert client.admin.describe_subscription(topic, "sk").backlog == 13
    with client.push_consumer(topic, "sk", "shared", receiver_queue_size=0) as pc:
        got = drain(pc, 13)
        assert nothing_more(pc, 0.3)
    assert sorted(m.value for m in got) == sorted(m.value for m in after)


def test_forced_reset_brings_connected_consumers_back_at_the_new_position(
    two: PushCluster, client: Client
) -> None:
    topic = split_topic(client)
    produce(client, topic, 12, key=lambda i: b"k%d" % i)
    with client.push_consumer(
        topic, "rs", "shared", initial_position="earliest", receiver_queue_size=4
    ) as pc:
        first = drain(pc, 12)
        with pytest.raises(SubscriptionInUse):
            client.admin.reset_subscription(topic, "rs", "earliest")
        change = client.admin.reset_subscription(topic, "rs", "earliest", force=True)
        assert change.disconnected == 2  # one stream per dispatcher
        assert sorted(p.after for p in change.partitions) == [0, 0, 0, 0]
        again = drain(pc, 12, timeout=30)  # the SDK reconnected by itself
        assert sorted(m.value for m in again) == sorted(m.value for m in first)


def test_delete_on_two_dispatchers_leaves_nothing_in_redis(two: PushCluster, client: Client) -> None:
    topic = split_topic(client)
    produce(client, topic, 10, key=lambda i: b"k%d" % i)
    with client.push_consumer(
        topic, "gone", "shared", initial_position="earliest", receiver_queue_size=0
    ) as pc:
        drain(pc, 3)
    store = redis.Redis.from_url(two.redis.url)
    try:
        # 4 cursors and their epochs (flushed every 50 ms)
        wait_for(lambda: len(store.keys("sluice:cur:{gone}:*")) == 8, "the cursors in Redis")
        client.admin.delete_subscription(topic, "gone")
        assert store.keys("sluice:cur:{gone}:*") == []
        assert store.hget("sluice:subs", f"{topic}/gone") is None
    finally:
        store.close()
    assert client.admin.list_subscriptions(topic) == []
    with pytest.raises(UnknownSubscription):
        client.admin.peek_subscription(topic, "gone", 1)
    with pytest.raises(UnknownSubscription):
        client.admin.delete_subscription(topic, "gone")
