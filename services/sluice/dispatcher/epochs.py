"""The leader epochs of a partition's log as a dispatcher feed read it (KIP-320). Pure: no I/O.

Every batch carries the epoch of the leader that appended it (docs/replication.md, "Leader epochs in the
log"). A feed notes, per epoch, the first offset it read in it (a small copy of the log's own epoch cache,
for the part the feed has seen), and ``end``, past the last record it read. Two things need it: the feed's
own check after a leader change (``latest``, the epoch of the last record it read: epochs only grow along
the log), and the cursors that persist an epoch with their position (``PartitionCursor.epoch_to_save``),
which a dispatcher loading the cursor checks against the current leader.

*Decision:* a cursor below ``end`` persists ``latest``, not ``epoch_at`` its position. ``epoch_at`` is exact
only where the feed read every batch, and a feed jumps (it reads from the lowest position that wants
records, and a subscription joining lower makes it read below what it read before): for an offset in a
gap it can answer an epoch older than the record's, and an older epoch can report a truncation that did
not happen (its end is below the record). A later epoch never does (every record below the position sits
in an epoch at or below it, so that epoch ends at or past the position); it can only miss a truncation in
corner cases, the same trade the SDK consumer's commits make (docs/replication.md).

Only a batch of a newer epoch than the last one noted costs anything (``note_views``, once per leader
change); the feed compares the last batch of each answer with ``latest``: two comparisons per answer.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from sluice.codec.batch import BatchView

__all__ = ["MAX_EPOCHS", "EpochTrail"]

#: Epochs kept; the oldest go first (a cursor that far behind falls back to the epoch it was loaded with).
MAX_EPOCHS = 256


class EpochTrail:
    """``(epoch, first offset read in it)``, both strictly increasing."""

    __slots__ = ("_epochs", "_starts", "end")

    def __init__(self) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        #: Past the last record read (the highest answer end); every epoch noted is of records below it.
        self.end = 0

    def __len__(self) -> int:
        return len(self._epochs)

    @property
    def latest(self) -> int:
        """The newest epoch read (-1: none)."""
        return self._epochs[-1] if self._epochs else -1

    def note(self, epoch: int, start: int) -> None:
        """Records of ``epoch`` were read from ``start`` on. An epoch not newer than the latest changes
        nothing (a feed reading again below what it read, for a subscription left behind)."""
        if epoch <= self.latest or (self._starts and start < self._starts[-1]):
            return
        self._epochs.append(epoch)
        self._starts.append(start)
        if len(self._epochs) > MAX_EPOCHS:
            del self._epochs[0], self._starts[0]

    def note_views(self, views: Sequence[BatchView]) -> None:
        """The batches of one answer, in offset order."""
        for v in views:
            h = v.header
            if h.partition_leader_epoch > self.latest:
                self.note(h.partition_leader_epoch, h.base_offset)

    def epoch_at(self, offset: int) -> int:
        """The epoch of the record at ``offset`` as read (-1: before anything noted)."""
        k = bisect_right(self._starts, offset)
        return self._epochs[k - 1] if k else -1

    def epoch_below(self, position: int) -> int:
        """The epoch a cursor at ``position`` persists: ``latest`` if the feed read past it, else -1
        (module docstring)."""
        return self.latest if 0 < position <= self.end else -1

    def truncate(self, end: int) -> None:
        """The log was truncated at ``end``: epochs first read at or above it are forgotten."""
        k = bisect_left(self._starts, end)
        del self._epochs[k:], self._starts[k:]
        self.end = min(self.end, end)
