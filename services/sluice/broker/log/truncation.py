"""Leader epochs, truncation, retention and damaged batches of a partition log: every way a log is cut,
and what a replica needs beyond append and read.

``end_offset_for_epoch`` answers OffsetForLeaderEpoch from the log's epoch cache; ``truncate_to``
and ``truncate_fully_and_start_at`` cut a follower's log back to where it agrees with its leader
(KIP-101, KIP-279). A mixin of ``PartitionLog``, split off to keep each module to one concern; it
works on ``PartitionLog``'s state under its lock. Decisions: docs/replication.md, "Leader epochs in
the log".
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator
from pathlib import Path

from sluice.broker.log.config import LogConfig
from sluice.broker.log.durable import fsync_dir
from sluice.broker.log.epochs import LeaderEpochCache
from sluice.broker.log.handles import ReadHandles, storage_error
from sluice.broker.log.producers import PartitionProducers
from sluice.broker.log.results import ReadResult
from sluice.broker.log.segment import Segment
from sluice.codec.batch import BatchHeader, iter_headers
from sluice.errors import InvalidArgument, StorageError

log = logging.getLogger(__name__)


class EpochsAndTruncation:
    """The epoch cache, truncations and the reads around damaged batches of ``PartitionLog``
    (which defines these attributes)."""

    directory: Path
    config: LogConfig
    log_start_offset: int
    log_end_offset: int
    flushed_offset: int
    _lock: threading.Lock
    _closed: bool
    _epochs: LeaderEpochCache
    _segments: list[Segment]
    _bases: list[int]
    _handles: ReadHandles
    _unsynced_paths: list[Path]
    _sealed_bytes: int
    _now_ms: Callable[[], int]

    @property
    def size_bytes(self) -> int:
        raise NotImplementedError

    corrupt_ranges: list[tuple[int, int]]
    producers: PartitionProducers
    _headers_from: Callable[[int], Iterator[BatchHeader]]

    def _load_epochs(self) -> None:
        """Load the epoch checkpoint, or rebuild it from the batch headers if it is missing,
        corrupt, or older than the log (its latest epoch is not the last batch's: written at a
        flush, it may lag the log after a crash). Entries the log no longer holds are dropped
        (the log may have lost its tail, or retention its head)."""
        try:
            loaded = self._epochs.load()
            if loaded:
                self._epochs.truncate_from_end(self.log_end_offset)
                self._epochs.truncate_from_start(self.log_start_offset)
                last = next((s.last_batch_epoch() for s in reversed(self._segments) if s.size), -1)
                if last != self._epochs.latest_epoch:
                    log.warning(
                        "%s: the epoch checkpoint ends at epoch %d, the log at %d: rebuilding it",
                        self.directory,
                        self._epochs.latest_epoch,
                        last,
                    )
                    loaded = False
            if not loaded:
                self._epochs.rebuild(e for seg in self._segments for e in seg.batch_epochs())
        except BaseException:
            for seg in self._segments:
                seg.close()
            raise

    def _stop_before_corrupt(self, offset: int, result: ReadResult) -> ReadResult:
        for start, end in self.corrupt_ranges:
            if start >= result.next_offset or end <= result.base_offset_of_first:
                continue
            if offset >= start:
                raise StorageError(
                    f"offsets [{start}, {end}) of {self.directory.name} failed verification on this "
                    "broker (a corrupt batch): they need a re-fetch from a healthy replica"
                )
            for pos, h in iter_headers(result.data):
                if h.base_offset >= start:
                    return ReadResult(result.data[:pos], h.base_offset, result.base_offset_of_first)
        return result

    @property
    def latest_epoch(self) -> int:
        """The highest leader epoch in the log (-1 if none)."""
        return self._epochs.latest_epoch

    def epoch_entries(self) -> list[tuple[int, int]]:
        """The epoch cache as ``(epoch, start_offset)`` pairs, oldest first."""
        return self._epochs.entries()

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: ``(the largest epoch <= epoch, where it ends)`` in this log
        (``LeaderEpochCache.end_offset_for``; ``(-1, -1)`` when undefined)."""
        with self._lock:
            return self._epochs.end_offset_for(epoch, self.log_end_offset)

    def begin_epoch(self, epoch: int) -> None:
        """A new leader records its epoch's start at its log end before appending anything in it
        (KIP-279), so OffsetForLeaderEpoch from a follower that saw an epoch between answers where
        this leader's history of it ends, not "undefined" (which would empty the follower's log)."""
        with self._lock:
            if not self._closed and epoch > self._epochs.latest_epoch:
                self._epochs.assign(epoch, self.log_end_offset)

    def truncate_to(self, offset: int) -> None:
        """Cut the log back so that it ends at ``offset`` (a follower removing a divergent tail).

        Whole batches go: a batch holding ``offset`` is removed with the rest, so the end may
        land below ``offset`` if it falls inside a batch (a truncation point from
        ``end_offset_for_epoch`` never does). Later segments are deleted, the segment holding
        the cut becomes the active one and is fsynced, its indexes and the epoch cache are cut
        too. Below the log start, the whole log goes (``truncate_fully_and_start_at``).
        """
        if offset < 0:
            raise InvalidArgument(f"cannot truncate to a negative offset {offset}")
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return
        with self._lock:
            if self._closed:
                raise StorageError(f"the log in {self.directory} is closed")
            if offset >= self.log_end_offset:
                return
            keep = bisect_right(self._bases, offset)
            for seg in reversed(self._segments[keep:]):  # newest first: a crash leaves a prefix
                seg.delete()
            del self._segments[keep:], self._bases[keep:]
            seg = self._segments[-1]
            try:
                seg.reactivate()
                seg.truncate_to(offset, self.config.index_interval_bytes)
            finally:  # on a failure too: the state says what is left on disk
                self._after_truncation_locked()
        log.info("truncated %s to offset %d", self.directory, self.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and start it empty at ``offset`` (a follower whose log has nothing
        in common with the leader's, or is behind the leader's log start)."""
        if offset < 0:
            raise InvalidArgument(f"cannot start a log at a negative offset {offset}")
        with self._lock:
            if self._closed:
                raise StorageError(f"the log in {self.directory} is closed")
            for seg in reversed(self._segments):
                seg.delete()
            self._segments = [Segment.create(self.directory, offset, self._handles)]
            self._bases = [offset]
            self._epochs.clear()
            self.producers.forget_all()
            self._after_truncation_locked()
        log.info("emptied %s; it starts at offset %d", self.directory, offset)

    def _after_truncation_locked(self) -> None:
        live = {s.log_path for s in self._segments}
        self._unsynced_paths = [p for p in self._unsynced_paths if p in live]
        self._sealed_bytes = sum(s.size for s in self._segments[:-1])
        self.log_start_offset = self._segments[0].base_offset
        self.log_end_offset = self._segments[-1].next_offset
        self.flushed_offset = min(self.flushed_offset, self.log_end_offset)
        self._epochs.truncate_from_end(self.log_end_offset)
        # A damaged batch cut away is healed: the replica fetches it again from its leader.
        self.corrupt_ranges = [r for r in self.corrupt_ranges if r[0] < self.log_end_offset]
        self._sync_dir()
        self.producers.truncated(self.log_start_offset, self.log_end_offset, self._headers_from)

    def _sync_dir(self) -> None:
        try:
            fsync_dir(self.directory)
        except OSError as exc:
            raise storage_error(f"fsync of {self.directory}", exc) from exc

    def apply_retention(self) -> int:
        """Delete the oldest whole segments that are past retention; returns how many.

        By time: a segment goes when its newest record timestamp is older than
        ``retention_ms``. By size: oldest segments go while the log is larger than
        ``retention_bytes``. The active segment is never deleted.
        """
        cfg = self.config
        now = self._now_ms()
        deleted = 0
        with self._lock:
            self.producers.table.expire(now)
            while len(self._segments) > 1:
                oldest = self._segments[0]
                too_old = cfg.retention_ms >= 0 and oldest.max_timestamp < now - cfg.retention_ms
                too_big = cfg.retention_bytes >= 0 and self.size_bytes > cfg.retention_bytes
                if not (too_old or too_big):
                    break
                self._segments.pop(0)
                self._bases.pop(0)
                self._sealed_bytes -= oldest.size
                oldest.delete()
                deleted += 1
            self.log_start_offset = self._segments[0].base_offset
            if deleted:
                self._epochs.truncate_from_start(self.log_start_offset)
                self.corrupt_ranges = [r for r in self.corrupt_ranges if r[1] > self.log_start_offset]
        if deleted:
            log.info(
                "retention deleted %d segment(s) of %s; log start is now %d",
                deleted,
                self.directory,
                self.log_start_offset,
            )
        return deleted


#: Rounds of OffsetForLeaderEpoch before giving up: each round moves to a strictly lower epoch.
MAX_EPOCH_ROUNDS = 1000


def divergence_offset(local: EpochsAndTruncation, ask_leader: Callable[[int], tuple[int, int]]) -> int:
    """Where a follower's log stops agreeing with its leader's: the offset to ``truncate_to``.

    ``ask_leader(epoch)`` is the leader's ``end_offset_for_epoch`` (an OffsetForLeaderEpoch
    request). The follower asks about its latest epoch; the leader answers with the largest epoch
    it has at or below it and where that epoch ends on the leader. If the follower has that epoch
    too, the logs agree up to the smaller of the two ends (KIP-101). If not (the follower's epochs
    between are ones the leader never saw: back-to-back failovers, KIP-279), it asks again about
    its own largest epoch below the answer, until both name an epoch they share. An undefined
    answer means nothing is shared: the follower starts over at the leader's log start (-1 is
    returned; the caller truncates fully).
    """
    epoch = local.latest_epoch
    for _ in range(MAX_EPOCH_ROUNDS):
        if epoch < 0:
            return -1
        leader_epoch, leader_end = ask_leader(epoch)
        if leader_epoch < 0:
            return -1
        own_epoch, own_end = local.end_offset_for_epoch(leader_epoch)
        if own_epoch == leader_epoch:
            return min(leader_end, own_end)
        if own_epoch < 0 or own_epoch >= epoch:
            return min(leader_end, local.log_start_offset)  # below our first epoch: nothing shared
        epoch = own_epoch
    raise StorageError(f"no agreement on a leader epoch after {MAX_EPOCH_ROUNDS} rounds")
