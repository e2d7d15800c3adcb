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
records (``BatchView.cut``, the dispatcher's cut: offsets and ``last_offset_delta`` unchanged).

Pure: no I/O, no clock. Caller: ``sluice.broker.fetch``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from sluice.codec.batch import BatchHeader, BatchView, filter_batch, iter_headers, read_tags
from sluice.codec.batch.layout import malformed_is_corrupt
from sluice.codec.batch.summary import find_summary
from sluice.codec.header_columns import header_columns
from sluice.codec.sql_filter import SqlFilter, raw_headers


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
                kept = sql_filter_batch(data, pos, header, sql)
        elif not tags.isdisjoint(batch_tags):
            kept = filter_batch(data, pos, header, tags)
        if kept is not None:
            if out.out_bytes + len(kept) > limit and not (min_one and out.out_bytes == 0):
                out.stopped_on_limit = True
                return out
            out.batches.append(kept)
            out.out_bytes += len(kept)
        out.next_offset = end
    return out


def sql_filter_batch(data: bytes, pos: int, header: BatchHeader, sql: SqlFilter) -> bytes | None:
    """The batch at ``pos`` cut to the records ``sql`` matches (the batch itself when all do);
    None when none does. A malformed batch: CorruptBatch."""
    with malformed_is_corrupt(header.base_offset):
        view = BatchView(data, pos, header)
        n = header.record_count
        starts = view.starts()[2]
        columns = header_columns(data, starts, sql.columns) if sql.columns else None
        keep: list[bool]
        if columns is not None:
            keep = list(map(sql.matches_values, *columns))
        else:
            empty = sql.matches_empty
            matches = sql.matches_raw
            pairs = itertools.pairwise(starts)
            keep = [matches(raw_headers(data, a, b)) if a != b else empty for a, b in pairs]
        runs: list[tuple[int, int]] = []
        start = -1
        for i, k in enumerate(keep):
            if k and start < 0:
                start = i
            elif not k and start >= 0:
                runs.append((start, i))
                start = -1
        if start >= 0:
            runs.append((start, n))
        return view.cut(runs) if runs else None
