"""Subscription admin through the dispatchers: reset, skip, delete, and peek.

Each dispatcher acts on the partitions of the topic routed to it (docs/dispatcher.md, "Subscription
admin"); these functions ask every dispatcher serving the topic and merge the answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TypeVar

from sluice.client.metadata import MetadataCache
from sluice.client.push.admin import dispatchers_of, list_subscriptions
from sluice.client.rpc import call
from sluice.common.names import validate_group, validate_topic
from sluice.common.peers import Peers
from sluice.errors import InvalidArgument, SubscriptionInUse, UnknownSubscription
from sluice.v1 import dispatcher_pb2 as pb
from sluice.v1 import dispatcher_pb2_grpc, offset_store_pb2

__all__ = [
    "ParkedKeyInfo",
    "PartitionChange",
    "PeekedMessage",
    "SubscriptionChange",
    "delete_subscription",
    "list_parked_keys",
    "peek_subscription",
    "reset_subscription",
    "reset_target",
    "skip_subscription",
    "unpark_key",
]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """Where one partition of a subscription was (``before``; -1: no stored position) and is now.
    ``note`` says so when the asked position was outside the log and was clamped."""

    partition: int
    before: int
    after: int
    note: str = ""


@dataclass(frozen=True, slots=True)
class SubscriptionChange:
    """The outcome of a reset, skip or delete, merged over the dispatchers serving the topic."""

    topic: str
    subscription: str
    partitions: tuple[PartitionChange, ...]
    #: Consumers whose streams were ended (``force``).
    disconnected: int
    #: Skip: the (partition, offset) of each skipped message.
    skipped: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class PeekedMessage:
    """A message a subscription would deliver next (peek changes nothing)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes
    tag: str | None
    headers: dict[str, bytes]
    redelivery_count: int


def reset_target(to: str | int | datetime) -> tuple[int, int]:
    """``(ResetSpec, value)`` for "earliest", "latest", an offset (int or digits), or a time: an aware
    ``datetime`` or an ISO 8601 string (without a zone: UTC)."""
    if isinstance(to, datetime):
        when = to
    elif isinstance(to, int) and not isinstance(to, bool):
        if to < 0:
            raise InvalidArgument(f"a reset offset must be >= 0, got {to}")
        return offset_store_pb2.RESET_SPEC_OFFSET, to
    elif isinstance(to, str):
        text = to.strip()
        if text.lower() == "earliest":
            return offset_store_pb2.RESET_SPEC_EARLIEST, 0
        if text.lower() == "latest":
            return offset_store_pb2.RESET_SPEC_LATEST, 0
        if text.isdigit():
            return offset_store_pb2.RESET_SPEC_OFFSET, int(text)
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidArgument(
                f"cannot reset to {to!r}: use earliest, latest, an offset (0 or more) or an ISO 8601 time "
                "such as 2026-11-25T17:00:00Z"
            ) from None
    else:
        raise InvalidArgument(f"cannot reset to {to!r}: expected a str, an int or a datetime")
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return offset_store_pb2.RESET_SPEC_TIMESTAMP, int(when.timestamp() * 1000)


def _each_dispatcher(
    channels: Peers,
    metadata: MetadataCache,
    topic: str,
    subscription: str,
    ask: Callable[[dispatcher_pb2_grpc.DispatcherStub], R],
) -> list[R]:
    """``ask`` every dispatcher serving ``topic``; UnknownSubscription only if every one says so."""
    validate_topic(topic)
    validate_group(subscription, "subscription")
    answers: list[R] = []
    unknown: UnknownSubscription | None = None
    for _, address in sorted(dispatchers_of(metadata, topic).items()):
        try:
            answers.append(ask(channels.stub(address, dispatcher_pb2_grpc.DispatcherStub)))
        except UnknownSubscription as exc:
            unknown = exc
    if not answers:
        raise unknown or UnknownSubscription(f"no live dispatcher serves topic {topic!r}")
    return answers


def _check_idle(
    channels: Peers, metadata: MetadataCache, topic: str, subscription: str, force: bool, timeout: float
) -> None:
    """Refuse before changing anything when consumers are connected to any dispatcher (each dispatcher
    checks again for its own partitions, under its lock)."""
    if force:
        return
    for s in list_subscriptions(channels, metadata, topic, timeout):
        if s.subscription == subscription and s.consumers:
            raise SubscriptionInUse(
                f"subscription {subscription!r} of topic {topic!r} has {s.consumers} consumer(s) connected: "
                "stop them, or pass force (--force) to disconnect them"
            )


def _change(
    topic: str, subscription: str, partitions: list[pb.PartitionPosition], disconnected: int
) -> SubscriptionChange:
    return SubscriptionChange(
        topic,
        subscription,
        tuple(
            PartitionChange(p.partition, p.before, p.after, p.note)
            for p in sorted(partitions, key=lambda p: p.partition)
        ),
        disconnected,
    )


def reset_subscription(
    channels: Peers,
    metadata: MetadataCache,
    topic: str,
    subscription: str,
    to: str | int | datetime,
    *,
    partitions: list[int] | None = None,
    force: bool = False,
    timeout: float = 10.0,
) -> SubscriptionChange:
    """Move a durable subscription to ``to`` on every partition (or ``partitions``): see reset_target."""
    spec, value = reset_target(to)
    _check_idle(channels, metadata, topic, subscription, force, timeout)
    request = pb.ResetSubscriptionRequest(
        topic=topic,
        subscription=subscription,
        spec=spec,  # type: ignore[arg-type]
        value=value,
        partitions=partitions or [],
        force=force,
    )
    answers = _each_dispatcher(
        channels, metadata, topic, subscription, lambda stub: call(stub.ResetSubscription, request, timeout)
    )
    return _change(
        topic,
        subscription,
        [p for a in answers for p in a.partitions],
        sum(a.disconnected for a in answers),
    )


def skip_subscription(
    channels: Peers,
    metadata: MetadataCache,
    topic: str,
    subscription: str,
    count: int,
    *,
    force: bool = False,
    timeout: float = 10.0,
) -> SubscriptionChange:
    """Acknowledge the next ``count`` messages: those ``peek_subscription(count)`` shows."""
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        raise InvalidArgument(f"count must be a positive integer, got {count!r}")
    _check_idle(channels, metadata, topic, subscription, force, timeout)
    # With several dispatchers, each skips its share of the overall next `count`, found by one peek.
    shares: dict[int, int] | None = None
    if len(dispatchers_of(metadata, topic)) > 1:
        shares = {}
        for m in peek_subscription(channels, metadata, topic, subscription, count, timeout=timeout):
            shares[m.partition] = shares.get(m.partition, 0) + 1
    routed = {p.partition: p.dispatcher_id for p in metadata.get([topic]).topic(topic).partitions}

    def ask(stub: dispatcher_pb2_grpc.DispatcherStub, dispatcher_id: str) -> pb.SkipSubscriptionResponse:
        n = count if shares is None else sum(k for p, k in shares.items() if routed.get(p) == dispatcher_id)
        if n == 0:
            return pb.SkipSubscriptionResponse()
        request = pb.SkipSubscriptionRequest(topic=topic, subscription=subscription, count=n, force=force)
        return call(stub.SkipSubscription, request, timeout)

    answers = []
    for dispatcher_id, address in sorted(dispatchers_of(metadata, topic).items()):
        answers.append(ask(channels.stub(address, dispatcher_pb2_grpc.DispatcherStub), dispatcher_id))
    change = _change(
        topic, subscription, [p for a in answers for p in a.partitions], sum(a.disconnected for a in answers)
    )
    skipped = tuple(sorted((m.partition, m.offset) for a in answers for m in a.skipped))
    return replace(change, skipped=skipped)


def delete_subscription(
    channels: Peers,
    metadata: MetadataCache,
    topic: str,
    subscription: str,
    *,
    force: bool = False,
    timeout: float = 10.0,
) -> SubscriptionChange:
    """Delete a subscription: its cursors and its registry entry. Refused (SubscriptionInUse) while
    consumers are connected unless ``force``, which ends their streams (UnknownSubscription)."""
    _check_idle(channels, metadata, topic, subscription, force, timeout)
    request = pb.DeleteSubscriptionRequest(topic=topic, subscription=subscription, force=force)
    answers = _each_dispatcher(
        channels, metadata, topic, subscription, lambda stub: call(stub.DeleteSubscription, request, timeout)
    )
    return SubscriptionChange(
        topic,
        subscription,
        tuple(PartitionChange(p, -1, -1) for a in answers for p in sorted(a.partitions)),
        sum(a.disconnected for a in answers),
    )


def peek_subscription(
    channels: Peers,
    metadata: MetadataCache,
    topic: str,
    subscription: str,
    count: int,
    *,
    timeout: float = 10.0,
) -> list[PeekedMessage]:
    """The next ``count`` messages of the subscription (unacknowledged, in flight ones included), oldest
    timestamp first, without consuming or moving anything."""
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        raise InvalidArgument(f"count must be a positive integer, got {count!r}")
    request = pb.PeekSubscriptionRequest(topic=topic, subscription=subscription, count=count)
    answers = _each_dispatcher(
        channels, metadata, topic, subscription, lambda stub: call(stub.PeekSubscription, request, timeout)
    )
    found = [
        PeekedMessage(
            topic=topic,
            partition=m.id.partition,
            offset=m.id.offset,
            timestamp=m.timestamp,
            key=m.key or None,
            value=m.value,
            tag=m.tag or None,
            headers=dict(m.headers),
            redelivery_count=m.redelivery_count,
        )
        for a in answers
        for m in a.messages
    ]
    return sorted(found, key=lambda m: (m.timestamp, m.partition, m.offset))[:count]


@dataclass(frozen=True)
class ParkedKeyInfo:
    """A Key_Shared key parked after repeated failures (docs/poison-keys.md)."""

    key: bytes
    state: str
    since: datetime
    head_partition: int
    head_offset: int
    head_redelivery_count: int
    waiting: int
    dispatcher_id: str


def list_parked_keys(
    channels: Peers, metadata: MetadataCache, topic: str, subscription: str, *, timeout: float = 10.0
) -> list[ParkedKeyInfo]:
    """The parked keys of a subscription, over every dispatcher serving the topic, oldest first."""
    request = pb.ListParkedKeysRequest(topic=topic, subscription=subscription)
    answers = _each_dispatcher(
        channels, metadata, topic, subscription, lambda stub: call(stub.ListParkedKeys, request, timeout)
    )
    keys = [
        ParkedKeyInfo(
            key=k.key,
            state=k.state,
            since=datetime.fromtimestamp(k.since_ms / 1000, UTC),
            head_partition=k.head_partition,
            head_offset=k.head_offset,
            head_redelivery_count=k.head_redelivery_count,
            waiting=k.waiting,
            dispatcher_id=k.dispatcher_id,
        )
        for a in answers
        for k in a.keys
    ]
    return sorted(keys, key=lambda k: k.since)


def unpark_key(
    channels: Peers,
    metadata: MetadataCache,
    topic: str,
    subscription: str,
    key: bytes,
    *,
    timeout: float = 10.0,
) -> int:
    """Release a parked key (its messages go again, counted from 0); returns how many were released.
    Raises InvalidArgument if no dispatcher had the key parked."""
    request = pb.UnparkKeyRequest(topic=topic, subscription=subscription, key=key)
    answers = _each_dispatcher(
        channels, metadata, topic, subscription, lambda stub: call(stub.UnparkKey, request, timeout)
    )
    if not any(a.found for a in answers):
        raise InvalidArgument(
            f"key {key!r} is not parked in subscription {subscription!r} of topic {topic!r}"
        )
    return sum(a.released for a in answers)
