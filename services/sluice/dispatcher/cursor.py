"""One subscription's position on one partition: what is acknowledged, and how often things came back.

Pure: no I/O. ``mark_delete`` is the first offset not known to be acknowledged (everything below it
is); ``acked`` holds the individually acknowledged ranges above it; ``redeliveries`` counts, per
unacknowledged offset, how many times it went back to the subscription (nack, ack timeout, consumer
gone), and ``counts`` holds the counts a crash left behind, by range. A change bumps ``version``; the
cursor store persists a version and reports it back with ``mark_saved``, so ``dirty`` means
"something is not in the offset store yet".

**Counts that survive a crash** (durable cursors, ``persisted=True``; docs/dispatcher.md, "What a
kill -9 costs"). Two rules make a persisted count a lower bound of what a consumer may have seen,
whatever instant the process dies at:

1. *Write-ahead mark, batched.* A message read from the log is sent only below ``gate``: the
   ``delivered_up_to`` mark the offset store already holds. The mark is raised ahead of deliveries
   by ``lead`` offsets and rides along with the next cursor flush, so in steady state no delivery
   waits and no write is added; a delivery that reaches the gate asks for a flush at once (a
   stall). After a crash, every unacknowledged offset below the persisted mark counts once more
   (:meth:`recover`), as one range in ``counts``.
2. *A raised count is persisted before the message goes out again.* ``bump_redelivery`` records
   the version; :meth:`count_saved` is false until a save of that version landed, and the
   subscription holds the message back until then.

A crash thus costs, per (subscription, partition), at most ``lead`` never-delivered offsets counted
once too often, plus the messages that had come back and were not sent again yet.

**Leader epochs** (KIP-320; docs/dispatcher.md, "Across a leader change"). A snapshot carries a leader
epoch at or above that of the record just below the cursor's highest position (``epoch_to_save``): the
feed's latest when the feed read past that record, else the epoch the cursor was loaded (and checked)
with while the position is not above the one it was loaded at, else none (-1: not checked when loaded).
Never an older epoch than the record's: that could report a truncation that did not happen. A dispatcher
loading the cursor checks it against the current leader; :meth:`truncate` forgets what the cursor said
about records a truncated log no longer holds.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping

from sluice.dispatcher.epochs import EpochTrail
from sluice.dispatcher.ranges import AckRanges, CountRanges, runs

__all__ = ["MAX_LEAD", "MIN_LEAD", "CursorSnapshot", "PartitionCursor"]

#: Bounds of ``lead``, the distance (in offsets) the persisted delivered-up-to mark runs ahead of
#: the deliveries. It adapts to about 4 flushes' worth of deliveries: enough that a steady stream
#: never waits for the offset store, little enough to bound what a crash over-counts.
MIN_LEAD = 128
MAX_LEAD = 65_536
#: The gate of a cursor that is not persisted (non-durable subscription): everything may go.
UNGATED = 2**63 - 1


class CursorSnapshot:
    """An immutable copy of a cursor for the offset store (taken at flush time)."""

    __slots__ = (
        "acked_ranges",
        "delivered_up_to",
        "leader_epoch",
        "mark_delete",
        "partition",
        "redelivery_counts",
        "redelivery_ranges",
        "version",
    )

    def __init__(
        self,
        partition: int,
        mark_delete: int,
        acked_ranges: array[int],
        counts: dict[int, int],
        version: int,
        delivered_up_to: int = 0,
        redelivery_ranges: array[int] | None = None,
        leader_epoch: int = -1,
    ) -> None:
        self.partition = partition
        self.mark_delete = mark_delete
        self.acked_ranges = acked_ranges
        self.redelivery_counts = counts
        self.version = version
        self.delivered_up_to = delivered_up_to
        self.redelivery_ranges = redelivery_ranges if redelivery_ranges is not None else array("q")
        self.leader_epoch = leader_epoch


class PartitionCursor:
    """Acknowledgement state of one (subscription, partition)."""

    __slots__ = (
        "_peak",
        "_requested_mark",
        "_since_save",
        "_unsaved_bumps",
        "acked",
        "counts",
        "delivered_high",
        "delivered_up_to",
        "epoch_covers",
        "epochs",
        "gate",
        "lead",
        "leader_epoch",
        "mark_delete",
        "partition",
        "persisted",
        "redeliveries",
        "saved_version",
        "urgent",
        "version",
    )

    def __init__(
        self,
        partition: int,
        mark_delete: int = 0,
        acked_ranges: Iterable[int] = (),
        redeliveries: Mapping[int, int] | None = None,
        *,
        count_ranges: Iterable[int] = (),
        persisted: bool = False,
        leader_epoch: int = -1,
    ) -> None:
        self.partition = partition
        self.mark_delete = mark_delete
        self.acked = AckRanges(acked_ranges)
        self.redeliveries: dict[int, int] = dict(redeliveries or {})
        self.counts = CountRanges(count_ranges)
        self.version = 0
        self.saved_version = 0
        # A loaded cursor may hold ranges touching mark_delete (an older writer): normalise.
        self.mark_delete = self.acked.pop_below(mark_delete)
        #: Durable: deliveries wait for the write-ahead mark and raised counts (module docstring).
        self.persisted = persisted
        #: The mark to persist: everything below it may have been delivered.
        self.delivered_up_to = self.mark_delete
        #: Messages read from the log may be sent only below this (the persisted mark).
        self.gate = self.mark_delete if persisted else UNGATED
        #: Wants a flush now: a delivery or a redelivery waits for one.
        self.urgent = False
        self.lead = MIN_LEAD
        self.delivered_high = self.mark_delete
        self._requested_mark = self.mark_delete
        self._since_save = 0
        self._peak = 0
        # offset -> version of its last count raise not known to be persisted yet.
        self._unsaved_bumps: dict[int, int] = {}
        #: The epoch its records were read in, as loaded (then checked), for what ``epochs`` does not cover,
        #: and the position it vouches for (the loaded one: nothing above it was read in that epoch).
        self.leader_epoch = leader_epoch
        self.epoch_covers = self._high() if leader_epoch >= 0 else 0
        #: The partition feed's epochs of what it read (``FeedTarget.follow_epochs``); None before a feed.
        self.epochs: EpochTrail | None = None

    # ---- queries -------------------------------------------------------------------------------------

    def is_acked(self, offset: int) -> bool:
        return offset < self.mark_delete or offset in self.acked

    @property
    def dirty(self) -> bool:
        return self.version != self.saved_version

    @property
    def has_counts(self) -> bool:
        return bool(self.redeliveries) or bool(self.counts)

    def redelivery_count(self, offset: int) -> int:
        n = self.redeliveries.get(offset)
        if n is not None:
            return n
        return self.counts.count_at(offset) if self.counts else 0

    def counts_of(self, offsets: Iterable[int]) -> list[int]:
        """The redelivery count of each offset (one call per delivery, not per message)."""
        get = self.redeliveries.get
        if not self.counts:
            return [get(o, 0) for o in offsets]
        end, at = self.counts.end, self.counts.count_at
        return [n if (n := get(o)) is not None else (at(o) if o < end else 0) for o in offsets]

    def count_saved(self, offset: int) -> bool:
        """Whether the offset store holds this offset's current count (it may be sent again)."""
        return offset not in self._unsaved_bumps

    def acked_count_from(self, position: int) -> int:
        """Acknowledged offsets at or above ``position`` (to compute a backlog)."""
        b = self.acked.flat
        total = 0
        for i in range(0, len(b), 2):
            s, e = b[i], b[i + 1]
            if e > position:
                total += e - max(s, position)
        return total

    # ---- changes -------------------------------------------------------------------------------------

    def ack_range(self, start: int, end: int) -> None:
        """Acknowledge ``[start, end)``."""
        if end <= self.mark_delete or end <= start:
            return
        if start <= self.mark_delete:
            self.mark_delete = self.acked.pop_below(end)
        else:
            self.acked.add(start, end)
        if self.redeliveries:
            doomed = (
                range(start, end) if end - start < 64 else [k for k in self.redeliveries if start <= k < end]
            )
            for o in doomed:
                self.redeliveries.pop(o, None)
        self.version += 1

    def ack_sorted(self, offsets: Iterable[int]) -> None:
        """Acknowledge sorted, distinct offsets (one range operation per run)."""
        for s, e in runs(offsets):
            self.ack_range(s, e)

    def bump_redelivery(self, offset: int) -> int:
        """The message went back unacknowledged: count it and return the new count."""
        n = self.redelivery_count(offset) + 1
        self.redeliveries[offset] = n
        self.version += 1
        if self.persisted:
            self._unsaved_bumps[offset] = self.version
        return n

    def skip_to(self, position: int) -> None:
        """Everything below ``position`` is gone from the log (retention) or was never wanted."""
        if position > self.mark_delete:
            self.ack_range(self.mark_delete, position)

    def truncate(self, end: int) -> int:
        """The log was truncated at ``end`` under this cursor (an unclean election: the records at and
        above it are gone, others may take their offsets): forget what the cursor says about them.
        Acknowledged offsets there are no longer acknowledged (they will hold new records), their counts
        go, and the write-ahead mark comes down to ``end`` (new records there were never delivered).
        Returns how many acknowledged offsets were forgotten."""
        forgotten = max(0, self.mark_delete - end) + self.acked_count_from(end)
        self.mark_delete = min(self.mark_delete, end)
        self.acked.remove_from(end)
        for o in [o for o in self.redeliveries if o >= end]:
            del self.redeliveries[o]
            self._unsaved_bumps.pop(o, None)
        self.counts.trim_from(end)
        mark = max(end, self.mark_delete)
        self.delivered_up_to = min(self.delivered_up_to, mark)
        self.delivered_high = min(self.delivered_high, mark)
        self._requested_mark = min(self._requested_mark, self.delivered_up_to)
        if self.persisted:
            self.gate = min(self.gate, self.delivered_up_to)
        if self.epochs is not None:
            self.epochs.truncate(end)
        self.version += 1
        return forgotten

    def _high(self) -> int:
        return max(self.mark_delete, self.acked.last_end)

    def epoch_to_save(self) -> int:
        """A leader epoch at or above that of the record below the cursor's highest position (-1: none
        known; module docstring)."""
        high = self._high()
        epoch = self.epochs.epoch_below(high) if self.epochs is not None else -1
        if epoch < 0 and 0 < high <= self.epoch_covers:
            epoch = self.leader_epoch
        return epoch

    # ---- the write-ahead delivered mark --------------------------------------------------------------

    def note_delivered(self, high: int, n: int) -> None:
        """``n`` messages went out, the highest below ``high``. Keeps the mark ``lead`` ahead: raised
        when half the lead is used, persisted by the next regular flush (no write of its own)."""
        self.delivered_high = max(self.delivered_high, high)
        self._since_save += n
        if self.persisted and self.delivered_high + (self.lead >> 1) > self.delivered_up_to:
            self.delivered_up_to = self.delivered_high + self.lead
            self.version += 1

    def stall(self, next_offset: int) -> None:
        """The message at ``next_offset`` (and all after it) waits for the gate: ask for a flush now,
        unless one that carries a high enough mark is on its way. Deliveries outran the lead: double it."""
        if self._requested_mark > next_offset:
            return
        if not self.urgent:
            self._peak = max(self._peak, self.lead // 2)
            self.lead = min(self.lead * 2, MAX_LEAD)
        mark = next_offset + self.lead
        if mark > self.delivered_up_to:
            self.delivered_up_to = mark
            self.version += 1
        self.urgent = True

    def recover(self, persisted_mark: int) -> int:
        """A loaded cursor: whatever the previous owner may have delivered (everything unacknowledged
        below its persisted mark) counts once more. Nothing may be sent before the raised counts are
        persisted (the gate starts at mark_delete). Returns how many offsets were counted."""
        md = self.mark_delete
        self.delivered_up_to = self.delivered_high = self._requested_mark = md
        self.gate = md
        if persisted_mark <= md:
            return 0
        for o in self.redeliveries:
            if o < persisted_mark:  # at or above md: acknowledged offsets have no entry
                self.redeliveries[o] += 1
        self.counts.add_one(md, persisted_mark)
        self.version += 1
        return persisted_mark - md - (self.acked_count_from(md) - self.acked_count_from(persisted_mark))

    def settle(self, in_flight: Iterable[int]) -> None:
        """A graceful unload: what is still in flight went back unacknowledged (as if its consumer
        disconnected), so the counts are exact and the mark can fall back to mark_delete: a clean
        stop leaves nothing for the next owner to over-count."""
        if not self.persisted:
            return
        for o in in_flight:
            self.bump_redelivery(o)
        if self.delivered_up_to != self.mark_delete:
            self.delivered_up_to = self.mark_delete
            self.version += 1

    # ---- persistence ---------------------------------------------------------------------------------

    def snapshot(self) -> CursorSnapshot:
        """The cursor as of now. ``acked_ranges`` is the live array, not a copy (a 500,000-range cursor
        is 8 MB): the caller converts it (to a ``sluice.v1.Cursor``) before yielding to the event loop."""
        if self.counts:
            self.counts.trim_below(self.mark_delete)
        self.urgent = False
        self._requested_mark = max(self._requested_mark, self.delivered_up_to)
        return CursorSnapshot(
            self.partition,
            self.mark_delete,
            self.acked.flat,
            dict(self.redeliveries),
            self.version,
            self.delivered_up_to,
            array("q", self.counts.flat),
            self.epoch_to_save(),
        )

    def mark_saved(self, version: int, delivered_up_to: int = 0) -> None:
        """The offset store holds ``version`` (with this mark); later changes keep the cursor dirty.
        Opens the gate up to the mark, releases the counts it covers, adapts the lead to about four
        saves' worth of deliveries (a decaying peak, so one quiet flush does not shrink it)."""
        self.saved_version = max(self.saved_version, version)
        if not self.persisted:
            return
        # Never above the mark in memory: a truncation lowers it while a save of a higher one is on its
        # way, and the gate must not open over offsets the next save no longer covers.
        self.gate = max(self.gate, min(delivered_up_to, self.delivered_up_to))
        if self._unsaved_bumps:
            self._unsaved_bumps = {o: v for o, v in self._unsaved_bumps.items() if v > version}
        self._peak = max(self._since_save, self._peak * 7 // 8)
        self._since_save = 0
        self.lead = min(max(4 * self._peak, MIN_LEAD), MAX_LEAD)

    def nbytes(self) -> int:
        """Approximate memory of the cursor: range bounds plus the redelivery map."""
        return self.acked.nbytes() + len(self.redeliveries) * 100 + len(self.counts) * 24
