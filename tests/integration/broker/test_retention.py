"""Retention deletes whole old segments and moves log_start_offset; aged segments roll."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from sluice.v1 import common_pb2

from .conftest import Broker, make_batch, records, vals


def _segments(broker: Broker, topic: str) -> list[Path]:
    return sorted((broker.data_dir / f"{topic}-0").glob("*.log"))


def _eventually(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    # The retention task runs every 200 ms in the shared broker; wait for its effect.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_size_retention_deletes_old_segments_and_moves_log_start(broker: Broker, topic: str) -> None:
    broker.assign(topic, segment_bytes=4096, retention_bytes=8192)
    one = make_batch(vals(10, size=100))  # ~1.3 KiB: about three batches per segment
    for _ in range(30):
        broker.produce(topic, 0, one)
    assert broker.offsets(topic, -1).offset == 300
    # A retention pass deletes one segment at a time, moving the log start with each: only once the log
    # is within its limit (the gauge reads the live size) does log_start_offset stop moving.
    assert _eventually(
        lambda: (broker.metric("sluice_broker_log_size_bytes", topic=topic, partition="0") or 0) <= 8192
    )
    assert _eventually(lambda: _log_start_is_consistent(broker, topic))
    start = broker.offsets(topic, -2).offset
    assert start > 0
    assert start % 10 == 0  # whole segments (of whole batches) go
    assert broker.fetch_one(topic, 0).error.code == common_pb2.OFFSET_OUT_OF_RANGE
    p = broker.fetch_one(topic, start)
    assert p.log_start_offset == start
    assert records(p)[0].offset == start
    assert len(_segments(broker, topic)) <= 4


def _log_start_is_consistent(broker: Broker, topic: str) -> bool:
    """ListOffsets and a fetch at the log start agree: no retention pass ran between the two."""
    start = broker.offsets(topic, -2).offset
    p = broker.fetch_one(topic, start)
    return start > 0 and p.log_start_offset == start and bool(records(p)) and records(p)[0].offset == start


def test_time_retention_deletes_segments_of_old_records(broker: Broker, topic: str) -> None:
    broker.assign(topic, segment_bytes=4096, retention_ms=60_000)
    now_ms = int(time.time() * 1000)
    for _ in range(6):
        broker.produce(topic, 0, make_batch(vals(10, size=100), ts=now_ms - 3_600_000))  # an hour old
    for _ in range(3):
        broker.produce(topic, 0, make_batch(vals(10, size=100), ts=now_ms))
    assert _eventually(lambda: broker.offsets(topic, -2).offset >= 60)
    # Recent records stay.
    assert broker.offsets(topic, -1).offset == 90


def test_aged_active_segment_is_rolled(broker: Broker, topic: str) -> None:
    broker.assign(topic, segment_ms=300)
    # Current timestamps: a 1970 record would be past the default 7-day retention once rolled.
    now_ms = int(time.time() * 1000)
    broker.produce(topic, 0, make_batch(vals(3), ts=now_ms))
    assert len(_segments(broker, topic)) == 1
    assert _eventually(lambda: len(_segments(broker, topic)) == 2)
    r = broker.produce(topic, 0, make_batch(vals(3), ts=now_ms))
    assert r.base_offset == 3
    assert [x.offset for x in records(broker.fetch_one(topic, 0))] == list(range(6))
