"""The two per-segment indexes: sparse offset -> file position, and max timestamp -> offset.

Both live in memory as flat ``array`` columns (a few bytes per entry, no Python object per
entry), so a broker with millions of records on disk keeps only kilobytes to a few megabytes
of index in RAM. The files are an append-only copy of the arrays: entries are written in
batches by ``persist()`` (on flush, roll and close), never per append, so the produce path
stays one ``os.write``. Index files are derived data: recovery checks them against the log
and rebuilds them when they disagree, which is why ``flush()`` does not fsync them.

File formats (little-endian, fixed-size entries, no header):

- ``<base>.index``: ``u32 relative_offset, u32 position`` per entry, both strictly
  increasing. An entry is added for a batch once ``index_interval_bytes`` of log have been
  written since the previous entry; position 0 (the segment start) is implicit.
- ``<base>.timeindex``: ``i64 max_timestamp, u32 relative_offset`` per entry, both strictly
  increasing. An entry says "every batch up to and including the one at this relative offset
  has record timestamps <= max_timestamp". Entries are added at the same batches as offset
  entries (only when the running maximum grew) and once more when the segment is sealed.
"""

from __future__ import annotations

import contextlib
import operator
import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from itertools import islice
from pathlib import Path

from sluice.broker.log import fileops
from sluice.broker.log.handles import storage_error

OFFSET_ENTRY_BYTES = 8
TIME_ENTRY_BYTES = 12
_TIME_ENTRY = struct.Struct("<qI")


def _strictly_increasing(values: array[int]) -> bool:
    # map/operator keep the loop in C: ~10 ns per entry.
    return all(map(operator.lt, values, islice(values, 1, None)))


class _IndexFile:
    """The append-only file behind an index: tracks how many entries are on disk.

    Holds no descriptor between writes: entries are written in batches (on flush, roll and
    close), so opening per batch costs one ``open``/``close`` per flush interval at most, and
    a broker's descriptors stay one per partition (docs/storage.md, "Descriptor budget").
    """

    __slots__ = ("path", "persisted")

    def __init__(self, path: Path) -> None:
        self.path = path
        #: Entries already written to the file; the arrays may hold more.
        self.persisted = 0

    def read_all(self) -> bytes | None:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _open(self, flags: int) -> int:
        try:
            return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | flags, 0o644)
        except OSError as exc:
            raise storage_error(f"opening the index {self.path}", exc) from exc

    def write(self, data: bytes, entry_bytes: int) -> None:
        """Append whole entries after the ``persisted`` ones. A failed write (ENOSPC) is cut back to
        them, so a retry never leaves a torn or doubled entry (if the cut fails too, the file no
        longer parses and the next open rebuilds it: indexes are derived data)."""
        if not data:
            return
        fd = self._open(os.O_APPEND)
        try:
            fileops.write_all(fd, data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                fileops.ftruncate(fd, self.persisted * entry_bytes)
            raise storage_error(f"writing the index {self.path}", exc) from exc
        finally:
            os.close(fd)

    def truncate(self, entries: int, entry_bytes: int) -> None:
        """Cut the file to ``entries`` entries (creating it if missing)."""
        fd = self._open(0)
        try:
            os.ftruncate(fd, entries * entry_bytes)
        except OSError as exc:
            raise storage_error(f"truncating the index {self.path}", exc) from exc
        finally:
            os.close(fd)
        self.persisted = entries


class OffsetIndex:
    """Sparse relative offset -> file position, as two parallel u32 arrays."""

    __slots__ = ("_file", "positions", "rel_offsets")

    def __init__(self, path: Path) -> None:
        self._file = _IndexFile(path)
        self.rel_offsets = array("I")
        self.positions = array("I")

    def __len__(self) -> int:
        return len(self.rel_offsets)

    def load(self, log_size: int) -> bool:
        """Read the file; False (and an empty index) if it is missing or structurally wrong."""
        raw = self._file.read_all()
        if raw is None or len(raw) % OFFSET_ENTRY_BYTES:
            return False
        flat = array("I")
        flat.frombytes(raw)
        rel, pos = flat[0::2], flat[1::2]
        if len(pos) and (pos[0] == 0 or not _strictly_increasing(rel) or not _strictly_increasing(pos)):
            return False
        self.rel_offsets, self.positions = rel, pos
        self._file.persisted = len(rel)
        # Entries past the end of the log (the log lost a tail the index kept) are dropped;
        # the caller spot-checks the last remaining one.
        self.drop_positions_from(log_size)
        return True

    def append(self, rel_offset: int, position: int) -> None:
        self.rel_offsets.append(rel_offset)
        self.positions.append(position)

    def last_position(self) -> int:
        """Position of the last indexed batch; 0 (the implicit entry) when empty."""
        return self.positions[-1] if self.positions else 0

    def lookup(self, rel_offset: int) -> tuple[int, int]:
        """The last entry at or below ``rel_offset`` as (rel_offset, position); (0, 0) if none."""
        i = bisect_right(self.rel_offsets, rel_offset) - 1
        if i < 0:
            return 0, 0
        return self.rel_offsets[i], self.positions[i]

    def truncate_entries(self, count: int) -> None:
        """Keep the first ``count`` entries, in memory and on disk."""
        del self.rel_offsets[count:]
        del self.positions[count:]
        if self._file.persisted > count:
            self._file.truncate(count, OFFSET_ENTRY_BYTES)

    def drop_positions_from(self, position: int) -> None:
        """Drop every entry pointing at or past ``position`` (the log was cut there)."""
        self.truncate_entries(bisect_left(self.positions, position))

    def reset(self) -> None:
        """Forget every entry and empty the file (before a rebuild)."""
        del self.rel_offsets[:]
        del self.positions[:]
        self._file.truncate(0, OFFSET_ENTRY_BYTES)

    def persist(self) -> None:
        """Append the entries not yet on disk to the file (one write)."""
        start, end = self._file.persisted, len(self.rel_offsets)
        if start >= end:
            return
        flat = array("I", bytes(8 * (end - start)))
        flat[0::2] = self.rel_offsets[start:end]
        flat[1::2] = self.positions[start:end]
        self._file.write(flat.tobytes(), OFFSET_ENTRY_BYTES)
        self._file.persisted = end

    def memory_bytes(self) -> int:
        return self.rel_offsets.buffer_info()[1] * 4 + self.positions.buffer_info()[1] * 4


class TimeIndex:
    """Running max timestamp -> relative offset, as an i64 and a u32 array."""

    __slots__ = ("_file", "rel_offsets", "timestamps")

    def __init__(self, path: Path) -> None:
        self._file = _IndexFile(path)
        self.timestamps = array("q")
        self.rel_offsets = array("I")

    def __len__(self) -> int:
        return len(self.timestamps)

    def load(self, max_rel_offset: int) -> bool:
        """Read the file; False (and an empty index) if missing or structurally wrong.

        ``max_rel_offset``: the largest relative offset the segment can hold, or -1 if
        unknown (the active segment before recovery).
        """
        raw = self._file.read_all()
        if raw is None or len(raw) % TIME_ENTRY_BYTES:
            return False
        n = len(raw) // TIME_ENTRY_BYTES
        flat = struct.unpack(f"<{'qI' * n}", raw) if n else ()
        ts, rel = array("q", flat[0::2]), array("I", flat[1::2])
        if n and (
            not _strictly_increasing(ts)
            or not _strictly_increasing(rel)
            or (max_rel_offset >= 0 and rel[-1] > max_rel_offset)
        ):
            return False
        self.timestamps, self.rel_offsets = ts, rel
        self._file.persisted = n
        return True

    def max_timestamp(self) -> int | None:
        return self.timestamps[-1] if self.timestamps else None

    def maybe_append(self, max_timestamp: int, rel_offset: int) -> None:
        """Add an entry if the running maximum grew since the last one."""
        if not self.timestamps or (max_timestamp > self.timestamps[-1] and rel_offset > self.rel_offsets[-1]):
            self.timestamps.append(max_timestamp)
            self.rel_offsets.append(rel_offset)

    def floor_below(self, timestamp: int) -> int:
        """Relative offset of the last batch known to hold only timestamps < ``timestamp``
        (scan may start there); 0 when no entry qualifies."""
        i = bisect_left(self.timestamps, timestamp) - 1
        return self.rel_offsets[i] if i >= 0 else 0

    def truncate_after_rel(self, rel_offset: int) -> None:
        """Drop entries about batches after ``rel_offset`` (their log may be gone)."""
        count = bisect_right(self.rel_offsets, rel_offset)
        del self.timestamps[count:]
        del self.rel_offsets[count:]
        if self._file.persisted > count:
            self._file.truncate(count, TIME_ENTRY_BYTES)

    def reset(self) -> None:
        del self.timestamps[:]
        del self.rel_offsets[:]
        self._file.truncate(0, TIME_ENTRY_BYTES)

    def persist(self) -> None:
        start, end = self._file.persisted, len(self.timestamps)
        if start >= end:
            return
        data = b"".join(
            _TIME_ENTRY.pack(t, r)
            for t, r in zip(self.timestamps[start:end], self.rel_offsets[start:end], strict=True)
        )
        self._file.write(data, TIME_ENTRY_BYTES)
        self._file.persisted = end

    def memory_bytes(self) -> int:
        return self.timestamps.buffer_info()[1] * 8 + self.rel_offsets.buffer_info()[1] * 4
