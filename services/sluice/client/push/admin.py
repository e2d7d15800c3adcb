"""Subscriptions as the dispatchers see them: list and describe (the admin changes and peek:
``sub_admin.py``).

A topic's partitions may be routed to several dispatchers, each of which knows the
subscription on its own partitions only. These functions ask every dispatcher
involved and merge the answers: backlogs add up, consumers are listed per
dispatcher (a consumer with streams to two dispatchers appears once for each).
Idle durable subscriptions (no consumer; they live until deleted) are listed too,
with their backlog and the time their last consumer left.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sluice.client.metadata import MetadataCache
from sluice.client.rpc import call
from sluice.common.peers import Peers
from sluice.errors import UnknownSubscription
from sluice.v1 import dispatcher_pb2 as pb
from sluice.v1 import dispatcher_pb2_grpc

__all__ = [
    "ConsumerInfo",
    "SubscriptionInfo",
    "describe_subscription",
    "dispatchers_of",
    "list_subscriptions",
]

TYPE_NAMES = {
    pb.SUBSCRIPTION_TYPE_EXCLUSIVE: "exclusive",
    pb.SUBSCRIPTION_TYPE_SHARED: "shared",
    pb.SUBSCRIPTION_TYPE_FAILOVER: "failover",
    pb.SUBSCRIPTION_TYPE_KEY_SHARED: "key_shared",
}


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    dispatcher_id: str
    consumer_id: str
    consumer_name: str
    permits: int
    unacked: int
    blocked: bool
    active_partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    topic: str
    subscription: str
    type: str
    #: Connected consumers, summed over the dispatchers (a consumer counts once per dispatcher).
    consumers: int
    backlog: int
    dispatchers: tuple[str, ...]
    consumer_details: tuple[ConsumerInfo, ...] = field(default=())
    durable: bool = True
    #: Wall-clock ms: now while consumers are connected, else when the last one left (0: unknown).
    last_active_ms: int = 0
    filter: str = "*"


def _merge(prev: SubscriptionInfo | None, dispatcher_id: str, s: pb.SubscriptionSummary) -> SubscriptionInfo:
    return SubscriptionInfo(
        topic=s.topic,
        subscription=s.subscription,
        type=TYPE_NAMES.get(s.type, str(s.type)),
        consumers=s.consumers + (prev.consumers if prev else 0),
        backlog=s.backlog + (prev.backlog if prev else 0),
        dispatchers=(*(prev.dispatchers if prev else ()), dispatcher_id),
        consumer_details=prev.consumer_details if prev else (),
        durable=s.durable,
        last_active_ms=max(s.last_active_ms, prev.last_active_ms if prev else 0),
        filter=s.filter or "*",
    )


def dispatchers_of(metadata: MetadataCache, topic: str | None) -> dict[str, str]:
    """{dispatcher_id: address} of the live dispatchers (serving ``topic``, if given)."""
    md = metadata.get(None if topic is None else [topic], refresh=True)
    wanted = None if topic is None else {p.dispatcher_id for p in md.topic(topic).partitions}
    return {
        d.dispatcher_id: d.address
        for d in md.dispatchers.values()
        if d.alive and (wanted is None or d.dispatcher_id in wanted)
    }


def list_subscriptions(
    channels: Peers, metadata: MetadataCache, topic: str | None = None, timeout: float = 10.0
) -> list[SubscriptionInfo]:
    """Every subscription the dispatchers (of ``topic``) serve, idle durable ones included."""
    merged: dict[tuple[str, str], SubscriptionInfo] = {}
    for dispatcher_id, address in sorted(dispatchers_of(metadata, topic).items()):
        stub = channels.stub(address, dispatcher_pb2_grpc.DispatcherStub)
        resp = call(stub.ListSubscriptions, pb.ListSubscriptionsRequest(topic=topic or ""), timeout)
        for s in resp.subscriptions:
            key = (s.topic, s.subscription)
            merged[key] = _merge(merged.get(key), dispatcher_id, s)
    return [merged[k] for k in sorted(merged)]


def describe_subscription(
    channels: Peers, metadata: MetadataCache, topic: str, subscription: str, timeout: float = 10.0
) -> SubscriptionInfo:
    """Consumers (permits, unacked, blocked, active partitions), backlog and last-active time of one
    subscription. Raises UnknownSubscription (UnknownTopicOrPartition for a topic that does not exist)."""
    found: list[tuple[str, pb.DescribeSubscriptionResponse]] = []
    for dispatcher_id, address in sorted(dispatchers_of(metadata, topic).items()):
        stub = channels.stub(address, dispatcher_pb2_grpc.DispatcherStub)
        request = pb.DescribeSubscriptionRequest(topic=topic, subscription=subscription)
        try:
            found.append((dispatcher_id, call(stub.DescribeSubscription, request, timeout)))
        except UnknownSubscription:
            continue  # another dispatcher serves it
    if not found:
        raise UnknownSubscription(
            f"topic {topic!r} has no subscription {subscription!r} (never created or deleted; a "
            "non-durable one exists only while consumers are connected)"
        )
    info: SubscriptionInfo | None = None
    for d, resp in found:
        info = _merge(info, d, resp.summary)
    assert info is not None
    consumers = tuple(
        ConsumerInfo(
            dispatcher_id=d,
            consumer_id=c.consumer_id,
            consumer_name=c.consumer_name,
            permits=c.permits,
            unacked=c.unacked,
            blocked=c.blocked,
            active_partitions=tuple(c.active_partitions),
        )
        for d, resp in found
        for c in resp.consumers
    )
    return replace(info, consumer_details=consumers)
