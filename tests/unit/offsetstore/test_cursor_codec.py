"""The cursor codec: exact round trips, strict validation, and the size targets of issue 4."""

from __future__ import annotations

import random
import struct
import zlib
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.offsetstore.cursor_codec import (
    MAGIC,
    MAGIC_V2,
    MAX_COUNT,
    CursorCodecError,
    CursorState,
    decode_cursor,
    encode_cursor,
)
from sluice.v1 import offset_store_pb2

TWO_MB = 2 * 1024 * 1024


def alternate_ack_ranges(messages: int) -> list[int]:
    """Every other message of ``messages`` acked (1, 3, 5, ...): one range per acked message."""
    flat: list[int] = []
    for offset in range(1, messages, 2):
        flat += [offset, offset + 1]
    return flat


def test_empty_cursor_round_trips() -> None:
    blob = encode_cursor(0)
    assert blob.startswith(MAGIC)
    assert decode_cursor(blob) == CursorState(0, array("q"), {})


def test_example_round_trips_exactly() -> None:
    ranges = [12, 15, 20, 21, 1_000_000, 1_000_500, 2**40, 2**40 + 3]
    counts = {10: 1, 11: 4, 16: MAX_COUNT, 2**41: 2}
    state = decode_cursor(encode_cursor(10, ranges, counts))
    assert state.mark_delete == 10
    assert list(state.acked_ranges) == ranges
    assert state.redelivery_counts == counts
    assert state.acked_ranges.typecode == "q"


def test_ranges_may_touch_but_not_overlap() -> None:
    assert list(decode_cursor(encode_cursor(0, [0, 2, 2, 3])).acked_ranges) == [0, 2, 2, 3]


def test_offsets_near_int64_max_round_trip() -> None:
    top = 2**63 - 1
    state = decode_cursor(encode_cursor(top - 10, [top - 5, top], {top: 1}))
    assert list(state.acked_ranges) == [top - 5, top]
    assert state.redelivery_counts == {top: 1}


@st.composite
def cursors(draw: st.DrawFn) -> tuple[int, list[int], dict[int, int]]:
    mark_delete = draw(st.integers(0, 2**62))
    gaps = draw(st.lists(st.tuples(st.integers(0, 2**20), st.integers(1, 2**20)), max_size=200))
    flat: list[int] = []
    position = mark_delete
    for gap, length in gaps:
        flat += [position + gap, position + gap + length]
        position += gap + length
    counts = draw(st.dictionaries(st.integers(0, 2**63 - 1), st.integers(0, MAX_COUNT), max_size=100))
    return mark_delete, flat, counts


@settings(max_examples=300, deadline=None)
@given(cursors())
def test_any_valid_cursor_round_trips(cursor: tuple[int, list[int], dict[int, int]]) -> None:
    mark_delete, flat, counts = cursor
    state = decode_cursor(encode_cursor(mark_delete, flat, counts))
    assert (state.mark_delete, list(state.acked_ranges), state.redelivery_counts) == (
        mark_delete,
        flat,
        counts,
    )


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_decode_to_garbage(blob: bytes) -> None:
    try:
        state = decode_cursor(MAGIC + blob)
    except CursorCodecError:
        return
    # Whatever decodes must re-encode to the same cursor.
    again = decode_cursor(encode_cursor(state.mark_delete, state.acked_ranges, state.redelivery_counts))
    assert again == state


@pytest.mark.parametrize(
    ("mark_delete", "ranges", "counts", "message"),
    [
        (-1, [], {}, "mark_delete"),
        (0, [1], {}, "odd number"),
        (5, [3, 6], {}, "range 0 .* starts below mark_delete"),
        (0, [1, 5, 4, 8], {}, "range 1 .* starts below the previous range's end 5"),
        (0, [1, 1], {}, "range 0 .* empty or reversed"),
        (0, [3, 2], {}, "range 0 .* empty or reversed"),
        (0, [], {-1: 1}, "redelivered offsets"),
        (0, [], {4: -1}, "redelivery count of offset 4"),
        (0, [], {4: MAX_COUNT + 1}, "redelivery count of offset 4"),
    ],
)
def test_invalid_cursors_are_refused_with_the_reason(
    mark_delete: int, ranges: list[int], counts: dict[int, int], message: str
) -> None:
    with pytest.raises(CursorCodecError, match=message):
        encode_cursor(mark_delete, ranges, counts)


def test_corrupt_blobs_are_refused() -> None:
    blob = encode_cursor(7, [8, 10, 12, 20], {9: 3})
    with pytest.raises(CursorCodecError, match="too short"):
        decode_cursor(blob[:10])
    with pytest.raises(CursorCodecError, match="not a cursor"):
        decode_cursor(b"XXXX" + blob[4:])
    with pytest.raises(CursorCodecError, match="corrupt cursor body"):
        decode_cursor(blob[:-3])
    with pytest.raises(CursorCodecError, match="corrupt cursor body"):
        decode_cursor(blob + b"trailing")
    # A header claiming more ranges than the body holds.
    lying = bytearray(blob)
    struct.pack_into("<I", lying, 12, 3)
    with pytest.raises(CursorCodecError, match="expected"):
        decode_cursor(bytes(lying))
    # A header claiming a column width that does not exist.
    lying = bytearray(blob)
    lying[20] = 3
    with pytest.raises(CursorCodecError, match="corrupt cursor header"):
        decode_cursor(bytes(lying))


def test_decoding_is_bounded_by_the_header() -> None:
    """A small blob that inflates to far more than its header claims is refused, not expanded."""
    header = struct.pack("<4sqIIBBB", MAGIC, 0, 1, 0, 1, 1, 1)
    bomb = header + zlib.compress(b"\x01" * 10_000_000)
    with pytest.raises(CursorCodecError, match="corrupt cursor body"):
        decode_cursor(bomb)


def test_alternate_ack_of_a_million_messages_persists_in_far_less_than_2_mb() -> None:
    """Issue 4's worst case: 500,000 ranges. Plain protobuf needs ~3 MB; the codec about 1 KB."""
    flat = alternate_ack_ranges(1_000_000)
    assert len(flat) == 1_000_000
    plain = offset_store_pb2.Cursor(mark_delete=0, acked_ranges=flat).ByteSize()
    blob = encode_cursor(0, flat)
    print(f"\nalternate-ack cursor, 500,000 ranges: codec {len(blob)} bytes, plain protobuf {plain} bytes")
    assert plain > TWO_MB  # why the codec exists
    assert len(blob) < 16 * 1024
    assert list(decode_cursor(blob).acked_ranges) == flat


def test_alternate_ack_with_every_unacked_message_redelivered_stays_small() -> None:
    flat = alternate_ack_ranges(1_000_000)
    counts = {offset: 1 + offset % 3 for offset in range(0, 1_000_000, 2)}
    blob = encode_cursor(0, flat, counts)
    print(f"\nalternate-ack cursor + 500,000 redelivery counts: {len(blob)} bytes")
    assert len(blob) < 64 * 1024
    assert decode_cursor(blob).redelivery_counts == counts


def test_random_holes_in_a_million_messages_stay_under_2_mb() -> None:
    """Not compressible by repetition: each message acked with probability 1/2."""
    rng = random.Random(7)
    flat: list[int] = []
    for offset in range(1, 1_000_000):
        if rng.random() < 0.5:
            if flat and flat[-1] == offset:
                flat[-1] = offset + 1
            else:
                flat += [offset, offset + 1]
    blob = encode_cursor(0, flat)
    print(f"\nrandom-ack cursor, {len(flat) // 2} ranges: {len(blob)} bytes")
    assert len(blob) < TWO_MB // 4
    assert list(decode_cursor(blob).acked_ranges) == flat


# ---- version 2: the write-ahead delivered mark and range counts (crash counts) -------------------


def test_crash_count_fields_round_trip_as_version_2() -> None:
    blob = encode_cursor(10, [12, 14], {11: 3}, delivered_up_to=300, redelivery_ranges=[10, 20, 1, 20, 40, 2])
    assert blob.startswith(MAGIC_V2)
    assert decode_cursor(blob) == CursorState(
        10, array("q", [12, 14]), {11: 3}, 300, array("q", [10, 20, 1, 20, 40, 2])
    )


def test_a_cursor_without_them_stays_version_1_for_older_readers() -> None:
    blob = encode_cursor(10, [12, 14], {11: 3})
    assert blob.startswith(MAGIC)
    assert decode_cursor(blob).delivered_up_to == 0


def test_a_million_in_flight_after_a_crash_is_one_range() -> None:
    """Per range, not per message: a window of 1,000,000 unacked messages adds 24 bytes at most."""
    plain = encode_cursor(0, alternate_ack_ranges(1_000_000))
    crashed = encode_cursor(
        0, alternate_ack_ranges(1_000_000), delivered_up_to=1_000_000, redelivery_ranges=[0, 1_000_000, 1]
    )
    assert len(crashed) - len(plain) <= 12 + 24 + 8


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"delivered_up_to": -1}, "delivered_up_to"),
        ({"redelivery_ranges": [1, 2]}, "triples"),
        ({"redelivery_ranges": [5, 5, 1]}, "range 0"),
        ({"redelivery_ranges": [1, 9, 1, 5, 12, 1]}, "range 1"),
        ({"redelivery_ranges": [1, 9, 0]}, "count 0"),
        ({"redelivery_ranges": [1, 9, MAX_COUNT + 1]}, "count"),
    ],
)
def test_invalid_crash_count_fields_are_refused(kwargs: dict[str, object], reason: str) -> None:
    with pytest.raises(CursorCodecError, match=reason):
        encode_cursor(0, **kwargs)  # type: ignore[arg-type]


def test_a_truncated_version_2_blob_is_refused() -> None:
    blob = encode_cursor(0, delivered_up_to=5, redelivery_ranges=[0, 5, 1])
    for cut in (8, 30, len(blob) - 3):
        with pytest.raises(CursorCodecError):
            decode_cursor(blob[:cut])
