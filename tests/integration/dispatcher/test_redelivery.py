"""Nack, ack timeout, DLQ, and what survives a kill -9 of the dispatcher (counts, acked holes)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice.codec.batch import Record
from sluice.retry.levels import H_OFFSET, H_PARTITION, H_SOURCE, H_TOPIC
from sluice.v1 import dispatcher_pb2 as pb
from tests.integration.dispatcher.conftest import Cluster, ids, run_cluster, wait_until

SHARED = pb.SUBSCRIPTION_TYPE_SHARED
EARLIEST = pb.INITIAL_POSITION_EARLIEST


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # No memory budget: the holes scenario holds its whole backlog unacknowledged on purpose (~330 MB at
    # the bench's 1,000,000).
    with run_cluster("--cursor-flush-interval", "50ms", "--memory-budget-bytes", "0") as c:
        yield c


def test_nack_and_ack_timeout_redeliver_with_increasing_count(cluster: Cluster) -> None:
    cluster.create_topic("nk")
    cluster.produce("nk", 0, [b"m0", b"m1"])
    c = cluster.consumer("nk", "s", type=SHARED, initial_position=EARLIEST, nack_delay_ms=200)
    c.flow(100)
    assert [m.redelivery_count for m in c.receive(2)] == [0, 0]
    c.ack([(0, 1)])
    started = time.monotonic()
    c.nack([(0, 0)])
    (m,) = c.receive(1)
    assert time.monotonic() - started >= 0.19, "redelivered only after the nack delay"
    assert (m.id.offset, m.redelivery_count, m.value) == (0, 1, b"m0")
    c.nack([(0, 0)])
    (m,) = c.receive(1)
    assert m.redelivery_count == 2
    # Ack timeout: never acked -> redelivered with the next count.
    cluster.produce("nk", 0, [b"m2"])
    t = cluster.consumer("nk", "t", type=SHARED, initial_position=EARLIEST, ack_timeout_ms=300)
    t.flow(100)
    first = t.receive(3)
    t.ack(ids(first[:2]))
    (again,) = t.receive(1, timeout=5)
    assert (again.id.offset, again.redelivery_count) == (2, 1)


def test_dead_letter_after_max_redeliver(cluster: Cluster) -> None:
    cluster.create_topic("dl")
    cluster.produce("dl", 0, [b"poison"], keys=[b"k1"], tags=["tagA"], headers={"h": b"v"})
    cluster.produce("dl", 0, [b"fine"])
    c = cluster.consumer("dl", "s", type=SHARED, initial_position=EARLIEST, nack_delay_ms=50, max_redeliver=2)
    c.flow(100)
    counts = []
    for _ in range(3):
        msgs = c.receive(1)
        poison = [m for m in msgs if m.value == b"poison"]
        for m in msgs:
            if m.value == b"fine":
                c.ack(ids([m]))
        (p,) = poison
        counts.append(p.redelivery_count)
        c.nack(ids([p]))
    assert counts == [0, 1, 2]
    assert c.quiet(0.5) == [], "not delivered again after max_redeliver"
    wait_until(lambda: len(dlq_records(cluster)) == 1, what="the DLQ record")
    (r,) = dlq_records(cluster)
    # Its headers, plus where it came from (for `sluice dlq redrive --to original`, docs/retry.md) and its
    # source (a restart's dedup of parked keys' dead letters, docs/poison-keys.md).
    origin = {H_TOPIC: b"dl", H_PARTITION: b"0", H_OFFSET: b"0", H_SOURCE: b"dl/0/0"}
    assert (r.value, r.key, r.tag, r.headers) == (b"poison", b"k1", "tagA", {"h": b"v", **origin})
    wait_until(
        lambda: cluster.metric("sluice_dispatcher_dlq_messages_total", topic="dl") == 1, what="dlq metric"
    )
    wait_until(lambda: cluster.describe("dl", "s").summary.backlog == 0, what="dead letter acked")


def dlq_records(cluster: Cluster) -> list[Record]:
    try:
        return cluster.read_all("dl.s.DLQ")
    except AssertionError:
        return []


def test_kill_9_between_redeliveries_continues_the_count(cluster: Cluster) -> None:
    cluster.create_topic("kc")
    cluster.produce("kc", 0, [b"again"])
    sub = dict(type=SHARED, initial_position=EARLIEST, durable=True, nack_delay_ms=50, max_redeliver=4)
    c = cluster.consumer("kc", "s", **sub)
    c.flow(100)
    assert c.receive(1)[0].redelivery_count == 0
    c.nack([(0, 0)])
    assert c.receive(1)[0].redelivery_count == 1
    c.nack([(0, 0)])
    assert c.receive(1)[0].redelivery_count == 2
    cluster.wait_flushed("kc", "s")
    cluster.restart_dispatcher(kill=True)
    c = cluster.consumer("kc", "s", **sub)
    c.flow(100)
    (m,) = c.receive(1)
    # Delivered with count 2 and never acknowledged: the kill counts as one more return.
    assert (m.value, m.redelivery_count) == (b"again", 3), "the count survived the kill, raised"
    c.nack([(0, 0)])
    assert c.receive(1)[0].redelivery_count == 4
    c.nack([(0, 0)])
    assert c.quiet(0.5) == []
    wait_until(
        lambda: len(cluster.read_all("kc.s.DLQ")) == 1 if _exists(cluster, "kc.s.DLQ") else False,
        what="DLQ after the count continued",
    )


def _exists(cluster: Cluster, topic: str) -> bool:
    from sluice.v1 import coordinator_pb2

    md = cluster.coord.Metadata(coordinator_pb2.MetadataRequest(), timeout=10)
    return any(t.name == topic for t in md.topics)


@pytest.mark.parametrize("n", [20_000])
def test_cursor_with_holes_survives_kill_9_exactly(cluster: Cluster, n: int) -> None:
    """Ack every other message of n, kill -9, restart: exactly the unacked half comes back.

    The issue's case, 1,000,000 (about a minute on a quiet machine, three loaded), runs in
    ``bench/chaos/cursor_holes.py``; at that scale the suite keeps the cursor's own checks: 500,000
    ranges saved and loaded through the offset store
    (``offsetstore/test_offset_store.py::test_cursor_round_trip_of_the_alternate_ack_pattern``) and
    their memory
    (``unit/dispatcher/test_ranges_cursor.py::test_alternate_ack_of_a_million_stays_under_20_mb``).
    """
    cursor_with_holes_survives_kill_9(cluster, n)


def cursor_with_holes_survives_kill_9(cluster: Cluster, n: int) -> None:
    """The scenario, shared with the bench: AssertionError on a failure."""
    topic = f"holes-{n}"
    cluster.create_topic(topic)
    for start in range(0, n, 5000):
        cluster.produce(topic, 0, [f"{i}".encode() for i in range(start, start + 5000)])
    # The whole backlog in flight at once: lift the default max_unacked (50,000).
    sub = dict(type=SHARED, initial_position=EARLIEST, durable=True, max_unacked=n + 1)
    c = cluster.consumer(topic, "s", **sub)
    c.flow(n)
    got = c.receive(n, timeout=120)
    assert [m.id.offset for m in got] == list(range(n))
    c.ack([(0, o) for o in range(1, n, 2)])
    wait_until(lambda: cluster.describe(topic, "s").consumers[0].unacked == n // 2, what="acks applied")
    cluster.wait_flushed(topic, "s")
    cluster.restart_dispatcher(kill=True)
    c = cluster.consumer(topic, "s", **sub)
    c.flow(n)
    again = c.receive(n // 2, timeout=120)
    assert [m.id.offset for m in again] == list(range(0, n, 2)), "exactly the unacked half, in order"
    assert c.quiet(0.5) == [], "nothing acked comes back"
    # Delivered before the kill and not acknowledged: each comes back counted once.
    assert all(m.redelivery_count == 1 for m in again)
