"""Fetch planning over real partition logs: limits, the first-batch rule, filtering, readiness."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.broker.fetch import FetchCaps, FetchRead, PartitionSpec, new_read, validate_limits
from sluice.broker.log.partition_log import PartitionLog
from sluice.codec.batch import iter_headers
from sluice.errors import InvalidArgument, InvalidFilter, OffsetOutOfRange

from .helpers import batch, offsets_and_values, open_log, tags_of, values

CAPS = FetchCaps()


def _read(
    logs: dict[str, PartitionLog],
    specs: list[PartitionSpec],
    *,
    max_bytes: int = 1 << 20,
    min_bytes: int = 1,
    max_wait_ms: int = 500,
    caps: FetchCaps = CAPS,
) -> FetchRead:
    limits = validate_limits(max_wait_ms, min_bytes, max_bytes, caps)
    read = new_read(((s, logs[s.topic], None) for s in specs), limits, caps)
    read.read()
    return read


def _spec(topic: str, offset: int = 0, pmax: int = 1 << 20, flt: str = "") -> PartitionSpec:
    return PartitionSpec(topic, 0, offset, pmax, flt)


@pytest.fixture
def log_a(tmp_path: Path) -> PartitionLog:
    return open_log(tmp_path / "a")


@pytest.fixture
def log_b(tmp_path: Path) -> PartitionLog:
    return open_log(tmp_path / "b")


def test_reads_everything_in_order_and_reports_next_offset(log_a: PartitionLog) -> None:
    for i in range(3):
        log_a.append(batch(values(4, f"b{i}-")))
    read = _read({"a": log_a}, [_spec("a")])
    (part,) = read.finish()
    assert [o for o, _ in offsets_and_values(part.records)] == list(range(12))
    assert part.position == 12
    assert part.high_watermark == 12
    assert part.log_start_offset == 0
    assert read.ready()


def test_partition_max_bytes_stops_at_whole_batches(log_a: PartitionLog) -> None:
    one = batch(values(4, size=100))
    for _ in range(5):
        log_a.append(one)
    read = _read({"a": log_a}, [_spec("a", pmax=2 * len(one) + 10)])
    (part,) = read.parts
    assert part.out_bytes == 2 * len(one)
    assert part.position == 8
    assert part.full


def test_max_bytes_spans_partitions_and_the_rest_get_nothing(
    log_a: PartitionLog, log_b: PartitionLog
) -> None:
    one = batch(values(4, size=100))
    for _ in range(3):
        log_a.append(one)
        log_b.append(one)
    read = _read({"a": log_a, "b": log_b}, [_spec("a"), _spec("b")], max_bytes=int(len(one) * 1.5))
    a, b = read.finish()
    assert a.out_bytes == len(one)
    assert a.position == 4
    assert b.out_bytes == 0
    assert b.position == 0
    assert b.high_watermark == 12
    assert read.total_bytes <= int(len(one) * 1.5)
    assert read.ready()  # nothing more can fit


def test_first_batch_is_returned_even_when_over_both_limits(log_a: PartitionLog, log_b: PartitionLog) -> None:
    big = batch(values(3, size=5000))
    log_a.append(big)
    log_a.append(big)
    log_b.append(big)
    read = _read({"a": log_a, "b": log_b}, [_spec("a", pmax=100), _spec("b", pmax=100)], max_bytes=100)
    a, b = read.parts
    assert a.out_bytes == len(big)
    assert a.position == 3
    assert b.out_bytes == 0  # only the first non-empty partition gets the exception


def test_first_batch_rule_applies_to_the_first_non_empty_partition(
    log_a: PartitionLog, log_b: PartitionLog
) -> None:
    log_b.append(batch(values(3, size=5000)))
    read = _read({"a": log_a, "b": log_b}, [_spec("a", pmax=100), _spec("b", pmax=100)], max_bytes=100)
    a, b = read.parts
    assert a.out_bytes == 0
    assert b.position == 3
    assert b.out_bytes > 100


def test_offsets_out_of_range_and_negative(log_a: PartitionLog) -> None:
    log_a.append(batch(values(2)))
    read = _read({"a": log_a}, [_spec("a", offset=3)])
    assert isinstance(read.parts[0].error, OffsetOutOfRange)
    assert read.parts[0].high_watermark == -1
    assert read.ready()  # an error answers at once
    read = _read({"a": log_a}, [_spec("a", offset=-1)])
    assert isinstance(read.parts[0].error, OffsetOutOfRange)


def test_at_the_end_waits_then_continues_after_an_append(log_a: PartitionLog) -> None:
    log_a.append(batch(values(2)))
    read = _read({"a": log_a}, [_spec("a", offset=2)], min_bytes=1)
    assert not read.ready()
    assert read.waiting_keys() == [("a", 0)]
    log_a.append(batch(values(3, "new")))
    read.read({("a", 0)})
    assert read.ready()
    (part,) = read.finish()
    assert offsets_and_values(part.records) == [(2, b"new0"), (3, b"new1"), (4, b"new2")]


def test_min_bytes_accumulates_across_reads(log_a: PartitionLog) -> None:
    one = batch(values(1, size=50))
    log_a.append(one)
    read = _read({"a": log_a}, [_spec("a")], min_bytes=3 * len(one))
    assert not read.ready()
    log_a.append(one)
    read.read({("a", 0)})
    assert not read.ready()
    log_a.append(one)
    read.read({("a", 0)})
    assert read.ready()
    assert read.parts[0].position == 3


def test_zero_wait_or_zero_min_bytes_answers_at_once(log_a: PartitionLog) -> None:
    assert _read({"a": log_a}, [_spec("a")], max_wait_ms=0).ready()
    assert _read({"a": log_a}, [_spec("a")], min_bytes=0).ready()
    assert _read({"a": log_a}, [], max_wait_ms=100).ready()


def test_filter_keeps_matching_records_and_moves_past_the_rest(log_a: PartitionLog) -> None:
    log_a.append(batch(values(5, "a"), "a"))
    log_a.append(batch(values(4, "m"), ["a", "b", None, "b"]))
    log_a.append(batch(values(3, "c"), "c"))
    read = _read({"a": log_a}, [_spec("a", flt="b || c")])
    (part,) = read.finish()
    assert [o for o, _ in offsets_and_values(part.records)] == [6, 8, 9, 10, 11]
    assert set(tags_of(part.records)) == {"b", "c"}
    assert part.position == 12


def test_selective_filter_is_bounded_by_the_scan_budget(log_a: PartitionLog) -> None:
    one = batch(values(10, size=100), "noise")
    for _ in range(20):
        log_a.append(one)
    caps = FetchCaps(scan_bytes=5 * len(one), scan_chunk_bytes=len(one))
    read = _read({"a": log_a}, [_spec("a", flt="signal")], caps=caps)
    (part,) = read.parts
    assert part.scan_budget_hit
    assert part.batches == []
    assert 0 < part.position < 200  # progress, but not the whole log in one request
    assert read.ready()  # answer now so the consumer moves on


def test_invalid_filter_is_a_per_partition_error(log_a: PartitionLog) -> None:
    read = _read({"a": log_a}, [_spec("a", flt="a || ???")])
    assert isinstance(read.parts[0].error, InvalidFilter)


def test_request_limits_are_capped() -> None:
    caps = FetchCaps(max_wait_ms=1000, max_bytes=1 << 20)
    with pytest.raises(InvalidArgument, match="max_wait_ms"):
        validate_limits(1001, 1, 100, caps)
    with pytest.raises(InvalidArgument, match="max_bytes"):
        validate_limits(10, 1, (1 << 20) + 1, caps)
    with pytest.raises(InvalidArgument, match="min_bytes"):
        validate_limits(10, -1, 100, caps)
    assert validate_limits(-5, 1, 0, caps).max_wait_ms == 0
    assert validate_limits(10, 1, 0, caps).max_bytes == 1 << 20  # 0 means the cap


def test_a_damaged_batch_ends_the_answer_before_it_then_is_a_typed_error(tmp_path: Path) -> None:
    """A batch that failed verification at an unclean open is never served: a fetch gets the
    records before it, and the next fetch, starting at it, a retriable STORAGE_ERROR."""
    log = open_log(tmp_path / "a")
    for i in range(4):
        log.append(batch(values(3, f"b{i}-")))
    log.close()
    segment = next((tmp_path / "a").glob("*.log"))
    raw = bytearray(segment.read_bytes())
    third_pos, third = list(iter_headers(bytes(raw)))[2]
    raw[third_pos + third.length - 3] ^= 0x10  # inside the third batch's records
    segment.write_bytes(bytes(raw))
    damaged = PartitionLog(tmp_path / "a", log.config, verify_all=True)
    assert damaged.corrupt_ranges == [(6, 9)]
    for filtered in ("", "x"):
        read = _read({"a": damaged}, [_spec("a", 0, flt=filtered)])
        (part,) = read.finish()
        if not filtered:
            assert [o for o, _ in offsets_and_values(part.records)] == list(range(6))
        assert part.position == 6
        assert part.error is None
    read = _read({"a": damaged}, [_spec("a", 6)])
    (part,) = read.finish()
    assert part.error is not None
    assert part.error.code_name == "STORAGE_ERROR"
    assert part.error.retriable
    damaged.close()


def test_a_filter_that_skipped_everything_answers_at_once_but_not_once_parked(log_a: PartitionLog) -> None:
    for _ in range(3):
        log_a.append(batch(values(2), tags="noise"))
    read = _read({"a": log_a}, [_spec("a", flt="signal")])
    (part,) = read.parts
    assert (part.position, part.records) == (6, b"")
    assert read.ready()  # the skipped position goes back now, not after max_wait_ms
    # At the end: nothing skipped yet, so it waits; once parked, a non-matching append is skipped but
    # keeps it waiting (an empty answer per append would spin the consumer).
    read = _read({"a": log_a}, [_spec("a", offset=6, flt="signal")])
    assert not read.ready()
    read.parked = True
    log_a.append(batch(values(2), tags="noise"))
    read.read({("a", 0)})
    assert read.parts[0].position == 8
    assert not read.ready()
    log_a.append(batch(values(1), tags="signal"))
    read.read({("a", 0)})
    assert read.ready()
    assert [o for o, _ in offsets_and_values(read.parts[0].records)] == [8]
