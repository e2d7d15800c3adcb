"""Exact tag filtering over raw log batches, without decoding records where a header will do.

A filtered fetch reads whole raw batches from the log and walks their headers:

- a batch whose tag table shares no tag with the filter is skipped from its header alone;
- a batch whose records all match is passed through byte for byte;
- a mixed batch is rebuilt with only the matching records (``codec.batch.filter_batch``),
  keeping its base offset and ``last_offset_delta`` so offsets stay what they were.

Every batch walked, kept or skipped, moves the position forward: that position becomes the
partition's ``next_offset``, so a consumer whose filter matched nothing still advances.

An SQL92 filter (``sql``, docs/filters.md) walks the same way: a batch whose header summary proves
no record can match is skipped from its tag table alone (``may_match``); otherwise each record's
headers are decoded and the compiled filter keeps or drops it, and the batch is cut to the kept
records (``_cut``, as the dispatcher's ``BatchView.cut``: offsets and ``last_offset_delta`` unchanged).

Pure: no I/O, no clock. Caller: ``sluice.broker.fetch``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from sluice.codec.batch import (
    HEADER_SIZE,
    BatchHeader,
    Columns,
    columns,
    filter_batch,
    iter_headers,
    read_header,
    read_tags,
)
from sluice.codec.batch.compression import plain_batch
from sluice.codec.batch.layout import assemble, malformed_is_corrupt
from sluice.codec.batch.summary import find_summary
from sluice.codec.header_columns import Column, Int64s, header_columns
from sluice.codec.sql_filter import SqlFilter, raw_headers

#: What a filter is given: a tag set or a compiled SQL filter.
_F = TypeVar("_F", frozenset[str], SqlFilter)


@dataclass(slots=True)
class FilteredChunk:
    """What filtering one run of raw batches produced."""

    #: Encoded batches to return, in log order (raw or rebuilt).
    batches: list[bytes] = field(default_factory=list)
    #: Sum of ``len(b) for b in batches``.
    out_bytes: int = 0
    #: The position after the last batch walked (kept or skipped).
    next_offset: int = 0
    #: True when a matching batch did not fit in ``limit``: the caller must stop here.
    stopped_on_limit: bool = False


def filter_chunk(
    data: bytes,
    position: int,
    tags: frozenset[str],
    limit: int,
    min_one: bool,
    sql: SqlFilter | None = None,
) -> FilteredChunk:
    """Keep the records of ``data`` whose tag is in ``tags``, within ``limit`` output bytes.

    ``data`` is a run of whole batches as the log returns them, the first one containing
    ``position``. When ``min_one`` is true the first matching batch is returned even if it
    alone exceeds ``limit`` (Kafka's rule, so one large batch never blocks a consumer).

    Worked example: batches [0..9 tag a], [10..19 tag b], [20..29 tags a,b] with
    ``tags={"b"}``, position 0 and room for everything: the first batch is skipped from its
    header, the second is kept as is, the third is rebuilt with its ``b`` records only, and
    ``next_offset`` is 30.

    With ``sql`` set, records are kept by that filter instead and ``tags`` is ignored.
    """
    out = FilteredChunk(next_offset=position)
    for pos, header in iter_headers(data):
        end = header.next_offset
        if end <= out.next_offset:
            # A batch entirely before the position (cannot come from a correct log read).
            continue
        batch_tags = read_tags(data, pos, header)
        kept: bytes | None = None
        if sql is not None:
            summary = find_summary(batch_tags)
            if summary is None or sql.may_match(summary):
                kept = _compressed_aware(sql_filter_batch, data, pos, header, sql)
        elif not tags.isdisjoint(batch_tags):
            kept = _compressed_aware(filter_batch, data, pos, header, tags)
        if kept is not None:
            if out.out_bytes + len(kept) > limit and not (min_one and out.out_bytes == 0):
                out.stopped_on_limit = True
                return out
            out.batches.append(kept)
            out.out_bytes += len(kept)
        out.next_offset = end
    return out


def _compressed_aware(
    cut: Callable[[bytes, int, BatchHeader, _F], bytes | None],
    data: bytes,
    pos: int,
    header: BatchHeader,
    spec: _F,
) -> bytes | None:
    """``cut`` (a tag or SQL filter) applied to the batch at ``pos``, compressed or not.

    A compressed batch reaches here only when its readable tag table or header summary could not rule
    it out, and is then inflated (bounded, ``compression.inflate``) and filtered as a plain batch. When
    every record is kept the stored compressed bytes are returned as they are; a batch cut to some of
    its records is returned plain (the broker never compresses: docs/compression.md, "Filtering").
    """
    if not header.attributes:
        return cut(data, pos, header, spec)
    plain, ppos, ph = plain_batch(data, pos, header)
    kept = cut(plain, ppos, ph, spec)
    if kept is not None and read_header(kept).record_count == header.record_count:
        return data[pos : pos + header.length]
    return kept


def sql_filter_batch(data: bytes, pos: int, header: BatchHeader, sql: SqlFilter) -> bytes | None:
    """The batch at ``pos`` cut to the records ``sql`` matches (the batch itself when all do);
    None when none does. A malformed batch: CorruptBatch."""
    with malformed_is_corrupt(header.base_offset):
        c = columns(data, pos, header)
        starts = _data_starts(c)
        hs = starts[2]
        cols = header_columns(data, hs, sql.columns) if sql.columns else None
        keep: BoolArray | list[bool]
        if cols is not None:
            keep = _evaluate_columns(sql, cols)
        else:
            empty = sql.matches_empty
            matches = sql.matches_raw
            pairs = itertools.pairwise(hs.tolist())
            keep = [matches(raw_headers(data, a, b)) if a != b else empty for a, b in pairs]
        kept = np.flatnonzero(np.array(keep, dtype=bool))
        if not len(kept):
            return None
        if len(kept) == header.record_count:
            return data[pos : pos + header.length]
        return _cut(data, pos, header, starts, kept)


def _data_starts(c: Columns) -> tuple[Int64s, Int64s, Int64s]:
    """Where each record's key, value and headers start (plus one past the end), by numpy sums."""
    keys = np.maximum(np.frombuffer(c.key_lengths, dtype=np.int32), 0).astype(np.int64)
    lengths = [keys]
    for col in (c.value_lengths, c.headers_lengths):
        lengths.append(np.frombuffer(col, dtype=np.int32).astype(np.int64))
    out: list[Int64s] = []
    at = c.data_start
    for ln in lengths:
        s = np.empty(len(ln) + 1, dtype=np.int64)
        s[0] = at
        np.cumsum(ln, out=s[1:])
        s[1:] += at
        at = int(s[-1])
        out.append(s)
    return out[0], out[1], out[2]


BoolArray = npt.NDArray[np.bool_]

#: The per-record columns: byte width and numpy type, in layout order.
_COLUMNS = (("<i4", 4), ("<i8", 8), ("<i4", 4), ("<i4", 4), ("<i4", 4), ("<u2", 2))


def _cut(data: bytes, pos: int, h: BatchHeader, starts: tuple[Int64s, Int64s, Int64s], kept: Int64s) -> bytes:
    """The batch keeping only the records ``kept`` (sorted indexes), as ``BatchView.cut`` does: base
    offset, offset deltas, timestamps, ``last_offset_delta`` and tag table kept, so every record keeps
    its offset. Gathered by numpy: a scattered 10 % of a batch is hundreds of runs, and slicing each
    run of each column in Python cost more than the filter itself."""
    n = h.record_count
    start = pos + HEADER_SIZE
    parts: list[bytes] = [data[start : start + h.tag_table_length]]
    col = start + h.tag_table_length
    for dtype, width in _COLUMNS:
        parts.append(np.frombuffer(data, dtype=dtype, count=n, offset=col)[kept].tobytes())
        col += width * n
    arr = np.frombuffer(data, dtype=np.uint8)
    for s in starts:
        begins = s[:-1][kept]
        lengths = (s[1:] - s[:-1])[kept]
        total = int(lengths.sum())
        if total:
            firsts = np.cumsum(lengths) - lengths  # where each record's bytes go in the output
            index = np.repeat(begins - firsts, lengths) + np.arange(total, dtype=np.int64)
            parts.append(arr[index].tobytes())
    return assemble(
        len(kept),
        h.last_offset_delta,
        h.base_timestamp,
        h.max_timestamp,
        h.tag_table_length,
        b"".join(parts),
        base_offset=h.base_offset,
        append_time_ms=h.append_time_ms,
        leader_epoch=h.partition_leader_epoch,
        producer=(h.producer_id, h.producer_epoch, h.base_sequence),
    )


def _evaluate_columns(sql: SqlFilter, columns: list[Column]) -> BoolArray:
    """The filter once per distinct row of header values, spread to the records by numpy: no Python
    step per record when the values repeat (a region, a priority)."""
    if len(columns) == 1:
        col = columns[0]
        answers = [sql.matches_values(v) for v in col.values]
        return np.array(answers, dtype=bool)[col.codes]
    combined = columns[0].codes
    for col in columns[1:]:
        # Re-coded after each step, so the combined codes stay below n * distinct values.
        combined = np.unique(combined * len(col.values) + col.codes, return_inverse=True)[1].reshape(-1)
    _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    picks = [[col.values[c] for c in col.codes[first].tolist()] for col in columns]
    answers = list(map(sql.matches_values, *picks))
    return np.array(answers, dtype=bool)[inverse.reshape(-1)]
