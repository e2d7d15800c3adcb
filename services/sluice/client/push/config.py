"""PushConsumerConfig: every push-consumer setting in one typed, validated dataclass.

Build one with keywords (``client.push_consumer(..., receiver_queue_size=0)``), from a
mapping (:meth:`PushConsumerConfig.from_dict`), and derive variants with
:meth:`PushConsumerConfig.replace`. Unknown keys and bad values are rejected with
:class:`~sluice.errors.InvalidArgument` naming the key. Durations are ``timedelta``;
strings such as ``"250ms"`` and numbers of seconds are converted.

``to_subscribe`` turns the settings into the wire ``Subscribe`` message, so the
mapping between the SDK's names and the protocol lives in this one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol

from sluice.client.push.message import Message
from sluice.client.push.stats import PushConsumerStats
from sluice.codec.filter import parse_filter
from sluice.common.settings import convert_setting
from sluice.errors import InvalidArgument
from sluice.retry.levels import sub_dlq_topic
from sluice.serde.builtin import DeserializerSpec, resolve_deserializer
from sluice.v1 import dispatcher_pb2

__all__ = [
    "SUBSCRIPTION_TYPES",
    "KeySharedPolicy",
    "ListenerConsumer",
    "MessageListener",
    "PushConsumerConfig",
    "SubscriptionTypeName",
    "dlq_topic",
]

SubscriptionTypeName = Literal["exclusive", "shared", "failover", "key_shared"]
#: SDK name -> wire enum value.
SUBSCRIPTION_TYPES: dict[str, int] = {
    "exclusive": dispatcher_pb2.SUBSCRIPTION_TYPE_EXCLUSIVE,
    "shared": dispatcher_pb2.SUBSCRIPTION_TYPE_SHARED,
    "failover": dispatcher_pb2.SUBSCRIPTION_TYPE_FAILOVER,
    "key_shared": dispatcher_pb2.SUBSCRIPTION_TYPE_KEY_SHARED,
}
#: The hash space Key_Shared ranges live in (inclusive).
HASH_MAX = 65535


class ListenerConsumer(Protocol):
    """What a ``message_listener`` gets as its first argument: the PushConsumer that received the
    message, through the calls a listener makes. Stated here as a Protocol because the consumer
    depends on its config, never the other way round (no import cycle)."""

    def ack(self, msg: Message, /) -> None: ...

    def ack_cumulative(self, msg: Message, /) -> None: ...

    def nack(self, msg: Message, /) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stats(self) -> PushConsumerStats: ...


MessageListener = Callable[[ListenerConsumer, Message], None]


def dlq_topic(topic: str, subscription: str) -> str:
    """The dead-letter topic of a subscription: ``<topic>.<subscription>.DLQ`` (for the subscription
    of a redrive topic ``<topic>.<subscription>.REDRIVE``, the DLQ it was redriven from)."""
    return sub_dlq_topic(topic, subscription)


@dataclass(frozen=True, slots=True)
class KeySharedPolicy:
    """How a Key_Shared subscription gives key-hash ranges to its consumers.

    ``auto_split`` (the default): the dispatcher splits the hash space among whoever is
    connected. ``sticky``: this consumer owns exactly ``ranges``, inclusive
    ``(start, end)`` pairs in ``[0, 65535]``, e.g. ``KeySharedPolicy.sticky((0, 32767))``.
    """

    mode: Literal["auto_split", "sticky"] = "auto_split"
    ranges: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in ("auto_split", "sticky"):
            raise InvalidArgument(f"key_shared_policy mode must be auto_split or sticky, got {self.mode!r}")
        if self.mode == "auto_split" and self.ranges:
            raise InvalidArgument("key_shared_policy: ranges are only for the sticky mode")
        if self.mode == "sticky" and not self.ranges:
            raise InvalidArgument("key_shared_policy: the sticky mode needs at least one range")
        for r in self.ranges:
            if len(r) != 2 or not 0 <= r[0] <= r[1] <= HASH_MAX:
                raise InvalidArgument(f"key_shared_policy: bad range {r!r}: need 0 <= start <= end <= 65535")

    @classmethod
    def sticky(cls, *ranges: tuple[int, int]) -> KeySharedPolicy:
        return cls("sticky", tuple((int(a), int(b)) for a, b in ranges))

    def to_proto(self) -> dispatcher_pb2.KeySharedPolicy:
        mode = (
            dispatcher_pb2.KEY_SHARED_MODE_STICKY
            if self.mode == "sticky"
            else dispatcher_pb2.KEY_SHARED_MODE_AUTO_SPLIT
        )
        flat = [v for r in self.ranges for v in r]
        return dispatcher_pb2.KeySharedPolicy(mode=mode, ranges=flat)


def _ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)


@dataclass(frozen=True, slots=True)
class PushConsumerConfig:
    """Settings of one :class:`~sluice.client.push.PushConsumer`."""

    receiver_queue_size: int = 1000
    """Messages the consumer may hold that the application has not taken yet. The first
    ``Flow`` asks for this many (split across the dispatcher streams, at least 1 each) and
    a stream is refilled once the application has taken half of its share. ``0`` is a
    true zero-queue consumer: each ``receive()`` grants exactly one permit to one stream
    and the consumer never holds more than one message."""

    consumer_name: str = ""
    """A name shown by ``sluice subscription describe``; Failover picks the active
    consumer by priority, then name. Default: the client id."""

    priority: int = 0
    """Failover: the lowest priority value is active first."""

    durable: bool = True
    """Durable subscriptions keep their cursor in the offset store; non-durable ones start
    from ``initial_position`` and vanish with their last consumer."""

    initial_position: str | int = "latest"
    """Where a new subscription starts: ``"latest"``, ``"earliest"`` or an offset (int)."""

    filter: str | None = None
    """A tag filter (``"tagA || tagB"``), applied by the dispatcher."""

    key_shared_policy: KeySharedPolicy | None = None
    """Key_Shared only: auto-split (default) or sticky ranges."""

    max_unacked: int = 0
    """The dispatcher stops sending once this many messages are unacked, until acks bring
    the count to half. 0: the dispatcher's default."""

    ack_timeout: timedelta = timedelta(0)
    """Redeliver what was not acked within this time. 0: the dispatcher's default (off)."""

    nack_delay: timedelta = timedelta(0)
    """How long after ``nack()`` the message comes back. 0: the dispatcher's default (1 s)."""

    nack_backoff: bool = False
    """Exponential nack backoff: a message nacked for the n-th time comes back after
    ``nack_delay * 2**n`` (capped by ``nack_backoff_max``). The SDK holds the nack for the
    extra time, so it works whatever the dispatcher's own setting."""

    nack_backoff_max: timedelta = timedelta(seconds=60)
    """Cap of the exponential nack backoff."""

    max_redeliver: int = 0
    """After this many redeliveries a message goes to ``<topic>.<subscription>.DLQ`` and is
    acked (see :func:`dlq_topic`). 0: the dispatcher's default (no DLQ)."""

    park_after: int = 0
    """Key_Shared poison isolation (docs/poison-keys.md): once a message came back this many times
    its key is parked: only it is retried, the key's later messages wait, every other key flows.
    Subscription-wide (the first consumer's). 0: off."""

    park_hold: bool = False
    """With ``park_after``: a key whose head is past ``max_redeliver`` stays parked for an operator
    (``sluice subscription unpark``) instead of going to the DLQ."""

    park_max_messages: int = 0
    """With ``park_after``: a parked key with more waiting messages goes to the DLQ whatever the
    policy. 0: the dispatcher's default (10,000)."""

    park_max_bytes: int = 0
    """With ``park_after``: past this many bytes parked over all keys of the subscription (its parking
    store, ``<topic>.<subscription>.PARK``), the largest key goes to the DLQ whatever the policy.
    Subscription-wide. 0: the dispatcher's default (64 MiB)."""

    message_listener: MessageListener | None = None
    """``listener(consumer, message)``, run on one listener thread instead of ``receive()``.
    It should ack or nack; an exception it raises is logged and the message is nacked."""

    reconnect_backoff: timedelta = timedelta(milliseconds=100)
    """First wait before reconnecting a broken stream; doubled per failed attempt."""

    reconnect_backoff_max: timedelta = timedelta(seconds=60)
    """Cap of the doubling reconnect backoff (reset once a stream is subscribed again)."""

    ack_group_time: timedelta = timedelta(milliseconds=2)
    """How long individual acks (``ack``, ``ack_many``) wait to be written together as one ``Ack``
    command (Pulsar's ``acknowledgementGroupTime``); 1,000 pending, a permit, a nack or ``close()``
    write them at once. 0: each is written as soon as the stream's writer is free. Acks still
    waiting when the process dies are lost and their messages redelivered (at-least-once)."""

    zero_queue_handoff: timedelta = timedelta(milliseconds=200)
    """Zero-queue, Shared/Key_Shared, several dispatchers: how long the one permit may sit
    at a dispatcher that has nothing to send before the SDK moves it to the next stream
    (by resubscribing the idle stream, which the dispatcher treats as a reconnect). Doubles
    while nothing arrives, up to ``ZERO_QUEUE_HANDOFF_MAX``. 0: the permit never moves."""

    subscribe_timeout: timedelta = timedelta(seconds=30)
    """How long the constructor waits for every stream to be subscribed."""

    redrive: bool = True
    """Also consume ``<topic>.<subscription>.REDRIVE`` (where ``sluice dlq redrive --subscription``
    writes) as this subscription, through the same receive/ack/listener (docs/retry.md, "Redrive of
    push subscriptions"). Creates nothing: the topic is read once it exists. Off for non-durable
    subscriptions, ``receiver_queue_size=0`` and a consumer of a redrive topic itself."""

    redrive_check_interval: timedelta = timedelta(seconds=30)
    """While the redrive topic does not exist, how often the consumer asks the coordinator whether it
    does now (one Metadata request). 0: only at the consumer's start and routing refreshes."""

    consumer_id: str = field(default="")
    """The id resubscriptions reuse (idempotent on the dispatcher). Default: random."""

    key_deserializer: DeserializerSpec = None
    """Turns each message's ``key`` into an object: a callable ``bytes -> obj`` or a built-in's name
    (``"str"``, ``"json"``, ``"bytes"``); an Avro or Protobuf deserializer object (docs/serializers.md).
    Deserialized on first access; a failure raises DeserializationError (carrying the raw record) from
    ``message.key``, and the message can still be acked or nacked. ``message.raw_key`` is the bytes."""

    value_deserializer: DeserializerSpec = None
    """Turns each message's ``value`` into an object, like ``key_deserializer`` (``message.raw_value``)."""

    def __post_init__(self) -> None:
        _check(self)

    # ---- converters ----------------------------------------------------------------

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PushConsumerConfig:
        return cls().replace(**values)

    def replace(self, **overrides: Any) -> PushConsumerConfig:
        """A copy with ``overrides`` converted and applied; unknown keys are rejected."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise InvalidArgument(
                f"unknown push consumer setting(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        converted = {k: _convert(k, v) for k, v in overrides.items()}
        return dataclasses.replace(self, **converted)

    @property
    def zero_queue(self) -> bool:
        return self.receiver_queue_size == 0

    def to_subscribe(
        self,
        topic: str,
        subscription: str,
        type_: str,
        consumer_id: str,
        name: str,
        partitions: Sequence[int],
    ) -> dispatcher_pb2.Subscribe:
        """The wire ``Subscribe`` for one stream serving ``partitions``."""
        pos = self.initial_position
        if isinstance(pos, int):
            position, offset = dispatcher_pb2.INITIAL_POSITION_OFFSET, pos
        elif pos == "earliest":
            position, offset = dispatcher_pb2.INITIAL_POSITION_EARLIEST, 0
        else:
            position, offset = dispatcher_pb2.INITIAL_POSITION_LATEST, 0
        sub = dispatcher_pb2.Subscribe(
            topic=topic,
            subscription=subscription,
            type=SUBSCRIPTION_TYPES[type_],  # type: ignore[arg-type]
            consumer_name=name,
            priority=self.priority,
            initial_position=position,
            initial_offset=offset,
            durable=self.durable,
            filter=self.filter or "",
            consumer_id=consumer_id,
            max_unacked=self.max_unacked,
            ack_timeout_ms=_ms(self.ack_timeout),
            nack_delay_ms=_ms(self.nack_delay),
            max_redeliver=self.max_redeliver,
            partitions=list(partitions),
            # Log batches as the broker stored them, decoded here (docs/push-consumer.md).
            record_batches=True,
            park_after=self.park_after,
            park_hold=self.park_hold,
            park_max_messages=self.park_max_messages,
            park_max_bytes=self.park_max_bytes,
        )
        if self.key_shared_policy is not None:
            sub.key_shared_policy.CopyFrom(self.key_shared_policy.to_proto())
        return sub


_DURATIONS = (
    "ack_timeout",
    "ack_group_time",
    "nack_delay",
    "nack_backoff_max",
    "reconnect_backoff",
    "reconnect_backoff_max",
    "subscribe_timeout",
    "zero_queue_handoff",
    "redrive_check_interval",
)
_INTS = (
    "receiver_queue_size",
    "priority",
    "max_unacked",
    "max_redeliver",
    "park_after",
    "park_max_messages",
    "park_max_bytes",
)
_INT32_MAX = 2**31 - 1


def _convert(name: str, raw: Any) -> Any:
    try:
        if name in _DURATIONS:
            return convert_setting("push consumer", name, timedelta, raw)
        if name == "key_shared_policy" and isinstance(raw, str):
            return KeySharedPolicy(raw)  # type: ignore[arg-type]
        if name == "key_shared_policy" and isinstance(raw, list | tuple):
            return KeySharedPolicy.sticky(*raw)
        if name == "initial_position" and isinstance(raw, str) and raw.lstrip("-").isdigit():
            return int(raw)
    except InvalidArgument as exc:
        raise InvalidArgument(f"push consumer setting {name}: {exc.message}") from None
    except (TypeError, ValueError):
        raise InvalidArgument(f"push consumer setting {name}: {raw!r} is not valid") from None
    return raw


# A flat list of independent setting checks: one `if` per setting, no decision to split.
def _check(cfg: PushConsumerConfig) -> None:  # noqa: C901, PLR0912
    for name in _INTS:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"push consumer setting {name} must be an int, got {value!r}")
        lowest = -_INT32_MAX if name == "priority" else 0
        if not lowest <= value <= _INT32_MAX:
            raise InvalidArgument(
                f"push consumer setting {name} must be in [{lowest}, {_INT32_MAX}], got {value}"
            )
    for name in _DURATIONS:
        value = getattr(cfg, name)
        if not isinstance(value, timedelta) or value < timedelta(0):
            raise InvalidArgument(f"push consumer setting {name} must be a duration >= 0, got {value!r}")
        if _ms(value) > _INT32_MAX:
            raise InvalidArgument(f"push consumer setting {name} is too long: {value}")
    for name in ("reconnect_backoff", "subscribe_timeout"):
        if getattr(cfg, name) <= timedelta(0):
            raise InvalidArgument(f"push consumer setting {name} must be positive")
    if cfg.ack_group_time > timedelta(seconds=60):
        raise InvalidArgument(
            f"push consumer setting ack_group_time must be at most 60 s, got {cfg.ack_group_time}"
        )
    if cfg.reconnect_backoff_max < cfg.reconnect_backoff:
        raise InvalidArgument("reconnect_backoff_max must be >= reconnect_backoff")
    pos = cfg.initial_position
    if isinstance(pos, bool) or not (pos in ("latest", "earliest") or (isinstance(pos, int) and pos >= 0)):
        raise InvalidArgument(f"initial_position must be 'latest', 'earliest' or an offset >= 0, got {pos!r}")
    if not all(isinstance(v, bool) for v in (cfg.durable, cfg.nack_backoff, cfg.redrive)):
        raise InvalidArgument("durable, nack_backoff and redrive must be booleans")
    if not isinstance(cfg.consumer_name, str) or not isinstance(cfg.consumer_id, str):
        raise InvalidArgument("consumer_name and consumer_id must be strings")
    if cfg.filter is not None:
        if not isinstance(cfg.filter, str):
            raise InvalidArgument(f"filter must be a string, got {cfg.filter!r}")
        parse_filter(cfg.filter)  # raises InvalidFilter for a bad expression, before any I/O
    if cfg.key_shared_policy is not None and not isinstance(cfg.key_shared_policy, KeySharedPolicy):
        raise InvalidArgument(f"key_shared_policy must be a KeySharedPolicy, got {cfg.key_shared_policy!r}")
    for name in ("key_deserializer", "value_deserializer"):
        resolve_deserializer(getattr(cfg, name), name)  # InvalidArgument for an unknown name or type
    if cfg.message_listener is not None and not callable(cfg.message_listener):
        raise InvalidArgument("message_listener must be callable(consumer, message)")
