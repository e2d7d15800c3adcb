"""Long-poll: a parked fetch completes on an append, or after max_wait, never by polling."""

from __future__ import annotations

import time

import grpc

from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2

from .conftest import Broker, make_batch, part, records, vals


def _parked(
    broker: Broker, *parts: pb.FetchPartition, max_wait_ms: int, min_bytes: int = 1
) -> grpc.CallFuture[pb.FetchResponse]:
    req = pb.FetchRequest(
        max_wait_ms=max_wait_ms, min_bytes=min_bytes, session_epoch=-1, partitions=list(parts)
    )
    return broker.stub.Fetch.future(req, timeout=30)


def test_fetch_returns_soon_after_a_concurrent_produce(broker: Broker, topic: str) -> None:
    broker.assign(topic)
    broker.produce(topic, 0, make_batch(vals(2)))
    started = time.monotonic()
    fut = _parked(broker, part(topic, 2), max_wait_ms=5000)
    time.sleep(0.3)
    assert not fut.done()  # parked: nothing new yet
    broker.produce(topic, 0, make_batch(vals(3, "new")))
    resp = fut.result()
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, elapsed  # far from max_wait (5 s)
    (p,) = resp.partitions
    assert [(r.offset, r.value) for r in records(p)] == [(2, b"new0"), (3, b"new1"), (4, b"new2")]
    assert p.next_offset == 5
    assert p.high_watermark == 5


def test_with_nothing_arriving_it_returns_after_max_wait(broker: Broker, topic: str) -> None:
    broker.assign(topic)
    started = time.monotonic()
    resp = broker.fetch(part(topic, 0), max_wait_ms=400)
    elapsed = time.monotonic() - started
    assert 0.38 <= elapsed < 1.5, elapsed
    (p,) = resp.partitions
    assert p.error.code == common_pb2.NONE
    assert p.records == b""
    assert p.next_offset == 0


def test_min_bytes_waits_for_enough_data(broker: Broker, topic: str) -> None:
    broker.assign(topic, partitions=2)
    small = make_batch(vals(1, size=100))
    fut = _parked(broker, part(topic, 0, 0), part(topic, 0, 1), max_wait_ms=5000, min_bytes=2 * len(small))
    time.sleep(0.1)
    broker.produce(topic, 0, small)
    time.sleep(0.3)
    assert not fut.done()  # one batch is not min_bytes yet
    broker.produce(topic, 1, small)  # appends on any watched partition count
    resp = fut.result()
    assert [len(p.records) for p in resp.partitions] == [len(small), len(small)]


def test_unassigning_a_partition_answers_parked_fetches(broker: Broker, topic: str) -> None:
    broker.assign(topic, partitions=2)
    started = time.monotonic()
    fut = _parked(broker, part(topic, 0, 1), max_wait_ms=5000)
    time.sleep(0.2)
    broker.assign(topic, partitions=1, full=True)  # topic/1 moves away
    resp = fut.result()
    assert time.monotonic() - started < 2.0
    assert resp.partitions[0].error.code == common_pb2.NOT_LEADER


def test_parked_fetches_show_in_metrics(broker: Broker, topic: str) -> None:
    broker.assign(topic)
    futs = [_parked(broker, part(topic, 0), max_wait_ms=3000) for _ in range(3)]
    deadline = time.monotonic() + 2
    parked = 0.0
    while time.monotonic() < deadline and parked < 3:
        parked = broker.metric("sluice_broker_fetch_parked") or 0.0
        time.sleep(0.05)
    assert parked >= 3
    broker.produce(topic, 0, make_batch(vals(1)))
    assert all(len(f.result().partitions[0].records) > 0 for f in futs)
