"""A log truncated under a subscription (KIP-320): the feed's epoch trail, the cursor, the state machine.

The state-machine tests drive ``truncate_partition`` as the runtime does when a feed finds the truncation
point; the integration test (tests/integration/dispatcher/test_leader_epochs.py) produces a real one.
"""

from __future__ import annotations

from sluice.codec.batch import BatchBuilder, batch_views, stamp
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.epochs import MAX_EPOCHS, EpochTrail
from sluice.dispatcher.model import SubscriptionType
from sluice.dispatcher.ranges import CountRanges
from sluice.dispatcher.truncation import truncate_partition
from tests.unit.dispatcher.context import Ctx


def _batch(base: int, n: int, epoch: int) -> bytes:
    builder = BatchBuilder()
    for i in range(n):
        builder.append(b"v%d" % i, None, None, None, 1000 + i)
    raw = bytearray(builder.build())
    stamp(raw, 0, base, 1, epoch)
    return bytes(raw)


# ---- the trail --------------------------------------------------------------------------------------


def test_the_trail_notes_where_each_epoch_was_first_read() -> None:
    trail = EpochTrail()
    trail.note_views(batch_views(_batch(0, 5, 1) + _batch(5, 5, 1) + _batch(10, 3, 3)))
    trail.note_views(batch_views(_batch(13, 2, 4)))
    assert [trail.epoch_at(o) for o in (0, 9, 10, 12, 13, 99)] == [1, 1, 3, 3, 4, 4]
    assert trail.epoch_at(-1) == -1
    # Read again below (a subscription left behind): older epochs change nothing.
    trail.note_views(batch_views(_batch(0, 5, 1)))
    assert (len(trail), trail.latest) == (3, 4)
    trail.truncate(11)
    assert (trail.latest, trail.epoch_at(12)) == (3, 3)
    trail.truncate(10)
    assert (trail.latest, trail.epoch_at(12)) == (1, 1)
    trail.note(6, 10)  # the new leader's records from the truncation point
    assert trail.epoch_at(10) == 6


def test_the_trail_is_bounded() -> None:
    trail = EpochTrail()
    for e in range(MAX_EPOCHS + 10):
        trail.note(e, e * 10)
    assert len(trail) == MAX_EPOCHS
    assert trail.epoch_at(0) == -1  # forgotten: the cursor falls back to its own epoch
    assert trail.epoch_at(10 * (MAX_EPOCHS + 9)) == MAX_EPOCHS + 9


# ---- the cursor -------------------------------------------------------------------------------------


def test_count_ranges_trim_from() -> None:
    c = CountRanges([0, 5, 1, 8, 12, 2, 20, 30, 1])
    c.trim_from(10)
    assert list(c.flat) == [0, 5, 1, 8, 10, 2]
    c.trim_from(8)
    assert list(c.flat) == [0, 5, 1]
    c.trim_from(0)
    assert not c


def test_a_truncated_cursor_forgets_acks_counts_and_marks_above_the_end() -> None:
    cur = PartitionCursor(0, 10, [12, 15, 20, 25], {11: 2, 16: 3}, count_ranges=[11, 30, 1], persisted=True)
    cur.note_delivered(30, 10)
    snap = cur.snapshot()
    cur.mark_saved(snap.version, snap.delivered_up_to)
    assert cur.gate > 14
    forgotten = cur.truncate(14)
    assert forgotten == 1 + 5  # 14 and 20..24 were acknowledged (12 and 13 stay: below the end)
    assert (cur.mark_delete, list(cur.acked.flat)) == (10, [12, 14])
    assert cur.redeliveries == {11: 2}
    assert list(cur.counts.flat) == [11, 14, 1]
    assert cur.delivered_up_to == cur.gate == 14  # new records at 14.. were never delivered
    # A save of the older, higher mark landing now does not open the gate above the new mark.
    cur.mark_saved(snap.version, snap.delivered_up_to)
    assert cur.gate == 14


def test_a_truncation_below_mark_delete_moves_it_back() -> None:
    cur = PartitionCursor(0, 100, [105, 110])
    assert cur.truncate(90) == 10 + 5
    assert (cur.mark_delete, list(cur.acked.flat)) == (90, [])


def test_the_epoch_saved_is_never_older_than_the_record_below_the_position() -> None:
    """The loaded epoch vouches up to the loaded position; the feed's latest up to what it read; above
    both, no epoch (unchecked) rather than one that could be older than the record's."""
    cur = PartitionCursor(0, 10, leader_epoch=2)
    assert cur.snapshot().leader_epoch == 2  # loaded at 10 in epoch 2
    cur.ack_range(10, 15)
    assert cur.epoch_to_save() == -1  # 14 was not read in epoch 2 for sure, and no feed read it
    trail = EpochTrail()
    trail.note(3, 5)
    trail.note(5, 20)
    trail.end = 30
    cur.epochs = trail
    assert cur.epoch_to_save() == 5  # the feed read past 15: its latest epoch is at or above the record's
    cur.ack_range(15, 31)
    assert cur.snapshot().leader_epoch == -1  # above what the feed read
    fresh = PartitionCursor(0)
    assert fresh.epoch_to_save() == -1  # nothing read


def test_a_feed_that_jumped_does_not_vouch_an_older_epoch_for_a_gap() -> None:
    """The trail's epoch at an offset the feed never read can be older than the record's; the cursor does
    not use it (it would report a truncation that did not happen)."""
    trail = EpochTrail()
    trail.note(3, 0)  # read 0..100 in epoch 3
    trail.note(5, 500)  # then 500..600 for another subscription; 100..500 (epoch 4, say) never read
    trail.end = 600
    cur = PartitionCursor(0, 300)
    cur.epochs = trail
    assert trail.epoch_at(299) == 3
    assert cur.epoch_to_save() == 5


# ---- the state machine ------------------------------------------------------------------------------


def test_messages_of_the_truncated_records_are_dropped_in_every_state_and_not_sent_again() -> None:
    ctx = Ctx(SubscriptionType.SHARED)
    ctx.join("a", permits=6)
    ctx.produce(0, 10)  # 0..5 in flight at a, 6..9 pending
    ctx.ack("a", [(0, 0), (0, 1)])
    assert not ctx.nack("a", [(0, 4)])  # back for redelivery
    ps = ctx.sub.partitions[0]
    a = ctx.consumers["a"]
    held_before = ps.held_bytes
    assert held_before > 0
    dropped, forgotten = truncate_partition(ctx.sub, 0, 3)
    # 3 and 5 in flight, 4 to be redelivered, 6..9 pending; 2 in flight stays (below the end).
    assert (dropped, forgotten) == (7, 0)
    assert sorted(ps.inflight) == [2]
    assert sorted(a.inflight[0]) == [2]
    assert a.unacked == 1
    assert not ps.replay
    assert not ps.pending
    assert ps.read_position == 3
    assert 0 < ps.held_bytes < held_before
    # An ack of a dropped message is refused (its record is gone); the kept one is accepted.
    assert ctx.ack("a", [(0, 3)]) == [(0, 3)]
    assert not ctx.ack("a", [(0, 2)])
    # The new leader's records at 3.. are delivered; nothing of the old log comes back.
    ctx.take("a")
    ctx.flow("a", 10)
    ctx.next_offset[0] = 3
    ctx.produce(0, 4)
    assert [o for _, o, _ in ctx.take("a")] == [3, 4, 5, 6]
    assert ps.cursor.mark_delete == 3


def test_acknowledged_records_above_the_end_are_forgotten_and_read_again() -> None:
    ctx = Ctx(SubscriptionType.SHARED)
    ctx.join("a", permits=10)
    ctx.produce(0, 10)
    ctx.ack_all("a")
    ps = ctx.sub.partitions[0]
    assert ps.cursor.mark_delete == 10
    assert truncate_partition(ctx.sub, 0, 6) == (0, 4)
    assert (ps.cursor.mark_delete, ps.read_position) == (6, 6)
    ctx.take("a")
    ctx.flow("a", 10)
    ctx.next_offset[0] = 6
    ctx.produce(0, 2)
    assert [o for _, o, _ in ctx.take("a")] == [6, 7]


def test_key_shared_holds_are_released_with_the_dropped_messages() -> None:
    ctx = Ctx(SubscriptionType.KEY_SHARED)
    ctx.join("a", permits=10)
    ctx.produce(0, 4, keys=[b"k"] * 4)
    assert ctx.sub.hash_held
    truncate_partition(ctx.sub, 0, 0)
    assert not ctx.sub.hash_held
    assert not ctx.sub.hash_holder


def test_an_unknown_partition_or_a_truncation_above_everything_changes_nothing() -> None:
    ctx = Ctx(SubscriptionType.SHARED)
    ctx.join("a", permits=10)
    ctx.produce(0, 5)
    assert truncate_partition(ctx.sub, 7, 0) == (0, 0)
    assert truncate_partition(ctx.sub, 0, 5) == (0, 0)
    assert sorted(ctx.sub.partitions[0].inflight) == [0, 1, 2, 3, 4]
