"""Subscription types, flow control and bad input against real processes, observed on the wire."""

from __future__ import annotations

import time

from sluice.v1 import common_pb2
from sluice.v1 import dispatcher_pb2 as pb
from tests.integration.dispatcher.conftest import Cluster, ids, wait_until

SHARED = pb.SUBSCRIPTION_TYPE_SHARED
EXCLUSIVE = pb.SUBSCRIPTION_TYPE_EXCLUSIVE
EARLIEST = pb.INITIAL_POSITION_EARLIEST


def test_exclusive_second_consumer_is_busy(cluster: Cluster) -> None:
    cluster.create_topic("ex")
    cluster.produce("ex", 0, [b"a", b"b"])
    first = cluster.consumer("ex", "s", type=EXCLUSIVE, initial_position=EARLIEST, durable=True)
    first.flow(10)
    assert [m.value for m in first.receive(2)] == [b"a", b"b"]
    second = cluster.stream().subscribe("ex", "s", type=EXCLUSIVE, consumer_id="other", durable=True)
    err = second.expect_error(common_pb2.CONSUMER_BUSY)
    assert "exclusive" in err.message
    assert second.next_event(5) is None, "the refused stream ends"
    # The first consumer is unaffected.
    cluster.produce("ex", 0, [b"c"])
    assert [m.value for m in first.receive(1)] == [b"c"]


def test_shared_spreads_and_never_exceeds_permits_on_the_wire(cluster: Cluster) -> None:
    cluster.create_topic("sh", partitions=2)
    for p in (0, 1):
        cluster.produce("sh", p, [f"{p}-{i}".encode() for i in range(300)])
    a = cluster.consumer("sh", "s", type=SHARED, initial_position=EARLIEST)
    b = cluster.consumer("sh", "s", type=SHARED, initial_position=EARLIEST)
    got_a: list[pb.PushedMessage] = []
    got_b: list[pb.PushedMessage] = []
    for _ in range(6):  # grant 50 at a time, acking as we go
        a.flow(50)
        b.flow(50)
        batch_a, batch_b = a.receive(50), b.receive(50)
        assert len(batch_a) == 50, "exactly the permits, never more"
        assert len(batch_b) == 50
        got_a += batch_a
        got_b += batch_b
        a.ack(ids(batch_a))
        b.ack(ids(batch_b))
    assert a.quiet(0.3) == [], "nothing beyond the permits"
    assert b.quiet(0.1) == []
    assert a.max_batch <= 50
    assert b.max_batch <= 50
    everything = sorted(ids(got_a) + ids(got_b))
    assert everything == sorted((p, o) for p in (0, 1) for o in range(300))


def test_zero_queue_consumers_on_a_partitioned_topic(cluster: Cluster) -> None:
    """4 partitions, Shared, two consumers that each grant exactly one permit per receive()."""
    cluster.create_topic("zq", partitions=4)
    for p in range(4):
        cluster.produce("zq", p, [f"{p}-{i}".encode() for i in range(10)])
    consumers = [cluster.consumer("zq", "s", type=SHARED, initial_position=EARLIEST) for _ in range(2)]
    seen: list[tuple[int, int]] = []
    for _ in range(20):
        for c in consumers:
            c.flow(1)  # receive(): one permit
            (m,) = c.receive(1)
            assert c.quiet(0.02) == [], "a zero-queue consumer never holds more than one message"
            seen.append((m.id.partition, m.id.offset))
            c.ack([(m.id.partition, m.id.offset)])
    assert sorted(seen) == sorted((p, o) for p in range(4) for o in range(10))
    assert all(c.max_batch == 1 for c in consumers)


def test_blocking_at_max_unacked_resumes_after_acking_half(cluster: Cluster) -> None:
    cluster.create_topic("blk")
    cluster.produce("blk", 0, [str(i).encode() for i in range(100)])
    c = cluster.consumer("blk", "s", type=SHARED, initial_position=EARLIEST, max_unacked=10)
    c.flow(1000)
    first = c.receive(10)
    assert len(first) == 10
    assert c.quiet(0.3) == [], "blocked at max_unacked"
    d = cluster.describe("blk", "s").consumers[0]
    assert d.blocked
    assert d.unacked == 10
    c.ack(ids(first[:4]))
    assert c.quiet(0.3) == [], "6 unacked: still blocked"
    c.ack(ids(first[4:5]))
    more = c.receive(5)
    assert len(more) == 5
    assert more[0].id.offset == 10
    assert c.quiet(0.2) == []


def test_bad_input_gets_typed_errors_and_leaves_the_dispatcher_healthy(cluster: Cluster) -> None:
    cluster.create_topic("bad")
    cluster.produce("bad", 0, [b"x", b"y"])
    # A message before Subscribe.
    s = cluster.stream()
    s.flow(5)
    s.expect_error(common_pb2.PROTOCOL_VIOLATION)
    assert s.next_event(5) is None
    # Unknown topic.
    s = cluster.stream().subscribe("no-such-topic", "s")
    s.expect_error(common_pb2.UNKNOWN_TOPIC_OR_PARTITION)
    # Invalid names and filters.
    cluster.stream().subscribe("bad", "bad name!").expect_error(common_pb2.INVALID_ARGUMENT)
    cluster.stream().subscribe("bad", "s", filter="a b").expect_error(common_pb2.INVALID_FILTER)
    # On a live stream: permits <= 0, unknown ids, a second Subscribe; the stream stays usable.
    c = cluster.consumer("bad", "s", type=SHARED, initial_position=EARLIEST)
    c.flow(0)
    c.expect_error(common_pb2.INVALID_PERMITS)
    c.flow(-3)
    c.expect_error(common_pb2.INVALID_PERMITS)
    c.ack([(0, 12345), (9, 0)])
    err = c.expect_error(common_pb2.UNKNOWN_MESSAGE_ID)
    assert "0/12345" in err.message
    assert "9/0" in err.message
    c.subscribe("bad", "s")
    c.expect_error(common_pb2.PROTOCOL_VIOLATION)
    c.flow(2)
    got = c.receive(2)
    assert [m.value for m in got] == [b"x", b"y"]
    # A type change while a consumer is connected.
    t = cluster.stream().subscribe("bad", "s", type=pb.SUBSCRIPTION_TYPE_FAILOVER, consumer_id="t")
    t.expect_error(common_pb2.SUBSCRIPTION_TYPE_MISMATCH)
    # A foreign id: another consumer's message.
    other = cluster.consumer("bad", "s", type=SHARED)
    other.ack(ids(got[:1]))
    other.expect_error(common_pb2.UNKNOWN_MESSAGE_ID)
    c.ack(ids(got))
    wait_until(lambda: cluster.describe("bad", "s").consumers[0].unacked == 0, what="acks applied")
    # Still healthy: a fresh subscription works.
    cluster.produce("bad", 0, [b"z"])
    fresh = cluster.consumer("bad", "fresh", type=SHARED, initial_position=EARLIEST)
    fresh.flow(10)
    assert [m.value for m in fresh.receive(3)] == [b"x", b"y", b"z"]


def test_resubscribing_with_the_same_consumer_id_is_idempotent(cluster: Cluster) -> None:
    cluster.create_topic("idem")
    cluster.produce("idem", 0, [b"a", b"b", b"c"])
    old = cluster.consumer("idem", "s", type=EXCLUSIVE, initial_position=EARLIEST, consumer_id="me")
    old.flow(10)
    assert len(old.receive(3)) == 3
    old.ack([(0, 0)])
    time.sleep(0.2)
    new = cluster.consumer("idem", "s", type=EXCLUSIVE, consumer_id="me")
    assert old.next_event(5) is None or old.quiet(1) == [], "the replaced stream ends"
    new.flow(10)
    again = new.receive(2)
    assert [(m.id.offset, m.redelivery_count) for m in again] == [(1, 1), (2, 1)]
    desc = cluster.describe("idem", "s")
    assert [c.consumer_id for c in desc.consumers] == ["me"]
