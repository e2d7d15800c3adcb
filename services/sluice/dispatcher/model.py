"""Domain values of a subscription: its type, lifecycle, settings and the effects of a state change."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sluice.codec.filter import MATCH_ALL, TagFilter
from sluice.dispatcher.messages import Message

__all__ = [
    "Delivery",
    "Effects",
    "ParkEvent",
    "SubscriptionSettings",
    "SubscriptionState",
    "SubscriptionType",
]


class SubscriptionType(enum.IntEnum):
    """Same numbers as ``sluice.v1.SubscriptionType``."""

    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3

    @property
    def label(self) -> str:
        return self.name.lower()


class SubscriptionState(enum.Enum):
    """LOADING (cursors being read) -> ACTIVE -> CLOSED; LOADING -> CLOSED on a failed load."""

    LOADING = "loading"
    ACTIVE = "active"
    CLOSED = "closed"
    UNKNOWN = "unknown"


SUBSCRIPTION_TRANSITIONS = {
    SubscriptionState.LOADING: {SubscriptionState.ACTIVE, SubscriptionState.CLOSED},
    SubscriptionState.ACTIVE: {SubscriptionState.CLOSED},
}


@dataclass(frozen=True, slots=True)
class SubscriptionSettings:
    """Subscription-wide settings, fixed by its first consumer (changing them needs it to be empty)."""

    type: SubscriptionType = SubscriptionType.EXCLUSIVE
    durable: bool = True
    filter: TagFilter = MATCH_ALL
    #: Key_Shared: sticky ranges (True) or auto-split (False).
    sticky: bool = False
    #: Bytes of read-but-undispatched messages held per partition before the feed pauses.
    read_ahead_bytes: int = 4 * 1024 * 1024
    #: Key_Shared poison isolation (``parking.py``): park a key once one of its messages came back this
    #: many times (0: off); with ``park_hold`` a key whose head is past ``max_redeliver`` stays parked
    #: for an operator instead of going to the DLQ; past ``park_max_messages`` parked messages it
    #: goes to the DLQ whatever the policy.
    park_after: int = 0
    park_hold: bool = False
    park_max_messages: int = 10_000
    #: And past this many bytes of parked messages over all of its keys, the largest key goes to the
    #: DLQ (the parking store stays bounded in bytes too: ``parkstore.py``).
    park_max_bytes: int = 64 * 1024 * 1024

    def mismatch(self, other: SubscriptionSettings) -> str | None:
        """Why ``other`` cannot join a subscription with these settings, or None."""
        if other.type != self.type:
            return f"type is {self.type.label}, not {other.type.label}"
        if other.durable != self.durable:
            return f"it is {'durable' if self.durable else 'non-durable'}"
        if other.filter.expression != self.filter.expression:
            return f"its filter is {self.filter.expression!r}, not {other.filter.expression!r}"
        if self.type == SubscriptionType.KEY_SHARED and other.sticky != self.sticky:
            return f"its Key_Shared mode is {'sticky' if self.sticky else 'auto-split'}"
        return None


@dataclass(slots=True)
class Delivery:
    """Messages for one consumer (one ``MessageBatch`` on the wire), with their redelivery counts."""

    consumer_id: str
    messages: list[Message] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ParkEvent:
    """An event for the parking store (``parkstore.py``; ``retry.parkbook`` defines them): ``park``
    (``message`` at ``partition``/``offset``, with its head ``count``), ``fail`` (the head's new
    ``count``), ``resolved`` (the key's parked messages of ``partition`` up to ``offset`` are finished;
    ``how``), ``unpark`` (an operator released ``key``)."""

    op: str
    partition: int
    offset: int
    key: bytes
    message: Message | None = None
    count: int = 0
    how: str = ""


@dataclass(slots=True)
class Effects:
    """What a state change asks the service layer to do."""

    deliveries: dict[str, Delivery] = field(default_factory=dict)
    #: (consumer_id, partition, is_active)
    active_changes: list[tuple[str, int, bool]] = field(default_factory=list)
    #: (message, redelivery count): produce to the DLQ topic, then call ``dead_lettered``.
    dead_letters: list[tuple[Message, int]] = field(default_factory=list)
    redelivered: int = 0
    #: A delivery or redelivery waits for a cursor flush (``PartitionCursor.gate``): flush now.
    persist_soon: bool = False
    #: Append to the parking store in order, then call ``parks_saved`` (``parkstore.py``).
    park_events: list[ParkEvent] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.deliveries or self.active_changes or self.dead_letters or self.park_events)

    def delivery(self, consumer_id: str) -> Delivery:
        d = self.deliveries.get(consumer_id)
        if d is None:
            d = self.deliveries[consumer_id] = Delivery(consumer_id)
        return d
