"""Validation of a produced or recovered batch: framing, CRC, counts and column sums, by C-level scans."""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

from sluice.codec.batch.compression import MAX_INFLATED_BYTES, check_codec, inflate, inflated_size
from sluice.codec.batch.layout import (
    CRC_START,
    HEADER_SIZE,
    MAX_RECORDS_PER_BATCH,
    NO_KEY,
    NO_TAG,
    BatchHeader,
    Columns,
    check_magic,
    columns,
    crc32c,
    decode_headers,
    dense_offset_deltas,
    read_header,
    read_tags,
)
from sluice.errors import BatchTooLarge, CorruptBatch, LimitExceeded

_U16 = struct.Struct("<H")


@dataclass(frozen=True, slots=True)
class HeaderLimits:
    """The most headers one record may carry, and the most bytes its headers may take (count, names and
    values: the record's headers blob). A consumer decodes headers into a dict per record, so these bound
    what one produced record costs every consumer; Kafka bounds neither (only by the batch size)."""

    max_count: int = 1_000
    max_bytes: int = 1024 * 1024


DEFAULT_HEADER_LIMITS = HeaderLimits()


def validate_batch(
    buf: bytes | memoryview,
    pos: int,
    max_batch_bytes: int,
    require_dense: bool = False,
    headers: HeaderLimits | None = None,
) -> BatchHeader:
    """Fully check the batch at ``pos``: framing, CRC, counts and column sums.

    Caller: the broker on produce (``require_dense``: a producer's batch holds
    offsets 0..n-1 exactly) and log recovery. Costs one CRC pass plus a few
    C-level reductions over the columns. A batch of another format version is refused first
    (UNSUPPORTED_VERSION for format 1), before its bytes are read as a version-2 header.
    """
    check_magic(buf, pos)
    h = read_header(buf, pos)
    end = _check_frame(buf, pos, h, max_batch_bytes)
    if h.attributes:
        # A compressed batch's content is checked as the plain batch it inflates to (bounded by the
        # batch limit, which so bounds what consumers inflate): a batch consumers cannot read, once
        # acknowledged, is a poison pill for ever (docs/compression.md, "Validation on produce").
        size = inflated_size(buf, pos, h)
        if size > max_batch_bytes:  # the limit bounds a batch as consumers hold it, so its plain size
            raise BatchTooLarge(f"batch inflates to {size} bytes, over the limit of {max_batch_bytes} bytes")
        plain, plain_header = inflate(buf, pos, h, limit=min(max_batch_bytes, MAX_INFLATED_BYTES))
        _check_content(plain, 0, plain_header, plain_header.length, require_dense, headers)
        return h
    _check_content(buf, pos, h, end, require_dense, headers)
    return h


def _check_content(
    buf: bytes | memoryview,
    pos: int,
    h: BatchHeader,
    end: int,
    require_dense: bool,
    headers: HeaderLimits | None,
) -> None:
    """The tag table, columns and record headers of a plain batch whose frame is checked."""
    tags = read_tags(buf, pos, h)
    c = columns(buf, pos, h)
    key_bytes = _check_lengths(c)
    _check_offsets(c, h, require_dense)
    _check_tag_indexes(c, h.record_count, len(tags))
    headers_bytes = sum(c.headers_lengths)
    data_len = key_bytes + sum(c.value_lengths) + headers_bytes
    if c.data_start + data_len != end:
        raise CorruptBatch("record lengths do not add up to the batch length")
    if headers_bytes and headers is not None:  # the producer's path; recovery reads what was accepted
        _check_headers(buf, end - headers_bytes, c, headers)


def _check_headers(buf: bytes | memoryview, start: int, c: Columns, limits: HeaderLimits) -> None:
    """Each record's headers within ``limits`` (its blob's size, then the count its blob starts with),
    then parsed with the consumers' own parser.

    Why the parse: the CRC only proves the bytes are the producer's, not that they are well formed. A
    batch whose headers a consumer cannot parse, once acknowledged, is a poison pill: every consumer of
    the partition fails on it for ever (found by tests/unit/fuzz). Runs only for a batch where some
    record has headers (a batch without costs nothing more), on the producer's path only: recovery
    must not cut a log at a batch an older release accepted.
    """
    lengths = c.headers_lengths
    mv = memoryview(buf)
    biggest = max(lengths)
    if biggest > limits.max_bytes:
        raise LimitExceeded(
            f"a record's headers take {biggest} bytes, over the limit max_record_header_bytes="
            f"{limits.max_bytes}",
            limit="max_record_header_bytes",
            value=limits.max_bytes,
        )
    for at, length in zip(itertools.accumulate(lengths, initial=start), lengths, strict=False):
        if not length:
            continue
        if length < 2:
            raise CorruptBatch("record headers are truncated")
        (count,) = _U16.unpack_from(buf, at)
        if count > limits.max_count:
            raise LimitExceeded(
                f"a record carries {count} headers, over the limit max_record_headers={limits.max_count}",
                limit="max_record_headers",
                value=limits.max_count,
            )
        decode_headers(mv[at : at + length])


def _check_frame(buf: bytes | memoryview, pos: int, h: BatchHeader, max_batch_bytes: int) -> int:
    """The header's own fields and the CRC; returns where the batch ends."""
    if h.length < HEADER_SIZE + 2:
        raise CorruptBatch(f"batch length {h.length} is smaller than a header")
    if h.length > max_batch_bytes:
        raise BatchTooLarge(f"batch of {h.length} bytes exceeds the limit of {max_batch_bytes} bytes")
    end = pos + h.length
    if end > len(buf):
        raise CorruptBatch(f"batch claims {h.length} bytes but only {len(buf) - pos} remain")
    if crc32c(memoryview(buf)[pos + CRC_START : end]) != h.crc:
        raise CorruptBatch("batch CRC32C mismatch")
    if h.attributes:
        # After the CRC (the attributes are inside it): a flipped bit is damage, not an unknown codec.
        check_codec(h)
    n = h.record_count
    if not 0 < n <= MAX_RECORDS_PER_BATCH:
        raise CorruptBatch(f"record count {n} is out of range")
    if h.last_offset_delta < n - 1:
        raise CorruptBatch("last offset delta is smaller than the record count")
    return end


def _check_lengths(c: Columns) -> int:
    """Signs of the length and timestamp columns; returns the bytes the keys take.

    Sign checks and sums are C-level scans of the columns: no Python step per record.
    """
    if not _all_non_negative(c.value_lengths) or not _all_non_negative(c.headers_lengths):
        raise CorruptBatch("negative record length")
    key_lengths = c.key_lengths
    if _all_non_negative(key_lengths):
        key_bytes = sum(key_lengths)
    else:  # some records have no key (-1)
        lengths = key_lengths.tolist()
        if min(lengths) < NO_KEY:
            raise CorruptBatch("negative record length")
        key_bytes = sum(lengths) + lengths.count(NO_KEY)
    if not _all_non_negative(c.timestamp_deltas):
        raise CorruptBatch("negative timestamp delta")
    return key_bytes


def _check_offsets(c: Columns, h: BatchHeader, require_dense: bool) -> None:
    n = h.record_count
    deltas = c.offset_deltas
    if require_dense:
        if h.last_offset_delta != n - 1 or deltas.tobytes() != dense_offset_deltas(n):
            raise CorruptBatch("a produced batch must hold offset deltas 0..record_count-1")
        return
    if deltas[0] < 0 or deltas[n - 1] > h.last_offset_delta:
        raise CorruptBatch("offset deltas fall outside the batch")
    if n > 1 and any(b <= a for a, b in itertools.pairwise(deltas)):
        raise CorruptBatch("offset deltas are not increasing")


def _check_tag_indexes(c: Columns, n: int, tag_count: int) -> None:
    if tag_count:
        used_tags = set(c.tag_indexes.tolist())
        used_tags.discard(NO_TAG)
        if used_tags and max(used_tags) >= tag_count:
            raise CorruptBatch("record tag index is out of range")
    elif c.tag_indexes.tobytes().count(0xFF) != 2 * n:  # no tags: every index must be NO_TAG
        raise CorruptBatch("record tag index is out of range")


def _all_non_negative(column: memoryview) -> bool:
    """Whether no signed little-endian integer in ``column`` is negative.

    Reads only each integer's top byte (a strided slice) and asks ``isascii``, which is exactly
    "no byte has its high bit set": one C-level pass, where ``min`` makes a Python int per record.
    """
    width = column.itemsize
    return column.tobytes()[width - 1 :: width].isascii()
