"""``Subscribe.record_batches``: log batches forwarded to the consumer, acks as ranges, on the wire."""

from __future__ import annotations

import queue
import time

from sluice.codec.batch import Record, decode_records, validate_batch
from sluice.v1 import common_pb2
from sluice.v1 import dispatcher_pb2 as pb
from tests.integration.dispatcher.conftest import Cluster, StreamClient

SHARED = pb.SUBSCRIPTION_TYPE_SHARED
KEY_SHARED = pb.SUBSCRIPTION_TYPE_KEY_SHARED
EARLIEST = pb.INITIAL_POSITION_EARLIEST

Got = tuple[Record, int]  # (record, redelivery_count)


def subscribe_batches(cluster: Cluster, topic: str, subscription: str, **kw: object) -> StreamClient:
    kw.setdefault("consumer_id", f"{subscription}-{len(cluster.streams)}")
    s = cluster.stream().subscribe(topic, subscription, record_batches=True, **kw)
    ev = s.next_event(15)
    assert ev is not None
    assert ev.WhichOneof("event") == "subscribed", ev
    assert ev.subscribed.record_batches, "the dispatcher confirms it sends record batches"
    return s


def receive_batches(s: StreamClient, n: int, timeout: float = 15) -> list[Got]:
    """Exactly ``n`` records (more arriving in the same event are returned too)."""
    out: list[Got] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"received {len(out)} of {n} records"
        try:
            ev = s.next_event(left)
        except queue.Empty:
            continue
        assert ev is not None, f"stream ended: {s.end_error}"
        kind = ev.WhichOneof("event")
        if kind == "error":
            raise AssertionError(f"error event: {ev.error}")
        if kind != "messages":
            continue
        assert not ev.messages.messages, "a record_batches consumer gets no PushedMessage"
        for entry in ev.messages.batches:
            validate_batch(entry.records, 0, 1 << 24)
            recs = decode_records(entry.records, "", entry.partition)
            counts = list(entry.redelivery_counts) or [0] * len(recs)
            out += zip(recs, counts, strict=True)
    return out


def arriving(s: StreamClient, seconds: float) -> list[Got]:
    """Records arriving within ``seconds``."""
    got: list[Got] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            ev = s.next_event(left)
        except queue.Empty:
            break
        if ev is None:
            break
        if ev.WhichOneof("event") == "messages":
            for e in ev.messages.batches:
                recs = decode_records(e.records, "", e.partition)
                got += zip(recs, list(e.redelivery_counts) or [0] * len(recs), strict=True)
    return got


def ack_ranges(s: StreamClient, partition: int, bounds: list[int]) -> None:
    cmd = pb.ConsumerCommand()
    cmd.ack.ranges.add(partition=partition, bounds=bounds)
    s.send(cmd)


def test_filtered_shared_records_arrive_whole_and_acks_as_ranges_count(cluster: Cluster) -> None:
    cluster.create_topic("rb", partitions=2)
    tags: list[str | None] = ["a" if i % 3 else "b" for i in range(30)]
    for p in (0, 1):
        cluster.produce(
            "rb",
            p,
            [f"{p}-{i}".encode() for i in range(30)],
            keys=[f"k{i % 4}".encode() for i in range(30)],
            tags=tags,
            headers={"h": b"x"},
        )
    expected = {(r.partition, r.offset): r for p in (0, 1) for r in cluster.read_all("rb", p) if r.tag == "a"}
    a = subscribe_batches(cluster, "rb", "s", type=SHARED, initial_position=EARLIEST, filter="a")
    b = subscribe_batches(cluster, "rb", "s", type=SHARED, initial_position=EARLIEST, filter="a")
    a.flow(7)
    b.flow(7)
    got_a = receive_batches(a, 7)
    got_b = receive_batches(b, 7)
    assert len(got_a) == 7, "never more than the permits"
    assert len(got_b) == 7
    assert not arriving(a, 0.3)
    for rec, count in got_a + got_b:
        want = expected[(rec.partition, rec.offset)]
        assert (rec.key, rec.value, rec.tag, rec.headers, rec.timestamp) == (
            want.key,
            want.value,
            want.tag,
            want.headers,
            want.timestamp,
        )
        assert count == 0
    # Acks as ranges (each record its own range, as runs of a filtered stream are short); nacks by id.
    for rec, _ in got_a:
        ack_ranges(a, rec.partition, [rec.offset, rec.offset + 1])
    b.nack([(r.partition, r.offset) for r, _ in got_b])
    a.flow(100)
    rest = receive_batches(a, len(expected) - 7)
    seen = {(r.partition, r.offset): n for r, n in rest}
    assert set(seen) == set(expected) - {(r.partition, r.offset) for r, _ in got_a}
    assert all(seen[(r.partition, r.offset)] == 1 for r, _ in got_b), "nacked: redelivered with count 1"
    assert not arriving(a, 0.3), "acked by ranges: not redelivered"
    # A malformed range is refused; the stream stays usable.
    ack_ranges(a, 0, [5])
    assert a.expect_error(common_pb2.INVALID_ARGUMENT).message
    a.close()
    b.close()


def test_key_shared_cuts_keep_per_key_order_and_mixed_consumers_agree(cluster: Cluster) -> None:
    cluster.create_topic("rbk")
    n = 200
    cluster.produce(
        "rbk", 0, [str(i).encode() for i in range(n)], keys=[f"k{i % 7}".encode() for i in range(n)]
    )
    log = {r.offset: r for r in cluster.read_all("rbk")}
    fast = subscribe_batches(cluster, "rbk", "ks", type=KEY_SHARED, initial_position=EARLIEST)
    # An older client on the same subscription still gets PushedMessages.
    old = cluster.consumer("rbk", "ks", type=KEY_SHARED, initial_position=EARLIEST)
    fast.flow(1000)
    old.flow(1000)
    got_fast: list[Got] = []
    got_old: list[pb.PushedMessage] = []
    deadline = time.monotonic() + 15
    while len(got_fast) + len(got_old) < n and time.monotonic() < deadline:
        got_fast += arriving(fast, 0.05)
        got_old += old.quiet(0.05)
    assert len(got_fast) + len(got_old) == n
    assert got_fast, "both consumers own some hashes"
    assert got_old
    keys_fast = {r.key for r, _ in got_fast}
    keys_old = {m.key for m in got_old}
    assert not keys_fast & keys_old, "a key goes to one consumer"
    for rec, _ in got_fast:
        assert rec.value == log[rec.offset].value
        assert rec.key == log[rec.offset].key
    for m in got_old:
        assert m.value == log[m.id.offset].value
    offsets = [r.offset for r, _ in got_fast]
    assert offsets == sorted(offsets), "per-key (and here per-consumer) order"
    fast.close()
    old.close()


def test_subscription_joining_behind_a_parked_fetch_is_served_and_the_feed_keeps_going(
    cluster: Cluster,
) -> None:
    # The feed's fetch parks at the log end for the first subscription; a second one joining at the
    # start makes it cancel that fetch (and its FetchStream call) and read from 0 on a new call.
    cluster.create_topic("rbp")
    cluster.produce("rbp", 0, [b"a", b"b", b"c"])
    late = subscribe_batches(cluster, "rbp", "late", type=SHARED, initial_position=pb.INITIAL_POSITION_LATEST)
    late.flow(100)
    assert not arriving(late, 0.3)  # parked at offset 3
    early = subscribe_batches(cluster, "rbp", "early", type=SHARED, initial_position=EARLIEST)
    early.flow(100)
    assert [r.value for r, _ in receive_batches(early, 3, timeout=5)] == [b"a", b"b", b"c"]
    cluster.produce("rbp", 0, [b"d"])
    assert [(r.offset, r.value) for r, _ in receive_batches(late, 1)] == [(3, b"d")]
    assert [(r.offset, r.value) for r, _ in receive_batches(early, 1)] == [(3, b"d")]
    late.close()
    early.close()
