"""A consumer as the subscription state machine sees it: explicit flow-control counters.

``permits`` are what the consumer granted with ``Flow`` and has not been sent yet; ``unacked`` is
what it was sent and has not acknowledged (nor nacked); ``blocked`` latches when ``unacked`` reaches
``max_unacked`` and clears when acknowledgements bring it to half of that or below (Pulsar's
``blockedConsumerOnUnackedMsgs``). The dispatcher never sends more than
``min(permits, max_unacked - unacked)`` messages, so neither bound is ever exceeded.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from sluice.dispatcher.keyshared import StickyRanges
from sluice.dispatcher.messages import Message
from sluice.dispatcher.model import SubscriptionSettings, SubscriptionType
from sluice.errors import ConsumerBusy, InvalidArgument, SubscriptionTypeMismatch

__all__ = ["Consumer", "ConsumerSpec", "ConsumerState", "check_join"]


class ConsumerState(enum.Enum):
    """Lifecycle of a consumer. CONNECTED -> CLOSED; UNKNOWN is never entered on purpose."""

    CONNECTED = "connected"
    CLOSED = "closed"
    UNKNOWN = "unknown"


_TRANSITIONS = {ConsumerState.CONNECTED: {ConsumerState.CLOSED}}


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """What a consumer asked for in ``Subscribe`` (values already defaulted and validated)."""

    consumer_id: str
    name: str
    priority: int = 0
    #: Partitions this consumer wants; None: every partition of the subscription.
    partitions: frozenset[int] | None = None
    #: 0: unlimited.
    max_unacked: int = 0
    #: 0: off.
    ack_timeout_ms: int = 0
    nack_delay_ms: int = 0
    #: Deliveries after the first before the DLQ; 0: never dead-letter.
    max_redeliver: int = 0
    #: Cap of the exponential nack backoff; 0: a fixed ``nack_delay_ms``.
    nack_backoff_max_ms: int = 0
    #: Key_Shared sticky mode: inclusive hash ranges; None: auto-split.
    sticky_ranges: tuple[tuple[int, int], ...] | None = None


class Consumer:
    """One connected consumer of one subscription."""

    __slots__ = (
        "active_partitions",
        "blocked",
        "delivered",
        "inflight",
        "join_seq",
        "permits",
        "spec",
        "state",
        "unacked",
    )

    def __init__(self, spec: ConsumerSpec, join_seq: int) -> None:
        self.spec = spec
        self.join_seq = join_seq
        self.state = ConsumerState.CONNECTED
        self.permits = 0
        self.unacked = 0
        self.blocked = False
        #: partition -> offset -> message, for everything sent and not yet acknowledged.
        self.inflight: dict[int, dict[int, Message]] = {}
        #: Failover/Exclusive: partitions this consumer is the active consumer of.
        self.active_partitions: set[int] = set()
        self.delivered = 0

    @property
    def consumer_id(self) -> str:
        return self.spec.consumer_id

    def transition(self, to: ConsumerState) -> None:
        assert to in _TRANSITIONS.get(self.state, set()), f"consumer {self.state} -> {to}"
        self.state = to

    def serves(self, partition: int) -> bool:
        parts = self.spec.partitions
        return parts is None or partition in parts

    def capacity(self) -> int:
        """How many messages may be sent now."""
        if self.blocked:
            return 0
        cap = self.permits
        limit = self.spec.max_unacked
        if limit:
            cap = min(cap, limit - self.unacked)
        return cap if cap > 0 else 0

    def on_sent(self, n: int) -> None:
        self.permits -= n
        self.unacked += n
        self.delivered += n
        limit = self.spec.max_unacked
        if limit and self.unacked >= limit:
            self.blocked = True

    def on_released(self, n: int) -> bool:
        """``n`` messages stopped counting as unacked; True if that unblocked the consumer."""
        self.unacked -= n
        limit = self.spec.max_unacked
        if self.blocked and self.unacked <= limit // 2:
            self.blocked = False
            return True
        return False


def check_join(
    topic: str,
    name: str,
    current: SubscriptionSettings,
    consumers: Iterable[Consumer],
    spec: ConsumerSpec,
    settings: SubscriptionSettings,
) -> None:
    """Raise the typed error a consumer with ``spec`` and ``settings`` gets when it joins subscription
    ``name`` of ``topic`` (``current`` settings, these ``consumers``); change nothing.
    Caller: ``Subscription.check_join``."""
    others = [c for c in consumers if c.consumer_id != spec.consumer_id]
    if others:
        why = current.mismatch(settings)
        if why is not None:
            raise SubscriptionTypeMismatch(
                f"subscription {name!r} on {topic!r} has {len(others)} connected consumer(s) "
                f"and its {why}; disconnect them first or use another subscription name"
            )
        if settings.type == SubscriptionType.EXCLUSIVE:
            raise ConsumerBusy(
                f"exclusive subscription {name!r} on {topic!r} already has consumer "
                f"{others[0].spec.name or others[0].consumer_id!r}"
            )
    if settings.type == SubscriptionType.KEY_SHARED and settings.sticky:
        if spec.sticky_ranges is None:
            raise InvalidArgument("sticky Key_Shared needs key_shared_policy.ranges")
        probe = StickyRanges()
        for c in others:
            if c.spec.sticky_ranges:
                probe.add(c.consumer_id, c.spec.sticky_ranges)
        probe.add(spec.consumer_id, spec.sticky_ranges)
