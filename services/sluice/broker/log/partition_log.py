"""The log of one partition: an ordered run of segments with dense offsets.

Synchronous and pure file I/O. One thread (the broker's event loop) appends, reads,
rolls and applies retention; ``flush()`` alone may run on another thread while appends
continue (see its docstring). The on-disk design is in docs/storage.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from pathlib import Path

from sluice.broker.log.config import MAX_SEGMENT_BYTES, LogConfig
from sluice.broker.log.durable import fdatasync_path, fsync_dir
from sluice.broker.log.epochs import LeaderEpochCache
from sluice.broker.log.handles import ReadHandles, storage_error
from sluice.broker.log.producers import PartitionProducers
from sluice.broker.log.read_check import failed_batches
from sluice.broker.log.recovery import load_segments
from sluice.broker.log.results import AppendResult, ReadResult
from sluice.broker.log.segment import Segment
from sluice.broker.log.space import DiskSpace
from sluice.broker.log.truncation import EpochsAndTruncation
from sluice.codec.batch import HEADER_SIZE, BatchHeader, HeaderLimits, stamp, validate_batch
from sluice.errors import (
    CorruptBatch,
    InvalidArgument,
    InvalidRequest,
    NotLeader,
    OffsetOutOfRange,
    StorageError,
    StorageFull,
)

log = logging.getLogger(__name__)

#: Relative offsets are u32 in the index: roll before a segment would span more.
_MAX_RELATIVE_OFFSET = 2**32 - 1
#: Read handles of a log opened on its own (tests, tools); a broker shares one LRU.
_PRIVATE_READ_HANDLES = 4


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class PartitionLog(EpochsAndTruncation):
    """Append-only, segmented, indexed log of one partition in one directory.

    Holds one descriptor of its own (the active segment's); sealed segments are read
    through ``handles``, the broker's shared LRU. Opening is all or nothing: a failure
    (a StorageError) leaves no descriptor open.
    """

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        now_ms: Callable[[], int] = wall_clock_ms,
        handles: ReadHandles | None = None,
        verify_all: bool = False,
        space: DiskSpace | None = None,
    ) -> None:
        self.directory = Path(directory)
        #: The log directory's free-space guard (a broker shares one); None: never refuse for space.
        self._space = space
        self.config = config
        self._now_ms = now_ms
        self._handles = handles if handles is not None else ReadHandles(_PRIVATE_READ_HANDLES)
        #: Guards what flush() shares with the appending thread: the active segment,
        #: its in-memory index arrays and the list of sealed segments awaiting fsync.
        self._lock = threading.Lock()
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        #: Files of segments sealed since the last flush: their tails still need an fsync.
        #: Paths, not descriptors, so a roll never holds a second descriptor per partition.
        self._unsynced_paths: list[Path] = []
        self._dir_dirty = False
        self._sealed_bytes = 0
        self._listeners: list[Callable[[], None]] = []
        self._closed = False
        self.log_start_offset = 0
        self.log_end_offset = 0
        #: The log end at the start of the last successful flush(): everything below is fsync'ed
        #: (a replica reports it to its leader under flush=always; docs/replication.md).
        self.flushed_offset = 0
        self.directory.mkdir(parents=True, exist_ok=True)
        #: Epoch -> start offset (docs/replication.md, "Leader epochs in the log").
        self._epochs = LeaderEpochCache(self.directory)
        #: An append began a new epoch since the checkpoint was last written (the next flush does).
        self._epochs_dirty = False
        #: Offset ranges [base, next) of batches that failed their CRC (or other checks) inside
        #: intact framing at an unclean open: this replica's copy is damaged there.
        self.corrupt_ranges: list[tuple[int, int]] = []
        #: Called when a read finds a damaged batch (the broker reports it to the controller).
        self.on_damage: Callable[[], None] | None = None
        #: Idempotent producers' last batches (docs/replication.md, "Idempotent producer").
        self.producers = PartitionProducers(self.directory)
        self._load(verify_all)

    # ---- opening and recovery ---------------------------------------------------------

    def _load(self, verify_all: bool) -> None:
        interval = self.config.index_interval_bytes
        loaded = load_segments(self.directory, self._handles, interval, verify_all)
        self._segments = loaded.segments
        self._dir_dirty = loaded.dir_dirty
        self._bases = [s.base_offset for s in self._segments]
        self._sealed_bytes = sum(s.size for s in self._segments[:-1])
        self.log_start_offset = self._segments[0].base_offset
        self.log_end_offset = self._segments[-1].next_offset
        self.corrupt_ranges = [r for seg in self._segments for r in seg.corrupt]
        if self.corrupt_ranges:
            log.error(
                "%s: %d batch(es) failed verification and need a re-fetch from a replica: offsets %s",
                self.directory,
                len(self.corrupt_ranges),
                self.corrupt_ranges,
            )
        self.flushed_offset = self.log_end_offset  # what recovery found on disk
        self._load_epochs()
        self.producers.recover(self.log_start_offset, self.log_end_offset, self._headers_from)

    def _headers_from(self, offset: int) -> Iterator[BatchHeader]:
        """Batch headers from the batch holding ``offset`` to the log end (producer-state replay)."""
        first = max(0, bisect_right(self._bases, offset) - 1)
        for i, seg in enumerate(self._segments[first:]):
            yield from seg.batch_headers(seg.position_for(offset) if i == 0 else 0)

    # ---- appending --------------------------------------------------------------------

    def append(self, batches: bytes | bytearray | memoryview, leader_epoch: int = 0) -> AppendResult:
        """Validate, stamp and append one or more concatenated producer batches.

        Every batch is stamped with its base offset, the append time and ``leader_epoch``
        (the epoch this broker leads the partition in; 0 for a partition without replication).
        An epoch older than the log's latest is refused (NOT_LEADER: this broker was deposed).

        All or nothing: every batch is checked before a byte is written, and the whole
        request goes into one segment with one write (rolling first if it would not fit),
        so a failure never leaves part of a request in the log.
        """
        self._check_appendable(batches)
        if leader_epoch < 0:
            raise InvalidArgument(f"leader_epoch must be >= 0, got {leader_epoch}")
        latest = self._epochs.latest_epoch
        if leader_epoch < latest:
            raise NotLeader(
                f"leader epoch {leader_epoch} is older than the log's latest epoch {latest}: "
                "this broker no longer leads the partition"
            )
        headers = self._validate(batches, self.config.header_limits)
        earlier = self.producers.check(headers)
        if earlier is not None:
            return AppendResult(*earlier)  # an idempotent retry: written before, answered as then
        now = self._now_ms()
        buf = bytearray(batches)
        offset = self.log_end_offset
        pos = 0
        for h in headers:
            stamp(buf, pos, offset, now, leader_epoch)
            offset += h.last_offset_delta + 1
            pos += h.length
        new_epoch = [(leader_epoch, self.log_end_offset)] if leader_epoch > latest else []
        return self._write(buf, headers, new_epoch, now)

    def append_replicated(self, batches: bytes | bytearray | memoryview) -> AppendResult:
        """Append batches copied from the leader, byte for byte: a follower's append.

        Each batch keeps the leader's base offset, append time and leader epoch (outside the
        CRC, which is verified like a produced batch's). The first must start at this log's end
        and the rest follow densely; epochs never go down, and a new one is recorded in the
        epoch cache at the batch that starts it.
        """
        self._check_appendable(batches)
        headers = self._validate(batches)
        expected, epoch = self.log_end_offset, self._epochs.latest_epoch
        new_epochs: list[tuple[int, int]] = []
        for h in headers:
            if h.base_offset != expected:
                raise CorruptBatch(f"replicated batch at offset {h.base_offset}, expected {expected}")
            if h.partition_leader_epoch < epoch:
                raise CorruptBatch(
                    f"replicated batch in epoch {h.partition_leader_epoch} after epoch {epoch}"
                )
            if h.partition_leader_epoch > epoch:
                epoch = h.partition_leader_epoch
                new_epochs.append((epoch, h.base_offset))
            expected = h.next_offset
        return self._write(bytes(batches), headers, new_epochs, self._now_ms())

    def _check_appendable(self, batches: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise StorageError(f"the log in {self.directory} is closed")
        total = len(batches)
        if total == 0:
            raise CorruptBatch("empty produce: no batches")
        if total > MAX_SEGMENT_BYTES:
            raise InvalidRequest(f"produce of {total} bytes for one partition is too large")

    def _write(
        self, buf: bytes | bytearray, headers: list[BatchHeader], new_epochs: list[tuple[int, int]], now: int
    ) -> AppendResult:
        """Write stamped batches at the log end; ``new_epochs`` lists the (epoch, start offset) of
        each leader epoch these batches begin (usually none: the log's latest epoch goes on)."""
        total = len(buf)
        first_offset = self.log_end_offset
        offset = first_offset + sum(h.last_offset_delta + 1 for h in headers)
        interval = self.config.index_interval_bytes
        if self._space is not None:
            self._space.check(total)  # STORAGE_FULL before the disk is: docs/storage.md, "Disk full"
        with self._lock:
            # The cache before the data; its file is written by the next flush (off this path).
            for epoch, start in new_epochs:
                self._epochs_dirty |= self._epochs.assign(epoch, start)
            seg = self._segments[-1]
            try:
                if seg.size and (
                    seg.size + total > self.config.segment_bytes
                    or offset - seg.base_offset > _MAX_RELATIVE_OFFSET
                    or self._is_old(seg, now)
                ):
                    seg = self._roll_locked()
                start = seg.size
                seg.write(buf)
            except (StorageError, StorageFull) as exc:
                self._epochs.truncate_from_end(first_offset)  # nothing of the new epoch was written
                if isinstance(exc, StorageFull) and self._space is not None:
                    self._space.hit_no_space()
                raise
            if self._space is not None:
                self._space.wrote(total)
            seg.size = start + total
            pos, batch_offset = start, first_offset
            for h in headers:
                seg.note_batch(pos, batch_offset, h.max_timestamp, interval)
                batch_offset += h.last_offset_delta + 1
                pos += h.length
            seg.next_offset = offset
            if seg.first_append_ms is None:
                seg.first_append_ms = now
            self.log_end_offset = offset
            self.producers.record(headers, first_offset, now)
        for listener in tuple(self._listeners):
            try:
                listener()
            except Exception:
                log.exception("append listener failed")
        return AppendResult(first_offset, offset - 1, now)

    def _validate(
        self, batches: bytes | bytearray | memoryview, header_limits: HeaderLimits | None = None
    ) -> list[BatchHeader]:
        """Validate a run of batches. ``header_limits``: the produce path's; a follower's append
        passes none, as the leader accepted the records (a follower with lower limits must not stall)."""
        headers: list[BatchHeader] = []
        limit = self.config.max_batch_bytes
        pos, total = 0, len(batches)
        while pos < total:
            # Dense offset deltas (0..record_count-1) in every batch of a log, produced or copied from a
            # leader (logs are never compacted): checked by one C-level comparison of the column, not a
            # Python step per record (it was 5 % of a busy broker's samples).
            h = validate_batch(batches, pos, limit, require_dense=True, headers=header_limits)  # type: ignore[arg-type]
            headers.append(h)
            pos += h.length
        return headers

    def _is_old(self, seg: Segment, now: int) -> bool:
        return seg.first_append_ms is not None and now - seg.first_append_ms >= self.config.segment_ms

    def _roll_locked(self) -> Segment:
        # Seal, then create: either can fail (StorageError) and leave the old segment
        # active and intact; sealing twice is harmless. Only then does the old segment
        # close its descriptor; the next flush reopens the file to fsync its tail.
        old = self._segments[-1]
        try:
            old.seal()
        except StorageError as exc:  # derived data: the next open rebuilds the missing index entries
            log.warning("%s: the indexes of the segment being sealed were not written: %s", old.log_path, exc)
        new = Segment.create(self.directory, old.next_offset, self._handles)
        os.close(old.release_fd())
        self._unsynced_paths.append(old.log_path)
        self._segments.append(new)
        self._bases.append(new.base_offset)
        self._sealed_bytes += old.size
        self._dir_dirty = True
        # Every batch below the new segment is in the table now: recovery replays from here at most.
        self.producers.snapshot(new.base_offset)
        return new

    def maybe_roll(self) -> bool:
        """Roll the active segment if it is older than ``segment_ms`` (and not empty)."""
        with self._lock:
            if self._closed or not self._is_old(self._segments[-1], self._now_ms()):
                return False
            self._roll_locked()
            return True

    def add_append_listener(self, callback: Callable[[], None]) -> None:
        """``callback()`` runs synchronously after every successful append."""
        self._listeners.append(callback)

    def remove_append_listener(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    # ---- reading ----------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        """What a reader may see: all of it (a replicated leader bounds its readers with a HW view)."""
        return self.log_end_offset

    def read(self, offset: int, max_bytes: int, min_one: bool = True) -> ReadResult:
        """Whole batches starting with the one containing ``offset``, up to ``max_bytes``.

        With ``min_one`` the first batch comes back whole even when larger than
        ``max_bytes``. Reads continue into the next segment while there is room. A batch
        that failed verification (``corrupt_ranges``) is never served: the read stops before
        it, and a read starting in it is a retriable STORAGE_ERROR (a healthy replica serves
        it, or this one once it has re-fetched it).
        """
        result = self._read_batches(offset, max_bytes, min_one)
        failed = failed_batches(result.data) if result.data else ()
        for found in failed:  # rot found while serving (read_check.py): never served, reported
            if found not in self.corrupt_ranges:
                self.corrupt_ranges = sorted([*self.corrupt_ranges, found])
                log.error("%s: offsets %s fail their CRC: a damaged copy", self.directory, found)
        if failed and self.on_damage is not None:
            self.on_damage()
        if self.corrupt_ranges and result.data:
            return self._stop_before_corrupt(offset, result)
        return result

    def _read_batches(self, offset: int, max_bytes: int, min_one: bool) -> ReadResult:
        end = self.log_end_offset
        if offset < self.log_start_offset or offset > end:
            raise OffsetOutOfRange(
                f"offset {offset} is out of range: the log holds offsets "
                f"[{self.log_start_offset}, {end}) (log start offset {self.log_start_offset}, "
                f"log end offset {end})"
            )
        if offset == end:
            return ReadResult(b"", offset, offset)
        slack = self.config.index_interval_bytes + HEADER_SIZE
        i = bisect_right(self._bases, offset) - 1
        seg = self._segments[i]
        data, first_base, next_offset, reached_end = seg.read(
            seg.position_for(offset), offset, max_bytes, min_one, slack
        )
        if not reached_end or i + 1 == len(self._segments) or len(data) >= max_bytes:
            return ReadResult(data, next_offset, first_base if data else offset)
        parts = [data] if data else []
        room = max_bytes - len(data)
        first_min_one = min_one and not data
        for seg in self._segments[i + 1 :]:
            more, more_base, more_next, reached_end = seg.read(0, next_offset, room, first_min_one, slack)
            if more:
                if not parts:
                    first_base = more_base
                parts.append(more)
                room -= len(more)
                next_offset = more_next
                first_min_one = False
            if not reached_end or room <= 0:
                break
        data = b"".join(parts) if len(parts) != 1 else parts[0]
        return ReadResult(data, next_offset, first_base if data else offset)

    def offset_for_timestamp(self, ts_ms: int) -> tuple[int, int] | None:
        """First ``(offset, timestamp)`` whose record timestamp is >= ``ts_ms``; None if none."""
        for seg in self._segments:
            if seg.max_timestamp >= ts_ms:
                found = seg.find_timestamp(ts_ms)
                if found is not None:
                    return found
        return None

    @property
    def size_bytes(self) -> int:
        return self._sealed_bytes + self._segments[-1].size

    def index_memory_bytes(self) -> int:
        """Bytes held by the in-memory index arrays of every segment."""
        return sum(s.memory_bytes() for s in self._segments)

    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    # ---- durability and retention ------------------------------------------------------

    def flush(self) -> None:
        """Make everything appended before this call durable (fdatasync).

        Thread-safe against appends: under the lock it only writes pending index entries,
        duplicates the active segment's descriptor and takes the list of segments sealed
        since the last flush, then fsyncs outside the lock, so appends go on while the disk
        works. The dup stays valid if the segment is rolled, closed or deleted meanwhile;
        a sealed segment is reopened by path (fsync applies to the file, whichever
        descriptor asks), one at a time, and one deleted by retention meanwhile needs no
        sync. Index files are not fsynced: they are rebuilt from the log if a crash leaves
        them behind or wrong. A failure leaves the sealed segments queued for the next flush.
        """
        with self._lock:
            if self._closed:
                return
            active = self._segments[-1]
            try:
                active.persist_indexes()
            except StorageError as exc:  # derived data: the entries stay pending, the next flush retries
                log.warning("%s: index entries not written (next flush retries): %s", self.directory, exc)
            try:
                active_fd = os.dup(active.fd)
            except OSError as exc:
                raise storage_error(f"flushing {self.directory}", exc) from exc
            sealed, self._unsynced_paths = self._unsynced_paths, []
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            epochs = self._epochs.encode() if self._epochs_dirty else None
            self._epochs_dirty = False
            flushing = self.log_end_offset
        try:
            os.fdatasync(active_fd)
            while sealed:
                fdatasync_path(sealed[0])
                sealed.pop(0)
            if dir_dirty:
                fsync_dir(self.directory)
            if epochs is not None:
                self._write_epochs(*epochs)
                epochs = None
            self.flushed_offset = min(max(self.flushed_offset, flushing), self.log_end_offset)
        except StorageError:
            self._epochs_dirty = self._epochs_dirty or epochs is not None
            raise
        except FileNotFoundError:
            if not self._closed:  # else: deleted while this flush ran; nothing left to sync
                raise StorageError(f"the log directory {self.directory} disappeared") from None
        except OSError as exc:
            with self._lock:
                self._unsynced_paths[:0] = sealed
                self._dir_dirty = self._dir_dirty or dir_dirty
                self._epochs_dirty = self._epochs_dirty or epochs is not None
            raise storage_error(f"fsync of {self.directory}", exc) from exc
        finally:
            os.close(active_fd)

    def _write_epochs(self, data: bytes, version: int) -> None:
        """Write the epoch checkpoint; a failure (ENOSPC) is logged and retried at the next flush, not
        raised: the data is durable, and an open rebuilds a checkpoint that lags the log."""
        try:
            self._epochs.write(data, version)
        except StorageError as exc:
            log.warning("%s: epoch checkpoint not written (next flush retries): %s", self.directory, exc)
            with self._lock:
                self._epochs_dirty = True

    def close(self) -> None:
        """Flush, write the indexes and close every file. Idempotent."""
        if self._closed:
            return
        try:
            self.flush()
            with self._lock:
                self.producers.snapshot(self.log_end_offset)  # a clean shutdown replays nothing
        finally:
            self._close_files()

    def _close_files(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for seg in self._segments:
                seg.close()
            self._unsynced_paths = []

    def delete(self) -> None:
        """Close the log (without syncing what is about to be removed) and remove its directory."""
        self._close_files()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __repr__(self) -> str:
        return (
            f"PartitionLog({str(self.directory)!r}, start={self.log_start_offset}, "
            f"end={self.log_end_offset}, segments={len(self._segments)})"
        )
