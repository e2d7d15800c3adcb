"""Header values of a whole batch, column by column, for the broker's SQL92 filtering.

Why: the filter's cost on the broker is reading each record's headers, and a Python loop over
every header of every record (``sql_filter.raw_headers``) costs about a microsecond per header.
Producers usually give every record of a batch the same header names in the same order (a
"uniform" batch), and then the positions of every header of every record follow from a few
numpy gathers over the batch, one per header position: a column of value offsets and lengths per
name, checked against the blobs' ends, with no Python step per record except slicing out the values
the filter reads. A batch that is not uniform gets None, and the caller reads records one by one.

Exact by construction: the layout is walked as the format defines it (count, name length, name,
value length, value) for all records at once, every record's name bytes are compared, and every
record's walk must end exactly at its blob's end; anything else falls back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

#: Below this many records the per-record loop is as fast (numpy's fixed cost per call).
MIN_RECORDS = 16

Int64s = npt.NDArray[np.int64]


_WIDE: dict[int, np.dtype[np.unsignedinteger[Any]]] = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def _uint(arr: npt.NDArray[np.uint8], at: Int64s, width: int) -> Int64s:
    """The little-endian unsigned integers of ``width`` bytes at ``at``: one gather, one view."""
    raw = arr[at[:, None] + np.arange(width, dtype=np.int64)]
    return np.ascontiguousarray(raw).view(_WIDE[width]).reshape(-1).astype(np.int64)


def _u16(arr: npt.NDArray[np.uint8], at: Int64s) -> Int64s:
    return _uint(arr, at, 2)


def _u32(arr: npt.NDArray[np.uint8], at: Int64s) -> Int64s:
    return _uint(arr, at, 4)


#: Values up to this many bytes are deduplicated in numpy, packed with their length in one uint64.
PACKED_WIDTH = 7


@dataclass(frozen=True, slots=True)
class Column:
    """One header's values over a batch: record i's value is ``values[codes[i]]`` (None: absent).

    Short values (a region, a priority, a flag: the usual filter subjects) are deduplicated by numpy,
    so ``values`` holds each distinct value once and the filter runs once per distinct value; longer
    ones are sliced one per record (``codes`` is then ``0..n-1``)."""

    codes: Int64s
    values: list[bytes | None]

    def per_record(self) -> list[bytes | None]:
        values = self.values
        return [values[c] for c in self.codes.tolist()]


def header_columns(buf: bytes, starts: Sequence[int] | Int64s, wanted: Sequence[str]) -> list[Column] | None:
    """For a batch whose records' header blobs are ``buf[starts[i]:starts[i+1]]``, one ``Column`` per
    name of ``wanted``, or None when the batch is not uniform (or too small to be worth it)."""
    n = len(starts) - 1
    if n < MIN_RECORDS:
        return None
    found = _walk(buf, np.asarray(starts, dtype=np.int64), frozenset(wanted))
    if found is None:
        return None
    out: list[Column] = []
    for w in wanted:
        col = found.get(w)
        out.append(Column(np.zeros(n, dtype=np.int64), [None]) if col is None else _column(buf, *col))
    return out


_SPREAD = np.arange(8, dtype=np.int64)


def _column(buf: bytes, begins: Int64s, lengths: Int64s) -> Column:
    if int(lengths.max()) > PACKED_WIDTH:
        pairs = zip(begins.tolist(), lengths.tolist(), strict=True)
        values: list[bytes | None] = [buf[x : x + y] for x, y in pairs]
        return Column(np.arange(len(begins), dtype=np.int64), values)
    arr = np.frombuffer(buf, dtype=np.uint8)
    raw = arr[np.minimum(begins[:, None] + _SPREAD, len(arr) - 1)]
    # The value's bytes, zero past its end, and its length in the last byte: equal keys, equal values.
    packed = np.where(lengths[:, None] > _SPREAD, raw, 0).astype(np.uint8)
    packed[:, 7] = lengths
    _, first, inverse = np.unique(packed.view("<u8").reshape(-1), return_index=True, return_inverse=True)
    at, size = begins[first].tolist(), lengths[first].tolist()
    values = [buf[x : x + y] for x, y in zip(at, size, strict=True)]
    return Column(inverse.reshape(-1).astype(np.int64), values)


def _walk(buf: bytes, bounds: Int64s, wanted: frozenset[str]) -> dict[str, tuple[Int64s, Int64s]] | None:
    """{name: (value starts, value lengths)} over every record at once; None if not uniform.

    The walk stops after the last header ``wanted`` needs (the headers after it cannot move it), once
    it has made sure no record repeats a wanted name later on: a repeated name's last value is the
    record's value (``decode_headers`` keeps the last), so a repeat sends the batch back to the full
    walk. "No repeat" is proven by counting, over all the batch's header blobs, the places where the
    name's encoding (length, then bytes) occurs (overlaps included): exactly one per record, the one
    the walk checked, leaves no room for another."""
    s, e = bounds[:-1], bounds[1:]
    arr = np.frombuffer(buf, dtype=np.uint8)
    # A record without headers, or with another header count: not uniform.
    count = _u16(arr, s) if (e - s >= 2).all() else np.zeros(0, dtype=np.int64)
    k = int(count[0]) if len(count) else -1
    if k < 0 or not (count == k).all():
        return None
    found: dict[str, tuple[Int64s, Int64s]] = {}
    heads: dict[str, bytes] = {}
    p = s + 2
    for walked in range(1, k + 1):
        first = int(p[0])
        if first + 2 > int(e[0]):
            return None
        length = buf[first] | buf[first + 1] << 8
        if not (p + 2 + length + 4 <= e).all():
            return None
        # The name's length and bytes as the first record has them, checked in every record at once.
        head = buf[first : first + 2 + length]
        at = p[:, None] + np.arange(2 + length, dtype=np.int64)
        if not (arr[at] == np.frombuffer(head, dtype=np.uint8)).all():
            return None
        name = head[2:].decode(errors="replace")
        q = p + 2 + length
        value_len = _u32(arr, q)
        found[name] = (q + 4, value_len)
        heads[name] = head
        # No bounds check here: the next header's (or the final) check covers the new positions
        # before anything is read at them.
        p = q + 4 + value_len
        if walked < k and wanted <= found.keys():
            if not (p <= e).all() or not _no_repeats(buf, bounds, [heads[w] for w in wanted], len(s)):
                return None  # the record-by-record read decides
            return found
    return found if (p == e).all() else None


def _no_repeats(buf: bytes, bounds: Int64s, heads: list[bytes], n: int) -> bool:
    a, b = int(bounds[0]), int(bounds[-1])
    for h in heads:
        if any(h[:i] == h[-i:] for i in range(1, len(h))):
            # Occurrences of a self-overlapping encoding can overlap: count every start position.
            found = len(re.findall(b"(?=" + re.escape(h) + b")", buf[a:b]))
        else:
            found = buf.count(h, a, b)  # cannot overlap: the plain (C) count is exact
        if found != n:
            return False
    return True
