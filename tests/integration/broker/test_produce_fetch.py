"""Produce and fetch through a real broker: round trip, limits, filters, offsets, errors."""

from __future__ import annotations

import grpc
import pytest

from sluice.client.rpc import call
from sluice.errors import InvalidArgument, InvalidRequest
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2

from .conftest import Broker, make_batch, part, records, vals


def test_round_trip_preserves_order_and_offsets(broker: Broker, topic: str) -> None:
    broker.assign(topic, partitions=2)
    bases = []
    for i in range(5):
        r = broker.produce(topic, 1, make_batch(vals(3, f"b{i}-")))
        assert r.error.code == common_pb2.NONE
        bases.append(r.base_offset)
        assert r.log_append_time_ms > 0
    assert bases == [0, 3, 6, 9, 12]
    p = broker.fetch_one(topic, 0, partition=1)
    got = records(p)
    assert [r.offset for r in got] == list(range(15))
    assert [r.value for r in got] == [f"b{i}-{j}".encode() for i in range(5) for j in range(3)]
    assert (p.high_watermark, p.log_start_offset, p.next_offset) == (15, 0, 15)
    # Mid-batch fetch: whole batches come back, the consumer skips what is before its offset.
    p = broker.fetch_one(topic, 7, partition=1)
    assert next(r.offset for r in records(p, 7)) == 7
    # Partition 0 is empty: no records, positions stay.
    p = broker.fetch_one(topic, 0, partition=0)
    assert p.records == b""
    assert p.next_offset == 0
    assert p.high_watermark == 0


def test_several_batches_in_one_produce_get_dense_offsets(broker: Broker, topic: str) -> None:
    broker.assign(topic)
    r = broker.produce(topic, 0, make_batch(vals(2)), make_batch(vals(3)), make_batch(vals(1)))
    assert r.base_offset == 0
    assert broker.offsets(topic, -1).offset == 6
    assert [x.offset for x in records(broker.fetch_one(topic))] == list(range(6))


def test_limits_max_bytes_partition_max_bytes_and_one_oversized_batch(broker: Broker, topic: str) -> None:
    broker.assign(topic, partitions=2)
    one = make_batch(vals(4, size=200))
    for p in (0, 1):
        for _ in range(6):
            broker.produce(topic, p, one)
    size = len(one)
    # partition_max_bytes: whole batches within the limit.
    resp = broker.fetch(part(topic, 0, 0, pmax=2 * size + 5), part(topic, 0, 1, pmax=3 * size))
    a, b = resp.partitions
    assert len(a.records) == 2 * size
    assert a.next_offset == 8
    assert len(b.records) == 3 * size
    assert b.next_offset == 12
    # max_bytes across partitions: the second partition gets what is left.
    resp = broker.fetch(part(topic, 0, 0), part(topic, 0, 1), max_bytes=int(3.5 * size))
    a, b = resp.partitions
    assert len(a.records) == 3 * size
    assert b.records == b""
    assert b.next_offset == 0
    assert len(a.records) + len(b.records) <= int(3.5 * size)
    # One batch larger than every limit still comes back, alone.
    big = make_batch(vals(3, size=20_000))
    broker.produce(topic, 0, big)
    resp = broker.fetch(part(topic, 24, 0, pmax=100), part(topic, 0, 1, pmax=100), max_bytes=100)
    a, b = resp.partitions
    assert len(a.records) == len(big)
    assert a.next_offset == 27
    assert b.records == b""


def test_filtering_returns_only_matching_records_and_advances(broker: Broker, topic: str) -> None:
    broker.assign(topic)
    broker.produce(topic, 0, make_batch(vals(5, "a"), "tagA"))
    broker.produce(topic, 0, make_batch(vals(6, "m"), ["tagA", "tagB", None, "tagB", "tagC", "tagB"]))
    broker.produce(topic, 0, make_batch(vals(4, "c"), "tagC"))
    p = broker.fetch_one(topic, 0, filter="tagB")
    got = records(p)
    assert [(r.offset, r.tag) for r in got] == [(6, "tagB"), (8, "tagB"), (10, "tagB")]
    assert p.next_offset == 15
    assert p.high_watermark == 15
    p = broker.fetch_one(topic, 0, filter="tagB || tagC")
    assert [r.offset for r in records(p)] == [6, 8, 9, 10, 11, 12, 13, 14]
    # Nothing matches: no records, but next_offset moves past everything scanned.
    p = broker.fetch_one(topic, 0, filter="nomatch")
    assert p.records == b""
    assert p.next_offset == 15
    p = broker.fetch_one(topic, 0, filter="bad tag!")
    assert p.error.code == common_pb2.INVALID_FILTER


def test_list_offsets_earliest_latest_and_by_time(broker: Broker, topic: str) -> None:
    broker.assign(topic)
    broker.produce(topic, 0, make_batch(vals(5), ts=10_000))
    broker.produce(topic, 0, make_batch(vals(5), ts=20_000))
    assert broker.offsets(topic, -2).offset == 0
    assert broker.offsets(topic, -1).offset == 10
    found = broker.offsets(topic, 20_002)
    assert (found.offset, found.timestamp) == (7, 20_002)
    assert broker.offsets(topic, 99_999).offset == 10  # none that late: latest
    assert broker.offsets(topic, -7).error.code == common_pb2.INVALID_ARGUMENT


def test_per_partition_errors(broker: Broker, topic: str) -> None:
    broker.assign(topic, partitions=1, max_batch_bytes=4096)
    resp = broker.stub.Produce(
        pb.ProduceRequest(
            acks=1,
            partitions=[
                pb.ProducePartition(topic="no-such-topic", partition=0, records=make_batch(vals(1))),
                pb.ProducePartition(topic=topic, partition=3, records=make_batch(vals(1))),
                pb.ProducePartition(topic=topic, partition=0, records=b"\x00" * 70),
                pb.ProducePartition(topic=topic, partition=0, records=make_batch(vals(1, size=5000))),
                pb.ProducePartition(topic=topic, partition=0, records=b""),
                pb.ProducePartition(topic="bad topic", partition=0, records=make_batch(vals(1))),
                pb.ProducePartition(topic=topic, partition=0, records=make_batch(vals(2))),
            ],
        )
    )
    codes = [p.error.code for p in resp.partitions]
    assert codes == [
        common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
        common_pb2.NOT_LEADER,
        common_pb2.CORRUPT_BATCH,
        common_pb2.BATCH_TOO_LARGE,
        common_pb2.CORRUPT_BATCH,
        common_pb2.INVALID_TOPIC,
        common_pb2.NONE,
    ]
    assert resp.partitions[-1].base_offset == 0  # nothing bad reached the log
    fetched = broker.fetch(part(topic, 5), part("no-such-topic", 0), part(topic, 0, 9), max_wait_ms=5000)
    assert [p.error.code for p in fetched.partitions] == [
        common_pb2.OFFSET_OUT_OF_RANGE,
        common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
        common_pb2.NOT_LEADER,
    ]
    assert broker.fetch_one(topic, -1).error.code == common_pb2.OFFSET_OUT_OF_RANGE


def test_request_level_errors_are_typed(broker: Broker, topic: str) -> None:
    broker.assign(topic)
    with pytest.raises(InvalidRequest):
        call(broker.stub.Produce, pb.ProduceRequest(acks=1))
    for bad in (pb.ProduceRequest(acks=2), pb.ProduceRequest(acks=1, timeout_ms=-1)):
        bad.partitions.add(topic=topic, partition=0, records=make_batch(vals(1)))
        with pytest.raises(InvalidArgument):
            call(broker.stub.Produce, bad)
    with pytest.raises(InvalidArgument, match="max_wait_ms"):
        call(broker.stub.Fetch, pb.FetchRequest(max_wait_ms=3_600_000, session_epoch=-1))
    with pytest.raises(InvalidArgument, match="max_bytes"):
        call(broker.stub.Fetch, pb.FetchRequest(max_bytes=2**31 - 1, session_epoch=-1))
    with pytest.raises(grpc.RpcError) as info:
        broker.stub.Fetch(pb.FetchRequest(max_bytes=-1, session_epoch=-1))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_full_assignment_stops_serving_without_deleting(broker: Broker, topic: str) -> None:
    other = topic + "-other"
    broker.assign(other)
    broker.assign(topic, partitions=2)
    broker.produce(topic, 1, make_batch(vals(4)))
    # A full assignment that leaves out topic/1 (and everything else assigned earlier).
    broker.assign(topic, partitions=1, full=True)
    assert broker.fetch_one(topic, 0, partition=1).error.code == common_pb2.NOT_LEADER
    # Still on disk, so its topic is known here: NOT_LEADER (refresh metadata), not UNKNOWN.
    assert broker.fetch_one(other, 0).error.code == common_pb2.NOT_LEADER
    broker.assign(topic, partitions=2)
    assert broker.fetch_one(topic, 0, partition=1).high_watermark == 4  # data kept


def test_metrics_are_exported(broker: Broker, topic: str) -> None:
    broker.assign(topic)
    broker.produce(topic, 0, make_batch(vals(7)))
    broker.fetch_one(topic)
    assert broker.metric("sluice_broker_records_in_total", topic=topic) == 7
    assert broker.metric("sluice_broker_records_out_total", topic=topic) == 7
    assert (broker.metric("sluice_broker_bytes_in_total", topic=topic) or 0) > 0
    assert broker.metric("sluice_broker_log_end_offset", topic=topic, partition="0") == 7
    assert broker.metric("sluice_broker_fetch_parked") is not None
    assert broker.metric("sluice_broker_rpc_requests_total", method="Produce", code="OK") is not None
