"""One subscription's position on one partition: what is acknowledged, and how often things came back.

Pure: no I/O. ``mark_delete`` is the first offset not known to be acknowledged (everything below it
is); ``acked`` holds the individually acknowledged ranges above it; ``redeliveries`` counts, per
unacknowledged offset, how many times it went back to the subscription (nack, ack timeout, consumer
gone). A change bumps ``version``; the cursor store persists a version and reports it back with
``mark_saved``, so ``dirty`` means "something is not in the offset store yet".
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping

from sluice.dispatcher.ranges import AckRanges, runs

__all__ = ["CursorSnapshot", "PartitionCursor"]


class CursorSnapshot:
    """An immutable copy of a cursor for the offset store (taken at flush time)."""

    __slots__ = ("acked_ranges", "mark_delete", "partition", "redelivery_counts", "version")

    def __init__(
        self, partition: int, mark_delete: int, acked_ranges: array[int], counts: dict[int, int], version: int
    ) -> None:
        self.partition = partition
        self.mark_delete = mark_delete
        self.acked_ranges = acked_ranges
        self.redelivery_counts = counts
        self.version = version


class PartitionCursor:
    """Acknowledgement state of one (subscription, partition)."""

    __slots__ = ("acked", "mark_delete", "partition", "redeliveries", "saved_version", "version")

    def __init__(
        self,
        partition: int,
        mark_delete: int = 0,
        acked_ranges: Iterable[int] = (),
        redeliveries: Mapping[int, int] | None = None,
    ) -> None:
        self.partition = partition
        self.mark_delete = mark_delete
        self.acked = AckRanges(acked_ranges)
        self.redeliveries: dict[int, int] = dict(redeliveries or {})
        self.version = 0
        self.saved_version = 0
        # A loaded cursor may hold ranges touching mark_delete (an older writer): normalise.
        self.mark_delete = self.acked.pop_below(mark_delete)

    # ---- queries -------------------------------------------------------------------------------------

    def is_acked(self, offset: int) -> bool:
        return offset < self.mark_delete or offset in self.acked

    @property
    def dirty(self) -> bool:
        return self.version != self.saved_version

    def redelivery_count(self, offset: int) -> int:
        return self.redeliveries.get(offset, 0)

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
        n = self.redeliveries.get(offset, 0) + 1
        self.redeliveries[offset] = n
        self.version += 1
        return n

    def skip_to(self, position: int) -> None:
        """Everything below ``position`` is gone from the log (retention) or was never wanted."""
        if position > self.mark_delete:
            self.ack_range(self.mark_delete, position)

    # ---- persistence ---------------------------------------------------------------------------------

    def snapshot(self) -> CursorSnapshot:
        """The cursor as of now. ``acked_ranges`` is the live array, not a copy (a 500,000-range cursor
        is 8 MB): the caller converts it (to a ``sluice.v1.Cursor``) before yielding to the event loop."""
        return CursorSnapshot(
            self.partition, self.mark_delete, self.acked.flat, dict(self.redeliveries), self.version
        )

    def mark_saved(self, version: int) -> None:
        """The offset store holds ``version``; later changes keep the cursor dirty."""
        self.saved_version = max(self.saved_version, version)

    def nbytes(self) -> int:
        """Approximate memory of the cursor: range bounds plus the redelivery map."""
        return self.acked.nbytes() + len(self.redeliveries) * 100
