"""A new leader's high watermark catching up (KIP-320, docs/replication.md "Consumers across a failover").

A leader elected from the ISR holds every record its predecessor committed, but it learns how far the
followers have them only as they fetch from it: its high watermark starts where it last heard (it may
be below the old leader's) and catches up within a fetch round or two. Meanwhile:

- a consumer asking for an offset above the HW but within the log (it saw the old leader's higher HW)
  gets the retriable ``OFFSET_NOT_AVAILABLE``, not an empty answer, while the HW is below the start of
  the leader's epoch: it waits for the HW instead of taking "nothing there" for an answer, and never
  reads what is not yet committed here;
- ListOffsets (latest, or by timestamp) answers ``OFFSET_NOT_AVAILABLE`` while the HW is below the start
  of the leader's epoch (its log end when elected, which is at least the old leader's HW): a latest offset
  below that could be lower than one the old leader gave, and a reader's end offset (the Spark source's
  ``latestOffset``) must never go backwards.

An offset exactly at the HW still long-polls as before: that is every consumer's steady state.
"""

from __future__ import annotations

from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.leader_state import HighWatermarkView
from sluice.errors import OffsetNotAvailable

__all__ = ["above_high_watermark", "latest_not_available"]


def above_high_watermark(
    key: TopicPartitionKey, view: HighWatermarkView, offset: int
) -> OffsetNotAvailable | None:
    """The error for a consumer's fetch at ``offset``, if it is above the HW and within the log while
    the leader catches up. In the steady state (the HW at or past the start of the leader's epoch) such
    an offset still answers empty and long-polls, as before: nothing the old leader showed can be there."""
    hw = view.high_watermark
    if hw < offset <= view.log_end_offset and _epoch_start(view) > hw:
        return OffsetNotAvailable(
            f"offset {offset} of {key[0]}/{key[1]} is above the high watermark {hw} of the leader in "
            f"epoch {view.state.leader_epoch}, which is catching up: retry",
            topic=key[0],
            partition=key[1],
        )
    return None


def latest_not_available(key: TopicPartitionKey, view: HighWatermarkView) -> OffsetNotAvailable | None:
    """The error for ListOffsets while the leader's HW is below the start of its own epoch."""
    hw = view.high_watermark
    start = _epoch_start(view)
    if hw < start:
        return OffsetNotAvailable(
            f"the high watermark {hw} of {key[0]}/{key[1]} is below the start {start} of leader epoch "
            f"{view.state.leader_epoch}: the new leader is catching up, retry",
            topic=key[0],
            partition=key[1],
        )
    return None


def _epoch_start(view: HighWatermarkView) -> int:
    """Where the leader's latest epoch starts in its log (its log end when it was elected; 0 if none)."""
    entries = view.plog.epoch_entries()
    return entries[-1][1] if entries else 0
