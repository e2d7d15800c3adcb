"""Subscriptions as the dispatchers see them: ``ListSubscriptions`` / ``DescribeSubscription``.

A topic's partitions may be routed to several dispatchers, each of which knows the
subscription on its own partitions only. These functions ask every dispatcher
involved and merge the answers: backlogs add up, consumers are listed per
dispatcher (a consumer with streams to two dispatchers appears once for each).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.client.metadata import MetadataCache
from sluice.client.rpc import ChannelPool, call
from sluice.errors import SluiceError, UnknownTopicOrPartition
from sluice.v1 import dispatcher_pb2 as pb
from sluice.v1 import dispatcher_pb2_grpc

__all__ = ["ConsumerInfo", "SubscriptionInfo", "describe_subscription", "list_subscriptions"]

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


def _dispatchers(metadata: MetadataCache, topic: str | None) -> dict[str, str]:
    """{dispatcher_id: address} of the live dispatchers (serving ``topic``, if given)."""
    md = metadata.get(None if topic is None else [topic], refresh=True)
    wanted = None if topic is None else {p.dispatcher_id for p in md.topic(topic).partitions}
    return {
        d.dispatcher_id: d.address
        for d in md.dispatchers.values()
        if d.alive and (wanted is None or d.dispatcher_id in wanted)
    }


def list_subscriptions(
    channels: ChannelPool, metadata: MetadataCache, topic: str | None = None, timeout: float = 10.0
) -> list[SubscriptionInfo]:
    """Every subscription loaded on the dispatchers (of ``topic``), merged across dispatchers."""
    merged: dict[tuple[str, str], SubscriptionInfo] = {}
    for dispatcher_id, address in sorted(_dispatchers(metadata, topic).items()):
        stub = channels.stub(address, dispatcher_pb2_grpc.DispatcherStub)
        resp = call(stub.ListSubscriptions, pb.ListSubscriptionsRequest(topic=topic or ""), timeout)
        for s in resp.subscriptions:
            key = (s.topic, s.subscription)
            prev = merged.get(key)
            merged[key] = SubscriptionInfo(
                topic=s.topic,
                subscription=s.subscription,
                type=TYPE_NAMES.get(s.type, str(s.type)),
                consumers=s.consumers + (prev.consumers if prev else 0),
                backlog=s.backlog + (prev.backlog if prev else 0),
                dispatchers=(*(prev.dispatchers if prev else ()), dispatcher_id),
            )
    return [merged[k] for k in sorted(merged)]


def describe_subscription(
    channels: ChannelPool, metadata: MetadataCache, topic: str, subscription: str, timeout: float = 10.0
) -> SubscriptionInfo:
    """Consumers (permits, unacked, blocked, active partitions) and backlog of one subscription.

    Raises UnknownTopicOrPartition when no dispatcher has it loaded (no consumer
    connected recently) or the topic does not exist.
    """
    found: list[tuple[str, pb.DescribeSubscriptionResponse]] = []
    for dispatcher_id, address in sorted(_dispatchers(metadata, topic).items()):
        stub = channels.stub(address, dispatcher_pb2_grpc.DispatcherStub)
        request = pb.DescribeSubscriptionRequest(topic=topic, subscription=subscription)
        try:
            found.append((dispatcher_id, call(stub.DescribeSubscription, request, timeout)))
        except UnknownTopicOrPartition:
            continue  # not loaded on this dispatcher
        except SluiceError:
            raise
    if not found:
        raise UnknownTopicOrPartition(
            f"subscription {subscription!r} of topic {topic!r} is not loaded on any dispatcher "
            "(it has no consumer and none connected recently, or it does not exist)"
        )
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
    first = found[0][1].summary
    return SubscriptionInfo(
        topic=topic,
        subscription=subscription,
        type=TYPE_NAMES.get(first.type, str(first.type)),
        consumers=sum(r.summary.consumers for _, r in found),
        backlog=sum(r.summary.backlog for _, r in found),
        dispatchers=tuple(d for d, _ in found),
        consumer_details=consumers,
    )
