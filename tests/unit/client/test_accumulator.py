"""The accumulator state machine, driven with a fake clock (no threads, no network)."""

from __future__ import annotations

import random

import pytest

from sluice.client.producer.accumulator import Accumulator, BatchState, ProducerBatch
from sluice.client.producer.partitioner import StickyPartitioner
from sluice.codec.batch import COLUMN_BYTES, decode_records, read_header


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1000


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(clock: Clock, partitions: int = 2, batch_size: int = 2048, linger_ms: float = 5) -> Accumulator:
    return Accumulator(
        "t",
        partitions,
        StickyPartitioner(partitions, random.Random(1)),
        batch_size=batch_size,
        linger=linger_ms / 1000,
        delivery_timeout=10.0,
        clock=clock,
    )


def add(acc: Accumulator, p: int, value: bytes, key: bytes | None = None) -> tuple[ProducerBatch, int]:
    """What Producer.send does with the lock held (minus blocking on buffer memory)."""
    size = COLUMN_BYTES + len(value) + (len(key) if key else 0)
    b = acc.open[p]
    if b is None or b.builder is None or b.builder.size + size > acc.batch_size:
        b = acc.roll(p)
    assert b.builder is not None
    return b, b.builder.append(value, key, None, None, 1_000)


def test_a_batch_closes_when_the_next_record_does_not_fit(clock: Clock) -> None:
    acc = make(clock, batch_size=1024)
    first, _ = add(acc, 0, b"x" * 400)
    assert add(acc, 0, b"y" * 400)[0] is first
    third, idx = add(acc, 0, b"z" * 400)  # 72 + 2 + 3 * 422 > 1024
    assert third is not first
    assert idx == 0
    assert first.state is BatchState.QUEUED
    assert first.record_count == 2
    assert acc.buffered == first.size
    # The closed batch never exceeds batch_size.
    assert first.size <= 1024
    assert acc.ready(clock())[0] == [0]


def test_linger_makes_an_open_batch_ready(clock: Clock) -> None:
    acc = make(clock, linger_ms=5)
    add(acc, 1, b"v")
    ready, next_at = acc.ready(clock())
    assert ready == []
    assert next_at == pytest.approx(clock() + 0.005)
    clock.advance(4.9)
    assert acc.ready(clock())[0] == []
    clock.advance(0.2)
    assert acc.ready(clock())[0] == [1]


def test_flush_close_and_waiting_senders_skip_linger(clock: Clock) -> None:
    acc = make(clock, linger_ms=60_000)
    add(acc, 0, b"v")
    assert acc.ready(clock())[0] == []
    for attr in ("flushing", "waiting_for_space"):
        setattr(acc, attr, 1)
        assert acc.ready(clock())[0] == [0]
        setattr(acc, attr, 0)
    acc.closing = True
    assert acc.ready(clock())[0] == [0]


def test_drain_takes_the_backlog_in_order_and_one_run_per_partition(clock: Clock) -> None:
    acc = make(clock, batch_size=1024)
    for i in range(7):
        add(acc, 0, bytes([i]) * 400)
    queued = acc.queued(0)
    assert len(queued) == 3  # the 4th batch is still open
    taken = acc.drain([0], max_bytes=10 * 1024)
    assert taken == queued
    assert all(b.state is BatchState.IN_FLIGHT and b.attempts == 1 for b in taken)
    assert acc.in_flight(0) == taken
    # While a run is in flight, the partition is not ready, even when its open batch lingered.
    clock.advance(1000)
    assert acc.ready(clock())[0] == []
    assert acc.drain([0], 10 * 1024) == []
    for b in taken:
        acc.complete(b)
    assert acc.ready(clock())[0] == [0]
    (last,) = acc.drain([0], 10 * 1024)
    assert last.record_count == 1


def test_drain_respects_max_bytes_but_takes_at_least_one(clock: Clock) -> None:
    acc = make(clock, partitions=2, batch_size=1024)
    for p in (0, 1):
        for _ in range(4):
            add(acc, p, b"x" * 900)
    taken = acc.drain([0, 1], max_bytes=100)
    assert len(taken) == 1
    rest = acc.drain([0, 1], max_bytes=2000)
    assert len(rest) == 2
    assert {b.partition for b in rest} == {1 - taken[0].partition}


def test_retry_goes_back_in_creation_order_after_its_backoff(clock: Clock) -> None:
    acc = make(clock, batch_size=1024)
    for i in range(5):
        add(acc, 0, bytes([i]) * 600)
    run = acc.drain([0], max_bytes=1500)  # two of the four queued batches (678 bytes each)
    assert len(run) == 2
    later = acc.queued(0)
    for b in run:
        acc.reenqueue(b, clock() + 0.1)
    assert acc.queued(0) == run + later
    assert acc.ready(clock())[0] == []  # backing off
    clock.advance(100)
    assert acc.ready(clock())[0] == [0]
    again = acc.drain([0], max_bytes=1500)
    assert again == run
    assert all(b.attempts == 2 for b in again)


def test_expire_fails_old_open_and_queued_batches(clock: Clock) -> None:
    acc = make(clock, batch_size=1024)
    add(acc, 0, b"a" * 600)
    add(acc, 0, b"b" * 600)  # closes the first
    add(acc, 1, b"c")
    clock.advance(9_999)
    assert acc.expire(clock()) == []
    clock.advance(2)
    expired = acc.expire(clock())
    assert len(expired) == 3
    assert all(b.state is BatchState.DONE for b in expired)
    assert acc.buffered == 0
    assert acc.empty


def test_abort_and_batches(clock: Clock) -> None:
    acc = make(clock, batch_size=1024)
    add(acc, 0, b"a" * 600)
    add(acc, 0, b"b" * 600)
    inflight = acc.drain([0], 4096)
    add(acc, 1, b"c")
    assert len(list(acc.batches())) == 3
    left = acc.abort(include_in_flight=False)
    assert len(left) == 2
    assert acc.in_flight(0) == inflight
    assert acc.abort(include_in_flight=True) == inflight
    assert acc.empty
    assert acc.buffered == 0


def test_illegal_transitions_are_caught(clock: Clock) -> None:
    acc = make(clock)
    b, _ = add(acc, 0, b"v")
    with pytest.raises(AssertionError, match="open -> in_flight"):
        b.transition(BatchState.IN_FLIGHT)


def test_sticky_partition_moves_when_its_batch_closes(clock: Clock) -> None:
    acc = make(clock, partitions=4, batch_size=1024)
    first = acc.partitioner.keyless()
    add(acc, first, b"x" * 600)
    assert acc.partitioner.keyless() == first
    acc.roll(first)
    assert acc.partitioner.keyless() != first


def test_encode_once_gives_a_valid_batch(clock: Clock) -> None:
    acc = make(clock)
    b, _ = add(acc, 0, b"hello", b"k")
    add(acc, 0, b"world")
    acc.close_open(0)
    raw = b.encode()
    assert b.encode() is raw
    assert b.builder is None
    h = read_header(raw)
    assert h.record_count == 2
    assert h.length == len(raw) == b.size
    assert [(r.key, r.value) for r in decode_records(raw, "t", 0)] == [(b"k", b"hello"), (None, b"world")]
