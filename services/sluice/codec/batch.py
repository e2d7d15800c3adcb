"""The record batch: the one format records travel and rest in.

A producer encodes a batch once; the broker validates it, stamps the base offset
and the append time into the header (fields outside the CRC), and writes it to
the log as it is. Consumers decode it. Nobody re-encodes per record, except the
broker when a tag filter keeps only part of a batch.

Layout (little-endian, no padding)::

    offset  size  field
    0       8     base_offset        stamped by the broker
    8       4     batch_length       whole batch, header included
    12      8     append_time_ms     stamped by the broker (-1 before)
    20      4     crc                CRC32C of bytes [24, batch_length)
    24      1     magic              = 1
    25      1     attributes         reserved (compression), must be 0
    26      4     record_count       > 0
    30      4     last_offset_delta  record_count - 1 unless filtered
    34      8     base_timestamp     ms
    42      8     max_timestamp      ms
    50      4     tag_table_length   bytes
    54            tag table          u16 count, then per tag u16 length + UTF-8
                  columns            record_count entries each, in this order:
                                     offset_delta i32, timestamp_delta i64,
                                     key_length i32 (-1: no key), value_length i32,
                                     headers_length i32, tag_index u16 (0xFFFF: none)
                  data               every key, then every value, then every headers blob

The tag table lists every distinct tag in the batch, so a filtered fetch can skip a
whole batch from its header alone. The per-record fields are stored as columns so
that validation and decoding read each one with a single C-level cast instead of a
struct call per record, and the data is stored by column too (all keys, then all
values, then all headers), so a batch's values are one contiguous run: an Arrow
binary column is a zero-copy view of it (sluice.spark). A record's headers are u16 count, then per header u16
name length, name, u32 value length, value.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c as _crc32c

from sluice.errors import BatchTooLarge, CorruptBatch

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("sluice.codec.batch assumes a little-endian host")

MAGIC = 1
HEADER = struct.Struct("<qiqIBBiiqqI")
HEADER_SIZE = HEADER.size  # 54
CRC_START = 24
NO_TAG = 0xFFFF
NO_KEY = -1
# Per-record column widths: four int32 columns, one int64 (timestamp delta; a
# user-supplied timestamp may be far from its neighbours) and one uint16.
COLUMN_BYTES = 4 * 4 + 8 + 2
MAX_RECORDS_PER_BATCH = 1_000_000
_U16 = struct.Struct("<H")
_HDR_NAME = struct.Struct("<H")
_HDR_VALUE = struct.Struct("<I")
_OFFSET_FIELD = struct.Struct("<q")
_STAMP = struct.Struct("<qiq")
_BATCH_LEN = struct.Struct("<i")
_FIELDS_8_20 = struct.Struct("<iq")

Headers = dict[str, bytes]


def crc32c(data: bytes | bytearray | memoryview) -> int:
    return int(_crc32c.crc32c(data))


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of a batch, parsed without touching its records."""

    base_offset: int
    length: int
    append_time_ms: int
    crc: int
    magic: int
    attributes: int
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
    """Parse the header at ``pos``; raises CorruptBatch if it does not fit."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptBatch(f"truncated batch header at byte {pos}")
    return BatchHeader(*HEADER.unpack_from(buf, pos))


def read_tags(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> tuple[str, ...]:
    """The batch's tag table (``pos`` is the batch start)."""
    start = pos + HEADER_SIZE
    end = start + header.tag_table_length
    if header.tag_table_length < 2 or end > pos + header.length:
        raise CorruptBatch("tag table does not fit in the batch")
    (count,) = _U16.unpack_from(buf, start)
    tags: list[str] = []
    p = start + 2
    for _ in range(count):
        if p + 2 > end:
            raise CorruptBatch("tag table is truncated")
        (n,) = _U16.unpack_from(buf, p)
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
    parts = [_U16.pack(len(headers))]
    for name, value in headers.items():
        raw = name.encode()
        parts += (_HDR_NAME.pack(len(raw)), raw, _HDR_VALUE.pack(len(value)), value)
    return b"".join(parts)


def decode_headers(raw: bytes | memoryview) -> Headers:
    if len(raw) < 2:
        raise CorruptBatch("record headers are truncated")
    (count,) = _U16.unpack_from(raw, 0)
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


class BatchBuilder:
    """Accumulates records for one partition and encodes them in one go.

    Caller: the producer's accumulator, one builder per open batch.
    Per record it only appends to column arrays; the batch is laid out once
    in :meth:`build`.
    """

    __slots__ = (
        "_headers",
        "_headers_lens",
        "_key_lens",
        "_keys",
        "_t0",
        "_tag_idx",
        "_tags",
        "_ts",
        "_value_lens",
        "_values",
        "size",
    )

    def __init__(self) -> None:
        #: Timestamps are kept as deltas from the first record's, so build() rarely
        #: has to rewrite them (only when a later record is older than the first).
        self._t0: int | None = None
        self._ts: list[int] = []
        self._key_lens: list[int] = []
        self._value_lens: list[int] = []
        # Headers and tags are the exception: their columns exist only once a record
        # has one (then back-filled), which spares two appends per plain record.
        self._headers_lens: list[int] | None = None
        self._tag_idx: list[int] | None = None
        self._tags: dict[str, int] = {}
        self._keys: list[bytes] = []
        self._values: list[bytes] = []
        self._headers: list[bytes] = []
        #: Estimated encoded size in bytes, for batch.size limits.
        self.size = HEADER_SIZE + 2

    def __len__(self) -> int:
        return len(self._ts)

    def append(
        self,
        value: bytes,
        key: bytes | None,
        tag: str | None,
        headers: Headers | None,
        timestamp_ms: int,
    ) -> int:
        """Add one record; returns its index in the batch."""
        ts = self._ts
        index = len(ts)
        t0 = self._t0
        if t0 is None:
            t0 = self._t0 = timestamp_ms
        ts.append(timestamp_ms - t0)
        if key is None:
            self._key_lens.append(NO_KEY)
            size = COLUMN_BYTES + len(value)
        else:
            klen = len(key)
            self._key_lens.append(klen)
            self._keys.append(key)
            size = COLUMN_BYTES + klen + len(value)
        self._values.append(value)
        self._value_lens.append(len(value))
        hl = self._headers_lens
        if headers:
            raw = encode_headers(headers)
            self._headers.append(raw)
            if hl is None:
                hl = self._headers_lens = [0] * index
            hl.append(len(raw))
            size += len(raw)
        elif hl is not None:
            hl.append(0)
        ti = self._tag_idx
        if tag:
            idx = self._tags.get(tag)
            if idx is None:
                idx = self._tags[tag] = len(self._tags)
                size += 2 + len(tag.encode())
            if ti is None:
                ti = self._tag_idx = [NO_TAG] * index
            ti.append(idx)
        elif ti is not None:
            ti.append(NO_TAG)
        self.size += size
        return index

    def build(self) -> bytes:
        """Encode the batch with base_offset 0 and append_time -1 (unstamped)."""
        n = len(self._ts)
        if n == 0:
            raise ValueError("cannot build an empty batch")
        assert self._t0 is not None
        low = min(self._ts)
        base_ts = self._t0 + low
        tags = list(self._tags)
        tag_table = [_U16.pack(len(tags))]
        for t in tags:
            raw = t.encode()
            tag_table += (_U16.pack(len(raw)), raw)
        tag_bytes = b"".join(tag_table)
        ts_deltas = array("q", self._ts if low == 0 else [t - low for t in self._ts])
        headers_lens = (
            bytes(4 * n) if self._headers_lens is None else array("i", self._headers_lens).tobytes()
        )
        tag_idx = (array("H", [NO_TAG]) * n if self._tag_idx is None else array("H", self._tag_idx)).tobytes()
        body = b"".join(
            (
                tag_bytes,
                dense_offset_deltas(n),
                ts_deltas.tobytes(),
                array("i", self._key_lens).tobytes(),
                array("i", self._value_lens).tobytes(),
                headers_lens,
                tag_idx,
                *self._keys,
                *self._values,
                *self._headers,
            )
        )
        return _assemble(n, n - 1, base_ts, self._t0 + max(self._ts), len(tag_bytes), body)


def _assemble(
    record_count: int,
    last_offset_delta: int,
    base_ts: int,
    max_ts: int,
    tag_table_length: int,
    body: bytes,
    base_offset: int = 0,
    append_time_ms: int = -1,
) -> bytes:
    length = HEADER_SIZE + len(body)
    # The CRC covers magic..end; base_offset, length and append_time are outside it. It is
    # computed in two steps so the body is copied once, into the result: every large copy is
    # a fresh allocation whose pages fault in (about 0.5 ms per MiB here).
    covered_header = struct.pack(
        "<BBiiqqI", MAGIC, 0, record_count, last_offset_delta, base_ts, max_ts, tag_table_length
    )
    crc = int(_crc32c.crc32c(body, _crc32c.crc32c(covered_header)))
    return b"".join((struct.pack("<qiqI", base_offset, length, append_time_ms, crc), covered_header, body))


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
    """Views on the columns of the batch at ``pos`` (bounds already validated)."""
    n = header.record_count
    mv = memoryview(buf)
    p = pos + HEADER_SIZE + header.tag_table_length
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


def validate_batch(
    buf: bytes | memoryview, pos: int, max_batch_bytes: int, require_dense: bool = False
) -> BatchHeader:
    """Fully check the batch at ``pos``: framing, CRC, counts and column sums.

    Caller: the broker on produce (``require_dense``: a producer's batch holds
    offsets 0..n-1 exactly) and log recovery. Costs one CRC pass plus a few
    C-level reductions over the columns.
    """
    h = read_header(buf, pos)
    if h.length < HEADER_SIZE + 2:
        raise CorruptBatch(f"batch length {h.length} is smaller than a header")
    if h.length > max_batch_bytes:
        raise BatchTooLarge(f"batch of {h.length} bytes exceeds the limit of {max_batch_bytes} bytes")
    end = pos + h.length
    if end > len(buf):
        raise CorruptBatch(f"batch claims {h.length} bytes but only {len(buf) - pos} remain")
    if h.magic != MAGIC:
        raise CorruptBatch(f"unsupported batch magic {h.magic}")
    if h.attributes != 0:
        raise CorruptBatch(f"unsupported batch attributes {h.attributes}")
    mv = memoryview(buf)
    if crc32c(mv[pos + CRC_START : end]) != h.crc:
        raise CorruptBatch("batch CRC32C mismatch")
    n = h.record_count
    if not 0 < n <= MAX_RECORDS_PER_BATCH:
        raise CorruptBatch(f"record count {n} is out of range")
    if h.last_offset_delta < n - 1:
        raise CorruptBatch("last offset delta is smaller than the record count")
    tags = read_tags(buf, pos, h)
    cols_start = pos + HEADER_SIZE + h.tag_table_length
    if cols_start + COLUMN_BYTES * n > end:
        raise CorruptBatch("record columns do not fit in the batch")
    c = columns(buf, pos, h)
    # Sign checks and sums are C-level scans of the columns: no Python step per record.
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
    deltas = c.offset_deltas
    if require_dense:
        if h.last_offset_delta != n - 1 or deltas.tobytes() != dense_offset_deltas(n):
            raise CorruptBatch("a produced batch must hold offset deltas 0..record_count-1")
    else:
        if deltas[0] < 0 or deltas[n - 1] > h.last_offset_delta:
            raise CorruptBatch("offset deltas fall outside the batch")
        if n > 1 and any(b <= a for a, b in itertools.pairwise(deltas)):
            raise CorruptBatch("offset deltas are not increasing")
    if tags:
        used_tags = set(c.tag_indexes.tolist())
        used_tags.discard(NO_TAG)
        if used_tags and max(used_tags) >= len(tags):
            raise CorruptBatch("record tag index is out of range")
    elif c.tag_indexes.tobytes().count(0xFF) != 2 * n:  # no tags: every index must be NO_TAG
        raise CorruptBatch("record tag index is out of range")
    data_len = key_bytes + sum(c.value_lengths) + sum(c.headers_lengths)
    if c.data_start + data_len != end:
        raise CorruptBatch("record lengths do not add up to the batch length")
    return h


def _all_non_negative(column: memoryview) -> bool:
    """Whether no signed little-endian integer in ``column`` is negative.

    Reads only each integer's top byte (a strided slice) and asks ``isascii``, which is exactly
    "no byte has its high bit set": one C-level pass, where ``min`` makes a Python int per record.
    """
    width = column.itemsize
    return column.tobytes()[width - 1 :: width].isascii()


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


def stamp(batch: bytearray | memoryview, pos: int, base_offset: int, append_time_ms: int) -> None:
    """Write the broker-assigned base offset and append time in place (outside the CRC)."""
    _OFFSET_FIELD.pack_into(batch, pos, base_offset)
    struct.pack_into("<q", batch, pos + 12, append_time_ms)


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


class Record(NamedTuple):
    """A consumed record. Identity: (topic, partition, offset).

    Immutable, and a named tuple so that ``decode_records`` can build it in C code
    (``tuple.__new__`` over a ``zip`` of a batch's columns) with no Python frame per record:
    decoding is most of what a consumer spends per record. It compares as the tuple of its
    fields (as kafka-python's ConsumerRecord does), and is unhashable: ``headers`` is a dict.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    tag: str | None
    headers: Headers
    timestamp: int

    def __repr__(self) -> str:
        return (
            f"Record(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
            f"key={self.key!r}, value={self.value!r}, tag={self.tag!r}, timestamp={self.timestamp})"
        )


_new_record = tuple.__new__


def decode_records(
    buf: bytes,
    topic: str,
    partition: int,
    start_offset: int = 0,
    verify_crc: bool = True,
) -> list[Record]:
    """Decode every record in a run of concatenated batches.

    Records below ``start_offset`` are dropped (a fetch returns whole batches,
    which may begin before the requested offset). A short tail is ignored, as
    a fetch may cut the last batch.
    """
    out: list[Record] = []
    mv = memoryview(buf)
    for pos, h in iter_headers(buf):
        if h.next_offset <= start_offset:
            continue
        if verify_crc and crc32c(mv[pos + CRC_START : pos + h.length]) != h.crc:
            raise CorruptBatch(f"batch at offset {h.base_offset} failed its CRC check")
        out += _batch_records(buf, pos, h, topic, partition, start_offset)
    return out


def _batch_records(
    buf: bytes, pos: int, h: BatchHeader, topic: str, partition: int, start_offset: int
) -> Iterator[Record]:
    """The records of one batch from ``start_offset`` on, built column by column.

    Each column becomes a list or a C-level iterator (slices between prefix sums of the
    lengths, ``map(add)`` for offsets and timestamps), and ``zip`` plus ``tuple.__new__``
    assemble the records: measured, 40% less time per record than a Python loop that
    slices and constructs record by record. Only keys with some absent, and headers, need a
    Python step per record.
    """
    c = columns(buf, pos, h)
    n = h.record_count
    key_lengths = c.key_lengths
    keys: Iterable[bytes | None]
    if min(key_lengths, default=0) >= 0:
        key_ends = list(itertools.accumulate(key_lengths, initial=c.data_start))
        keys = [buf[a:b] for a, b in itertools.pairwise(key_ends)]
        values_start = key_ends[-1]
    else:
        keys, values_start = _keys_with_absent(buf, c.data_start, key_lengths)
    value_ends = list(itertools.accumulate(c.value_lengths, initial=values_start))
    values = [buf[a:b] for a, b in itertools.pairwise(value_ends)]
    headers_lengths = c.headers_lengths
    headers: Iterable[Headers]
    if any(headers_lengths):
        mv = memoryview(buf)
        ends = list(itertools.accumulate(headers_lengths, initial=value_ends[-1]))
        headers = [decode_headers(mv[a:b]) if a != b else {} for a, b in itertools.pairwise(ends)]
    else:
        # A dict of its own per record: a caller may change one record's headers.
        headers = [{} for _ in range(n)]
    tag_table = read_tags(buf, pos, h)
    tags: Iterable[str | None]
    if tag_table:
        tag_of: dict[int, str | None] = dict(enumerate(tag_table))
        tag_of[NO_TAG] = None
        tags = map(tag_of.__getitem__, c.tag_indexes)
    else:
        tags = itertools.repeat(None)
    records = map(
        _new_record,
        itertools.repeat(Record),
        zip(
            itertools.repeat(topic),
            itertools.repeat(partition),
            map(operator.add, itertools.repeat(h.base_offset), c.offset_deltas),
            keys,
            values,
            tags,
            headers,
            map(operator.add, itertools.repeat(h.base_timestamp), c.timestamp_deltas),
        ),
    )
    if h.base_offset >= start_offset:
        return records
    # Offsets increase within a batch: skip the records before start_offset by position.
    return itertools.islice(records, bisect.bisect_left(c.offset_deltas, start_offset - h.base_offset), None)


def _keys_with_absent(buf: bytes, start: int, key_lengths: memoryview) -> tuple[list[bytes | None], int]:
    """Keys of a batch where some records have none; and where the values start."""
    keys: list[bytes | None] = []
    append = keys.append
    p = start
    for length in key_lengths:
        if length < 0:
            append(None)
        else:
            append(buf[p : p + length])
            p += length
    return keys, p


def filter_batch(buf: bytes, pos: int, h: BatchHeader, keep_tags: frozenset[str]) -> bytes | None:
    """Rebuild the batch at ``pos`` keeping only records whose tag is in ``keep_tags``.

    Returns None when no record matches. The result keeps the original base
    offset, offsets and last_offset_delta, so the consumer's position still
    moves past every filtered-out record.
    """
    tags = read_tags(buf, pos, h)
    keep_idx = {i for i, t in enumerate(tags) if t in keep_tags}
    if not keep_idx:
        return None
    if len(keep_idx) == len(tags) and NO_TAG not in columns(buf, pos, h).tag_indexes:
        return bytes(buf[pos : pos + h.length])
    c = columns(buf, pos, h)
    sel_od: list[int] = []
    sel_td: list[int] = []
    sel_kl: list[int] = []
    sel_vl: list[int] = []
    sel_hl: list[int] = []
    sel_ti: list[int] = []
    keys: list[bytes] = []
    values: list[bytes] = []
    headers: list[bytes] = []
    kp, vp, hp, _ = c.regions()
    new_tag_of: dict[int, int] = {}
    new_tags: list[str] = []
    for od, td, kl, vl, hl, ti in zip(
        c.offset_deltas,
        c.timestamp_deltas,
        c.key_lengths,
        c.value_lengths,
        c.headers_lengths,
        c.tag_indexes,
        strict=True,
    ):
        klen = max(kl, 0)
        if ti in keep_idx:
            nt = new_tag_of.get(ti)
            if nt is None:
                nt = new_tag_of[ti] = len(new_tags)
                new_tags.append(tags[ti])
            sel_od.append(od)
            sel_td.append(td)
            sel_kl.append(kl)
            sel_vl.append(vl)
            sel_hl.append(hl)
            sel_ti.append(nt)
            keys.append(buf[kp : kp + klen])
            values.append(buf[vp : vp + vl])
            headers.append(buf[hp : hp + hl])
        kp += klen
        vp += vl
        hp += hl
    table = [_U16.pack(len(new_tags))]
    for t in new_tags:
        raw = t.encode()
        table += (_U16.pack(len(raw)), raw)
    tag_bytes = b"".join(table)
    body = b"".join(
        (
            tag_bytes,
            array("i", sel_od).tobytes(),
            array("q", sel_td).tobytes(),
            array("i", sel_kl).tobytes(),
            array("i", sel_vl).tobytes(),
            array("i", sel_hl).tobytes(),
            array("H", sel_ti).tobytes(),
            *keys,
            *values,
            *headers,
        )
    )
    return _assemble(
        len(sel_od),
        h.last_offset_delta,
        h.base_timestamp,
        h.max_timestamp,
        len(tag_bytes),
        body,
        base_offset=h.base_offset,
        append_time_ms=h.append_time_ms,
    )


def encode_records(
    records: Iterable[tuple[bytes, bytes | None, str | None, Headers | None, int]],
) -> bytes:
    """Encode (value, key, tag, headers, timestamp_ms) tuples as one batch (tests, tools)."""
    b = BatchBuilder()
    for value, key, tag, headers, ts in records:
        b.append(value, key, tag, headers, ts)
    return b.build()


def batch_tags(buf: bytes | memoryview, pos: int, h: BatchHeader) -> Sequence[str]:
    return read_tags(buf, pos, h)


class BatchView:
    """One stamped batch, indexed for cutting and for reading single records.

    Caller: the dispatcher (forwards log batches to push consumers, cut down to the records each
    consumer gets) and the push SDK (reads records out of forwarded batches lazily). Built once per
    batch; the prefix sums make a record's key/value/headers and a cut of index runs a few slices
    each, with no per-record work beyond C-level ``accumulate``.
    """

    __slots__ = ("_data_starts", "buf", "cols", "header", "offsets", "pos", "tags")

    def __init__(self, buf: bytes, pos: int = 0, header: BatchHeader | None = None) -> None:
        h = read_header(buf, pos) if header is None else header
        self.buf = buf
        self.pos = pos
        self.header = h
        self.tags = read_tags(buf, pos, h)
        self.cols = columns(buf, pos, h)
        base = h.base_offset
        #: The record offsets, in batch order.
        self.offsets: list[int] = [base + d for d in self.cols.offset_deltas.tolist()]
        self._data_starts: tuple[list[int], list[int], list[int]] | None = None

    def __len__(self) -> int:
        return self.header.record_count

    def starts(self) -> tuple[list[int], list[int], list[int]]:
        """Absolute start positions of each record's key, value and headers, plus one past the end."""
        s = self._data_starts
        if s is None:
            c = self.cols
            kl = c.key_lengths
            key_lens: Iterable[int] = kl if min(kl, default=0) >= 0 else [k if k > 0 else 0 for k in kl]
            ks = list(itertools.accumulate(key_lens, initial=c.data_start))
            vs = list(itertools.accumulate(c.value_lengths, initial=ks[-1]))
            hs = list(itertools.accumulate(c.headers_lengths, initial=vs[-1]))
            s = self._data_starts = (ks, vs, hs)
        return s

    def key(self, i: int) -> bytes | None:
        kl = self.cols.key_lengths[i]
        if kl < 0:
            return None
        p = self.starts()[0][i]
        return self.buf[p : p + kl]

    def value(self, i: int) -> bytes:
        vs = self.starts()[1]
        return self.buf[vs[i] : vs[i + 1]]

    def headers(self, i: int) -> Headers:
        hs = self.starts()[2]
        if hs[i] == hs[i + 1]:
            return {}
        return decode_headers(memoryview(self.buf)[hs[i] : hs[i + 1]])

    def tag(self, i: int) -> str | None:
        t = self.cols.tag_indexes[i]
        return None if t == NO_TAG else self.tags[t]

    def timestamp(self, i: int) -> int:
        return self.header.base_timestamp + self.cols.timestamp_deltas[i]

    def record(self, topic: str, partition: int, i: int) -> Record:
        return Record(
            topic,
            partition,
            self.offsets[i],
            self.key(i),
            self.value(i),
            self.tag(i),
            self.headers(i),
            self.timestamp(i),
        )

    def cut(self, runs: Sequence[tuple[int, int]]) -> bytes:
        """A batch holding only the records of the index runs ``[i, j)`` (sorted, disjoint).

        It keeps the base offset, offset deltas, last_offset_delta, timestamps and tag table, so every
        record keeps its offset (a filtered-style batch, as ``filter_batch`` makes); the CRC is new.
        """
        h = self.header
        n = h.record_count
        if len(runs) == 1 and runs[0] == (0, n):
            return self.buf[self.pos : self.pos + h.length]
        mv = memoryview(self.buf)
        start = self.pos + HEADER_SIZE
        tag_bytes = mv[start : start + h.tag_table_length]
        parts: list[bytes | memoryview] = [tag_bytes]
        col = start + h.tag_table_length
        for width in (4, 8, 4, 4, 4, 2):
            parts += [mv[col + width * i : col + width * j] for i, j in runs]
            col += width * n
        for starts in self.starts():
            parts += [mv[starts[i] : starts[j]] for i, j in runs]
        return _assemble(
            sum(j - i for i, j in runs),
            h.last_offset_delta,
            h.base_timestamp,
            h.max_timestamp,
            h.tag_table_length,
            b"".join(parts),
            base_offset=h.base_offset,
            append_time_ms=h.append_time_ms,
        )


def batch_views(buf: bytes, verify_crc: bool = True) -> list[BatchView]:
    """A view per batch of a run of concatenated batches (a short tail is ignored, as a fetch may cut
    the last batch).

    Each view owns a copy of its batch's bytes (one memcpy per batch; none when ``buf`` is exactly
    one batch), so a record kept alive keeps its batch, not the whole fetch response.
    """
    out: list[BatchView] = []
    mv = memoryview(buf)
    for pos, h in iter_headers(buf):
        if verify_crc and crc32c(mv[pos + CRC_START : pos + h.length]) != h.crc:
            raise CorruptBatch(f"batch at offset {h.base_offset} failed its CRC check")
        out.append(BatchView(buf[pos : pos + h.length], 0, h))
    return out
