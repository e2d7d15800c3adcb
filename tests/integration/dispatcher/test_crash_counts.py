"""Redelivery counts across a kill -9 of the dispatcher (issue 12, "Crash counts").

Nothing here waits for a cursor flush before killing: the counts must hold whatever instant the
process dies at. The flush interval is long (1 s), so a count or a delivered mark that was not
written *before* its delivery would be lost with the process, and the tests would see it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice.v1 import coordinator_pb2
from sluice.v1 import dispatcher_pb2 as pb
from tests.integration.dispatcher.conftest import Cluster, run_cluster, wait_until

SHARED = pb.SUBSCRIPTION_TYPE_SHARED
EARLIEST = pb.INITIAL_POSITION_EARLIEST


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with run_cluster("--cursor-flush-interval", "1s") as c:
        yield c


def test_kill_9_counts_every_message_delivered_and_not_acked(cluster: Cluster) -> None:
    cluster.create_topic("crash")
    cluster.produce("crash", 0, [f"m{i}".encode() for i in range(100)])
    sub = dict(type=SHARED, initial_position=EARLIEST, durable=True)
    c = cluster.consumer("crash", "s", **sub)
    c.flow(1000)
    first = c.receive(100)
    assert [m.id.offset for m in first] == list(range(100))
    assert {m.redelivery_count for m in first} == {0}
    crash(cluster)  # at once: nothing was acked, nothing waited for a flush

    c = cluster.consumer("crash", "s", **sub)
    # Produced after the restart: never delivered by anyone, so not counted.
    cluster.produce("crash", 0, [f"late{i}".encode() for i in range(10)])
    c.flow(1000)
    again = c.receive(110)
    assert [m.id.offset for m in again] == list(range(110))
    assert [m.redelivery_count for m in again[:100]] == [1] * 100, "each was delivered once before the kill"
    assert [m.redelivery_count for m in again[100:]] == [0] * 10
    assert c.quiet(0.3) == []

    # A second crash counts them once more; acked ones are gone for good.
    c.ack([(0, o) for o in range(50)])
    wait_until(lambda: cluster.describe("crash", "s").consumers[0].unacked == 60, what="acks applied")
    cluster.wait_flushed("crash", "s")
    crash(cluster)
    c = cluster.consumer("crash", "s", **sub)
    c.flow(1000)
    third = c.receive(60)
    assert [m.id.offset for m in third] == list(range(50, 110))
    assert [m.redelivery_count for m in third] == [2] * 50 + [1] * 10


def test_a_message_that_crashes_everything_reaches_the_dlq(cluster: Cluster) -> None:
    """A poison message never acked: dispatcher killed with it in flight, then its consumer
    dying, then the dispatcher again. Each return counts once; after max_redeliver it goes to the
    DLQ, although most returns were crashes that left no chance to write anything."""
    cluster.create_topic("poison")
    cluster.produce("poison", 0, [b"poison"], keys=[b"k"])
    sub = dict(type=SHARED, initial_position=EARLIEST, durable=True, max_redeliver=3)
    counts: list[int] = []

    def deliver() -> None:
        c = cluster.consumer("poison", "s", **sub)
        c.flow(10)
        (m,) = c.receive(1)
        assert m.value == b"poison"
        counts.append(m.redelivery_count)

    deliver()
    crash(cluster)  # the dispatcher dies with it in flight
    deliver()
    cluster.streams.pop().close()  # its consumer dies: the stream ends, no ack
    deliver()  # sent again only once its raised count is persisted
    crash(cluster)
    deliver()
    crash(cluster)
    assert counts == [0, 1, 2, 3]

    # The next return (the last kill) puts it past max_redeliver: the DLQ, not the consumer.
    c = cluster.consumer("poison", "s", **sub)
    c.flow(10)
    assert c.quiet(1.0) == [], "not delivered a fifth time"
    wait_until(lambda: _dlq_values(cluster, "poison.s.DLQ") == [b"poison"], what="the DLQ record")
    wait_until(lambda: cluster.describe("poison", "s").summary.backlog == 0, what="dead letter acked")


def test_counts_raised_by_nack_and_ack_timeout_survive_a_kill_at_once(cluster: Cluster) -> None:
    """A redelivery goes out only once its raised count is persisted: killed right after it, the
    message comes back with that count plus one, never with the count of the last regular flush."""
    cluster.create_topic("raised")
    cluster.produce("raised", 0, [b"nacked", b"timed-out"])
    # Both messages go out at t0, so offset 1's ack timeout fires at t0 + T. Offset 0 is nacked at
    # t0 + T/2: its redelivery's own timeout falls at t0 + 1.5 T, T/2 after the kill below. (Nacked
    # at t0, its second timeout would race the first of offset 1, and a count of 3 would be right.)
    timeout_ms = 2000
    sub = dict(
        type=SHARED, initial_position=EARLIEST, durable=True, nack_delay_ms=1, ack_timeout_ms=timeout_ms
    )
    c = cluster.consumer("raised", "s", **sub)
    c.flow(10)
    assert [(m.id.offset, m.redelivery_count) for m in c.receive(2)] == [(0, 0), (1, 0)]
    time.sleep(timeout_ms / 2000)
    c.nack([(0, 0)])  # offset 1 is left to its ack timeout
    got = {m.id.offset: m.redelivery_count for m in c.receive(2, timeout=10)}
    assert got == {0: 1, 1: 1}
    crash(cluster)
    c = cluster.consumer("raised", "s", **sub)
    c.flow(10)
    again = {m.id.offset: m.redelivery_count for m in c.receive(2)}
    assert again == {0: 2, 1: 2}


def test_a_graceful_restart_counts_exactly(cluster: Cluster) -> None:
    """SIGTERM settles what is in flight (returned, as on a disconnect) and leaves no window: what
    had already come back, or was delivered before an earlier stop, is not counted again."""
    cluster.create_topic("graceful")
    cluster.produce("graceful", 0, [b"a", b"b"])
    sub = dict(type=SHARED, initial_position=EARLIEST, durable=True)
    c = cluster.consumer("graceful", "s", **sub)
    c.flow(10)
    assert [m.redelivery_count for m in c.receive(2)] == [0, 0]
    cluster.streams.pop().close()  # its consumer leaves: both come back, counted once
    wait_until(lambda: not cluster.describe("graceful", "s").consumers, what="the consumer gone")
    cluster.restart_dispatcher(kill=False)
    c = cluster.consumer("graceful", "s", **sub)
    c.flow(10)
    assert [(m.id.offset, m.redelivery_count) for m in c.receive(2)] == [(0, 1), (1, 1)]
    cluster.restart_dispatcher(kill=False)  # in flight at the stop: counted once more
    cluster.restart_dispatcher(kill=False)  # nothing delivered by this incarnation: nothing more
    c = cluster.consumer("graceful", "s", **sub)
    c.flow(10)
    assert [(m.id.offset, m.redelivery_count) for m in c.receive(2)] == [(0, 2), (1, 2)]


def crash(cluster: Cluster) -> None:
    """kill -9 the dispatcher while its consumers are still connected, then start it again."""
    cluster.restart_dispatcher(kill=True)


def _dlq_values(cluster: Cluster, topic: str) -> list[bytes]:
    md = cluster.coord.Metadata(coordinator_pb2.MetadataRequest(), timeout=10)
    if not any(t.name == topic for t in md.topics):
        return []
    return [r.value for r in cluster.read_all(topic)]
