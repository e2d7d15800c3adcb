"""Decoding: a run of batches into ``Record`` named tuples, built in C per batch."""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import struct
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from sluice.codec.batch.compression import plain_batch
from sluice.codec.batch.layout import (
    CRC_START,
    NO_TAG,
    BatchHeader,
    Columns,
    Headers,
    columns,
    crc32c,
    decode_headers,
    dense_offset_deltas,
    iter_headers,
    malformed_is_corrupt,
    read_tags,
)
from sluice.errors import CorruptBatch


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
        # The CRC first: a skip decided from a damaged last_offset_delta would drop a batch silently.
        # Only a fetch's first batch is ever skipped, so this costs one more CRC pass at most.
        if verify_crc and crc32c(mv[pos + CRC_START : pos + h.length]) != h.crc:
            raise CorruptBatch(f"batch at offset {h.base_offset} failed its CRC check")
        if h.next_offset <= start_offset:
            continue
        # A compressed batch is read as the plain batch it inflates to (bounded: ``compression``).
        plain, ppos, ph = plain_batch(buf, pos, h)
        with malformed_is_corrupt(h.base_offset):
            out += _batch_records(plain, ppos, ph, topic, partition, start_offset)
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
    keys, values, values_end = _keys_and_values(buf, c)
    # Empty headers: a dict of its own per record, as a caller may change one record's headers.
    headers_lengths = c.headers_lengths
    headers = _headers(buf, headers_lengths, values_end) if any(headers_lengths) else [{} for _ in range(n)]
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


def _keys_and_values(buf: bytes, c: Columns) -> tuple[list[bytes | None], list[bytes], int]:
    """A batch's keys and values as slices between prefix sums of their lengths (C-level passes), and
    where the values end (the headers follow)."""
    key_lengths = c.key_lengths
    keys: list[bytes | None]
    fixed = _fixed_sizes(buf, key_lengths, c.value_lengths)
    if fixed is not None:
        n = len(key_lengths)
        fields = fixed.unpack_from(buf, c.data_start)
        return list(fields[:n]), list(fields[n:]), c.data_start + fixed.size
    if min(key_lengths, default=0) >= 0:
        key_ends = list(itertools.accumulate(key_lengths, initial=c.data_start))
        keys = [buf[a:b] for a, b in itertools.pairwise(key_ends)]
        values_start = key_ends[-1]
    else:
        keys, values_start = _keys_with_absent(buf, c.data_start, key_lengths)
    value_ends = list(itertools.accumulate(c.value_lengths, initial=values_start))
    values = [buf[a:b] for a, b in itertools.pairwise(value_ends)]
    return keys, values, value_ends[-1]


def _fixed_sizes(buf: bytes, key_lengths: memoryview, value_lengths: memoryview) -> struct.Struct | None:
    """Where every key of a batch has one length and every value another (fixed-size records, as in
    ``make compare``): a ``Struct`` of ``n`` keys then ``n`` values, whose ``unpack_from`` makes every
    ``bytes`` in one C call, about a quarter of the CPU of slicing them one by one (docs/latency.md,
    "Session 15, SDK CPU per record"). None otherwise (lengths differ, a key is absent, or ``buf`` is
    not ``bytes``: a slice of another buffer type is that type, which unpacking would change)."""
    n = len(key_lengths)
    if not n or buf.__class__ is not bytes:
        return None
    klen, vlen = key_lengths[0], value_lengths[0]
    if klen < 0:
        return None
    kraw, vraw = key_lengths.tobytes(), value_lengths.tobytes()
    if kraw != kraw[:4] * n or vraw != vraw[:4] * n:
        return None
    if n > _CACHED_RECORDS:
        return _fixed_format(klen, vlen, n)  # used once: a kept one would hold 64 bytes a record
    return _fixed_struct(klen, vlen, n)


#: Formats of batches up to this many records are kept (a 256 KiB batch of 16 + 100-byte records has
#: about 2,000): 4 of them hold at most 2 MiB.
_CACHED_RECORDS = 8192


def _fixed_format(klen: int, vlen: int, n: int) -> struct.Struct:
    return struct.Struct(f"<{f'{klen}s' * n}{f'{vlen}s' * n}")


@functools.lru_cache(maxsize=4)
def _fixed_struct(klen: int, vlen: int, n: int) -> struct.Struct:
    """Kept for the next batch of the same shape (full batches of fixed-size records have one): a
    compiled format is 64 bytes a record, so a few are kept, not struct's own cache of 100."""
    return _fixed_format(klen, vlen, n)


def _headers(buf: bytes, headers_lengths: memoryview, start: int) -> list[Headers]:
    """Each record's headers (a dict of its own, empty where it has none)."""
    mv = memoryview(buf)
    ends = list(itertools.accumulate(headers_lengths, initial=start))
    return [decode_headers(mv[a:b]) if a != b else {} for a, b in itertools.pairwise(ends)]


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


class RecordColumns:
    """Records of one partition as columns: what ``Consumer.poll_columns`` hands out.

    ``offsets``, ``keys`` (None where a record has none), ``values`` and ``timestamps`` are plain lists,
    index ``i`` of each being one record: what a loop or a vectorised library wants, with no object per
    record. ``tags`` and ``headers`` are made when first read (``[None] * n`` and an empty dict per record
    when no record has any), so a caller that never reads them never pays for them; so is ``timestamps``
    when decoded from batches (kept until then as each batch's base and its deltas' bytes, a copy: the
    fetch answer is not held). ``records()`` gives the same records as :class:`Record` objects, as
    ``poll()`` would have.
    """

    __slots__ = ("_headers", "_tags", "_ts", "_ts_deltas", "keys", "offsets", "partition", "topic", "values")

    def __init__(
        self,
        topic: str,
        partition: int,
        offsets: list[int],
        keys: list[bytes | None],
        values: list[bytes],
        timestamps: list[int] | None,
        tags: list[str | None] | None = None,
        headers: list[Headers] | None = None,
        timestamp_deltas: list[tuple[int, bytes]] | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offsets = offsets
        self.keys = keys
        self.values = values
        #: The timestamps, or None while they are ``_ts_deltas``: per batch in order, its base timestamp
        #: and its records' deltas (int64 little-endian bytes), made into the list when first read.
        self._ts = timestamps
        self._ts_deltas = timestamp_deltas if timestamps is None else None
        if timestamps is None and timestamp_deltas is None:
            raise ValueError("RecordColumns needs timestamps or timestamp_deltas")
        #: None: no record has a tag (resp. headers).
        self._tags = tags
        self._headers = headers

    @property
    def timestamps(self) -> list[int]:
        if self._ts is None:
            assert self._ts_deltas is not None
            out: list[int] = []
            for base, raw in self._ts_deltas:
                out += _timestamps(base, memoryview(raw).cast("q"))
            self._ts, self._ts_deltas = out, None
        return self._ts

    @timestamps.setter
    def timestamps(self, value: list[int]) -> None:
        self._ts, self._ts_deltas = value, None

    def _cut_deltas(self, start: int, end: int) -> list[tuple[int, bytes]]:
        """``_ts_deltas`` of the records ``start`` to ``end``."""
        assert self._ts_deltas is not None
        out = []
        first = 0
        for base, raw in self._ts_deltas:
            last = first + len(raw) // 8
            lo, hi = max(start, first), min(end, last)
            if lo < hi:
                out.append((base, raw[8 * (lo - first) : 8 * (hi - first)]))
            first = last
        return out

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def tags(self) -> list[str | None]:
        if self._tags is None:
            self._tags = [None] * len(self.offsets)
        return self._tags

    @property
    def headers(self) -> list[Headers]:
        if self._headers is None:
            self._headers = [{} for _ in self.offsets]
        return self._headers

    def records(self) -> list[Record]:
        """The same records as :class:`Record` objects (what ``poll()`` returns)."""
        n = len(self.offsets)
        tags = self._tags if self._tags is not None else itertools.repeat(None, n)
        headers = self._headers if self._headers is not None else ({} for _ in range(n))
        return list(
            map(
                _new_record,
                itertools.repeat(Record),
                zip(
                    itertools.repeat(self.topic, n),
                    itertools.repeat(self.partition, n),
                    self.offsets,
                    self.keys,
                    self.values,
                    tags,
                    headers,
                    self.timestamps,
                    strict=True,
                ),
            )
        )

    @classmethod
    def of_records(cls, topic: str, partition: int, records: list[Record]) -> RecordColumns:
        """Columns of ``records`` (all of ``topic``/``partition``)."""
        tags = [r.tag for r in records]
        headers = [r.headers for r in records]
        return cls(
            topic,
            partition,
            [r.offset for r in records],
            [r.key for r in records],
            [r.value for r in records],
            [r.timestamp for r in records],
            tags if any(tags) else None,
            headers if any(headers) else None,
        )

    def cut(self, start: int, end: int) -> RecordColumns:
        """Records ``start`` to ``end`` (by position)."""
        return RecordColumns(
            self.topic,
            self.partition,
            self.offsets[start:end],
            self.keys[start:end],
            self.values[start:end],
            None if self._ts is None else self._ts[start:end],
            None if self._tags is None else self._tags[start:end],
            None if self._headers is None else self._headers[start:end],
            None if self._ts is not None else self._cut_deltas(start, end),
        )

    def extend(self, other: RecordColumns) -> None:
        """Append ``other``'s records (later ones of the same partition)."""
        n = len(self.offsets)
        self.offsets += other.offsets
        self.keys += other.keys
        self.values += other.values
        if self._ts is None and other._ts is None:
            self._ts_deltas += other._ts_deltas  # type: ignore[operator]
        else:
            self.timestamps += other.timestamps
        if self._tags is not None or other._tags is not None:
            self._tags = (self._tags if self._tags is not None else [None] * n) + other.tags
        if self._headers is not None or other._headers is not None:
            mine = self._headers if self._headers is not None else [{} for _ in range(n)]
            self._headers = mine + other.headers

    def __repr__(self) -> str:
        first = self.offsets[0] if self.offsets else None
        return f"RecordColumns({self.topic!r}, {self.partition}, records={len(self)}, first_offset={first})"


def decode_columns(
    buf: bytes, topic: str, partition: int, start_offset: int = 0, verify_crc: bool = True
) -> RecordColumns:
    """``decode_records`` as columns: the same records (from ``start_offset`` on, a short tail
    ignored, CorruptBatch on a bad CRC), with no object per record."""
    out = RecordColumns(topic, partition, [], [], [], [])
    mv = memoryview(buf)
    for pos, h in iter_headers(buf):
        if verify_crc and crc32c(mv[pos + CRC_START : pos + h.length]) != h.crc:
            raise CorruptBatch(f"batch at offset {h.base_offset} failed its CRC check")
        if h.next_offset <= start_offset:
            continue
        plain, ppos, ph = plain_batch(buf, pos, h)
        with malformed_is_corrupt(h.base_offset):
            batch = _batch_columns(plain, ppos, ph, topic, partition)
        if h.base_offset < start_offset:
            skip = bisect.bisect_left(batch.offsets, start_offset)
            batch = batch.cut(skip, len(batch))
        if not out.offsets:
            out = batch
        else:
            out.extend(batch)
    return out


def _offsets(base: int, deltas: memoryview) -> list[int]:
    """A batch's absolute offsets. A producer's batch is dense (deltas 0..n-1, what the broker requires
    on produce): then a ``range`` makes the list, about 5 ns a record against about 35 for adding the
    base to each delta (docs/latency.md, "Session 15, SDK CPU per record"). The test compares the
    column's bytes with the dense ones, so a batch with gaps (compacted) takes the general way."""
    n = len(deltas)
    if deltas.tobytes() == dense_offset_deltas(n):
        return list(range(base, base + n))
    return list(map(base.__add__, deltas))


def _timestamps(base: int, deltas: memoryview) -> list[int]:
    """A batch's absolute timestamps: one repeated where every delta is 0 (a ``send_many`` call's
    records share their timestamp, and a batch filled within one millisecond too), else the base
    added to each delta."""
    raw = deltas.tobytes()
    if raw.count(0) == len(raw):
        return [base] * len(deltas)
    return list(map(base.__add__, deltas))


def _batch_columns(buf: bytes, pos: int, h: BatchHeader, topic: str, partition: int) -> RecordColumns:
    """Every record of one (plain) batch as columns: ``_batch_records``' columns, kept as lists."""
    c = columns(buf, pos, h)
    keys, values, values_end = _keys_and_values(buf, c)
    headers: list[Headers] | None = None
    if any(c.headers_lengths):
        headers = _headers(buf, c.headers_lengths, values_end)
    tag_table = read_tags(buf, pos, h)
    tags: list[str | None] | None = None
    if tag_table:
        tag_of: dict[int, str | None] = dict(enumerate(tag_table))
        tag_of[NO_TAG] = None
        tags = list(map(tag_of.__getitem__, c.tag_indexes))
        if not any(tags):
            tags = None
    return RecordColumns(
        topic,
        partition,
        _offsets(h.base_offset, c.offset_deltas),
        keys,
        values,
        None,  # made when first read: poll_columns' callers often never do
        tags,
        headers,
        [(h.base_timestamp, c.timestamp_deltas.tobytes())],
    )
