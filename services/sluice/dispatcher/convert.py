"""Protobuf commands -> the core's request values (``requests.py``). Translation only: nothing here
checks a value; the core does (``requests.consumer_spec``, ``requests.ack_offsets``). Caller: the
servicer, for both transports."""

from __future__ import annotations

from typing import Any

from sluice.dispatcher.requests import SubscribeRequest
from sluice.v1 import dispatcher_pb2 as pb

__all__ = ["ack_ranges", "by_partition", "subscribe_from_proto"]


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
