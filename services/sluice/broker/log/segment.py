"""One log segment: ``<base>.log`` plus its offset and time indexes.

A segment holds whole stamped batches back to back, exactly as producers encoded them.
All reads are ``os.pread``, so concurrent positions never interfere; all writes go through
the active segment's ``O_APPEND`` descriptor, the only descriptor a segment keeps; a sealed one is
read through the broker's ``ReadHandles`` LRU (docs/storage.md, "Descriptor budget").

Caller: ``PartitionLog`` only. Not thread-safe on its own; ``PartitionLog`` serialises.
"""

from __future__ import annotations

import collections
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from sluice.broker.log import fileops
from sluice.broker.log.config import MAX_SEGMENT_BYTES
from sluice.broker.log.handles import ReadHandles, storage_error
from sluice.broker.log.index import OffsetIndex, TimeIndex
from sluice.broker.log.walk import first_at_or_after, walk_batches
from sluice.codec.batch import (
    APPEND_TIME_AT,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_AT,
    BatchHeader,
    validate_batch,
)
from sluice.errors import SluiceError, StorageError, StorageFull

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
#: "No timestamp yet": below any real record timestamp.
NO_TIMESTAMP = -(2**63)

# Just the header fields a read needs: base_offset, batch_length (at 0) and
# last_offset_delta. Two tiny unpacks beat building a BatchHeader per batch.
_BASE_AND_LENGTH = struct.Struct("<qi")
_LAST_DELTA = struct.Struct("<i")
_LAST_DELTA_AT = LAST_OFFSET_DELTA_AT
_APPEND_TIME = struct.Struct("<q")
_APPEND_TIME_AT = APPEND_TIME_AT


def segment_stem(base_offset: int) -> str:
    return f"{base_offset:020d}"


class Segment:
    """A segment file and its indexes, with the running state appends need."""

    __slots__ = (
        "base_offset",
        "corrupt",
        "fd",
        "first_append_ms",
        "handles",
        "index",
        "last_batch_offset",
        "log_path",
        "max_timestamp",
        "next_offset",
        "size",
        "time_index",
        "torn",
    )

    def __init__(self, directory: Path, base_offset: int, fd: int, size: int, handles: ReadHandles) -> None:
        stem = segment_stem(base_offset)
        self.base_offset = base_offset
        self.log_path = directory / (stem + LOG_SUFFIX)
        #: The segment's own read-write descriptor while it is active (or being loaded);
        #: -1 once sealed: reads then borrow one from ``handles``.
        self.fd = fd
        self.handles = handles
        #: Bytes of whole, valid batches: reads never go past it.
        self.size = size
        self.torn = False  # a failed append left bytes past ``size`` not cut off yet (``write``)
        #: Offset the next batch appended here would get.
        self.next_offset = base_offset
        #: Base offset of the last batch (for the final time-index entry at seal).
        self.last_batch_offset = base_offset
        #: Largest record timestamp in the segment (NO_TIMESTAMP when empty).
        self.max_timestamp = NO_TIMESTAMP
        #: Append time of the first batch: the segment's age for segment_ms rolls.
        self.first_append_ms: int | None = None
        #: (base offset, next offset) of batches kept although they failed validation: bit rot
        #: inside intact framing, found by a full verification (docs/replication.md, "Recovery").
        self.corrupt: list[tuple[int, int]] = []
        self.index = OffsetIndex(directory / (stem + INDEX_SUFFIX))
        self.time_index = TimeIndex(directory / (stem + TIME_INDEX_SUFFIX))

    # ---- opening --------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, handles: ReadHandles) -> Segment:
        """A new, empty active segment (stale index files of the same name are emptied).

        All or nothing: if any of the three files cannot be made (EMFILE, ENOSPC, EACCES),
        none is left behind and the error is a StorageError.
        """
        path = directory / (segment_stem(base_offset) + LOG_SUFFIX)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise storage_error(f"creating segment {path}", exc) from exc
        seg = cls(directory, base_offset, fd, 0, handles)
        try:
            seg.index.reset()
            seg.time_index.reset()
        except StorageError:
            seg.delete()
            raise
        return seg

    @classmethod
    def open(cls, directory: Path, base_offset: int, handles: ReadHandles) -> Segment:
        """Open an existing segment file; call ``load_sealed`` or ``recover`` next."""
        path = directory / (segment_stem(base_offset) + LOG_SUFFIX)
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            raise storage_error(f"opening segment {path}", exc) from exc
        return cls(directory, base_offset, fd, os.fstat(fd).st_size, handles)

    def release_fd(self) -> int:
        """Hand over the segment's own descriptor (it is sealed: reads go through ``handles``), for the
        caller to fsync and close; -1 if it had none."""
        fd, self.fd = self.fd, -1
        return fd

    def _indexed_max_timestamp(self) -> int:
        ts = self.time_index.max_timestamp()
        return NO_TIMESTAMP if ts is None else ts

    def _index_points_at_batch(self) -> bool:
        """Spot check: the last offset-index entry names a batch header with that offset."""
        if not len(self.index):
            return True
        rel, pos = self.index.rel_offsets[-1], self.index.positions[-1]
        raw = os.pread(self.fd, _BASE_AND_LENGTH.size, pos)
        if len(raw) < _BASE_AND_LENGTH.size:
            return False
        base, _ = _BASE_AND_LENGTH.unpack(raw)
        return bool(base == self.base_offset + rel)

    def load_sealed(self, expected_next_offset: int, interval: int, verify_all: bool = False) -> bool:
        """Load a closed segment's indexes, rebuilding them if they disagree with the log.

        Checks that the log's tail (from the last index entry on, CRC included) ends
        exactly at the end of the file with ``expected_next_offset`` (the next segment's
        base). False means the segment itself is torn: the caller recovers it as the
        active segment and drops everything after it. ``verify_all`` (after an unclean
        shutdown) validates every batch, CRC included, and rebuilds the indexes on the way.
        """
        if verify_all:
            self._reset_indexes()
            end, next_offset = self._scan(
                0, self.base_offset, True, interval, keep_corrupt=True, whole_at=expected_next_offset
            )
            return self._sealed_at(end, next_offset, expected_next_offset)
        index_ok = self.index.load(self.size) and self._index_points_at_batch()
        time_ok = self.time_index.load(expected_next_offset - self.base_offset - 1)
        if index_ok and time_ok:
            rel, pos = self.index.lookup(2**32)
            self.max_timestamp = self._indexed_max_timestamp()
            end, next_offset = self._scan(pos, self.base_offset + rel, validate=True, interval=interval)
        else:
            log.warning("rebuilding the indexes of segment %s", self.log_path)
            self._reset_indexes()
            end, next_offset = self._scan(0, self.base_offset, validate=False, interval=interval)
        return self._sealed_at(end, next_offset, expected_next_offset)

    def _reset_indexes(self) -> None:
        self.index.reset()
        self.time_index.reset()
        self.max_timestamp = NO_TIMESTAMP

    def _sealed_at(self, end: int, next_offset: int, expected_next_offset: int) -> bool:
        if end != self.size or next_offset != expected_next_offset:
            log.warning(
                "segment %s is torn: valid data ends at byte %d of %d, offset %d (expected %d)",
                self.log_path,
                end,
                self.size,
                next_offset,
                expected_next_offset,
            )
            return False
        self.next_offset = next_offset
        self.seal()
        return True

    def recover(self, interval: int, verify_all: bool = False) -> int:
        """Crash recovery of the active segment; returns the bytes truncated.

        Trusts the offset index up to its last entry that still names a batch inside the
        file, then validates every batch from there (framing, density, CRC) and cuts the
        file at the first one that fails: a torn write from a crash, or garbage. With
        ``verify_all`` (after an unclean shutdown) every batch from the start is validated:
        one failing inside intact framing with valid batches after it is kept and reported
        (``corrupt``), failing ones at the end are cut as a torn tail.
        """
        if verify_all:
            self.index.reset()
            self.time_index.reset()
        elif self.index.load(self.size):
            if not self._index_points_at_batch():
                self.index.reset()
        else:
            self.index.reset()
        start_rel, start_pos = self.index.lookup(2**32)
        if self.time_index.load(-1):
            self.time_index.truncate_after_rel(start_rel if start_pos else -1)  # rel 0 is rescanned too
        elif len(self.index):
            # Without the time entries up to the restart point, the running maximum
            # timestamp is unknown: rebuild both from the segment start.
            self.index.reset()
            self.time_index.reset()
            start_rel, start_pos = 0, 0
        else:
            self.time_index.reset()
        self.max_timestamp = self._indexed_max_timestamp()
        end, self.next_offset = self._scan(
            start_pos, self.base_offset + start_rel, True, interval, keep_corrupt=verify_all
        )
        cut = self.size - end
        if cut:
            log.warning("truncating %d bytes of torn or corrupt data at the end of %s", cut, self.log_path)
            os.ftruncate(self.fd, end)
            self.size = end
            self.index.drop_positions_from(end)
        if self.size:
            raw = os.pread(self.fd, _APPEND_TIME.size, _APPEND_TIME_AT)
            (self.first_append_ms,) = _APPEND_TIME.unpack(raw)
        self.persist_indexes()
        return cut

    def reactivate(self) -> None:
        """A sealed segment becomes the active one again (the log was truncated into it)."""
        if self.fd >= 0:
            return
        self.handles.forget(str(self.log_path))
        try:
            self.fd = os.open(self.log_path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            raise storage_error(f"reopening segment {self.log_path}", exc) from exc

    def truncate_to(self, offset: int, interval: int) -> None:
        """Cut the (active) segment before the first batch holding an offset >= ``offset``, fsync
        it, and recompute its indexes and running state from what is left."""
        cut = self.size
        for pos, header, _buf, _off in walk_batches(self.fd, self.position_for(offset), self.size, False):
            if header.next_offset > offset:
                cut = pos
                break
        self.persist_indexes()
        try:
            os.ftruncate(self.fd, cut)
            os.fsync(self.fd)
        except OSError as exc:
            raise storage_error(f"truncating {self.log_path}", exc) from exc
        self.size = cut
        self.first_append_ms = None
        self.last_batch_offset = self.base_offset
        # recover() reloads the indexes (dropping entries past the cut) and rescans from the
        # last one that is left: at most one index interval.
        self.recover(interval)

    def batch_epochs(self, start: int = 0) -> Iterator[tuple[int, int]]:
        """``(base_offset, leader_epoch)`` of every batch from position ``start`` (headers only)."""
        return ((h.base_offset, h.partition_leader_epoch) for h in self.batch_headers(start))

    def batch_headers(self, start: int = 0) -> Iterator[BatchHeader]:
        """The header of every batch from position ``start`` (no record is read)."""
        fd = self.fd if self.fd >= 0 else self.handles.acquire(str(self.log_path))
        try:
            for _pos, header, _buf, _off in walk_batches(fd, start, self.size, need_body=False):
                yield header
        finally:
            if fd != self.fd:
                self.handles.release(str(self.log_path))

    def last_batch_epoch(self) -> int:
        """The leader epoch of the segment's last batch; -1 if it has none."""
        tail = collections.deque(self.batch_epochs(self.position_for(self.last_batch_offset)), maxlen=1)
        return tail[0][1] if tail else -1

    def _scan(
        self,
        start: int,
        expected_offset: int,
        validate: bool,
        interval: int,
        keep_corrupt: bool = False,
        whole_at: int | None = None,
    ) -> tuple[int, int]:
        """Walk batches from ``start``, indexing them; stop at the first bad one.

        Returns (end position of the last good batch, next offset after it). A batch is
        bad if its framing is broken, its base offset breaks density, or (``validate``)
        it fails ``validate_batch``. With ``keep_corrupt`` a batch that fails validation
        but whose framing holds is passed over: if good batches follow, it is bit rot
        inside the data (kept, listed in ``corrupt``); if none do, it is a torn tail, unless
        the walk ends exactly at the end of the file with offset ``whole_at`` (a sealed
        segment followed by the segment of that base: its last batch is rot, not a tear).
        """
        end = start
        pending: list[tuple[int, int, int]] = []  # (position, base, next) since the last good batch
        for pos, header, buf, off in walk_batches(self.fd, start, self.size, need_body=validate):
            if header.base_offset != expected_offset:
                break
            if validate:
                try:
                    validate_batch(buf, off, MAX_SEGMENT_BYTES)
                except SluiceError as exc:
                    if not keep_corrupt:
                        break
                    log.error("%s: batch at offset %d is corrupt: %s", self.log_path, expected_offset, exc)
                    pending.append((pos, header.base_offset, header.next_offset))
                    expected_offset = header.next_offset
                    continue
            self.corrupt += [(base, nxt) for _, base, nxt in pending]
            pending = []
            self.note_batch(pos, header.base_offset, header.max_timestamp, interval)
            expected_offset = header.next_offset
            end = pos + header.length
        if pending:
            last_pos, _, last_next = pending[-1]
            tail_end = last_pos + int.from_bytes(os.pread(self.fd, 4, last_pos + 8), "little")
            if whole_at is not None and last_next == whole_at and tail_end == self.size:
                self.corrupt += [(base, nxt) for _, base, nxt in pending]
                return self.size, whole_at
            # Nothing valid after them: a torn or corrupt tail, cut with the rest.
            end, expected_offset = pending[0][0], pending[0][1]
        return end, expected_offset

    # ---- appending ------------------------------------------------------------------

    def write(self, data: bytearray | bytes) -> None:
        """Append bytes with one write (looping only on a short write); all or nothing: a failure
        (ENOSPC after a short write, EIO) is cut back to ``size``. If the cut fails too, appends are
        refused until a cut succeeds (O_APPEND would land after the stray bytes); a reopen cuts them
        anyway (``recover`` validates the active tail)."""
        if self.torn and not self._cut_tail():
            raise StorageError(f"{self.log_path} holds a failed append that cannot be cut off yet")
        try:
            fileops.write_all(self.fd, data)
        except OSError as exc:
            self._cut_tail()  # leave no partial batch behind: its offsets were not handed out
            kind: type[SluiceError] = StorageFull if fileops.is_no_space(exc) else StorageError
            raise kind(f"append to {self.log_path} failed: {exc}") from exc

    def _cut_tail(self) -> bool:
        """Cut the file back to ``size`` (the end of the last whole batch); False if that failed."""
        try:
            fileops.ftruncate(self.fd, self.size)
        except OSError:
            log.exception("could not cut a failed append off %s", self.log_path)
            self.torn = True
            return False
        self.torn = False
        return True

    def note_batch(self, position: int, base_offset: int, max_timestamp: int, interval: int) -> None:
        """Account for a batch now in the file at ``position`` (index entries, max timestamp)."""
        self.max_timestamp = max(self.max_timestamp, max_timestamp)
        self.last_batch_offset = base_offset
        if position - self.index.last_position() >= interval:
            rel = base_offset - self.base_offset
            self.index.append(rel, position)
            self.time_index.maybe_append(self.max_timestamp, rel)

    def persist_indexes(self) -> None:
        """Write pending index entries: time index first, so an offset entry on disk
        implies the time entries up to it are there too (recovery relies on it)."""
        self.time_index.persist()
        self.index.persist()

    def seal(self) -> None:
        """The segment takes no more appends: record its final max timestamp."""
        if self.size:
            self.time_index.maybe_append(self.max_timestamp, self.last_batch_offset - self.base_offset)
        self.persist_indexes()

    # ---- reading --------------------------------------------------------------------

    def position_for(self, offset: int) -> int:
        """A file position at or before the batch holding ``offset`` (sparse index floor)."""
        return self.index.lookup(offset - self.base_offset)[1]

    def read(
        self, start: int, offset: int, max_bytes: int, min_one: bool, slack: int
    ) -> tuple[bytes, int, int, bool]:
        """Whole batches from the one holding ``offset``, walking from position ``start``.

        Returns (data, base offset of the first batch, next offset, reached segment end).
        Usually one pread of ``slack + max_bytes`` bytes both finds the batch and holds
        the answer; a second pread happens only when the answer did not fit in it.
        """
        if self.fd >= 0:  # the active segment: the hot path, no LRU
            return self._read(self.fd, start, offset, max_bytes, min_one, slack)
        path = str(self.log_path)
        fd = self.handles.acquire(path)
        try:
            return self._read(fd, start, offset, max_bytes, min_one, slack)
        finally:
            self.handles.release(path)

    def _read(
        self, fd: int, start: int, offset: int, max_bytes: int, min_one: bool, slack: int
    ) -> tuple[bytes, int, int, bool]:
        size = self.size
        buf = os.pread(fd, min(size - start, slack + max(max_bytes, 0)), start)
        buf_start, off = start, 0
        # 1. Find the batch that holds `offset` (header fields only).
        while True:
            if off + HEADER_SIZE > len(buf):
                if buf_start + off >= size:  # offset is past this segment's data
                    return b"", offset, offset, True
                buf_start += off
                buf = os.pread(fd, min(size - buf_start, slack + max(max_bytes, 0)), buf_start)
                off = 0
                continue
            base, length = _BASE_AND_LENGTH.unpack_from(buf, off)
            if length < HEADER_SIZE:
                raise StorageError(f"{self.log_path} is corrupt at byte {buf_start + off}")
            (last_delta,) = _LAST_DELTA.unpack_from(buf, off + _LAST_DELTA_AT)
            if base + last_delta >= offset:
                break
            off += length
        first_pos, first_base = buf_start + off, base
        # 2. How many bytes of whole batches to return.
        if length > max_bytes:
            if not min_one:
                return b"", first_base, offset, False
            want = length
        else:
            want = max_bytes
        avail = min(size - first_pos, want)
        if off + avail > len(buf):
            buf = os.pread(fd, avail, first_pos)
            off = 0
        limit = off + avail
        end, next_offset = off, offset
        while end + HEADER_SIZE <= limit:
            base, length = _BASE_AND_LENGTH.unpack_from(buf, end)
            if end + length > limit:
                break
            (last_delta,) = _LAST_DELTA.unpack_from(buf, end + _LAST_DELTA_AT)
            end += length
            next_offset = base + last_delta + 1
        reached_end = first_pos + (end - off) >= size
        data = buf if off == 0 and end == len(buf) else buf[off:end]
        return data, first_base, next_offset, reached_end

    def find_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """First (offset, timestamp) in this segment with a record timestamp >= ``timestamp``."""
        if self.fd >= 0:
            return self._find_timestamp(self.fd, timestamp)
        path = str(self.log_path)
        fd = self.handles.acquire(path)
        try:
            return self._find_timestamp(fd, timestamp)
        finally:
            self.handles.release(path)

    def _find_timestamp(self, fd: int, ts: int) -> tuple[int, int] | None:
        return first_at_or_after(fd, self.index.lookup(self.time_index.floor_below(ts))[1], self.size, ts)

    # ---- lifecycle ------------------------------------------------------------------

    def memory_bytes(self) -> int:
        return self.index.memory_bytes() + self.time_index.memory_bytes()

    def close(self) -> None:
        self.handles.forget(str(self.log_path))
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def delete(self) -> None:
        """Close and remove the files (log first: index files without a log are orphans
        that the next open cleans up)."""
        self.close()
        delete_segment_files(self.log_path.parent, self.base_offset)


def delete_segment_files(directory: Path, base_offset: int) -> None:
    """Remove a segment's files (log first: index files without a log are orphans that the
    next open cleans up)."""
    stem = segment_stem(base_offset)
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        (directory / (stem + suffix)).unlink(missing_ok=True)
