"""Protobuf <-> the core's values: commands and operator requests to ``requests.py`` types, the
core's answers (``answers.py``) back to protobuf. Translation only: nothing here checks a value;
the core does (``requests.consumer_spec``, ``requests.ack_offsets``, ``subadmin.py``). Caller: the
servicer, for both transports."""

from __future__ import annotations

from typing import Any

from sluice.dispatcher.answers import (
    DeleteResult,
    PartitionPosition,
    PeekedMessage,
    ResetResult,
    SkipResult,
    SubscriptionDescription,
    SubscriptionSummary,
)
from sluice.dispatcher.parkadmin import ParkedKeyInfo
from sluice.dispatcher.requests import DeleteRequest, PeekRequest, ResetRequest, SkipRequest, SubscribeRequest
from sluice.v1 import dispatcher_pb2 as pb

__all__ = [
    "ack_ranges",
    "by_partition",
    "delete_from_proto",
    "delete_to_proto",
    "describe_to_proto",
    "epoch_claims",
    "list_to_proto",
    "parked_to_proto",
    "peek_from_proto",
    "peek_to_proto",
    "reset_from_proto",
    "reset_to_proto",
    "skip_from_proto",
    "skip_to_proto",
    "subscribe_from_proto",
]


def subscribe_from_proto(req: pb.Subscribe) -> SubscribeRequest:
    policy = req.key_shared_policy
    return SubscribeRequest(
        topic=req.topic,
        subscription=req.subscription,
        type=req.type,
        consumer_id=req.consumer_id,
        consumer_name=req.consumer_name,
        priority=req.priority,
        initial_position=req.initial_position,
        initial_offset=req.initial_offset,
        durable=req.durable,
        filter=req.filter,
        sticky=policy.mode == pb.KEY_SHARED_MODE_STICKY,
        sticky_ranges=tuple(policy.ranges),
        max_unacked=req.max_unacked,
        ack_timeout_ms=req.ack_timeout_ms,
        nack_delay_ms=req.nack_delay_ms,
        max_redeliver=req.max_redeliver,
        partitions=tuple(req.partitions),
        record_batches=req.record_batches,
        park_after=req.park_after,
        park_hold=req.park_hold,
        park_max_messages=req.park_max_messages,
        park_max_bytes=req.park_max_bytes,
    )


def parked_to_proto(keys: list[ParkedKeyInfo]) -> pb.ListParkedKeysResponse:
    return pb.ListParkedKeysResponse(
        keys=[
            pb.ParkedKey(
                key=k.key,
                state=k.state,
                since_ms=k.since_ms,
                head_partition=k.head_partition,
                head_offset=k.head_offset,
                head_redelivery_count=k.head_redelivery_count,
                waiting=k.waiting,
                dispatcher_id=k.dispatcher_id,
            )
            for k in keys
        ]
    )


def by_partition(ids: Any) -> dict[int, list[int]]:
    """Group ``MessageId``s by partition (two C-level comprehensions in the usual one-partition case)."""
    if not ids:
        return {}
    partitions = {i.partition for i in ids}
    if len(partitions) == 1:
        return {partitions.pop(): [i.offset for i in ids]}
    out: dict[int, list[int]] = {p: [] for p in partitions}
    for i in ids:
        out[i.partition].append(i.offset)
    return out


def ack_ranges(ack: pb.Ack) -> list[tuple[int, list[int]]]:
    """An ``Ack``'s ranges as ``(partition, bounds)``, unchecked."""
    return [(r.partition, list(r.bounds)) for r in ack.ranges]


def epoch_claims(ids: Any, ranges: Any = ()) -> list[tuple[int, int, list[int]]]:
    """The leader epochs an ``Ack``'s or ``Nack``'s ids and ranges name (``ack_epochs.Claim``): one
    claim per ``OffsetRanges`` with an epoch, one per partition and epoch of the ids with one; none
    from an older client (nothing is checked then)."""
    out = [(r.partition, r.leader_epoch, list(r.bounds)) for r in ranges if r.HasField("leader_epoch")]
    by: dict[tuple[int, int], list[int]] = {}
    for i in ids:
        if i.HasField("leader_epoch"):
            by.setdefault((i.partition, i.leader_epoch), []).extend((i.offset, i.offset + 1))
    out += [(p, e, b) for (p, e), b in by.items()]
    return out


# ---- describe -------------------------------------------------------------------------------------


def _summary(s: SubscriptionSummary) -> pb.SubscriptionSummary:
    return pb.SubscriptionSummary(
        topic=s.topic,
        subscription=s.subscription,
        type=s.type,  # type: ignore[arg-type]
        consumers=s.consumers,
        backlog=s.backlog,
        durable=s.durable,
        last_active_ms=s.last_active_ms,
        loaded=s.loaded,
        filter=s.filter,
    )


def list_to_proto(rows: list[SubscriptionSummary]) -> pb.ListSubscriptionsResponse:
    return pb.ListSubscriptionsResponse(subscriptions=[_summary(r) for r in rows])


def describe_to_proto(d: SubscriptionDescription) -> pb.DescribeSubscriptionResponse:
    return pb.DescribeSubscriptionResponse(
        summary=_summary(d.summary),
        consumers=[
            pb.ConsumerDescription(
                consumer_id=c.consumer_id,
                consumer_name=c.consumer_name,
                permits=c.permits,
                unacked=c.unacked,
                blocked=c.blocked,
                active_partitions=c.active_partitions,
            )
            for c in d.consumers
        ],
    )


# ---- subscription admin ---------------------------------------------------------------------------


def _positions(rows: list[PartitionPosition]) -> list[pb.PartitionPosition]:
    return [
        pb.PartitionPosition(partition=r.partition, before=r.before, after=r.after, note=r.note) for r in rows
    ]


def reset_from_proto(req: pb.ResetSubscriptionRequest) -> ResetRequest:
    return ResetRequest(req.topic, req.subscription, req.spec, req.value, tuple(req.partitions), req.force)


def reset_to_proto(r: ResetResult) -> pb.ResetSubscriptionResponse:
    return pb.ResetSubscriptionResponse(partitions=_positions(r.partitions), disconnected=r.disconnected)


def skip_from_proto(req: pb.SkipSubscriptionRequest) -> SkipRequest:
    return SkipRequest(req.topic, req.subscription, req.count, req.force)


def skip_to_proto(r: SkipResult) -> pb.SkipSubscriptionResponse:
    return pb.SkipSubscriptionResponse(
        skipped=[pb.MessageId(partition=p, offset=o) for p, o in r.skipped],
        partitions=_positions(r.partitions),
        disconnected=r.disconnected,
    )


def delete_from_proto(req: pb.DeleteSubscriptionRequest) -> DeleteRequest:
    return DeleteRequest(req.topic, req.subscription, req.force)


def delete_to_proto(r: DeleteResult) -> pb.DeleteSubscriptionResponse:
    return pb.DeleteSubscriptionResponse(partitions=r.partitions, disconnected=r.disconnected)


def peek_from_proto(req: pb.PeekSubscriptionRequest) -> PeekRequest:
    return PeekRequest(req.topic, req.subscription, req.count)


def peek_to_proto(found: list[PeekedMessage]) -> pb.PeekSubscriptionResponse:
    return pb.PeekSubscriptionResponse(
        messages=[
            pb.PushedMessage(
                id=pb.MessageId(partition=m.record.partition, offset=m.record.offset),
                redelivery_count=m.redelivery_count,
                key=m.record.key or b"",
                value=m.record.value,
                tag=m.record.tag or "",
                headers=m.record.headers or {},
                timestamp=m.record.timestamp,
            )
            for m in found
        ]
    )
