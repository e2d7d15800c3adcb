"""Snapshots of a parking store's replay (docs/poison-keys.md, "The store's snapshot").

A push subscription's parking store (``<topic>.<subscription>.PARK``) is an event log: its state is the
replay of every event from the log start (``parkbook.ParkBook``). Without a snapshot a restart reads the
whole log, which grows with every parked message. A snapshot is the replayed state at a position of the
log (``covers``: the next offset of ``.PARK`` it includes), written to its own topic
``<topic>.<subscription>.PARKSNAP`` as records, the last one a trailer that counts them and carries
their SHA-256. A restart reads the last snapshot (the trailer is the topic's last record), verifies it,
and replays ``.PARK`` from ``covers`` only. Anything wrong with it (no trailer: a writer died mid-way;
a count or digest that does not match; ``covers`` beyond the log's end: the topic was re-created) and the
restart replays the whole log instead, as before snapshots existed.

Pure: building the records and reading them back. ``dispatcher/parkstore.py`` writes and reads the topic.

Records (header ``sluice-park-op``):

- ``park``: one per record still parked, in key then offset order, exactly as the log's ``park`` events
  (the original key, value, tag and headers, ``sluice-park-source``); the first of each key carries the
  head's count and due time and the key's age (``sluice-park-since-ms``).
- ``sources``: offsets ever parked of one source partition (``sluice-park-tp``), at or above a low bound
  the caller gives (the persisted cursor's mark-delete: a restart acknowledges on the cursor only the
  parked offsets above it), packed as little-endian int64.
- ``snapshot`` (last): ``sluice-snap-covers``, ``sluice-snap-count`` (records before it), ``sluice-snap-
  digest`` (SHA-256 of those records' fields, length-prefixed), and the DLQ mark if any.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence

from sluice.codec.batch import Record
from sluice.retry.levels import source_key
from sluice.retry.parkbook import (
    H_DLQ_MARK,
    H_OP,
    H_PCOUNT,
    H_PDUE,
    H_PSINCE,
    H_PSOURCE,
    ParkBook,
    parse_source,
)

__all__ = [
    "SnapshotError",
    "load_snapshot",
    "snapshot_records",
    "snapshot_topic",
    "trailer_count",
]

H_TP = "sluice-park-tp"
H_COVERS = "sluice-snap-covers"
H_COUNT = "sluice-snap-count"
H_DIGEST = "sluice-snap-digest"
#: Offsets per ``sources`` record (8 bytes each).
SOURCES_PER_RECORD = 65_536
SNAP_SUFFIX = "SNAP"


def snapshot_topic(park_topic: str) -> str:
    """``<topic>.<subscription>.PARK`` -> ``<topic>.<subscription>.PARKSNAP``."""
    return park_topic + SNAP_SUFFIX


class SnapshotError(ValueError):
    """A snapshot that cannot be used (the caller replays the whole log)."""


def _update(h: hashlib._Hash, r: Record) -> None:
    tag = r.tag.encode() if r.tag else b""
    for part in (r.key or b"", r.value, tag):
        h.update(struct.pack("<I", len(part)))
        h.update(part)
    for k, v in sorted((r.headers or {}).items()):
        kb = k.encode()
        h.update(struct.pack("<II", len(kb), len(v)))
        h.update(kb)
        h.update(v)


def snapshot_records(
    book: ParkBook, covers: int, lows: Mapping[tuple[str, int], int], wall_ms: int
) -> list[Record]:
    """``book`` (the replay of the log up to ``covers``) as snapshot records, trailer last. ``lows``:
    per source partition, the lowest parked offset a restart may still need (sources below are left
    out; a partition not in ``lows`` keeps all of its sources)."""
    out: list[Record] = []
    for (tp, key), pk in sorted(book.keys.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        # The count goes with the record it was counted for (the head), else with the first.
        counted = pk.count_at if any(r.offset == pk.count_at for r in pk.pending) else pk.pending[0].offset
        for i, r in enumerate(pk.pending):
            headers = {
                **(r.headers or {}),
                H_OP: b"park",
                H_PSOURCE: source_key(tp[0], tp[1], r.offset).encode(),
            }
            if i == 0:
                headers[H_PSINCE] = str(pk.since_ms).encode()
            if r.offset == counted:
                headers[H_PCOUNT] = str(pk.count).encode()
                headers[H_PDUE] = str(pk.due_ms).encode()
            out.append(Record("", 0, -1, key, r.value, r.tag, headers, r.timestamp))
    by_tp: dict[tuple[str, int], list[int]] = {}
    for src in book.sources:
        topic, partition, offset = parse_source(src)
        if offset >= lows.get((topic, partition), 0):
            by_tp.setdefault((topic, partition), []).append(offset)
    for (topic, partition), offsets in sorted(by_tp.items()):
        offsets.sort()
        name = f"{topic}/{partition}".encode()
        for i in range(0, len(offsets), SOURCES_PER_RECORD):
            chunk = offsets[i : i + SOURCES_PER_RECORD]
            value = struct.pack(f"<{len(chunk)}q", *chunk)
            out.append(Record("", 0, -1, b"", value, None, {H_OP: b"sources", H_TP: name}, wall_ms))
    h = hashlib.sha256()
    for r in out:
        _update(h, r)
    trailer = {
        H_OP: b"snapshot",
        H_COVERS: str(covers).encode(),
        H_COUNT: str(len(out)).encode(),
        H_DIGEST: h.hexdigest().encode(),
    }
    if book.dlq_mark is not None:
        trailer[H_DLQ_MARK] = str(book.dlq_mark).encode()
    out.append(Record("", 0, -1, b"", b"", None, trailer, wall_ms))
    return out


def trailer_count(trailer: Record) -> int:
    """How many records precede ``trailer`` in its snapshot (SnapshotError if it is not a trailer)."""
    headers = trailer.headers or {}
    if headers.get(H_OP) != b"snapshot":
        raise SnapshotError("the last record is not a snapshot trailer (a write that did not finish)")
    try:
        return int(headers[H_COUNT])
    except (KeyError, ValueError):
        raise SnapshotError("a trailer without a record count") from None


def load_snapshot(records: Sequence[Record]) -> tuple[ParkBook, int]:
    """The book and ``covers`` of a snapshot (its records, trailer last), verified: SnapshotError if
    anything does not match."""
    if not records:
        raise SnapshotError("no snapshot")
    *body, trailer = records
    headers = trailer.headers or {}
    if trailer_count(trailer) != len(body):
        raise SnapshotError(f"the trailer counts {trailer_count(trailer)} records, {len(body)} read")
    h = hashlib.sha256()
    for r in body:
        _update(h, r)
    if h.hexdigest().encode() != headers.get(H_DIGEST):
        raise SnapshotError("the snapshot's digest does not match its records")
    try:
        covers = int(headers[H_COVERS])
        mark = headers.get(H_DLQ_MARK)
        book = ParkBook()
        book.dlq_mark = int(mark) if mark is not None else None
        for r in body:
            op = (r.headers or {}).get(H_OP)
            if op == b"park":
                book.apply(r)
                since = (r.headers or {}).get(H_PSINCE)
                if since is not None:
                    st, sp, _ = parse_source(r.headers[H_PSOURCE])
                    assert r.key is not None
                    book.keys[((st, sp), r.key)].since_ms = int(since)
            elif op == b"sources":
                st, _, part = r.headers[H_TP].decode().rpartition("/")
                n = len(r.value) // 8
                for offset in struct.unpack(f"<{n}q", r.value[: n * 8]):
                    book.note((st, int(part)), offset)
            else:
                raise SnapshotError(f"an unknown record in a snapshot: {op!r}")
    except (KeyError, ValueError, struct.error) as exc:
        raise SnapshotError(f"a malformed snapshot: {exc}") from None
    return book, covers
