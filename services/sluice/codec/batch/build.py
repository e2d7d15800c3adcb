"""Encoding: the producer's ``BatchBuilder`` lays a batch out once, column by column."""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from sluice.codec.batch.compression import NONE, compress
from sluice.codec.batch.layout import (
    COLUMN_BYTES,
    HEADER_SIZE,
    NO_KEY,
    NO_PRODUCER,
    NO_TAG,
    U16,
    Headers,
    assemble,
    dense_offset_deltas,
    encode_headers,
)
from sluice.codec.batch.summary import build_summary


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
        "_pairs",
        "_t0",
        "_tag_idx",
        "_tags",
        "_ts",
        "_value_lens",
        "_values",
        "codec",
        "size",
    )

    def __init__(self, codec: int = NONE) -> None:
        #: The compression codec id (``compression``); the records section is compressed in ``build``.
        self.codec = codec
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
        #: Every distinct (header name, value) pair, for the batch's header summary (``summary``).
        self._pairs: set[tuple[str, bytes]] = set()
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
            self._pairs.update(headers.items())
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

    def extend(
        self,
        values: list[bytes],
        keys: list[bytes | None] | None,
        value_lengths: list[int],
        key_lengths: list[int] | None,
        size: int,
        timestamp_ms: int,
        headers: list[bytes] | None = None,
        pairs: Iterable[tuple[str, bytes]] = (),
        tags: list[str | None] | None = None,
    ) -> int:
        """Add many records at once (``Producer.send_many``); returns the first one's index.

        The columns grow by list operations, with no Python step per record, except for headers and
        tags when given. ``key_lengths`` has ``NO_KEY`` for a record without a key (then ``keys``
        holds ``None`` there); ``keys`` None: no record has a key. ``headers``: each record's encoded
        headers (``b""`` for none), ``pairs`` their distinct (name, value) pairs for the summary.
        ``size``: the records' encoded size as ``append`` counts it, tags aside (counted here).
        """
        n = len(values)
        ts = self._ts
        index = len(ts)
        t0 = self._t0
        if t0 is None:
            t0 = self._t0 = timestamp_ms
        ts += [timestamp_ms - t0] * n
        if keys is None or key_lengths is None:
            self._key_lens += [NO_KEY] * n
        else:
            self._key_lens += key_lengths
            self._keys += [k for k in keys if k is not None] if NO_KEY in key_lengths else keys  # type: ignore[arg-type]
        self._values += values
        self._value_lens += value_lengths
        hl = self._headers_lens
        if headers is not None:
            if hl is None:
                hl = self._headers_lens = [0] * index
            hl += map(len, headers)
            self._headers += headers
            self._pairs.update(pairs)
        elif hl is not None:
            hl += [0] * n
        ti = self._tag_idx
        if tags is not None:
            if ti is None:
                ti = self._tag_idx = [NO_TAG] * index
            known = self._tags
            for tag in dict.fromkeys(tags):  # in order of first appearance, as append() numbers them
                if tag and tag not in known:
                    known[tag] = len(known)
                    size += 2 + len(tag.encode())
            ti += [NO_TAG if not t else known[t] for t in tags]
        elif ti is not None:
            ti += [NO_TAG] * n
        self.size += size
        return index

    def build(self, producer: tuple[int, int, int] = NO_PRODUCER) -> bytes:
        """Encode the batch unstamped (base_offset 0, append_time and leader epoch -1).

        ``producer`` is (producer_id, producer_epoch, base_sequence); all -1 (the default) for a
        producer without idempotence.
        """
        n = len(self._ts)
        if n == 0:
            raise ValueError("cannot build an empty batch")
        assert self._t0 is not None
        low = min(self._ts)
        base_ts = self._t0 + low
        tags = list(self._tags)
        # The header summary rides as a last, reserved tag-table entry no record points to.
        summary = build_summary(self._pairs) if self._pairs else None
        if summary is not None:
            tags.append(summary)
        tag_table = [U16.pack(len(tags))]
        for t in tags:
            raw = t.encode()
            tag_table += (U16.pack(len(raw)), raw)
        tag_bytes = b"".join(tag_table)
        ts_deltas = array("q", self._ts if low == 0 else [t - low for t in self._ts])
        headers_lens = (
            bytes(4 * n) if self._headers_lens is None else array("i", self._headers_lens).tobytes()
        )
        tag_idx = (array("H", [NO_TAG]) * n if self._tag_idx is None else array("H", self._tag_idx)).tobytes()
        # Keys, values and headers are joined column by column, and the batch once from those few
        # parts (assemble). One join over every key and value at once cost about 100 ns a record
        # here against about 10 for the two (docs/latency.md, "Session 15, SDK CPU per record"),
        # and the records section is no longer copied twice more (after the tag table, into the
        # batch) on its way.
        section = (
            dense_offset_deltas(n),
            ts_deltas.tobytes(),
            array("i", self._key_lens).tobytes(),
            array("i", self._value_lens).tobytes(),
            headers_lens,
            tag_idx,
            b"".join(self._keys),
            b"".join(self._values),
            b"".join(self._headers),
        )
        # The tag table (and the header summary in it) stays readable: the broker prunes by it.
        body = (tag_bytes, compress(self.codec, b"".join(section))) if self.codec else (tag_bytes, *section)
        return assemble(
            n,
            n - 1,
            base_ts,
            self._t0 + max(self._ts),
            len(tag_bytes),
            body,
            producer=producer,
            attributes=self.codec,
        )


def encode_records(
    records: Iterable[tuple[bytes, bytes | None, str | None, Headers | None, int]],
    producer: tuple[int, int, int] = NO_PRODUCER,
    codec: int = NONE,
) -> bytes:
    """Encode (value, key, tag, headers, timestamp_ms) tuples as one batch (tests, tools)."""
    b = BatchBuilder(codec)
    for value, key, tag, headers, ts in records:
        b.append(value, key, tag, headers, ts)
    return b.build(producer)
