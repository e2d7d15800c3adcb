"""Format version 2: the leader epoch outside the CRC, the producer fields inside, format 1 refused
or converted (docs/replication.md, "Batch format version 2")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec import batch as b
from sluice.codec.batch.v1 import is_v1, upgrade_v1, v1_length
from sluice.errors import CorruptBatch, UnsupportedVersion
from tests.batch_v1 import to_v1

from .test_batch import LIMIT, RecordTuple, record_st

producer_st = st.tuples(st.integers(-1, 2**63 - 1), st.integers(-1, 2**15 - 1), st.integers(-1, 2**31 - 1))
stamp_st = st.tuples(st.integers(0, 2**62), st.integers(-1, 2**62), st.integers(-1, 2**31 - 1))


def test_the_header_is_laid_out_as_documented() -> None:
    raw = bytearray(b.encode_records([(b"v", b"k", "t", None, 5)], producer=(7, 3, 11)))
    b.stamp(raw, 0, 1234, 99, 42)
    assert (b.HEADER_SIZE, b.CRC_START, b.CRC_AT, b.MAGIC_AT) == (72, 29, 25, 24)
    assert raw[24] == 2
    assert int.from_bytes(raw[0:8], "little") == 1234
    assert int.from_bytes(raw[8:12], "little") == len(raw)
    assert int.from_bytes(raw[12:20], "little") == 99
    assert int.from_bytes(raw[20:24], "little") == 42
    assert int.from_bytes(raw[25:29], "little") == b.crc32c(bytes(raw[29:]))
    assert int.from_bytes(raw[30:38], "little") == 7
    assert int.from_bytes(raw[38:40], "little") == 3
    assert int.from_bytes(raw[40:44], "little") == 11
    assert int.from_bytes(raw[44:48], "little") == 1  # record_count
    assert int.from_bytes(raw[48:52], "little") == 0  # last_offset_delta


def test_an_unstamped_batch_of_a_plain_producer_says_none_everywhere() -> None:
    h = b.read_header(b.encode_records([(b"v", None, None, None, 1)]))
    assert (h.partition_leader_epoch, h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1, -1)
    assert (h.base_offset, h.append_time_ms, h.magic) == (0, -1, 2)


@settings(max_examples=150, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=30), producer_st, stamp_st)
def test_v2_round_trip_keeps_records_producer_fields_and_stamps(
    records: list[RecordTuple], producer: tuple[int, int, int], stamps: tuple[int, int, int]
) -> None:
    raw = bytearray(b.encode_records(records, producer=producer))
    b.stamp(raw, 0, *stamps)
    h = b.validate_batch(bytes(raw), 0, LIMIT)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == producer
    assert (h.base_offset, h.append_time_ms, h.partition_leader_epoch) == stamps
    decoded = b.decode_records(bytes(raw), "t", 0)
    assert [(r.value, r.key, r.tag, r.headers or None, r.timestamp) for r in decoded] == [
        (v, k, t, hd or None, ts) for v, k, t, hd, ts in records
    ]
    view = b.batch_views(bytes(raw))[0]
    assert view.header == h


@settings(max_examples=60, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=12), producer_st, st.data())
def test_a_flipped_bit_anywhere_in_the_crc_range_fails_the_crc(
    records: list[RecordTuple], producer: tuple[int, int, int], data: st.DataObject
) -> None:
    raw = b.encode_records(records, producer=producer)
    pos = data.draw(st.integers(b.CRC_START, len(raw) - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    bad = bytearray(raw)
    bad[pos] ^= 1 << bit
    with pytest.raises(CorruptBatch):
        b.validate_batch(bytes(bad), 0, LIMIT)
    with pytest.raises(CorruptBatch, match="CRC"):
        b.decode_records(bytes(bad), "t", 0)


@settings(max_examples=100, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=12), producer_st, stamp_st, stamp_st)
def test_offset_time_and_epoch_can_be_restamped_without_breaking_the_crc(
    records: list[RecordTuple],
    producer: tuple[int, int, int],
    first: tuple[int, int, int],
    second: tuple[int, int, int],
) -> None:
    """What a follower relies on: it copies the leader's bytes, and the stamps are outside the CRC."""
    raw = bytearray(b.encode_records(records, producer=producer))
    crc = b.read_header(raw).crc
    b.stamp(raw, 0, *first)
    b.stamp(raw, 0, *second)
    h = b.validate_batch(bytes(raw), 0, LIMIT)
    assert h.crc == crc
    assert (h.base_offset, h.append_time_ms, h.partition_leader_epoch) == second
    assert bytes(raw[b.CRC_AT :]) == b.encode_records(records, producer=producer)[b.CRC_AT :]


def test_a_flipped_magic_is_refused_by_version() -> None:
    raw = bytearray(b.encode_records([(b"v", None, None, None, 1)]))
    raw[b.MAGIC_AT] = 3
    with pytest.raises(CorruptBatch, match="unsupported batch magic 3"):
        b.validate_batch(bytes(raw), 0, LIMIT)


def test_filter_and_cut_keep_the_producer_fields_and_the_leader_epoch() -> None:
    records = [(b"v%d" % i, None, "a" if i % 2 else "b", None, 10 + i) for i in range(6)]
    raw = bytearray(b.encode_records(records, producer=(5, 1, 100)))
    b.stamp(raw, 0, 40, 77, 9)
    h = b.read_header(raw)
    kept = b.filter_batch(bytes(raw), 0, h, frozenset({"a"}))
    assert kept is not None
    cut = b.BatchView(bytes(raw)).cut([(0, 2), (4, 5)])
    for out in (kept, cut):
        k = b.validate_batch(out, 0, LIMIT)
        assert (k.producer_id, k.producer_epoch, k.base_sequence) == (5, 1, 100)
        assert (k.base_offset, k.append_time_ms, k.partition_leader_epoch) == (40, 77, 9)
    assert [r.offset for r in b.decode_records(kept, "t", 0)] == [41, 43, 45]
    assert [r.offset for r in b.decode_records(cut, "t", 0)] == [40, 41, 44]


def test_a_format_1_batch_is_refused_with_a_typed_error_naming_the_fix() -> None:
    v1 = to_v1(b.encode_records([(b"v", None, None, None, 1)]))
    assert is_v1(v1)
    with pytest.raises(UnsupportedVersion, match="batch format 1: upgrade the client"):
        b.validate_batch(v1, 0, LIMIT)


@settings(max_examples=100, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=20), st.integers(0, 2**40), st.integers(-1, 2**40))
def test_a_format_1_batch_converts_to_the_same_records_in_format_2(
    records: list[RecordTuple], base: int, when: int
) -> None:
    v2 = b.encode_records(records)
    v1 = to_v1(v2, base_offset=base, append_time_ms=when)
    assert v1_length(v1 + b"trailing", 0) == len(v1)
    up = upgrade_v1(v1, 0, leader_epoch=0)
    h = b.validate_batch(up, 0, LIMIT)
    assert (h.base_offset, h.append_time_ms, h.partition_leader_epoch) == (base, when, 0)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1)
    assert len(up) == len(v1) + b.HEADER_SIZE - 54
    unstamped = bytearray(up)
    b.stamp(unstamped, 0, 0, -1, -1)
    assert bytes(unstamped) == v2  # byte for byte what a format-2 producer writes


def test_a_corrupt_format_1_batch_is_never_converted() -> None:
    v1 = bytearray(to_v1(b.encode_records([(b"value", None, None, None, 1)])))
    v1[-1] ^= 0x10
    assert v1_length(v1, 0) is None
    with pytest.raises(CorruptBatch, match="CRC-valid format-1"):
        upgrade_v1(v1, 0)
    assert v1_length(v1[:30], 0) is None


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=4), cut=st.integers(0, 80))
def test_the_header_free_walk_matches_the_header_walk(counts: list[int], cut: int) -> None:
    """``iter_spans``, ``stored_crc`` and ``record_count_at`` (the broker's read check and bytes-out
    metric) give what ``iter_headers`` does, up to the same short tail."""
    from sluice.codec.batch.layout import iter_spans, record_count_at, stored_crc

    batches = []
    for i, count in enumerate(counts):
        builder = b.BatchBuilder()
        for j in range(count):
            builder.append(b"v%d" % j, None, None, None, 1_000 + j)
        raw = bytearray(builder.build())
        b.stamp(raw, 0, 10 * i, 5, 1)
        batches.append(bytes(raw))
    data = b"".join(batches)
    data = data[: max(len(data) - cut, 0)]
    headers = list(b.iter_headers(data))
    assert [(pos, base, length) for pos, base, length in iter_spans(data)] == [
        (pos, h.base_offset, h.length) for pos, h in headers
    ]
    assert [(stored_crc(data, pos), record_count_at(data, pos)) for pos, _ in headers] == [
        (h.crc, h.record_count) for _, h in headers
    ]
