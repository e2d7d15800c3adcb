"""A pending record as the scheduler keeps it: its envelope read, and its on-disk frame.

A bucket file is a run of frames ``length:u32 crc32:u32 body``; a torn tail (a crash mid-write) fails
its length or CRC and ends the valid part, which is all the loader keeps.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from sluice.client.producer.delay import (
    DUE_HEADER,
    SCHEDULE_HEADER,
    TARGET_HEADER,
    TARGET_PARTITION_HEADER,
)
from sluice.codec.batch import Record

__all__ = ["Entry", "count_frames", "decode_frames", "encode_frame", "entry_of"]

_FRAME = struct.Struct("<II")
_BODY = struct.Struct("<qiqiqHiIHH")
_HEADER = struct.Struct("<HI")
_NO_TAG = 0xFFFF


class Entry(NamedTuple):
    """One pending record. Ordered by (due, schedule partition, schedule offset): the delivery order,
    so records due at the same time go out in the order they were stored."""

    due: int
    sp: int
    so: int
    topic: str
    tp: int
    key: bytes | None
    value: bytes
    tag: str | None
    #: The headers it is delivered with: the sender's, ``sluice-deliver-at`` and ``sluice-schedule``.
    headers: dict[str, bytes]
    timestamp: int


def entry_of(record: Record) -> Entry | None:
    """The pending record a schedule-topic record carries, or None for one without a valid envelope
    (not written by the SDK's delayed send: skipped and logged by the caller)."""
    headers = dict(record.headers) if record.headers else {}
    try:
        due = int(headers[DUE_HEADER])
        topic = headers.pop(TARGET_HEADER).decode()
        tp = int(headers.pop(TARGET_PARTITION_HEADER))
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
    if tp < 0 or not topic:
        return None
    # Its coordinates header now, where the record is read (and in _decode_body, where it is loaded), so
    # the delivered headers are built before the record is due, none on the due path. The frame does not
    # store it (the coordinates are there already).
    headers[SCHEDULE_HEADER] = b"%d:%d" % (record.partition, record.offset)
    return Entry(
        due,
        record.partition,
        record.offset,
        topic,
        tp,
        record.key,
        record.value,
        record.tag,
        headers,
        record.timestamp,
    )


def encode_frame(e: Entry) -> bytes:
    topic = e.topic.encode()
    tag = e.tag.encode() if e.tag is not None else b""
    headers = [(n, v) for n, v in e.headers.items() if n != SCHEDULE_HEADER]
    parts = [
        _BODY.pack(
            e.due,
            e.sp,
            e.so,
            e.tp,
            e.timestamp,
            len(topic),
            -1 if e.key is None else len(e.key),
            len(e.value),
            _NO_TAG if e.tag is None else len(tag),
            len(headers),
        ),
        topic,
        e.key or b"",
        e.value,
        tag,
    ]
    for name, value in headers:
        raw = name.encode()
        parts += (_HEADER.pack(len(raw), len(value)), raw, value)
    body = b"".join(parts)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def decode_frames(data: bytes, pause: Callable[[], None] | None = None) -> tuple[list[Entry], int]:
    """The entries of a bucket file's bytes and the length of its valid part (a torn tail excluded).
    ``pause`` is called every 1,000 entries (the scheduler yields the GIL there: a bucket being read in
    must not hold up the delivery thread for the whole decode)."""
    out: list[Entry] = []
    pos = 0
    for entry, end in _frames(data):
        out.append(entry)
        pos = end
        if pause is not None and len(out) % 1000 == 0:
            pause()
    return out, pos


def count_frames(path: Path) -> int:
    """How many whole frames a bucket file holds, by their length prefixes (no CRC check, no decode)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    count, pos, size = 0, 0, len(data)
    while pos + _FRAME.size <= size:
        length = _FRAME.unpack_from(data, pos)[0]
        pos += _FRAME.size + length
        if pos > size:
            break
        count += 1
    return count


def _frames(data: bytes) -> Iterator[tuple[Entry, int]]:
    pos, size = 0, len(data)
    while pos + _FRAME.size <= size:
        length, crc = _FRAME.unpack_from(data, pos)
        start, end = pos + _FRAME.size, pos + _FRAME.size + length
        if end > size or zlib.crc32(data[start:end]) != crc:
            return
        yield _decode_body(data, start), end
        pos = end


def _decode_body(data: bytes, pos: int) -> Entry:
    due, sp, so, tp, ts, tlen, klen, vlen, glen, nh = _BODY.unpack_from(data, pos)
    pos += _BODY.size
    topic = data[pos : pos + tlen].decode()
    pos += tlen
    key = None
    if klen >= 0:
        key = data[pos : pos + klen]
        pos += klen
    value = data[pos : pos + vlen]
    pos += vlen
    tag = None
    if glen != _NO_TAG:
        tag = data[pos : pos + glen].decode()
        pos += glen
    headers: dict[str, bytes] = {}
    for _ in range(nh):
        nlen, hlen = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size
        name = data[pos : pos + nlen].decode()
        pos += nlen
        headers[name] = data[pos : pos + hlen]
        pos += hlen
    headers[SCHEDULE_HEADER] = b"%d:%d" % (sp, so)
    return Entry(due, sp, so, topic, tp, key, value, tag, headers, ts)
