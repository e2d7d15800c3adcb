"""Walking the batch headers of a segment file with large preads (recovery, index rebuilds,
timestamp search, the epoch cache's rebuild)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from sluice.codec.batch import HEADER, HEADER_SIZE, BatchHeader, columns
from sluice.codec.batch.compression import plain_batch

#: Bytes per pread when walking a segment.
SCAN_CHUNK = 1 << 20


def walk_batches(
    fd: int, start: int, end: int, need_body: bool
) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
    """Yield ``(file_position, header, buffer, offset_in_buffer)`` for each batch in [start, end).

    With ``need_body`` the buffer holds the whole batch, otherwise at least its header.
    Reads in ``SCAN_CHUNK`` preads. Stops silently at a short or malformed header, or a
    batch running past ``end``: the caller compares where it got to with ``end``.
    """
    pos = start
    buf = b""
    buf_start = start
    while pos + HEADER_SIZE <= end:
        off = pos - buf_start
        if off + HEADER_SIZE > len(buf):
            buf = os.pread(fd, min(SCAN_CHUNK, end - pos), pos)
            buf_start, off = pos, 0
            if len(buf) < HEADER_SIZE:
                return
        header = BatchHeader(*HEADER.unpack_from(buf, off))
        length = header.length
        if length < HEADER_SIZE + 2 or pos + length > end:
            return
        if need_body and off + length > len(buf):
            buf = os.pread(fd, min(max(SCAN_CHUNK, length), end - pos), pos)
            buf_start, off = pos, 0
            if len(buf) < length:
                return
        yield pos, header, buf, off
        pos += length


def first_at_or_after(fd: int, start: int, end: int, timestamp: int) -> tuple[int, int] | None:
    """The first ``(offset, timestamp)`` in [start, end) with a record timestamp >= ``timestamp``."""
    for pos, header, _buf, _off in walk_batches(fd, start, end, need_body=False):
        if header.max_timestamp < timestamp:
            continue
        body, at, plain = plain_batch(os.pread(fd, header.length, pos), 0, header)
        cols = columns(body, at, plain)
        target_delta = timestamp - header.base_timestamp
        for offset_delta, ts_delta in zip(cols.offset_deltas, cols.timestamp_deltas, strict=True):
            if ts_delta >= target_delta:
                return header.base_offset + offset_delta, header.base_timestamp + ts_delta
    return None
