"""The batch format: encode once, validate, stamp, decode, filter."""

from __future__ import annotations

import contextlib
import struct
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec import batch as b
from sluice.errors import BatchTooLarge, CorruptBatch, UnsupportedVersion
from tests.examples import examples

LIMIT = 1 << 20

# (value, key, tag, headers, timestamp_ms), what encode_records takes.
RecordTuple = tuple[bytes, bytes | None, str | None, dict[str, bytes] | None, int]
record_st = st.tuples(
    st.binary(max_size=64),
    st.one_of(st.none(), st.binary(max_size=16)),
    st.one_of(st.none(), st.sampled_from(["tagA", "tagB", "tagC"])),
    st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.binary(max_size=8), max_size=3)),
    st.integers(min_value=0, max_value=2**40),
)


def _records(
    n: int, tag_every: int = 2
) -> list[tuple[bytes, bytes | None, str | None, b.Headers | None, int]]:
    return [
        (f"v{i}".encode(), f"k{i % 3}".encode(), "tagA" if i % tag_every else "tagB", None, 1_000 + i)
        for i in range(n)
    ]


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(record_st, min_size=1, max_size=40), st.integers(0, 2**40))
def test_round_trip_preserves_every_field(records: list[RecordTuple], base: int) -> None:
    raw = bytearray(b.encode_records(records))
    header = b.validate_batch(bytes(raw), 0, LIMIT)
    assert header.record_count == len(records)
    b.stamp(raw, 0, base, 77, 3)
    assert b.validate_batch(bytes(raw), 0, LIMIT).base_offset == base  # stamping is outside the CRC
    decoded = b.decode_records(bytes(raw), "t", 3)
    assert [(r.value, r.key, r.tag, r.headers or None, r.timestamp) for r in decoded] == [
        (v, k, t, h or None, ts) for v, k, t, h, ts in records
    ]
    assert [r.offset for r in decoded] == list(range(base, base + len(records)))
    assert {r.partition for r in decoded} == {3}


def test_header_lists_distinct_tags_for_batch_skipping() -> None:
    raw = b.encode_records(_records(10))
    h = b.read_header(raw)
    assert sorted(b.read_tags(raw, 0, h)) == ["tagA", "tagB"]


def test_corruption_anywhere_in_the_crc_range_is_detected() -> None:
    raw = b.encode_records(_records(5))
    for pos in range(b.CRC_START, len(raw)):
        bad = bytearray(raw)
        bad[pos] ^= 0x01
        with pytest.raises(CorruptBatch):
            b.validate_batch(bytes(bad), 0, LIMIT)


@pytest.mark.parametrize("cut", [1, 10, b.HEADER_SIZE - 1, b.HEADER_SIZE + 3])
def test_truncated_batch_is_corrupt(cut: int) -> None:
    raw = b.encode_records(_records(5))
    with pytest.raises(CorruptBatch):
        b.validate_batch(raw[: len(raw) - cut] if cut < len(raw) else raw[:cut], 0, LIMIT)


def test_oversized_batch_is_rejected_with_its_size() -> None:
    raw = b.encode_records([(b"x" * 5000, None, None, None, 1)])
    with pytest.raises(BatchTooLarge, match="exceeds the limit of 4096"):
        b.validate_batch(raw, 0, 4096)


def test_inconsistent_lengths_with_a_valid_crc_are_caught() -> None:
    """A producer bug (lengths that do not add up) must not reach the log even if its CRC is right."""
    raw = bytearray(b.encode_records(_records(3)))
    h = b.read_header(raw)
    value_col = b.HEADER_SIZE + h.tag_table_length + 3 * (4 + 8 + 4)  # fourth column: value lengths
    struct.pack_into("<i", raw, value_col, 1000)
    struct.pack_into("<I", raw, b.CRC_AT, b.crc32c(bytes(raw[b.CRC_START :])))
    with pytest.raises(CorruptBatch, match="do not add up"):
        b.validate_batch(bytes(raw), 0, LIMIT)


def test_decode_skips_records_before_start_offset_and_ignores_a_cut_tail() -> None:
    first = bytearray(b.encode_records(_records(5)))
    b.stamp(first, 0, 100, 1, 0)
    second = bytearray(b.encode_records(_records(5)))
    b.stamp(second, 0, 105, 1, 0)
    buf = bytes(first + second[:-3])  # a fetch may cut the last batch
    offsets = [r.offset for r in b.decode_records(buf, "t", 0, start_offset=102)]
    assert offsets == [102, 103, 104]


def test_filter_keeps_offsets_and_advances_past_filtered_records() -> None:
    raw = bytearray(b.encode_records(_records(10)))
    b.stamp(raw, 0, 50, 1, 0)
    h = b.read_header(raw)
    kept = b.filter_batch(bytes(raw), 0, h, frozenset({"tagB"}))
    assert kept is not None
    fh = b.validate_batch(kept, 0, LIMIT)
    assert fh.next_offset == h.next_offset == 60
    assert [r.offset for r in b.decode_records(kept, "t", 0)] == [50, 52, 54, 56, 58]
    assert {r.tag for r in b.decode_records(kept, "t", 0)} == {"tagB"}
    assert b.filter_batch(bytes(raw), 0, h, frozenset({"nope"})) is None


def test_untagged_records_never_match_a_tag_filter() -> None:
    raw = b.encode_records([(b"a", None, None, None, 1), (b"b", None, "x", None, 1)])
    kept = b.filter_batch(raw, 0, b.read_header(raw), frozenset({"x"}))
    assert kept is not None
    assert [r.value for r in b.decode_records(kept, "t", 0)] == [b"b"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_escape_as_anything_but_corrupt_batch(data: bytes) -> None:
    # UnsupportedVersion: random bytes whose magic byte is 1 read as a format-1 batch, a typed refusal too
    # (a clean-clone run drew one: 24 zero bytes, then 1).
    with contextlib.suppress(CorruptBatch, BatchTooLarge, UnsupportedVersion):
        b.validate_batch(data, 0, LIMIT)


@settings(max_examples=examples(80), deadline=None)
@given(
    st.lists(record_st, min_size=1, max_size=40),
    st.sets(st.sampled_from(["tagA", "tagB", "tagC"])),
    st.integers(0, 45),
)
def test_decode_from_a_start_offset_inside_a_filtered_batch(
    records: list[RecordTuple],
    keep: set[str],
    start: int,
) -> None:
    """Filtered batches have gaps in their offsets: records before the start are skipped by offset,
    not by position, and every field of the rest survives."""
    raw = bytearray(b.encode_records(records))
    b.stamp(raw, 0, 1000, 1, 0)
    full = b.decode_records(bytes(raw), "t", 1)
    kept = b.filter_batch(bytes(raw), 0, b.read_header(raw), frozenset(keep))
    expected = [r for r in full if r.tag in keep and r.offset >= 1000 + start]
    got = [] if kept is None else b.decode_records(kept, "t", 1, start_offset=1000 + start)
    assert got == expected


def test_each_record_has_headers_of_its_own_and_records_are_immutable() -> None:
    raw = bytearray(b.encode_records(_records(3)))
    b.stamp(raw, 0, 0, 1, 0)
    first, second, _ = b.decode_records(bytes(raw), "t", 0)
    first.headers["x"] = b"1"
    assert second.headers == {}
    with pytest.raises(AttributeError):
        first.value = b"changed"  # type: ignore[misc]


def _column_at(raw: bytes | bytearray, index: int) -> int:
    """Where column ``index`` (0 offset deltas .. 5 tag indexes) starts in a batch at 0."""
    h = b.read_header(raw)
    widths = (4, 8, 4, 4, 4, 2)
    return b.HEADER_SIZE + h.tag_table_length + sum(widths[:index]) * h.record_count


@pytest.mark.parametrize(
    ("tagged", "column", "record", "fmt", "value", "message"),
    [
        (False, 0, 1, "<i", 5, "offset deltas 0..record_count-1"),
        (False, 1, 2, "<q", -1, "negative timestamp delta"),
        (False, 2, 0, "<i", -2, "negative record length"),
        (False, 3, 2, "<i", -7, "negative record length"),
        (False, 4, 1, "<i", -1, "negative record length"),
        (False, 5, 1, "<H", 0, "tag index is out of range"),
        (True, 5, 0, "<H", 2, "tag index is out of range"),
    ],
)
def test_every_column_is_checked_even_with_a_valid_crc(
    tagged: bool, column: int, record: int, fmt: str, value: int, message: str
) -> None:
    """A batch whose CRC is right but whose columns lie (a producer bug) never reaches the log."""
    records = _records(3) if tagged else [(b"v", b"k", None, None, 5)] * 3
    raw = bytearray(b.encode_records(records))
    assert b.validate_batch(bytes(raw), 0, LIMIT, require_dense=True)
    struct.pack_into(fmt, raw, _column_at(raw, column) + struct.calcsize(fmt) * record, value)
    struct.pack_into("<I", raw, b.CRC_AT, b.crc32c(bytes(raw[b.CRC_START :])))
    with pytest.raises(CorruptBatch, match=message):
        b.validate_batch(bytes(raw), 0, LIMIT, require_dense=True)


def test_absent_keys_are_valid_and_count_in_the_layout() -> None:
    records = [(b"v1", None, None, None, 1), (b"v2", b"key", None, None, 2), (b"v3", None, "t", None, 3)]
    raw = b.encode_records(records)
    assert b.validate_batch(raw, 0, LIMIT, require_dense=True).record_count == 3
    assert [(r.key, r.value) for r in b.decode_records(raw, "t", 0)] == [
        (None, b"v1"),
        (b"key", b"v2"),
        (None, b"v3"),
    ]


@pytest.mark.parametrize("n", [1, 2, 5, 1000, 3000, 1001])
def test_dense_offset_deltas_of_any_length(n: int) -> None:
    assert b.dense_offset_deltas(n) == array("i", range(n)).tobytes()
