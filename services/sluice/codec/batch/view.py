"""Cutting batches: the broker's tag filter and the dispatcher's per-consumer cuts (``BatchView``)."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Sequence

from sluice.codec.batch.compression import plain_batch
from sluice.codec.batch.layout import (
    CRC_START,
    HEADER_SIZE,
    NO_TAG,
    U16,
    BatchHeader,
    Headers,
    assemble,
    columns,
    crc32c,
    decode_headers,
    iter_headers,
    malformed_is_corrupt,
    read_header,
    read_tags,
)
from sluice.codec.batch.records import Record
from sluice.codec.batch.summary import is_summary
from sluice.errors import CorruptBatch


def filter_batch(buf: bytes, pos: int, h: BatchHeader, keep_tags: frozenset[str]) -> bytes | None:
    """Rebuild the batch at ``pos`` keeping only records whose tag is in ``keep_tags``.

    Returns None when no record matches. The result keeps the original base
    offset, offsets and last_offset_delta, so the consumer's position still
    moves past every filtered-out record, and the leader epoch and producer fields
    (the CRC is new: the filtered batch is a different batch). A malformed batch: CorruptBatch.
    """
    with malformed_is_corrupt(h.base_offset):
        return _filter_batch(buf, pos, h, keep_tags)


def _filter_batch(buf: bytes, pos: int, h: BatchHeader, keep_tags: frozenset[str]) -> bytes | None:
    tags = read_tags(buf, pos, h)
    keep_idx = {i for i, t in enumerate(tags) if t in keep_tags}
    if not keep_idx:
        return None
    # The header summary entry (``summary``) is no record's tag: a batch whose every record is kept
    # is still passed through byte for byte.
    record_tags = len(tags) - sum(map(is_summary, tags))
    if len(keep_idx) == record_tags and NO_TAG not in columns(buf, pos, h).tag_indexes:
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
    table = [U16.pack(len(new_tags))]
    for t in new_tags:
        raw = t.encode()
        table += (U16.pack(len(raw)), raw)
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
    return assemble(
        len(sel_od),
        h.last_offset_delta,
        h.base_timestamp,
        h.max_timestamp,
        len(tag_bytes),
        body,
        base_offset=h.base_offset,
        append_time_ms=h.append_time_ms,
        leader_epoch=h.partition_leader_epoch,
        producer=(h.producer_id, h.producer_epoch, h.base_sequence),
    )


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
        self.offsets: list[int] = list(map(base.__add__, self.cols.offset_deltas.tolist()))  # C-level
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
        return assemble(
            sum(j - i for i, j in runs),
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
        if h.attributes:  # the dispatcher inflates: its cuts and the push SDK read plain batches
            plain, _, ph = plain_batch(buf, pos, h)
            with malformed_is_corrupt(h.base_offset):
                out.append(BatchView(plain, 0, ph))
            continue
        with malformed_is_corrupt(h.base_offset):
            out.append(BatchView(buf[pos : pos + h.length], 0, h))
    return out
