"""The batch layout: header, tag table, column views, record headers, stamping and the CRC.

Everything the other modules of the package share: the fixed header (``HEADER``), where the
columns sit (``columns``), and ``assemble``, the one place a batch is framed and its CRC computed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import struct
import sys
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

from sluice.errors import CorruptBatch, UnsupportedVersion


def _load_crc32c() -> ModuleType:
    """The ``crc32c`` package's C extension, loaded without running the package's ``__init__``.

    That ``__init__`` imports ``importlib.metadata`` (and with it ``email``, ``zipfile``...) only to set
    ``__version__``: 0.05-0.15 s of CPU in every process that touches a batch, i.e. every ``sluice``
    command and every service start-up (docs/testing.md). The extension itself is all we call.
    """
    loaded = sys.modules.get("crc32c")
    package = None if loaded is not None else importlib.util.find_spec("crc32c")
    where = package.submodule_search_locations if package is not None else None
    spec = importlib.machinery.PathFinder.find_spec("crc32c._crc32c", list(where)) if where else None
    if loaded is not None or spec is None or spec.loader is None:  # pragma: no cover - a different build
        import crc32c

        return crc32c
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Shared by every module of the package that computes a CRC-32C (``crc32c(data, seed)``).
crc32c_ext = _load_crc32c()
_crc32c = crc32c_ext

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("sluice.codec.batch assumes a little-endian host")

MAGIC = 2
HEADER = struct.Struct("<qiqiBIBqhiiiqqI")
HEADER_SIZE = HEADER.size  # 72
#: Where the magic byte sits, in every version (so a reader can tell them apart).
MAGIC_AT = 24
CRC_AT = 25
CRC_START = 29
#: "None": the leader epoch of an unstamped batch, the producer fields of a non-idempotent one.
NO_EPOCH = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PRODUCER = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE)
NO_TAG = 0xFFFF
NO_KEY = -1
# Per-record column widths: four int32 columns, one int64 (timestamp delta; a
# user-supplied timestamp may be far from its neighbours) and one uint16.
COLUMN_BYTES = 4 * 4 + 8 + 2
MAX_RECORDS_PER_BATCH = 1_000_000
U16 = struct.Struct("<H")
_HDR_NAME = struct.Struct("<H")
_HDR_VALUE = struct.Struct("<I")
_OFFSET_FIELD = struct.Struct("<q")
_TIME_FIELD = struct.Struct("<q")
_EPOCH_FIELD = struct.Struct("<i")
#: The fields stamped outside the CRC, by position: base_offset (0), append_time_ms (12) and
#: partition_leader_epoch (20). batch_length (8) is outside the CRC too but never changes.
APPEND_TIME_AT = 12
LEADER_EPOCH_AT = 20
#: last_offset_delta's place: with base_offset and batch_length, all a read needs of a header.
LAST_OFFSET_DELTA_AT = 48
_COVERED_HEADER = struct.Struct("<BqhiiiqqI")
_UNCOVERED_HEADER = struct.Struct("<qiqiBI")

Headers = dict[str, bytes]


def crc32c(data: bytes | bytearray | memoryview) -> int:
    return int(_crc32c.crc32c(data))


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of a batch, parsed without touching its records."""

    base_offset: int
    length: int
    append_time_ms: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    tag_table_length: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header at ``pos``; raises CorruptBatch if it does not fit.

    It does not check the magic: ``validate_batch`` does (``check_magic``).
    """
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptBatch(f"truncated batch header at byte {pos}")
    return BatchHeader(*HEADER.unpack_from(buf, pos))


def check_magic(buf: bytes | bytearray | memoryview, pos: int = 0) -> None:
    """Refuse a batch of another format version, before its header is read as version 2.

    Version 1 (magic 1, a 54-byte header) is what SDKs before replication wrote: the error says
    so, as UNSUPPORTED_VERSION, rather than a CRC mismatch (docs/replication.md, "Batch format
    version 2": why the broker refuses such a batch instead of up-converting it).
    """
    if len(buf) - pos <= MAGIC_AT:
        raise CorruptBatch(f"truncated batch header at byte {pos}")
    magic = buf[pos + MAGIC_AT]
    if magic == MAGIC:
        return
    if magic == 1:
        raise UnsupportedVersion("batch format 1: upgrade the client (this broker reads format 2)")
    raise CorruptBatch(f"unsupported batch magic {magic}")


def read_tags(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> tuple[str, ...]:
    """The batch's tag table (``pos`` is the batch start)."""
    start = pos + HEADER_SIZE
    end = start + header.tag_table_length
    if header.tag_table_length < 2 or end > pos + header.length:
        raise CorruptBatch("tag table does not fit in the batch")
    (count,) = U16.unpack_from(buf, start)
    tags: list[str] = []
    p = start + 2
    for _ in range(count):
        if p + 2 > end:
            raise CorruptBatch("tag table is truncated")
        (n,) = U16.unpack_from(buf, p)
        p += 2
        if p + n > end:
            raise CorruptBatch("tag table is truncated")
        try:
            tags.append(bytes(buf[p : p + n]).decode())
        except UnicodeDecodeError as exc:
            raise CorruptBatch("tag is not valid UTF-8") from exc
        p += n
    if p != end:
        raise CorruptBatch("tag table length does not match its contents")
    return tuple(tags)


def encode_headers(headers: Headers) -> bytes:
    parts = [U16.pack(len(headers))]
    for name, value in headers.items():
        raw = name.encode()
        parts += (_HDR_NAME.pack(len(raw)), raw, _HDR_VALUE.pack(len(value)), value)
    return b"".join(parts)


def decode_headers(raw: bytes | memoryview) -> Headers:
    if len(raw) < 2:
        raise CorruptBatch("record headers are truncated")
    (count,) = U16.unpack_from(raw, 0)
    out: Headers = {}
    p = 2
    try:
        for _ in range(count):
            (n,) = _HDR_NAME.unpack_from(raw, p)
            name = bytes(raw[p + 2 : p + 2 + n]).decode()
            p += 2 + n
            (m,) = _HDR_VALUE.unpack_from(raw, p)
            p += 4
            if p + m > len(raw):
                raise CorruptBatch("record header value is truncated")
            out[name] = bytes(raw[p : p + m])
            p += m
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptBatch("record headers are malformed") from exc
    if p != len(raw):
        raise CorruptBatch("record headers have trailing bytes")
    return out


def assemble(
    record_count: int,
    last_offset_delta: int,
    base_ts: int,
    max_ts: int,
    tag_table_length: int,
    body: bytes | tuple[bytes, ...],
    base_offset: int = 0,
    append_time_ms: int = -1,
    leader_epoch: int = NO_EPOCH,
    producer: tuple[int, int, int] = NO_PRODUCER,
    attributes: int = 0,
) -> bytes:
    """Frame a batch: the header, its CRC, then ``body`` (tag table, columns, data; for a compressed
    batch, ``attributes`` naming the codec: tag table, then the compressed section, ``compression``).

    ``producer`` is (producer_id, producer_epoch, base_sequence), inside the CRC.
    ``body`` may come in a few parts (the builder's columns, keys, values...), laid out in that order.
    """
    parts = (body,) if isinstance(body, bytes) else body
    length = HEADER_SIZE + sum(map(len, parts))
    # The CRC covers attributes..end; base_offset, length, append_time, the leader epoch and
    # the magic are outside it. It is computed part by part (the C CRC chained by its seed) so the
    # body is copied once, into the result: every large copy is a fresh allocation whose pages
    # fault in (about 0.5 ms per MiB here).
    covered_header = _COVERED_HEADER.pack(
        attributes, *producer, record_count, last_offset_delta, base_ts, max_ts, tag_table_length
    )
    crc = _crc32c.crc32c(covered_header)
    for part in parts:
        crc = _crc32c.crc32c(part, crc)
    uncovered = _UNCOVERED_HEADER.pack(base_offset, length, append_time_ms, leader_epoch, MAGIC, int(crc))
    return b"".join((uncovered, covered_header, *parts))


@dataclass(frozen=True, slots=True)
class Columns:
    """The per-record columns of one batch, as zero-copy views."""

    offset_deltas: memoryview
    timestamp_deltas: memoryview
    key_lengths: memoryview
    value_lengths: memoryview
    headers_lengths: memoryview
    tag_indexes: memoryview
    #: Where the keys start; values follow the keys, headers follow the values.
    data_start: int

    def regions(self) -> tuple[int, int, int, int]:
        """(keys_start, values_start, headers_start, end) of the data section."""
        keys = self.data_start
        values = keys + sum(self.key_lengths) + self.key_lengths.tolist().count(NO_KEY)
        headers = values + sum(self.value_lengths)
        return keys, values, headers, headers + sum(self.headers_lengths)


def columns(buf: bytes | memoryview, pos: int, header: BatchHeader) -> Columns:
    """Views on the columns of the batch at ``pos``; CorruptBatch if they do not fit in it.

    The fit is checked here, not only by ``validate_batch``, because readers that skip validation
    (a consumer with ``verify_crc`` off, the dispatcher's cuts) would otherwise fail with a bare
    ``TypeError`` from ``cast`` on a short slice.
    """
    if header.attributes:
        # A compressed batch's columns are inside its frame: read its ``compression.plain_batch``.
        raise CorruptBatch(f"batch at offset {header.base_offset} is compressed: inflate it first")
    n = header.record_count
    mv = memoryview(buf)
    p = pos + HEADER_SIZE + header.tag_table_length
    if n < 0 or p + COLUMN_BYTES * n > min(pos + header.length, len(mv)):
        raise CorruptBatch("record columns do not fit in the batch")
    offset_deltas = mv[p : p + 4 * n].cast("i")
    p += 4 * n
    timestamp_deltas = mv[p : p + 8 * n].cast("q")
    p += 8 * n
    key_lengths = mv[p : p + 4 * n].cast("i")
    p += 4 * n
    value_lengths = mv[p : p + 4 * n].cast("i")
    p += 4 * n
    headers_lengths = mv[p : p + 4 * n].cast("i")
    p += 4 * n
    tag_idx = mv[p : p + 2 * n].cast("H")
    return Columns(
        offset_deltas, timestamp_deltas, key_lengths, value_lengths, headers_lengths, tag_idx, p + 2 * n
    )


class _DenseOffsetDeltas:
    """The offset-delta column of an unfiltered batch, ``0 .. n-1`` as int32s, for any ``n``.

    Made once and cut to length (growing by doubling as larger batches come): building it from
    ``range`` per batch cost about 40 ns per record, on the producer (encoding) and on the broker
    (validating) alike.
    """

    __slots__ = ("_encoded",)

    def __init__(self) -> None:
        self._encoded = b""

    def __call__(self, n: int) -> bytes:
        encoded = self._encoded
        if len(encoded) < 4 * n:
            # Replaced whole, never changed in place: a thread holding the old one is unaffected.
            encoded = self._encoded = array("i", range(max(n, len(encoded) // 2))).tobytes()
        return encoded[: 4 * n]


dense_offset_deltas = _DenseOffsetDeltas()


def stamp(
    batch: bytearray | memoryview, pos: int, base_offset: int, append_time_ms: int, leader_epoch: int
) -> None:
    """Write the leader-assigned base offset, append time and leader epoch in place (all three
    outside the CRC, so the batch stays valid)."""
    _OFFSET_FIELD.pack_into(batch, pos, base_offset)
    _TIME_FIELD.pack_into(batch, pos + APPEND_TIME_AT, append_time_ms)
    _EPOCH_FIELD.pack_into(batch, pos + LEADER_EPOCH_AT, leader_epoch)


_PRODUCER_FIELDS = struct.Struct("<qhi")
_CRC_FIELD = struct.Struct("<I")
PRODUCER_AT = 30


def restamp_producer(batch: bytes, producer: tuple[int, int, int]) -> bytes:
    """The same batch under another producer id, epoch and first sequence, CRC recomputed.

    Caller: the idempotent producer, when a batch it already encoded must be sent under a new epoch or
    from sequence 0 again. The producer fields are inside the CRC (the producer sets them, the broker
    checks them), so the CRC is computed again: one pass of the C CRC over the batch, no record decoding.
    """
    out = bytearray(batch)
    _PRODUCER_FIELDS.pack_into(out, PRODUCER_AT, *producer)
    _CRC_FIELD.pack_into(out, CRC_AT, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


@contextmanager
def malformed_is_corrupt(base_offset: int) -> Iterator[None]:
    """Turn what a malformed batch makes a reader raise into CorruptBatch.

    The readers (``decode_records``, ``batch_views``, ``filter_batch``) trust the broker's validation
    and do not check every column again, which would cost consumers a second pass. Bytes that pass
    the CRC yet are malformed (only with ``verify_crc`` off, or a bug) then fail inside C-level
    column code with a ``KeyError`` (a tag index out of range), ``ValueError`` or ``TypeError``.
    Callers get the typed error instead, so a damaged batch is reported as one and never surfaces as
    an unexplained exception in an application (found by tests/unit/fuzz). Free when nothing raises.
    """
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, struct.error) as exc:
        if isinstance(exc, CorruptBatch):
            raise
        raise CorruptBatch(f"batch at offset {base_offset} is malformed ({type(exc).__name__})") from exc


def iter_headers(
    buf: bytes | memoryview, pos: int = 0, end: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Walk batch headers from ``pos`` without decoding records. Stops at a short tail."""
    stop = len(buf) if end is None else end
    while pos + HEADER_SIZE <= stop:
        h = BatchHeader(*HEADER.unpack_from(buf, pos))
        if h.length < HEADER_SIZE or pos + h.length > stop:
            return
        yield pos, h
        pos += h.length


#: The two fields a walk over stamped batches needs: base offset and length (the header's first 12 bytes).
_SPAN = struct.Struct("<qi")
_CRC = struct.Struct("<I")
_RECORD_COUNT = struct.Struct("<i")
_RECORD_COUNT_AT = 44


def iter_spans(buf: bytes | memoryview, pos: int = 0) -> Iterator[tuple[int, int, int]]:
    """``(pos, base_offset, length)`` of each whole batch from ``pos``, as :func:`iter_headers` walks
    them (stops at a short tail), without building a :class:`BatchHeader`: a frozen 15-field dataclass
    costs about 3 us, which the broker paid per batch on every read it serves (the CRC check and the
    bytes-out metric), several times the rest of the walk at one batch per read."""
    stop = len(buf)
    unpack = _SPAN.unpack_from
    while pos + HEADER_SIZE <= stop:
        base, length = unpack(buf, pos)
        if length < HEADER_SIZE or pos + length > stop:
            return
        yield pos, base, length
        pos += length


def stored_crc(buf: bytes | memoryview, pos: int) -> int:
    """The CRC field of the batch at ``pos``."""
    crc: int = _CRC.unpack_from(buf, pos + CRC_AT)[0]
    return crc


def record_count_at(buf: bytes | memoryview, pos: int) -> int:
    """The record count of the batch at ``pos``."""
    count: int = _RECORD_COUNT.unpack_from(buf, pos + _RECORD_COUNT_AT)[0]
    return count
