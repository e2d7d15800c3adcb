"""Producer-state snapshots: a partition's producer table at an offset, so recovery replays the log after it.

One file per snapshot, ``<offset %020d>.snapshot`` in the partition directory, where ``offset`` is the log end
offset the table reflects (every batch below it is in the table, none at or above it). Layout, little-endian::

    magic      4   b"SLPS"
    version    2   1
    crc        4   CRC32C of everything after this field
    offset     8
    count      4   entries
    entries        per entry: producer_id i64, epoch i16, batch count u8,
                   then per batch: first_sequence i32, last_sequence i32, first_offset i64,
                   last_offset i64, append_time_ms i64

Why a checksum: a snapshot is trusted instead of the log it summarises, so a flipped bit in it would silently
let a duplicate through or refuse a good batch. A snapshot that fails its checksum (or does not parse) is
reported and skipped: recovery falls back to an older one, or to the log start. Files are written whole to a
temporary name, fsync'ed, renamed and the directory fsync'ed, so a crash leaves the old set or the new one.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections import deque
from pathlib import Path

import crc32c as _crc32c

from sluice.broker.log.durable import replace_durably
from sluice.broker.log.producer_state import BATCHES_KEPT, BatchMeta, ProducerEntry

log = logging.getLogger(__name__)

SUFFIX = ".snapshot"
_MAGIC = b"SLPS"
_VERSION = 1
_PREFIX = struct.Struct("<4sHI")  # magic, version, crc
_BODY_HEAD = struct.Struct("<qI")  # offset, count
_ENTRY = struct.Struct("<qhB")
_BATCH = struct.Struct("<iiqqq")
#: Snapshots kept per partition: the newest for recovery, one older in case the newest is damaged.
KEEP = 2


class CorruptSnapshot(ValueError):
    """A snapshot file that fails its checksum or does not parse."""


def encode(offset: int, entries: list[ProducerEntry]) -> bytes:
    parts = [_BODY_HEAD.pack(offset, len(entries))]
    for entry in entries:
        parts.append(_ENTRY.pack(entry.producer_id, entry.epoch, len(entry.batches)))
        parts.extend(
            _BATCH.pack(b.first_sequence, b.last_sequence, b.first_offset, b.last_offset, b.append_time_ms)
            for b in entry.batches
        )
    body = b"".join(parts)
    return _PREFIX.pack(_MAGIC, _VERSION, _crc32c.crc32c(body)) + body


def decode(data: bytes) -> tuple[int, list[ProducerEntry]]:
    """The offset and entries of a snapshot; raises CorruptSnapshot."""
    try:
        magic, version, crc = _PREFIX.unpack_from(data, 0)
        if magic != _MAGIC or version != _VERSION:
            raise CorruptSnapshot(f"not a producer snapshot (magic {magic!r}, version {version})")
        body = memoryview(data)[_PREFIX.size :]
        if _crc32c.crc32c(body) != crc:
            raise CorruptSnapshot("producer snapshot checksum mismatch")
        offset, count = _BODY_HEAD.unpack_from(body, 0)
        pos = _BODY_HEAD.size
        entries: list[ProducerEntry] = []
        for _ in range(count):
            producer_id, epoch, nbatches = _ENTRY.unpack_from(body, pos)
            pos += _ENTRY.size
            if nbatches > BATCHES_KEPT:
                raise CorruptSnapshot(f"producer {producer_id}: {nbatches} batches (at most {BATCHES_KEPT})")
            batches: deque[BatchMeta] = deque(maxlen=BATCHES_KEPT)
            for _ in range(nbatches):
                batches.append(BatchMeta(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            entries.append(ProducerEntry(producer_id, epoch, batches))
        if pos != len(body):
            raise CorruptSnapshot(f"{len(body) - pos} trailing bytes after the last entry")
    except struct.error as exc:
        raise CorruptSnapshot(f"truncated producer snapshot: {exc}") from exc
    return offset, entries


def path_for(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SUFFIX}"


def offsets(directory: Path) -> list[int]:
    """Offsets of the snapshots in ``directory``, ascending (temporary files are not snapshots)."""
    found = []
    for path in directory.glob(f"*{SUFFIX}"):
        with contextlib.suppress(ValueError):
            found.append(int(path.name[: -len(SUFFIX)]))
    return sorted(found)


def write(directory: Path, offset: int, entries: list[ProducerEntry]) -> Path:
    """Write a snapshot durably, then keep only the newest :data:`KEEP`."""
    target = path_for(directory, offset)
    replace_durably(target, encode(offset, entries))
    for old in offsets(directory)[:-KEEP]:
        with contextlib.suppress(FileNotFoundError):
            path_for(directory, old).unlink()
    return target


def load_latest(directory: Path, at_most: int) -> tuple[int, list[ProducerEntry]] | None:
    """The newest readable snapshot at or below ``at_most``; a damaged one is logged, removed and skipped.

    Removing it matters: left in place it would be tried (and fail) at every open, and it could shadow a
    good snapshot written later at the same offset by a rename that then fails.
    """
    for offset in reversed(offsets(directory)):
        if offset > at_most:
            continue
        path = path_for(directory, offset)
        try:
            found_offset, entries = decode(path.read_bytes())
        except (OSError, CorruptSnapshot) as exc:
            log.warning("producer snapshot %s is unusable (%s): removed, using an older point", path, exc)
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if found_offset != offset:
            log.warning("producer snapshot %s names offset %d: removed", path, found_offset)
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        return offset, entries
    return None


def delete_above(directory: Path, offset: int) -> None:
    """Remove snapshots above ``offset`` (the log was truncated below them)."""
    for found in offsets(directory):
        if found > offset:
            with contextlib.suppress(FileNotFoundError):
                path_for(directory, found).unlink()
