"""The dispatcher core's request types, and their validation.

The transport adapters (``servicer.py``, ``wire_server.py`` through it) copy a protobuf command
into these plain values (``convert.py``) and check nothing; the core (``service.py``) validates
them here, so a bad Subscribe or Ack gets the same typed error on gRPC and on the wire protocol.
Numbers that name protobuf enums (subscription type, initial position) keep the proto's values,
as ``model.SubscriptionType`` does.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass

from sluice.codec.filter import parse_filter
from sluice.common.names import validate_group, validate_topic
from sluice.dispatcher.config import DispatcherConfig, ms
from sluice.dispatcher.consumer import ConsumerSpec
from sluice.dispatcher.keyshared import parse_sticky_ranges
from sluice.dispatcher.model import SubscriptionSettings, SubscriptionType
from sluice.errors import InvalidArgument

__all__ = [
    "MAX_ACK_RANGE",
    "DeleteRequest",
    "InitialPosition",
    "PeekRequest",
    "ResetRequest",
    "ResetSpec",
    "SkipRequest",
    "SubscribeRequest",
    "ack_offsets",
    "consumer_spec",
]

#: A consumer holds at most max_unacked messages, so a longer ack range cannot be valid; refusing it
#: keeps a malformed range from making the dispatcher expand billions of offsets.
MAX_ACK_RANGE = 10_000_000
#: A parked key's waiting messages before it goes to the DLQ whatever the policy (``parking.py``).
DEFAULT_PARK_MAX_MESSAGES = 10_000
#: Bytes parked over all keys of a subscription before its largest key goes to the DLQ (``parking.py``).
DEFAULT_PARK_MAX_BYTES = 64 * 1024 * 1024
_LIMITS = (
    "max_unacked",
    "ack_timeout_ms",
    "nack_delay_ms",
    "max_redeliver",
    "park_after",
    "park_max_messages",
    "park_max_bytes",
)
_TYPES = frozenset(t.value for t in SubscriptionType)


class InitialPosition(enum.IntEnum):
    """Where a new subscription starts (same numbers as ``sluice.v1.InitialPosition``)."""

    LATEST = 0
    EARLIEST = 1
    OFFSET = 2


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    """A ``Subscribe`` command as the core takes it: the client's values, unchecked."""

    topic: str
    subscription: str
    type: int = SubscriptionType.EXCLUSIVE
    consumer_id: str = ""
    consumer_name: str = ""
    priority: int = 0
    initial_position: int = InitialPosition.LATEST
    initial_offset: int = 0
    durable: bool = False
    filter: str = ""
    #: Key_Shared: sticky mode asked for, and its flat ``[start, end, ...]`` ranges.
    sticky: bool = False
    sticky_ranges: tuple[int, ...] = ()
    max_unacked: int = 0
    ack_timeout_ms: int = 0
    nack_delay_ms: int = 0
    max_redeliver: int = 0
    partitions: tuple[int, ...] = ()
    record_batches: bool = False
    #: Key_Shared poison isolation (``parking.py``); 0: off / the default cap.
    park_after: int = 0
    park_hold: bool = False
    park_max_messages: int = 0
    park_max_bytes: int = 0


def consumer_spec(req: SubscribeRequest, cfg: DispatcherConfig) -> tuple[ConsumerSpec, SubscriptionSettings]:
    """Validate ``req`` and resolve its defaults from the dispatcher's config. Caller: the core."""
    validate_topic(req.topic)
    validate_group(req.subscription, "subscription")
    if req.type not in _TYPES:
        raise InvalidArgument(f"unknown subscription type {req.type}")
    limits = (
        "max_unacked",
        "ack_timeout_ms",
        "nack_delay_ms",
        "max_redeliver",
        "park_after",
        "park_max_messages",
        "park_max_bytes",
    )
    for name in limits:
        if getattr(req, name) < 0:
            raise InvalidArgument(
                f"{name} must be >= 0 (0: the dispatcher default), got {getattr(req, name)}"
            )
    if any(p < 0 for p in req.partitions):
        raise InvalidArgument(f"partitions must be >= 0, got {list(req.partitions)}")
    kind = SubscriptionType(req.type)
    if (req.park_after or req.park_hold) and kind != SubscriptionType.KEY_SHARED:
        raise InvalidArgument(f"park_after and park_hold need a key_shared subscription, not {kind.label}")
    sticky = kind == SubscriptionType.KEY_SHARED and req.sticky
    settings = SubscriptionSettings(
        type=kind,
        durable=req.durable,
        filter=parse_filter(req.filter),
        sticky=sticky,
        read_ahead_bytes=cfg.read_ahead_bytes,
        park_after=req.park_after,
        park_hold=req.park_hold,
        park_max_messages=req.park_max_messages or DEFAULT_PARK_MAX_MESSAGES,
        park_max_bytes=req.park_max_bytes or DEFAULT_PARK_MAX_BYTES,
    )
    spec = ConsumerSpec(
        consumer_id=req.consumer_id or uuid.uuid4().hex,
        name=req.consumer_name or req.consumer_id,
        priority=req.priority,
        partitions=frozenset(req.partitions) if req.partitions else None,
        max_unacked=req.max_unacked or cfg.max_unacked,
        ack_timeout_ms=req.ack_timeout_ms or ms(cfg.ack_timeout),
        nack_delay_ms=req.nack_delay_ms or ms(cfg.nack_delay),
        max_redeliver=req.max_redeliver or cfg.max_redeliver,
        nack_backoff_max_ms=ms(cfg.nack_backoff_max),
        sticky_ranges=parse_sticky_ranges(req.sticky_ranges) if sticky else None,
    )
    return spec, settings


def ack_offsets(ids: dict[int, list[int]], ranges: list[tuple[int, list[int]]]) -> dict[int, list[int]]:
    """Every offset an ``Ack`` names, by partition: its ids plus its ranges (``(partition,
    [start, end, ...])``, end exclusive) expanded (a C-level ``range`` per run; the state machine
    checks each offset anyway). ``ids`` is extended in place."""
    for partition, b in ranges:
        if len(b) % 2:
            raise InvalidArgument(f"Ack.ranges of partition {partition} has an odd number of bounds")
        offsets: list[int] = []
        for i in range(0, len(b), 2):
            if b[i + 1] - b[i] > MAX_ACK_RANGE:
                raise InvalidArgument(f"Ack range [{b[i]}, {b[i + 1]}) is longer than {MAX_ACK_RANGE}")
            offsets += range(b[i], b[i + 1])
        if offsets:
            ids.setdefault(partition, []).extend(offsets)
    return ids


# ---- operator commands (``subadmin.py``) ---------------------------------------------------------


class ResetSpec(enum.IntEnum):
    """Where a reset moves a subscription (same numbers as ``sluice.v1.ResetSpec``)."""

    OFFSET = 0
    EARLIEST = 1
    LATEST = 2
    TIMESTAMP = 3


@dataclass(frozen=True, slots=True)
class ResetRequest:
    topic: str
    subscription: str
    #: A ``ResetSpec`` number, unchecked (the core refuses an unknown one).
    spec: int
    #: The offset (``OFFSET``) or the time in ms (``TIMESTAMP``).
    value: int = 0
    #: Empty: every partition of the topic routed to this dispatcher.
    partitions: tuple[int, ...] = ()
    force: bool = False


@dataclass(frozen=True, slots=True)
class SkipRequest:
    topic: str
    subscription: str
    count: int
    force: bool = False


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    topic: str
    subscription: str
    force: bool = False


@dataclass(frozen=True, slots=True)
class PeekRequest:
    topic: str
    subscription: str
    count: int
