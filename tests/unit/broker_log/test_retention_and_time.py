"""Retention by size and age, and lookups by timestamp."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sluice.broker.log import PartitionLog
from sluice.errors import OffsetOutOfRange

from .helpers import Clock, make_batch, read_all, segment_files, small_config, ts_batch


def test_retention_by_bytes_deletes_oldest_whole_segments(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config(segment_bytes=1000, retention_bytes=2500))
    for i in range(40):
        log.append(make_batch(3, seed=i))
    before = log.segment_base_offsets()
    assert log.size_bytes > 2500
    deleted = log.apply_retention()
    after = log.segment_base_offsets()
    assert deleted == len(before) - len(after) > 0
    assert after == before[deleted:]
    assert log.size_bytes <= 2500
    assert log.log_start_offset == after[0] > 0
    assert [int(f.stem) for f in segment_files(tmp_path)] == after
    assert not any(int(f.stem) < after[0] for f in segment_files(tmp_path, ".index"))
    assert not any(int(f.stem) < after[0] for f in segment_files(tmp_path, ".timeindex"))
    with pytest.raises(OffsetOutOfRange, match=f"log start offset {after[0]}"):
        log.read(0, 100)
    assert [r.offset for r in read_all(log)] == list(range(after[0], log.log_end_offset))
    assert log.apply_retention() == 0
    # Survives a restart: the log starts at the first remaining segment.
    log.close()
    assert PartitionLog(tmp_path, small_config()).log_start_offset == after[0]


def test_retention_never_deletes_the_active_segment(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config(segment_bytes=1000, retention_bytes=0))
    for i in range(20):
        log.append(make_batch(3, seed=i))
    log.apply_retention()
    assert len(log.segment_base_offsets()) == 1
    assert log.log_start_offset == log.segment_base_offsets()[0]
    assert log.log_end_offset == 60
    assert read_all(log)[-1].offset == 59


def test_retention_by_time_uses_the_newest_record_timestamp_of_a_segment(tmp_path: Path) -> None:
    clock = Clock(now_ms=80_000)
    log = PartitionLog(tmp_path, small_config(segment_bytes=1000, retention_ms=10_000), clock)
    for i in range(30):  # batch i holds timestamps 50_000 + 1000*i + (0, 1, 2)
        log.append(make_batch(3, ts=50_000 + 1000 * i, seed=i))
    segments = log.segment_base_offsets()
    assert len(segments) > 3
    newest = {
        base: 50_000 + 1000 * ((end - 1) // 3) + 2
        for base, end in zip(segments, [*segments[1:], 90], strict=True)
    }
    # Cut-off 70_000: the leading segments whose newest record is older go.
    expected_gone = 0
    while expected_gone < len(segments) - 1 and newest[segments[expected_gone]] < 70_000:
        expected_gone += 1
    assert 0 < expected_gone < len(segments) - 1
    assert log.apply_retention() == expected_gone
    assert log.log_start_offset == segments[expected_gone]
    assert read_all(log)[0].offset == segments[expected_gone]
    clock.advance(1_000_000)  # everything expires, but the active segment stays
    log.apply_retention()
    assert log.segment_base_offsets() == segments[-1:]


def test_unlimited_retention_keeps_everything(tmp_path: Path) -> None:
    clock = Clock(now_ms=10**12)
    log = PartitionLog(tmp_path, small_config(segment_bytes=500, retention_ms=-1, retention_bytes=-1), clock)
    for i in range(20):
        log.append(make_batch(3, ts=0, seed=i))
    assert log.apply_retention() == 0
    assert log.log_start_offset == 0


def brute_force_offset_for_timestamp(batches: list[list[int]], target: int) -> tuple[int, int] | None:
    offset = 0
    for stamps in batches:
        for ts in stamps:
            if ts >= target:
                return offset, ts
            offset += 1
    return None


@pytest.mark.parametrize("seed", range(4))
def test_offset_for_timestamp_matches_a_brute_force_scan(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    log = PartitionLog(tmp_path, small_config(segment_bytes=1200, index_interval_bytes=150))
    batches: list[list[int]] = []
    now = 10_000
    for i in range(60):
        # Mostly increasing, with producer clocks that jitter backwards.
        stamps = [now + rng.randint(-300, 300) for _ in range(rng.randint(1, 6))]
        now += rng.randint(0, 100)
        batches.append(stamps)
        log.append(ts_batch(stamps, seed=i))
    assert len(log.segment_base_offsets()) > 3
    lo = min(min(b) for b in batches)
    hi = max(max(b) for b in batches)
    for target in [*range(lo - 5, hi + 5, 7), hi, hi + 1]:
        assert log.offset_for_timestamp(target) == brute_force_offset_for_timestamp(batches, target), target
    log.close()
    reopened = PartitionLog(tmp_path, small_config(segment_bytes=1200, index_interval_bytes=150))
    for target in range(lo, hi, 31):
        assert reopened.offset_for_timestamp(target) == brute_force_offset_for_timestamp(batches, target)


def test_offset_for_timestamp_after_retention_and_on_empty_log(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config(segment_bytes=800, retention_bytes=1500))
    assert log.offset_for_timestamp(0) is None
    for i in range(20):
        log.append(make_batch(3, ts=1000 * i, seed=i))
    log.apply_retention()
    start = log.log_start_offset
    assert log.offset_for_timestamp(0) == (start, 1000 * (start // 3) + start % 3)
    assert log.offset_for_timestamp(19_002) == (59, 19_002)
    assert log.offset_for_timestamp(19_003) is None
