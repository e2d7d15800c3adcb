"""Each subscription type's semantics, on the pure state machine with a fake clock."""

from __future__ import annotations

import pytest

from sluice.dispatcher.model import SubscriptionSettings, SubscriptionType
from sluice.errors import ConsumerBusy, InvalidRequest, SubscriptionTypeMismatch
from tests.unit.dispatcher.context import Ctx

T = SubscriptionType


def test_exclusive_second_consumer_is_busy_and_reconnect_is_idempotent() -> None:
    ctx = Ctx(T.EXCLUSIVE)
    ctx.join("a", permits=10)
    ctx.produce(0, 3)
    with pytest.raises(ConsumerBusy):
        ctx.join("b")
    assert ctx.offsets("a") == [0, 1, 2]
    # The same consumer id again (a reconnect): replaces the old one, its unacked messages come back.
    ctx.join("a", permits=10)
    assert ctx.take("a") == [(0, 0, 0), (0, 1, 0), (0, 2, 0), (0, 0, 1), (0, 1, 1), (0, 2, 1)]
    assert len(ctx.sub.consumers) == 1


def test_type_change_with_connected_consumers_is_refused_but_allowed_when_empty() -> None:
    ctx = Ctx(T.SHARED)
    ctx.join("a")
    with pytest.raises(SubscriptionTypeMismatch):
        ctx.sub.check_join(
            ctx.consumers["a"].spec.__class__(consumer_id="b", name="b"),
            SubscriptionSettings(type=T.FAILOVER),
        )
    ctx.leave("a")
    spec = ctx.consumers["a"].spec.__class__(consumer_id="b", name="b")
    c, _ = ctx.sub.add_consumer(spec, SubscriptionSettings(type=T.FAILOVER), ctx.now)
    assert ctx.sub.settings.type == T.FAILOVER
    assert c.consumer_id == "b"


def test_shared_round_robin_among_consumers_with_permits() -> None:
    ctx = Ctx(T.SHARED)
    ctx.join("a", permits=100)
    ctx.join("b", permits=100)
    ctx.join("c")  # no permits: gets nothing
    ctx.produce(0, 200)
    a, b = ctx.offsets("a"), ctx.offsets("b")
    assert len(a) == 100
    assert len(b) == 100
    assert not ctx.offsets("c")
    assert sorted(a + b) == list(range(200))
    # Both got messages early on: the spread is interleaved, not one consumer first.
    assert min(a) < 50
    assert min(b) < 100


def test_permit_bound_is_never_exceeded() -> None:
    ctx = Ctx(T.SHARED, partitions=(0, 1, 2))
    ctx.join("a", permits=7)
    for p in (0, 1, 2):
        ctx.produce(p, 10)
    assert len(ctx.take("a")) == 7
    ctx.flow("a", 3)
    assert len(ctx.take("a")) == 3
    ctx.produce(0, 10)
    assert ctx.take("a") == []


def test_zero_queue_consumer_with_one_permit_is_served_from_every_partition() -> None:
    ctx = Ctx(T.SHARED, partitions=(0, 1, 2, 3))
    ctx.join("z")
    for p in range(4):
        ctx.produce(p, 5)
    seen = []
    for _ in range(20):
        ctx.flow("z", 1)
        got = ctx.take("z")
        assert len(got) == 1, "exactly one message per permit"
        seen.append(got[0][:2])
        ctx.ack("z", [got[0][:2]])
    assert sorted(seen) == sorted((p, o) for p in range(4) for o in range(5))
    assert {p for p, _ in seen[:4]} == {0, 1, 2, 3}, "partitions take turns"


def test_blocking_at_max_unacked_and_resume_at_half() -> None:
    ctx = Ctx(T.SHARED)
    ctx.join("a", permits=1000, max_unacked=10)
    ctx.produce(0, 100)
    got = ctx.take("a")
    assert len(got) == 10
    assert ctx.consumers["a"].blocked
    ctx.ack("a", [(0, o) for _, o, _ in got[:4]])
    assert ctx.take("a") == []
    assert ctx.consumers["a"].blocked
    ctx.ack("a", [(0, got[4][1])])  # 5 unacked = half: resume
    more = ctx.take("a")
    assert not ctx.consumers["a"].blocked or ctx.consumers["a"].unacked == 10
    assert len(more) == 5, "refilled up to max_unacked again, never beyond"


def test_failover_picks_priority_then_name_spreads_partitions_and_fails_over() -> None:
    ctx = Ctx(T.FAILOVER, partitions=(0, 1, 2, 3))
    ctx.join("b", permits=100, name="b")
    ctx.join("a", permits=100, name="a")
    ctx.join("low", permits=100, name="0-low", priority=5)  # worse priority: standby everywhere
    assert ctx.active["a"] == {0: True, 1: False, 2: True, 3: False}
    assert ctx.active["b"] == {0: False, 1: True, 2: False, 3: True}
    assert not any(ctx.active["low"].values())
    for p in range(4):
        ctx.produce(p, 2)
    assert {p for p, _, _ in ctx.take("a")} == {0, 2}
    assert {p for p, _, _ in ctx.take("b")} == {1, 3}
    # "a" disconnects without acking: "b" takes over its partitions and gets its messages, in order.
    ctx.leave("a")
    assert ctx.active["b"] == {0: True, 1: True, 2: True, 3: True}
    got = ctx.take("b")
    assert [(p, o) for p, o, _ in got] == [(0, 0), (0, 1), (2, 0), (2, 1)] or sorted(got) == sorted(
        [(0, 0, 1), (0, 1, 1), (2, 0, 1), (2, 1, 1)]
    )
    assert all(n == 1 for _, _, n in got)
    ctx.leave("b")
    assert ctx.active["low"] == {0: True, 1: True, 2: True, 3: True}


def test_cumulative_ack_on_exclusive_and_refused_on_shared() -> None:
    ctx = Ctx(T.EXCLUSIVE)
    ctx.join("a", permits=10)
    ctx.produce(0, 10)
    assert ctx.ack("a", [(0, 6)], cumulative=True) == []
    cur = ctx.sub.partitions[0].cursor
    assert cur.mark_delete == 7
    assert ctx.consumers["a"].unacked == 3
    shared = Ctx(T.SHARED)
    shared.join("a", permits=1)
    shared.produce(0, 1)
    with pytest.raises(InvalidRequest):
        shared.ack("a", [(0, 0)], cumulative=True)


def test_acks_of_unknown_and_foreign_ids_are_reported_and_the_rest_applied() -> None:
    ctx = Ctx(T.SHARED)
    ctx.join("a", permits=1)
    ctx.join("b", permits=1)
    ctx.produce(0, 3)
    (a_id,) = [(p, o) for p, o, _ in ctx.take("a")]
    (b_id,) = [(p, o) for p, o, _ in ctx.take("b")]
    bad = ctx.ack("a", [a_id, b_id, (0, 99), (7, 0)])
    assert sorted(bad) == sorted([b_id, (0, 99), (7, 0)])
    assert ctx.consumers["a"].unacked == 0
    assert ctx.consumers["b"].unacked == 1
    assert ctx.ack("a", [a_id]) == [], "a repeated ack is harmless"


def test_nack_redelivers_after_the_delay_with_increasing_count() -> None:
    ctx = Ctx(T.SHARED)
    ctx.join("a", permits=100, nack_delay_ms=1000)
    ctx.produce(0, 2)
    assert ctx.take("a") == [(0, 0, 0), (0, 1, 0)]
    ctx.nack("a", [(0, 0)])
    ctx.advance(999)
    assert ctx.take("a") == []
    ctx.advance(1)
    assert ctx.take("a") == [(0, 0, 1)]
    ctx.nack("a", [(0, 0)])
    ctx.advance(1000)
    assert ctx.take("a") == [(0, 0, 2)]


def test_nack_exponential_backoff_is_capped() -> None:
    ctx = Ctx(T.SHARED)
    ctx.join("a", permits=100, nack_delay_ms=100, nack_backoff_max_ms=350)
    ctx.produce(0, 1)
    ctx.take("a")
    waits = []
    for _ in range(4):
        ctx.nack("a", [(0, 0)])
        waited = 0
        while not ctx.received["a"]:
            ctx.advance(10)
            waited += 10
        ctx.take("a")
        waits.append(waited)
    assert waits == [100, 200, 350, 350]


def test_ack_timeout_redelivers_what_was_never_acked() -> None:
    ctx = Ctx(T.SHARED)
    ctx.join("a", permits=100, ack_timeout_ms=5000)
    ctx.produce(0, 3)
    ctx.take("a")
    ctx.ack("a", [(0, 1)])
    ctx.advance(4999)
    assert ctx.take("a") == []
    ctx.advance(1)
    assert ctx.take("a") == [(0, 0, 1), (0, 2, 1)]
    ctx.advance(5000)
    assert ctx.take("a") == [(0, 0, 2), (0, 2, 2)]


def test_dead_letter_after_max_redeliver_then_acked() -> None:
    ctx = Ctx(T.SHARED)
    ctx.join("a", permits=100, max_redeliver=2)
    ctx.produce(0, 1)
    counts = []
    for _ in range(3):
        (got,) = ctx.take("a")
        counts.append(got[2])
        ctx.nack("a", [(0, 0)])
    assert counts == [0, 1, 2]
    assert ctx.dead == [(0, 0, 3)]
    assert ctx.take("a") == []
    assert ctx.sub.partitions[0].cursor.mark_delete == 1, "dead-lettered then acknowledged"


def test_persisted_count_past_the_limit_goes_straight_to_the_dlq() -> None:
    from sluice.dispatcher.cursor import PartitionCursor

    ctx = Ctx(T.SHARED, cursors={0: PartitionCursor(0, redeliveries={1: 3})})
    ctx.join("a", permits=10, max_redeliver=3)
    ctx.produce(0, 3)
    assert ctx.take("a") == [(0, 0, 0), (0, 1, 3), (0, 2, 0)]  # 3 redeliveries allowed: still delivered
    ctx.nack("a", [(0, 1)])
    assert ctx.dead == [(0, 1, 4)]


def test_disconnect_returns_unacked_first_in_offset_order() -> None:
    ctx = Ctx(T.SHARED)
    ctx.join("a", permits=3)
    ctx.produce(0, 6)
    ctx.ack("a", [(0, 1)])
    ctx.leave("a")
    ctx.join("b", permits=10)
    assert ctx.take("b") == [(0, 0, 1), (0, 2, 1), (0, 3, 0), (0, 4, 0), (0, 5, 0)]


def test_filter_skips_and_acknowledges_non_matching_records() -> None:
    ctx = Ctx(T.SHARED, filter="red || blue")
    ctx.join("a", permits=100)
    ctx.produce(0, 6, tags=["red", "green", None, "blue", "green", "red"])
    assert ctx.offsets("a") == [0, 3, 5]
    ctx.ack("a", [(0, 0), (0, 3), (0, 5)])
    assert ctx.sub.partitions[0].cursor.mark_delete == 6


def test_restarted_cursor_with_holes_redelivers_exactly_the_unacked() -> None:
    from sluice.dispatcher.cursor import PartitionCursor

    cur = PartitionCursor(0)
    cur.ack_sorted(range(1, 2000, 2))
    ctx = Ctx(T.SHARED, cursors={0: cur})
    ctx.next_offset[0] = 0  # the feed reads the log again from mark_delete
    ctx.join("a", permits=10_000)
    ctx.produce(0, 2000)
    assert ctx.offsets("a") == list(range(0, 2000, 2))
