"""Acks and nacks that name a leader epoch (``ack_epochs.py``; docs/dispatcher.md, "Acks across a
truncation"): a late ack of a record an unclean election truncated away must not settle the new record
the new leader wrote at its offset.

Each test drives the state machine as ``DispatcherService.ack``/``nack`` do: the claims first
(``refuse_stale``), then the machine with what is left. The log is truncated with ``truncate_partition``
as the runtime does when the feed finds the truncation point; the integration test
(tests/integration/dispatcher/test_leader_epochs.py) produces a real one with real brokers.
"""

from __future__ import annotations

from sluice.dispatcher.ack_epochs import Claim, refuse_stale, unknown_ids
from sluice.dispatcher.convert import epoch_claims
from sluice.dispatcher.model import SubscriptionType
from sluice.dispatcher.requests import ack_offsets
from sluice.dispatcher.truncation import truncate_partition
from sluice.v1 import dispatcher_pb2 as pb
from tests.unit.dispatcher.context import Ctx

Ids = list[tuple[int, int]]


def ack(ctx: Ctx, cid: str, claims: list[Claim], cumulative: bool = False) -> tuple[Ids, Ids]:
    """Ack every offset of ``claims`` (partition, epoch, bounds) as the SDK does; (refused, bad)."""
    c = ctx.consumers[cid]
    ids = ack_offsets({}, [(p, b) for p, _, b in claims])
    if cumulative:
        ids = {p: [max(o)] for p, o in ids.items()}
    refused = refuse_stale(ctx.sub, c, ids, claims, cumulative)
    fx, bad = ctx.sub.ack(c, ids, cumulative, ctx.now)
    ctx.apply(fx)
    return refused, bad


def nack(ctx: Ctx, cid: str, claims: list[Claim]) -> tuple[Ids, Ids]:
    c = ctx.consumers[cid]
    ids = ack_offsets({}, [(p, b) for p, _, b in claims])
    refused = refuse_stale(ctx.sub, c, ids, claims)
    fx, bad = ctx.sub.nack(c, ids, ctx.now)
    ctx.apply(fx)
    return refused, bad


def rewritten(kind: SubscriptionType = SubscriptionType.SHARED) -> Ctx:
    """Consumer a got 0..4 in epoch 1 and acked 0 and 1; an unclean election truncated 2..4, and the new
    leader's records at 2..4 (epoch 2) went to a too."""
    ctx = Ctx(kind)
    ctx.join("a", permits=10)
    ctx.produce(0, 5, epoch=1)
    assert ack(ctx, "a", [(0, 1, [0, 2])]) == ([], [])
    truncate_partition(ctx.sub, 0, 2)
    ctx.next_offset[0] = 2
    ctx.take("a")
    ctx.produce(0, 3, epoch=2)
    assert [o for _, o, _ in ctx.take("a")] == [2, 3, 4]
    return ctx


def test_a_late_ack_of_a_truncated_record_leaves_the_new_record_unacknowledged_and_it_is_delivered() -> None:
    ctx = rewritten()
    ps = ctx.sub.partitions[0]
    # The old 2..4 acked late, in epoch 1, as one range (the SDK's ack group): refused, nothing settled.
    assert ack(ctx, "a", [(0, 1, [2, 5])]) == ([(0, 2), (0, 3), (0, 4)], [])
    assert sorted(ps.inflight) == [2, 3, 4]
    assert ps.cursor.mark_delete == 2
    assert ctx.consumers["a"].unacked == 3
    # a leaves without acking the new records: they go to the next consumer.
    ctx.leave("a")
    ctx.join("b", permits=10)
    assert [o for _, o, _ in ctx.take("b")] == [2, 3, 4]
    # Acked in their own epoch, they are settled.
    assert ack(ctx, "b", [(0, 2, [2, 5])]) == ([], [])
    assert ps.cursor.mark_delete == 5


def test_an_ack_in_the_records_epoch_and_an_ack_without_an_epoch_are_applied() -> None:
    ctx = rewritten()
    ps = ctx.sub.partitions[0]
    assert ack(ctx, "a", [(0, 2, [2, 4])]) == ([], [])  # the usual group: two lookups
    assert ack(ctx, "a", []) == ([], [])
    assert not ctx.ack("a", [(0, 4)])  # an older client: no epoch, not checked (as before)
    assert ps.cursor.mark_delete == 5


def test_a_group_spanning_the_truncation_point_settles_only_the_records_of_its_epoch() -> None:
    ctx = Ctx(SubscriptionType.SHARED)
    ctx.join("a", permits=10)
    ctx.produce(0, 4, epoch=1)
    truncate_partition(ctx.sub, 0, 2)  # 0 and 1 kept (epoch 1, in flight), 2 and 3 gone
    ctx.next_offset[0] = 2
    ctx.produce(0, 2, epoch=2)
    refused, bad = ack(ctx, "a", [(0, 1, [0, 4])])
    assert (refused, bad) == ([(0, 2), (0, 3)], [])
    assert sorted(ctx.sub.partitions[0].inflight) == [2, 3]
    assert ctx.sub.partitions[0].cursor.mark_delete == 2


def test_a_late_nack_of_a_truncated_record_is_refused_and_the_new_record_stays_in_flight() -> None:
    ctx = rewritten()
    ps = ctx.sub.partitions[0]
    assert nack(ctx, "a", [(0, 1, [3, 4])]) == ([(0, 3)], [])
    assert ps.inflight.get(3) is ctx.consumers["a"]
    assert ps.cursor.redelivery_count(3) == 0
    assert nack(ctx, "a", [(0, 2, [3, 4])]) == ([], [])
    assert ps.cursor.redelivery_count(3) == 1


def test_a_late_cumulative_ack_of_a_truncated_record_is_refused_whole() -> None:
    ctx = rewritten(SubscriptionType.EXCLUSIVE)
    ps = ctx.sub.partitions[0]
    assert ack(ctx, "a", [(0, 1, [4, 5])], cumulative=True) == ([(0, 4)], [])
    assert sorted(ps.inflight) == [2, 3, 4]
    # Above everything held (say 9, never delivered here) in epoch 1: records of epoch 2 below it.
    c = ctx.consumers["a"]
    ids = {0: [9]}
    assert refuse_stale(ctx.sub, c, ids, [(0, 1, [9, 10])], cumulative=True) == [(0, 9)]
    assert ids == {}
    assert ack(ctx, "a", [(0, 2, [3, 4])], cumulative=True) == ([], [])
    assert sorted(ps.inflight) == [4]
    assert ps.cursor.mark_delete == 4


def test_claims_are_read_from_ids_and_ranges_with_an_epoch_only() -> None:
    a = pb.Ack(
        ids=[pb.MessageId(partition=1, offset=7, leader_epoch=0), pb.MessageId(partition=1, offset=9)],
        ranges=[
            pb.OffsetRanges(partition=0, bounds=[2, 5], leader_epoch=3),
            pb.OffsetRanges(partition=0, bounds=[8, 9]),
        ],
    )
    assert epoch_claims(a.ids, a.ranges) == [(0, 3, [2, 5]), (1, 0, [7, 8])]


def test_the_error_names_refused_ids_apart_from_unknown_ones() -> None:
    err = unknown_ids([(0, 9)], [(0, 2)], "acknowledge")
    assert "1 message id(s) not delivered to this consumer" in str(err)
    assert "of a leader epoch whose record at that offset was truncated" in str(err)
