"""Append and read: dense offsets, segment rolls, fetch-style read limits, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.broker.log import LogConfig, PartitionLog
from sluice.codec.batch import (
    decode_records,
    encode_records,
    filter_batch,
    iter_headers,
    read_header,
    validate_batch,
)
from sluice.errors import BatchTooLarge, CorruptBatch, InvalidArgument, OffsetOutOfRange

from .helpers import Clock, make_batch, read_all, segment_files, small_config


def test_offsets_are_dense_across_appends_and_segment_rolls(tmp_path: Path) -> None:
    clock = Clock()
    log = PartitionLog(tmp_path, small_config(), clock)
    expected_base = 0
    for i in range(40):
        count = 1 + i % 5
        batches = make_batch(count, seed=i) + make_batch(2, seed=1000 + i)
        result = log.append(batches)
        assert result.base_offset == expected_base
        assert result.last_offset == expected_base + count + 2 - 1
        assert result.append_time_ms == clock.now
        expected_base = result.last_offset + 1
    assert log.log_end_offset == expected_base
    assert len(segment_files(tmp_path)) > 3, "small segment_bytes must have rolled"
    records = read_all(log)
    assert [r.offset for r in records] == list(range(expected_base))
    # The stamped header fields: base offsets chain densely, append time is the broker's.
    data = log.read(0, 1 << 30).data
    assert len(data) == log.size_bytes
    next_offset = 0
    for _, h in iter_headers(data):
        assert h.base_offset == next_offset
        assert h.append_time_ms == clock.now
        next_offset = h.next_offset
    assert next_offset == expected_base


def test_segments_are_named_by_base_offset_and_never_exceed_the_size_unless_one_request_does(
    tmp_path: Path,
) -> None:
    cfg = small_config(segment_bytes=1000)
    log = PartitionLog(tmp_path, cfg)
    batch = make_batch(3)
    for _ in range(30):
        log.append(batch)
    bases = log.segment_base_offsets()
    assert [f.name for f in segment_files(tmp_path)] == [f"{b:020d}.log" for b in bases]
    for f in segment_files(tmp_path):
        assert f.stat().st_size <= 1000
    big = make_batch(40)  # larger than a segment: gets a segment of its own
    assert len(big) > 1000
    log.append(big)
    assert segment_files(tmp_path)[-1].stat().st_size == len(big)


def test_read_returns_the_batch_containing_the_offset(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config())
    for i in range(10):
        log.append(make_batch(5, seed=i))  # batches cover [0,5), [5,10), ...
    res = log.read(12, 1 << 20)
    assert res.base_offset_of_first == 10
    assert read_header(res.data).base_offset == 10
    assert res.next_offset == 50
    records = decode_records(res.data, "t", 0, start_offset=12)
    assert records[0].offset == 12
    assert records[0].value.startswith(b"2:2:")


def test_max_bytes_cuts_at_batch_boundaries(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config(segment_bytes=1 << 20))
    batch_len = len(make_batch(4))
    for i in range(10):
        log.append(make_batch(4, seed=i))
    res = log.read(0, 3 * batch_len + batch_len // 2)
    assert len(res.data) == 3 * batch_len
    assert res.next_offset == 12
    assert res.base_offset_of_first == 0
    # Exactly at a boundary: that many whole batches.
    assert log.read(4, 2 * batch_len).next_offset == 12


def test_min_one_returns_an_oversized_first_batch_whole(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config(segment_bytes=1 << 20))
    log.append(make_batch(2))
    big = make_batch(50, value_size=100, seed=1)
    log.append(big)
    log.append(make_batch(2, seed=2))
    res = log.read(2, 100, min_one=True)
    assert len(res.data) == len(big)
    assert res.next_offset == 52
    res = log.read(3, 0, min_one=True)
    assert res.base_offset_of_first == 2
    assert res.next_offset == 52
    # Without min_one, nothing fits: empty, next_offset stays.
    res = log.read(2, 100, min_one=False)
    assert res.data == b""
    assert res.next_offset == 2


def test_read_spans_segments_until_max_bytes(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config(segment_bytes=500))
    batch = make_batch(3)
    for i in range(12):
        log.append(make_batch(3, seed=i))
    assert len(log.segment_base_offsets()) > 3
    res = log.read(0, 7 * len(batch))
    assert res.next_offset == 21
    assert [r.offset for r in decode_records(res.data, "t", 0)] == list(range(21))


def test_read_at_end_is_empty_and_outside_the_log_is_out_of_range(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config())
    empty = log.read(0, 100)
    assert (empty.data, empty.next_offset) == (b"", 0)
    log.append(make_batch(3))
    res = log.read(3, 100)
    assert (res.data, res.next_offset, res.base_offset_of_first) == (b"", 3, 3)
    with pytest.raises(OffsetOutOfRange, match=r"\[0, 3\)"):
        log.read(4, 100)
    with pytest.raises(OffsetOutOfRange, match="log start offset 0"):
        log.read(-1, 100)


def test_bad_input_is_rejected_and_nothing_is_written(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config(max_batch_bytes=2000))
    log.append(make_batch(2))
    size = log.size_bytes
    good = make_batch(2)
    corrupt = bytearray(make_batch(2))
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptBatch, match="empty produce"):
        log.append(b"")
    with pytest.raises(CorruptBatch, match="CRC"):
        log.append(good + bytes(corrupt))  # the good first batch must not be written either
    with pytest.raises(CorruptBatch):
        log.append(good + good[:30])  # truncated trailing batch
    with pytest.raises(BatchTooLarge, match="2000"):
        log.append(make_batch(100, value_size=50))
    assert log.size_bytes == size
    assert log.log_end_offset == 2
    assert [r.offset for r in read_all(log)] == [0, 1]


def test_a_batch_with_gaps_in_its_offsets_is_rejected(tmp_path: Path) -> None:
    # A filtered batch (last_offset_delta > record_count - 1) is valid on the wire but
    # would leave holes in the offsets if a producer sent it.
    full = encode_records([(b"a", None, "x", None, 1), (b"b", None, "y", None, 2)])
    partial = filter_batch(full, 0, read_header(full), frozenset({"x"}))
    assert partial is not None
    assert validate_batch(partial, 0, 1 << 20).last_offset_delta == 1
    log = PartitionLog(tmp_path, small_config())
    with pytest.raises(CorruptBatch, match=r"offset deltas 0\.\.record_count-1"):
        log.append(partial)
    assert log.log_end_offset == 0
    assert log.append(full).last_offset == 1


def test_listeners_run_after_each_append(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config())
    seen: list[int] = []

    def listener() -> None:
        seen.append(log.log_end_offset)

    def failing() -> None:
        raise RuntimeError("listener bug")

    log.add_append_listener(failing)
    log.add_append_listener(listener)
    log.append(make_batch(2))
    log.append(make_batch(3))
    with pytest.raises(CorruptBatch):
        log.append(b"junk")
    log.remove_append_listener(listener)
    log.remove_append_listener(listener)  # removing twice is harmless
    log.append(make_batch(1))
    assert seen == [2, 5]


def test_segments_roll_by_age_on_append_and_on_maybe_roll(tmp_path: Path) -> None:
    clock = Clock()
    log = PartitionLog(tmp_path, small_config(segment_bytes=1 << 20, segment_ms=1000), clock)
    assert not log.maybe_roll()  # empty segments never roll
    log.append(make_batch(2))
    clock.advance(999)
    assert not log.maybe_roll()
    log.append(make_batch(2))
    clock.advance(1)
    log.append(make_batch(2))  # the active segment's first batch is now 1000 ms old
    assert log.segment_base_offsets() == [0, 4]
    clock.advance(1000)
    assert log.maybe_roll()
    assert log.segment_base_offsets() == [0, 4, 6]
    assert not log.maybe_roll()
    assert [r.offset for r in read_all(log)] == list(range(6))


def test_config_rejects_nonsense() -> None:
    with pytest.raises(InvalidArgument, match="segment_bytes"):
        LogConfig(segment_bytes=0)
    with pytest.raises(InvalidArgument, match="retention_ms"):
        LogConfig(retention_ms=-5)
    with pytest.raises(InvalidArgument, match="unknown log config keys: nope"):
        LogConfig.from_dict({"nope": 1})
    assert LogConfig.from_dict(LogConfig(segment_bytes=77).to_dict()).segment_bytes == 77


def test_closed_log_refuses_appends(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config())
    log.close()
    log.close()
    log.flush()  # a no-op once closed
    with pytest.raises(Exception, match="closed"):
        log.append(make_batch(1))
