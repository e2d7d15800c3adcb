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
    "validate_ranges",
]

MAGIC = b"SLC1"
_HEADER = struct.Struct("<4sqIIBBB")
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
    """

    mark_delete: int = 0
    acked_ranges: array[int] = field(default_factory=_empty_ranges)
    redelivery_counts: dict[int, int] = field(default_factory=dict)


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
) -> bytes:
    """Encode a cursor; raise :class:`CursorCodecError` if it is invalid."""
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
    header = _HEADER.pack(MAGIC, mark_delete, len(range_deltas) // 2, len(keys), *widths)
    return header + zlib.compress(body, _ZLIB_LEVEL)


def decode_cursor(blob: bytes | bytearray | memoryview) -> CursorState:
    """Decode a blob made by :func:`encode_cursor`; raise :class:`CursorCodecError` if it is not one."""
    view = memoryview(blob)
    if len(view) < _HEADER.size:
        raise CursorCodecError(f"cursor blob too short ({len(view)} bytes)")
    magic, mark_delete, pairs, n_keys, w_ranges, w_keys, w_counts = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise CursorCodecError(f"not a cursor blob (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if mark_delete < 0 or any(w not in _TYPECODES for w in (w_ranges, w_keys, w_counts)):
        raise CursorCodecError("corrupt cursor header")
    n_ranges = 2 * pairs
    sizes = (n_ranges * w_ranges, n_keys * w_keys, n_keys * w_counts)
    expected = sum(sizes)
    if expected > _MAX_DECODED_BYTES:
        raise CursorCodecError(f"corrupt cursor header: claims {expected} bytes of columns")
    try:
        decompressor = zlib.decompressobj()
        # expected + 1: detects trailing data, and 0 would mean 'unlimited'.
        body = decompressor.decompress(view[_HEADER.size :], expected + 1)
        complete = decompressor.eof and not (decompressor.unconsumed_tail or decompressor.unused_data)
    except zlib.error as exc:
        raise CursorCodecError(f"corrupt cursor body: {exc}") from None
    if len(body) != expected or not complete:
        raise CursorCodecError(f"corrupt cursor body: expected {expected} bytes of columns, got {len(body)}")
    columns = memoryview(body)
    range_deltas = _unpack(columns[: sizes[0]], n_ranges, w_ranges)
    key_deltas = _unpack(columns[sizes[0] : sizes[0] + sizes[1]], n_keys, w_keys)
    counts = _unpack(columns[sizes[0] + sizes[1] :], n_keys, w_counts)
    try:
        ranges = array("q", accumulate(range_deltas, initial=mark_delete))
        keys = accumulate(key_deltas)
        redeliveries = dict(zip(keys, counts, strict=True))
    except OverflowError:
        raise CursorCodecError("corrupt cursor body: offsets overflow int64") from None
    del ranges[0]  # accumulate's initial value is mark_delete itself
    return CursorState(mark_delete, ranges, redeliveries)
