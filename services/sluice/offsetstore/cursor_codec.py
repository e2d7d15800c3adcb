"""The compact persisted form of a push-subscription cursor (pure, stdlib only).

A cursor is a mark-delete position (everything below it is acknowledged), the
individually acknowledged ranges above it, and the redelivery count of each
message that was redelivered. Written as plain protobuf (``sluice.v1.Cursor``),
the worst pattern of issue 4 -- every other message of 1,000,000 acknowledged,
500,000 ranges -- takes 1,000,000 varints of up to 3 bytes: about 3 MB, over the
2 MB target. This codec stores it in about 1 KB instead:

1. **Delta encoding.** The flattened ranges ``[s0, e0, s1, e1, ...]`` become
   ``s0 - mark_delete, e0 - s0, s1 - e0, e1 - s1, ...``: gaps and lengths, which
   are small and repetitive where positions are large and unique. Redelivered
   offsets are delta-encoded the same way (sorted, from 0); counts as they are.
2. **Fixed width per column.** Each column uses the narrowest of 1, 2, 4 or 8
   bytes that holds its largest value, so packing is one ``array`` conversion
   in C instead of a Python loop per value (which is what a varint would need).
3. **Byte shuffle.** Each column's bytes are regrouped by significance (all low
   bytes, then all second bytes, ...), as Blosc does: the high bytes are mostly
   zero and compress away.
4. **zlib** over the three columns.

Blob layout (little-endian)::

    magic  "SLC1"                        4 bytes (format version 1)
    mark_delete                          int64
    range_pairs, redeliveries            uint32, uint32
    width_ranges, width_keys, width_counts   uint8 x 3 (1, 2, 4 or 8)
    zlib( shuffle(range deltas) | shuffle(key deltas) | shuffle(counts) )

Version 2 (``"SLC2"``) adds what a dispatcher crash needs (docs/dispatcher.md): the
write-ahead ``delivered_up_to`` mark and redelivery counts by range::

    magic  "SLC2" | the version 1 header fields | delivered_up_to int64 | count_ranges uint32
    zlib( the version 1 columns | count ranges as int64 [start, end, count] triples )

A cursor without either is still written as version 1, so an older reader reads
it; both versions are read.

Version 3 (``"SLC3"``) adds the leader epoch of the records the cursor's position
was read from (KIP-320; docs/dispatcher.md, "Across a leader change")::

    magic  "SLC3" | the version 2 header fields | leader_epoch int32
    zlib( as version 2 )

It is written only for a cursor that has an epoch (``leader_epoch >= 0``); one
without is written as before (version 1 or 2), so a reader older than version 3
reads every cursor of a cluster without replication. All three versions are read;
versions 1 and 2 decode with ``leader_epoch = -1`` (unknown: not validated).

The dispatcher reuses this module for its in-memory form, so it depends on the
standard library only and has no notion of protobuf or Redis. Invalid input
raises :class:`CursorCodecError` (a ``ValueError``) with a precise message.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import sub

__all__ = [
    "MAX_COUNT",
    "CursorCodecError",
    "CursorState",
    "decode_cursor",
    "encode_cursor",
    "validate_count_ranges",
    "validate_ranges",
]

MAGIC = b"SLC1"
MAGIC_V2 = b"SLC2"
MAGIC_V3 = b"SLC3"
_HEADER = struct.Struct("<4sqIIBBB")
_HEADER_V2 = struct.Struct("<qI")  # after _HEADER: delivered_up_to, count-range triples
_HEADER_V3 = struct.Struct("<i")  # after _HEADER_V2: leader_epoch
#: Count ranges one cursor may hold (each crash without progress adds at most two).
MAX_COUNT_RANGES = 100_000
INT64_MAX = 2**63 - 1
MAX_COUNT = 2**31 - 1  # redelivery counts are int32 on the wire
_MAX_ITEMS = 2**32 - 1  # the header stores counts as uint32
# Column width in bytes -> array typecode of that exact size.
_TYPECODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
# Compression level 6 (zlib's default): level 9 is several times slower for a
# few percent on these columns.
_ZLIB_LEVEL = 6
# A decoded cursor may not claim more values than this (guards a corrupt or
# hostile header from allocating gigabytes before the length check).
_MAX_DECODED_BYTES = 1 << 31

assert all(array(tc).itemsize == w for w, tc in _TYPECODES.items()), "unexpected C integer sizes"


class CursorCodecError(ValueError):
    """The cursor is invalid (encode) or the blob is not a cursor (decode)."""


def _empty_ranges() -> array[int]:
    return array("q")


@dataclass(frozen=True, slots=True)
class CursorState:
    """A cursor's durable position.

    ``acked_ranges`` is flattened ``[start0, end0, start1, end1, ...]`` with ends
    exclusive, sorted, non-overlapping and at or above ``mark_delete``: an
    ``array('q')`` takes 8 bytes a value where a list of ints takes about 36.
    ``delivered_up_to``: everything below it may have been delivered (0: no mark).
    ``redelivery_ranges``: flattened ``[start0, end0, count0, ...]``, sorted,
    disjoint, non-empty, counts 1..MAX_COUNT.
    ``leader_epoch``: the leader epoch the records below the position were read in (-1: unknown).
    """

    mark_delete: int = 0
    acked_ranges: array[int] = field(default_factory=_empty_ranges)
    redelivery_counts: dict[int, int] = field(default_factory=dict)
    delivered_up_to: int = 0
    redelivery_ranges: array[int] = field(default_factory=_empty_ranges)
    leader_epoch: int = -1


def _deltas(base: int, values: Sequence[int]) -> list[int]:
    """``[v0 - base, v1 - v0, v2 - v1, ...]`` computed by ``map`` in C."""
    if not values:
        return []
    out = [values[0] - base]
    out.extend(map(sub, values[1:], values[:-1]))
    return out


def validate_ranges(mark_delete: int, acked_ranges: Sequence[int]) -> list[int]:
    """Check the flattened ranges against ``mark_delete``; return their deltas.

    Raises :class:`CursorCodecError` naming the first offending range.
    """
    if not 0 <= mark_delete <= INT64_MAX:
        raise CursorCodecError(f"mark_delete must be between 0 and 2^63-1, got {mark_delete}")
    if len(acked_ranges) % 2:
        raise CursorCodecError(
            f"acked_ranges must hold [start, end) pairs, got an odd number of values ({len(acked_ranges)})"
        )
    if len(acked_ranges) // 2 > _MAX_ITEMS:
        raise CursorCodecError(f"too many acked ranges ({len(acked_ranges) // 2}); at most {_MAX_ITEMS}")
    deltas = _deltas(mark_delete, acked_ranges)
    if deltas and (min(deltas) < 0 or min(deltas[1::2]) < 1 or acked_ranges[-1] > INT64_MAX):
        _explain_bad_range(mark_delete, acked_ranges)
    return deltas


def _explain_bad_range(mark_delete: int, flat: Sequence[int]) -> None:
    """Slow path, only on invalid input: find and name the first bad range."""
    previous_end = mark_delete
    for i in range(0, len(flat), 2):
        start, end = flat[i], flat[i + 1]
        if start < previous_end:
            where = "mark_delete" if i == 0 else f"the previous range's end {previous_end}"
            raise CursorCodecError(
                f"acked range {i // 2} [{start}, {end}) starts below {where}: "
                "ranges must be sorted, non-overlapping and at or above mark_delete"
            )
        if end <= start:
            raise CursorCodecError(
                f"acked range {i // 2} [{start}, {end}) is empty or reversed (end is exclusive)"
            )
        if end > INT64_MAX:
            raise CursorCodecError(f"acked range {i // 2} [{start}, {end}) ends beyond 2^63-1")
        previous_end = end
    raise CursorCodecError("acked ranges are invalid")  # unreachable when the fast check is right


def validate_count_ranges(flat: Sequence[int]) -> None:
    """Check flattened ``[start, end, count]`` triples; raise :class:`CursorCodecError` naming the
    first bad one."""
    if len(flat) % 3:
        raise CursorCodecError(
            f"redelivery_ranges must hold [start, end, count] triples, got {len(flat)} values"
        )
    if len(flat) // 3 > MAX_COUNT_RANGES:
        raise CursorCodecError(f"too many redelivery ranges ({len(flat) // 3}); at most {MAX_COUNT_RANGES}")
    previous_end = 0
    for i in range(0, len(flat), 3):
        start, end, count = flat[i], flat[i + 1], flat[i + 2]
        if start < previous_end or end <= start or end > INT64_MAX:
            raise CursorCodecError(
                f"redelivery range {i // 3} [{start}, {end}) must be non-empty, sorted, disjoint and "
                "within 0..2^63-1"
            )
        if not 1 <= count <= MAX_COUNT:
            raise CursorCodecError(
                f"redelivery range {i // 3} [{start}, {end}) has count {count}; it must be 1..{MAX_COUNT}"
            )
        previous_end = end


def _width(values: Sequence[int]) -> int:
    top = max(values, default=0)
    for width in (1, 2, 4):
        if top < 1 << (8 * width):
            return width
    return 8


def _pack(values: Sequence[int], width: int) -> bytes:
    """Fixed-width little-endian column, bytes regrouped by significance."""
    column = array(_TYPECODES[width], values)
    if sys.byteorder == "big":
        column.byteswap()
    raw = column.tobytes()
    if width == 1:
        return raw
    return b"".join(raw[i::width] for i in range(width))


def _unpack(data: bytes | memoryview, count: int, width: int) -> array[int]:
    if width == 1:
        raw: bytes | bytearray | memoryview = data
    else:
        interleaved = bytearray(count * width)
        for i in range(width):
            interleaved[i::width] = data[i * count : (i + 1) * count]
        raw = interleaved
    column = array(_TYPECODES[width])
    column.frombytes(raw)
    if sys.byteorder == "big":
        column.byteswap()
    return column


def encode_cursor(
    mark_delete: int,
    acked_ranges: Sequence[int] = (),
    redelivery_counts: Mapping[int, int] | None = None,
    delivered_up_to: int = 0,
    redelivery_ranges: Sequence[int] = (),
    leader_epoch: int = -1,
) -> bytes:
    """Encode a cursor; raise :class:`CursorCodecError` if it is invalid."""
    if not -1 <= leader_epoch <= MAX_COUNT:
        raise CursorCodecError(f"leader_epoch must be between -1 and 2^31-1, got {leader_epoch}")
    if not 0 <= delivered_up_to <= INT64_MAX:
        raise CursorCodecError(f"delivered_up_to must be between 0 and 2^63-1, got {delivered_up_to}")
    validate_count_ranges(redelivery_ranges)
    range_deltas = validate_ranges(mark_delete, acked_ranges)
    counts_map = redelivery_counts or {}
    keys = sorted(counts_map)
    if len(keys) > _MAX_ITEMS:
        raise CursorCodecError(f"too many redelivery counts ({len(keys)}); at most {_MAX_ITEMS}")
    if keys and (keys[0] < 0 or keys[-1] > INT64_MAX):
        raise CursorCodecError(f"redelivered offsets must be between 0 and 2^63-1, got {keys[0]}..{keys[-1]}")
    key_deltas = _deltas(0, keys)
    counts = [counts_map[k] for k in keys]
    if counts and (min(counts) < 0 or max(counts) > MAX_COUNT):
        bad = next(k for k in keys if not 0 <= counts_map[k] <= MAX_COUNT)
        raise CursorCodecError(
            f"redelivery count of offset {bad} must be between 0 and {MAX_COUNT}, got {counts_map[bad]}"
        )
    widths = (_width(range_deltas), _width(key_deltas), _width(counts))
    body = b"".join((_pack(range_deltas, widths[0]), _pack(key_deltas, widths[1]), _pack(counts, widths[2])))
    if not delivered_up_to and not redelivery_ranges and leader_epoch < 0:
        header = _HEADER.pack(MAGIC, mark_delete, len(range_deltas) // 2, len(keys), *widths)
        return header + zlib.compress(body, _ZLIB_LEVEL)
    triples = array("q", redelivery_ranges)
    if sys.byteorder == "big":
        triples.byteswap()
    magic = MAGIC_V2 if leader_epoch < 0 else MAGIC_V3
    header = _HEADER.pack(magic, mark_delete, len(range_deltas) // 2, len(keys), *widths)
    header += _HEADER_V2.pack(delivered_up_to, len(triples) // 3)
    if leader_epoch >= 0:
        header += _HEADER_V3.pack(leader_epoch)
    return header + zlib.compress(body + triples.tobytes(), _ZLIB_LEVEL)


def decode_cursor(blob: bytes | bytearray | memoryview) -> CursorState:
    """Decode a blob made by :func:`encode_cursor`; raise :class:`CursorCodecError` if it is not one."""
    view = memoryview(blob)
    if len(view) < _HEADER.size:
        raise CursorCodecError(f"cursor blob too short ({len(view)} bytes)")
    magic, mark_delete, pairs, n_keys, w_ranges, w_keys, w_counts = _HEADER.unpack_from(view)
    delivered_up_to = n_triples = 0
    leader_epoch = -1
    body_at = _HEADER.size
    if magic in (MAGIC_V2, MAGIC_V3):
        extra = _HEADER_V2.size + (_HEADER_V3.size if magic == MAGIC_V3 else 0)
        if len(view) < _HEADER.size + extra:
            raise CursorCodecError(f"cursor blob too short ({len(view)} bytes)")
        delivered_up_to, n_triples = _HEADER_V2.unpack_from(view, _HEADER.size)
        if magic == MAGIC_V3:
            (leader_epoch,) = _HEADER_V3.unpack_from(view, _HEADER.size + _HEADER_V2.size)
        body_at += extra
    elif magic != MAGIC:
        raise CursorCodecError(
            f"not a cursor blob (magic {bytes(magic)!r}, expected {MAGIC!r}, {MAGIC_V2!r} or {MAGIC_V3!r})"
        )
    if (
        mark_delete < 0
        or leader_epoch < -1
        or delivered_up_to < 0
        or n_triples > MAX_COUNT_RANGES
        or any(w not in _TYPECODES for w in (w_ranges, w_keys, w_counts))
    ):
        raise CursorCodecError("corrupt cursor header")
    n_ranges = 2 * pairs
    sizes = (n_ranges * w_ranges, n_keys * w_keys, n_keys * w_counts)
    expected = sum(sizes) + 24 * n_triples
    if expected > _MAX_DECODED_BYTES:
        raise CursorCodecError(f"corrupt cursor header: claims {expected} bytes of columns")
    try:
        decompressor = zlib.decompressobj()
        # expected + 1: detects trailing data, and 0 would mean 'unlimited'.
        body = decompressor.decompress(view[body_at:], expected + 1)
        complete = decompressor.eof and not (decompressor.unconsumed_tail or decompressor.unused_data)
    except zlib.error as exc:
        raise CursorCodecError(f"corrupt cursor body: {exc}") from None
    if len(body) != expected or not complete:
        raise CursorCodecError(f"corrupt cursor body: expected {expected} bytes of columns, got {len(body)}")
    columns = memoryview(body)
    range_deltas = _unpack(columns[: sizes[0]], n_ranges, w_ranges)
    key_deltas = _unpack(columns[sizes[0] : sizes[0] + sizes[1]], n_keys, w_keys)
    counts = _unpack(columns[sizes[0] + sizes[1] : sum(sizes)], n_keys, w_counts)
    triples = array("q")
    triples.frombytes(columns[sum(sizes) :])
    if sys.byteorder == "big":
        triples.byteswap()
    validate_count_ranges(triples)
    try:
        ranges = array("q", accumulate(range_deltas, initial=mark_delete))
        keys = accumulate(key_deltas)
        redeliveries = dict(zip(keys, counts, strict=True))
    except OverflowError:
        raise CursorCodecError("corrupt cursor body: offsets overflow int64") from None
    del ranges[0]  # accumulate's initial value is mark_delete itself
    return CursorState(mark_delete, ranges, redeliveries, delivered_up_to, triples, leader_epoch)
