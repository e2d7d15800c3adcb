"""Redelivery counts that survive a crash, in the pure state machine (fake clock, no I/O).

A "save" here is what the cursor store does: snapshot every cursor, then ``mark_saved`` with the
snapshot's version and mark, then ``Subscription.cursors_saved``. A "crash" is rebuilding the
subscription from the last *saved* snapshot only, as ``CursorStore.load`` would.
"""

from __future__ import annotations

from array import array

import pytest

from sluice.dispatcher.cursor import MAX_LEAD, MIN_LEAD, CursorSnapshot, PartitionCursor
from sluice.dispatcher.model import SubscriptionType
from sluice.dispatcher.ranges import CountRanges
from tests.unit.dispatcher.context import Ctx


def save(ctx: Ctx) -> dict[int, CursorSnapshot]:
    """Persist every cursor (the service's flush) and let what waited for it go."""
    snaps = {}
    for p, ps in ctx.sub.partitions.items():
        snap = ps.cursor.snapshot()
        ps.cursor.mark_saved(snap.version, snap.delivered_up_to)
        # The store serializes at once; the live ranges array must not be kept.
        snap.acked_ranges = array("q", snap.acked_ranges)
        snaps[p] = snap
    ctx.apply(ctx.sub.cursors_saved(ctx.now))
    return snaps


def reload(snap: CursorSnapshot, log_end: int | None = None) -> PartitionCursor:
    """What the next dispatcher loads after a kill -9 (``CursorStore.load``)."""
    cur = PartitionCursor(
        snap.partition,
        snap.mark_delete,
        snap.acked_ranges,
        snap.redelivery_counts,
        count_ranges=snap.redelivery_ranges,
        persisted=True,
    )
    mark = snap.delivered_up_to if log_end is None else min(snap.delivered_up_to, log_end)
    cur.recover(mark)
    return cur


def durable_ctx(
    kind: SubscriptionType = SubscriptionType.SHARED, cursor: PartitionCursor | None = None
) -> Ctx:
    return Ctx(kind, cursors={0: cursor or PartitionCursor(0, persisted=True)})


# ---- CountRanges --------------------------------------------------------------------------------------


def test_count_ranges_add_one_splits_and_merges() -> None:
    r = CountRanges()
    r.add_one(10, 20)
    assert list(r.flat) == [10, 20, 1]
    r.add_one(15, 30)  # overlaps the end: [10,15)x1 [15,20)x2 [20,30)x1
    assert list(r.flat) == [10, 15, 1, 15, 20, 2, 20, 30, 1]
    assert [r.count_at(o) for o in (9, 10, 14, 15, 19, 20, 29, 30)] == [0, 1, 1, 2, 2, 1, 1, 0]
    r.add_one(10, 15)  # equal neighbours merge
    assert list(r.flat) == [10, 20, 2, 20, 30, 1]
    r.trim_below(25)
    assert list(r.flat) == [25, 30, 1]
    r.trim_below(30)
    assert not r
    assert r.count_at(29) == 0


def test_count_ranges_stay_few_over_many_crashes() -> None:
    r = CountRanges()
    for k in range(50):  # 50 crashes, each window a little further on
        r.add_one(k * 10, 1000 + k * 10)
    assert len(r) <= 2 * 50 + 1
    assert (r.count_at(999), r.count_at(1485), r.count_at(1490)) == (50, 1, 0)


@pytest.mark.parametrize("flat", [[1, 2], [5, 5, 1], [1, 3, 0], [1, 5, 1, 4, 8, 1]])
def test_count_ranges_reject_bad_input(flat: list[int]) -> None:
    with pytest.raises(ValueError, match="redelivery range"):
        CountRanges(flat)


# ---- the cursor -----------------------------------------------------------------------------------


def test_recover_counts_every_unacked_offset_below_the_mark_once() -> None:
    cur = PartitionCursor(0, 10, [12, 14], {11: 3}, count_ranges=[10, 12, 1], persisted=True)
    assert cur.recover(20) == 8  # [10, 20) minus the acked 12, 13
    assert [cur.redelivery_count(o) for o in range(10, 22)] == [2, 4, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]
    assert (cur.gate, cur.dirty) == (10, True), "nothing goes out before the raised counts are persisted"
    assert cur.delivered_up_to == 10, "the new owner starts its own window"


def test_recover_without_a_mark_changes_nothing() -> None:
    cur = PartitionCursor(0, 10, redeliveries={11: 3}, persisted=True)
    assert (cur.recover(0), cur.recover(10)) == (0, 0)
    assert (cur.redelivery_count(11), cur.dirty) == (3, False)


# ---- the subscription: the write-ahead mark ------------------------------------------------------


def test_nothing_is_delivered_beyond_the_persisted_mark() -> None:
    ctx = durable_ctx()
    ctx.join("a", permits=1000)
    ctx.produce(0, 10)
    assert ctx.take("a") == [], "the mark is not persisted yet"
    assert ctx.sub.partitions[0].cursor.urgent, "a flush is asked for at once"
    snaps = save(ctx)
    assert snaps[0].delivered_up_to >= 10
    assert [o for _, o, _ in ctx.take("a")] == list(range(10))
    # Within the lead new records flow without waiting for a save.
    ctx.produce(0, 20)
    assert len(ctx.take("a")) == 20


def test_kill_9_after_delivery_counts_each_unacked_message_once() -> None:
    ctx = durable_ctx()
    ctx.join("a", permits=1000)
    ctx.produce(0, 100)
    snap = save(ctx)[0]
    assert len(ctx.take("a")) == 100
    ctx.ack("a", [(0, o) for o in range(0, 100, 2)])
    # Killed before the acks or the raised mark were saved: only `snap` survives.
    again = durable_ctx(cursor=reload(snap, log_end=100))
    again.join("b", permits=1000)
    again.produce(0, 100)
    assert again.take("b") == [], "raised counts first"
    save(again)
    got = again.take("b")
    assert [(o, n) for _, o, n in got] == [(o, 1) for o in range(100)], (
        "unsaved acks: delivered again, counted"
    )


def test_records_past_the_log_end_at_load_are_not_counted() -> None:
    ctx = durable_ctx()
    ctx.join("a", permits=1000)
    ctx.produce(0, 5)
    snap = save(ctx)[0]
    assert snap.delivered_up_to > 5, "the mark runs ahead of the deliveries"
    again = durable_ctx(cursor=reload(snap, log_end=5))
    again.join("b", permits=1000)
    again.produce(0, 8)
    save(again)
    assert [n for _, _, n in again.take("b")] == [1] * 5 + [0] * 3


def test_a_raised_count_is_persisted_before_the_message_goes_again() -> None:
    ctx = durable_ctx()
    ctx.join("a", permits=10, nack_delay_ms=0)
    ctx.produce(0, 2)
    save(ctx)
    ctx.take("a")
    ctx.nack("a", [(0, 0)])
    assert ctx.take("a") == [], "count 1 is not in the offset store yet"
    snap = save(ctx)[0]
    assert snap.redelivery_counts == {0: 1}
    assert ctx.take("a") == [(0, 0, 1)]
    # Crash now: it was sent with count 1 and never acked -> 2.
    assert reload(snap).redelivery_count(0) == 2


def test_nack_delay_still_applies_after_the_save() -> None:
    ctx = durable_ctx()
    ctx.join("a", permits=10, nack_delay_ms=1000)
    ctx.produce(0, 1)
    save(ctx)
    ctx.take("a")
    ctx.nack("a", [(0, 0)])
    save(ctx)
    assert ctx.take("a") == [], "the save does not cut the nack delay short"
    ctx.advance(1000)
    assert ctx.take("a") == [(0, 0, 1)]


def test_key_shared_waits_at_the_mark_too() -> None:
    ctx = durable_ctx(SubscriptionType.KEY_SHARED)
    ctx.join("a", permits=100)
    ctx.produce(0, 4, keys=[b"k1", b"k2", b"k1", b"k2"])
    assert ctx.take("a") == []
    save(ctx)
    assert [o for _, o, _ in ctx.take("a")] == [0, 1, 2, 3]


def test_max_redeliver_reached_by_crashes_alone_goes_to_the_dlq() -> None:
    cursor = PartitionCursor(0, persisted=True)
    for crash in range(3):
        ctx = durable_ctx(cursor=cursor)
        ctx.join("a", permits=10, max_redeliver=2)
        ctx.produce(0, 1)
        save(ctx)
        assert ctx.take("a") == [(0, 0, crash)]
        cursor = reload(save(ctx)[0])
    ctx = durable_ctx(cursor=cursor)
    ctx.auto_dlq = False
    ctx.join("a", permits=10, max_redeliver=2)
    ctx.produce(0, 1)
    save(ctx)
    assert ctx.take("a") == []
    assert ctx.dead == [(0, 0, 3)]


def test_a_graceful_unload_leaves_exact_counts() -> None:
    ctx = durable_ctx()
    ctx.join("a", permits=10)
    ctx.produce(0, 3)
    save(ctx)
    ctx.take("a")
    ctx.ack("a", [(0, 1)])
    ctx.sub.close()  # the service persists the cursors right after
    snap = ctx.sub.partitions[0].cursor.snapshot()
    assert snap.redelivery_counts == {0: 1, 2: 1}, "in flight at the stop: returned, as on a disconnect"
    assert snap.delivered_up_to == snap.mark_delete, "nothing left for the next owner to count again"
    cur = reload(snap)
    assert [cur.redelivery_count(o) for o in (0, 2)] == [1, 1]


# ---- the write cost ---------------------------------------------------------------------------------


@pytest.mark.parametrize("per_ms", [1, 20, 100])
def test_a_steady_stream_adds_no_writes_and_bounds_the_over_count(per_ms: int) -> None:
    """Records arrive at ``per_ms`` a millisecond and are acked at once; the service flushes every
    100 ms. After a short warm-up no delivery ever waits for a save (so no save beyond the regular
    flushes), and the mark never runs more than the lead ahead of what was delivered."""
    ctx = durable_ctx()
    ctx.join("a", permits=1 << 30, max_unacked=1 << 30)
    cursor = ctx.sub.partitions[0].cursor
    stalled_flushes = 0
    for ms in range(1, 3001):
        ctx.now = ms
        ctx.produce(0, per_ms)
        got = ctx.take("a")
        if got:
            ctx.ack("a", [(p, o) for p, o, _ in got])
        urgent = cursor.urgent
        if ms % 100 == 0 or urgent:
            if urgent and ms > 1000:
                stalled_flushes += 1
            save(ctx)
            ctx.ack("a", [(p, o) for p, o, _ in ctx.take("a")])
        # What a crash now would over-count: a few flushes' worth of deliveries at most.
        assert cursor.delivered_up_to - cursor.delivered_high <= max(2 * MIN_LEAD, 8 * 100 * per_ms)
        assert MIN_LEAD <= cursor.lead <= MAX_LEAD
    assert stalled_flushes == 0, "after the warm-up the lead keeps ahead of a steady stream"
    assert not ctx.sub.partitions[0].pending
    # The lead follows the rate: about four flushes' worth, no more.
    assert cursor.lead <= max(MIN_LEAD, 8 * 100 * per_ms)
