"""The producer table of one partition log, kept in step with the log: checked before an append,
recorded after it, snapshotted at segment rolls and clean shutdown, rebuilt on open and after truncation.

The table itself (``producer_state.py``) and its snapshots (``producer_snapshot.py``) know nothing of
segments; this module is the glue ``PartitionLog`` calls at five points: ``check`` (a produce, before the
write), ``record`` (every write, produced or replicated, so a follower has the state when it becomes
leader), ``snapshot`` (roll and close), ``recover`` (open) and ``truncated``. Replay reads batch
*headers* only (``headers_from``), never records: the producer fields are in the header.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from sluice.broker.log import producer_snapshot as snapshots
from sluice.broker.log.producer_state import (
    DEFAULT_EXPIRATION_MS,
    DEFAULT_MAX_PRODUCERS,
    NO_PRODUCER_ID,
    BatchMeta,
    ProducerStateTable,
)
from sluice.codec.batch import BatchHeader
from sluice.errors import CorruptBatch, OutOfOrderSequence

log = logging.getLogger(__name__)

#: Batch headers of the log from an offset on (the log's own reader).
HeadersFrom = Callable[[int], Iterable[BatchHeader]]


class PartitionProducers:
    """One partition's producer table and snapshot files. Used under the log's append path (one thread)."""

    def __init__(
        self,
        directory: Path,
        expiration_ms: int = DEFAULT_EXPIRATION_MS,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
    ) -> None:
        self.directory = directory
        self.table = ProducerStateTable(expiration_ms, max_producers)

    def check(self, headers: list[BatchHeader]) -> tuple[int, int, int] | None:
        """Before appending a produced run: the (first offset, last offset, append time) it got the first
        time if it is a retry, None if it is to be appended. Raises the typed refusal otherwise.

        A run is one partition's batches of one request, written with one write, so a retry of it is all
        duplicates; a run that is part duplicate and part new cannot come from a well-behaved producer
        (the SDK never appends new batches to a retried run) and is refused as out of order rather than
        half-written.
        """
        duplicates: list[BatchMeta] = []
        idempotent = 0
        #: Per producer in this run: whether its first batch was a retry. Only a producer's first batch
        #: is checked against the table as new; its later new batches follow on within the run.
        retried: dict[int, bool] = {}
        for h in headers:
            pid = h.producer_id
            if pid == NO_PRODUCER_ID:
                continue
            if pid < 0 or h.producer_epoch < 0 or h.base_sequence < 0:
                raise CorruptBatch(
                    f"producer fields {pid}/{h.producer_epoch}/{h.base_sequence}: an idempotent batch has a "
                    "producer id, epoch and first sequence >= 0; -1/-1/-1 without idempotence"
                )
            idempotent += 1
            if retried.get(pid, True):
                earlier = self.table.check(pid, h.producer_epoch, h.base_sequence, h.record_count)
                retried.setdefault(pid, earlier is not None)
                if earlier is not None:
                    duplicates.append(earlier)
        if not duplicates:
            if idempotent > 1:
                self._check_run_is_in_order(headers)
            return None
        if len(duplicates) != len(headers):
            raise OutOfOrderSequence(
                f"{len(duplicates)} of the request's {len(headers)} batches for this partition were written "
                "before and the rest were not: send a retried run without new batches"
            )
        return duplicates[0].first_offset, duplicates[-1].last_offset, duplicates[0].append_time_ms

    def _check_run_is_in_order(self, headers: list[BatchHeader]) -> None:
        """Several new batches of one producer in one run: each must start where the previous ended
        (the table checks only the first against what it holds)."""
        expected: dict[int, int] = {}
        for h in headers:
            if h.producer_id == NO_PRODUCER_ID:
                continue
            want = expected.get(h.producer_id)
            if want is not None and h.base_sequence != want:
                raise OutOfOrderSequence(
                    f"producer {h.producer_id}: batch at sequence {h.base_sequence} follows one ending "
                    f"before {want} in the same request"
                )
            expected[h.producer_id] = (h.base_sequence + h.record_count) % 2**31

    def record(self, headers: Iterable[BatchHeader], first_offset: int, append_time_ms: int) -> None:
        """After a write (produced or replicated): remember each idempotent batch at its offsets."""
        offset = first_offset
        for h in headers:
            last = offset + h.last_offset_delta
            if h.producer_id != NO_PRODUCER_ID:
                time_ms = h.append_time_ms if h.append_time_ms >= 0 else append_time_ms
                self.table.record(
                    h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, offset, last, time_ms
                )
            offset = last + 1

    def snapshot(self, offset: int) -> None:
        """Write the table as of ``offset`` (every batch below it recorded). A failure is logged, not
        raised: a snapshot only shortens recovery, which falls back to an older one or the log start."""
        try:
            snapshots.write(self.directory, offset, self.table.entries())
        except OSError as exc:
            log.warning("%s: producer snapshot at %d not written: %s", self.directory, offset, exc)

    def recover(self, log_start: int, log_end: int, headers_from: HeadersFrom) -> None:
        """On open: the newest readable snapshot at or below the log end, then the batches after it."""
        loaded = snapshots.load_latest(self.directory, at_most=log_end)
        start = log_start
        if loaded is not None:
            # A snapshot below the log start (retention removed segments since) still holds producers
            # whose batches are gone; they stay known until they expire, as in Kafka.
            start = max(loaded[0], log_start)
            self.table.restore(loaded[1])
        else:
            self.table.restore([])
        replayed = self._replay(start, headers_from)
        if replayed:
            log.info("%s: producer state replayed from %d: %d batches", self.directory, start, replayed)

    def truncated(self, log_start: int, log_end: int, headers_from: HeadersFrom) -> None:
        """The log was cut back to ``log_end``: snapshots above it are void, and the table is rebuilt
        from the newest one below (exact, unlike forgetting batches: a producer whose newest batches were
        cut keeps the older ones it still has)."""
        snapshots.delete_above(self.directory, log_end)
        self.recover(log_start, log_end, headers_from)

    def forget_all(self) -> None:
        """The log was emptied (it starts over at another offset): no state and no snapshot is valid."""
        snapshots.delete_above(self.directory, -1)
        self.table.restore([])

    def _replay(self, start: int, headers_from: HeadersFrom) -> int:
        count = 0
        for h in headers_from(start):
            if h.base_offset < start:
                continue  # the batch holding ``start`` began before it: already in the snapshot
            if h.producer_id != NO_PRODUCER_ID:
                self.table.record(
                    h.producer_id,
                    h.producer_epoch,
                    h.base_sequence,
                    h.record_count,
                    h.base_offset,
                    h.last_offset,
                    h.append_time_ms,
                )
                count += 1
        return count
