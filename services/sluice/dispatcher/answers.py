"""What the dispatcher core answers to the operator commands: describe (``describe.py``) and
subscription admin (``subadmin.py``). Plain values; ``convert.py`` turns them into protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.codec.batch import Record

__all__ = [
    "ConsumerDescription",
    "DeleteResult",
    "PartitionPosition",
    "PeekedMessage",
    "ResetResult",
    "SkipResult",
    "SubscriptionDescription",
    "SubscriptionSummary",
]


@dataclass(frozen=True, slots=True)
class SubscriptionSummary:
    topic: str
    subscription: str
    #: ``model.SubscriptionType``'s number (an idle one's, as the registry stored it).
    type: int
    consumers: int
    backlog: int
    durable: bool
    last_active_ms: int
    #: Loaded on this dispatcher (live state), or idle (from the registry).
    loaded: bool
    filter: str


@dataclass(frozen=True, slots=True)
class ConsumerDescription:
    consumer_id: str
    consumer_name: str
    permits: int
    unacked: int
    blocked: bool
    active_partitions: list[int]


@dataclass(frozen=True, slots=True)
class SubscriptionDescription:
    summary: SubscriptionSummary
    consumers: list[ConsumerDescription] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PartitionPosition:
    """A partition's mark-delete before and after a reset or skip (``before`` -1: no stored cursor)."""

    partition: int
    before: int
    after: int
    #: Why ``after`` is not what was asked (a clamped offset), or empty.
    note: str = ""


@dataclass(frozen=True, slots=True)
class ResetResult:
    partitions: list[PartitionPosition] = field(default_factory=list)
    disconnected: int = 0


@dataclass(frozen=True, slots=True)
class SkipResult:
    #: (partition, offset) of each skipped message.
    skipped: list[tuple[int, int]]
    partitions: list[PartitionPosition]
    disconnected: int


@dataclass(frozen=True, slots=True)
class DeleteResult:
    partitions: list[int]
    disconnected: int


@dataclass(frozen=True, slots=True)
class PeekedMessage:
    record: Record
    redelivery_count: int
