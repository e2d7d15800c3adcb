"""Durable subscriptions live until they are deleted: idle ones stay listed, described and in the
backlog gauge, with the right backlog, after they are unloaded and after a dispatcher restart.

The linger ("30 s" by default) and the registry refresh are shortened so that "long after the last
consumer left" takes a few seconds: the subscription is waited out of memory (``loaded`` false),
then observed for many linger intervals more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice.v1 import dispatcher_pb2 as pb
from tests.integration.dispatcher.conftest import Cluster, ids, run_cluster, wait_until

SHARED = pb.SUBSCRIPTION_TYPE_SHARED
EARLIEST = pb.INITIAL_POSITION_EARLIEST
LINGER_S = 0.3


@pytest.fixture(scope="module")
def idle_cluster() -> Iterator[Cluster]:
    with run_cluster(
        *("--idle-subscription-linger", f"{int(LINGER_S * 1000)}ms"),
        *("--subscription-refresh-interval", "200ms", "--cursor-flush-interval", "50ms"),
    ) as c:
        yield c


def listed(c: Cluster, topic: str) -> dict[str, pb.SubscriptionSummary]:
    resp = c.dispatcher_stub.ListSubscriptions(pb.ListSubscriptionsRequest(topic=topic), timeout=10)
    return {s.subscription: s for s in resp.subscriptions}


def backlog_gauge(c: Cluster, topic: str, subscription: str) -> float:
    return c.metric("sluice_dispatcher_backlog", topic=topic, subscription=subscription)


def test_an_idle_durable_subscription_stays_listed_with_its_backlog(idle_cluster: Cluster) -> None:
    c = idle_cluster
    topic = "idle"
    c.create_topic(topic, partitions=2)
    for p in (0, 1):
        c.produce(topic, p, [b"%d-%d" % (p, i) for i in range(3)])
    keep = c.consumer(topic, "keep", type=SHARED, initial_position=EARLIEST, durable=True)
    temp = c.consumer(topic, "temp", type=SHARED, initial_position=EARLIEST, durable=False)
    keep.flow(100)
    got = keep.receive(6)
    held = [m for m in got if m.id.offset == 0]  # holes below acknowledged offsets
    keep.ack([i for i in ids(got) if i[1] != 0])
    wait_until(lambda: listed(c, topic)["keep"].backlog == 2, what="the acks")
    c.wait_flushed(topic, "keep")
    before_leaving = int(time.time() * 1000)
    keep.close()
    temp.close()

    wait_until(lambda: not listed(c, topic)["keep"].loaded, timeout=10, what="the linger to unload it")
    time.sleep(10 * LINGER_S)  # "ten minutes" of idleness, in linger intervals
    subs = listed(c, topic)
    assert "temp" not in subs, "a non-durable subscription goes with its last consumer"
    idle = subs["keep"]
    assert (idle.consumers, idle.backlog, idle.durable, idle.loaded) == (0, 2, True, False)
    assert idle.type == SHARED
    assert before_leaving <= idle.last_active_ms <= int(time.time() * 1000)
    assert backlog_gauge(c, topic, "keep") == 2
    gauge = "sluice_dispatcher_subscription_last_active_seconds"
    last_active = c.metric(gauge, topic=topic, subscription="keep")
    assert before_leaving / 1000 <= last_active <= time.time()

    # Peek shows the holes, not the acknowledged offsets above them, and moves nothing.
    peeked = c.dispatcher_stub.PeekSubscription(
        pb.PeekSubscriptionRequest(topic=topic, subscription="keep", count=10), timeout=10
    )
    assert sorted(ids(peeked.messages)) == [(0, 0), (1, 0)]
    assert listed(c, topic)["keep"].backlog == 2

    # The backlog keeps growing while nobody is connected, and the listing says so.
    c.produce(topic, 0, [b"late-%d" % i for i in range(5)])
    wait_until(lambda: backlog_gauge(c, topic, "keep") == 7, what="the gauge to count the new records")
    assert listed(c, topic)["keep"].backlog == 7
    described = c.describe(topic, "keep")
    assert (described.summary.backlog, described.summary.consumers, list(described.consumers)) == (7, 0, [])

    # A restarted dispatcher knows it from the registry, with the same backlog.
    c.restart_dispatcher(kill=True)
    wait_until(lambda: "keep" in listed(c, topic), timeout=20, what="the restarted dispatcher to list it")
    assert listed(c, topic)["keep"].backlog == 7
    wait_until(lambda: backlog_gauge(c, topic, "keep") == 7, what="the gauge after the restart")

    # Nothing was lost: a consumer gets the 2 unacknowledged and the 5 produced while idle.
    back = c.consumer(topic, "keep", type=SHARED, durable=True)
    back.flow(100)
    values = sorted(m.value for m in back.receive(7))
    assert back.quiet(0.3) == []
    unacked = sorted(m.value for m in held)
    assert values == sorted([*unacked, *(b"late-%d" % i for i in range(5))])
    assert listed(c, topic)["keep"].loaded
