"""Whether the live brokers can hold a topic, and the message that says why not. Pure.

A topic is never placed under-replicated: with fewer live brokers than its replication factor it is
refused (INVALID_REPLICATION_FACTOR), and with none at all BROKER_NOT_AVAILABLE says which brokers were
last heard from when (docs/replication.md, "Topic configuration").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice.coordinator.cluster.records import BrokerRecord
from sluice.coordinator.cluster.sessions import SessionTracker
from sluice.errors import BrokerNotAvailable, InvalidReplicationFactor, InvalidRequest

__all__ = ["MAX_RACK_LENGTH", "check_capacity", "validate_rack"]

#: A rack name is a label (a Kubernetes zone such as ``europe-west1-b``), not free text.
MAX_RACK_LENGTH = 128


def validate_rack(rack: str, broker_id: int) -> str:
    if len(rack) > MAX_RACK_LENGTH or any(c.isspace() or not c.isprintable() for c in rack):
        raise InvalidRequest(
            f"broker {broker_id}: rack {rack[:MAX_RACK_LENGTH]!r} must be at most {MAX_RACK_LENGTH} "
            "printable characters without spaces"
        )
    return rack


def check_capacity(
    name: str,
    factor: int,
    live: Sequence[int],
    brokers: Iterable[BrokerRecord],
    sessions: SessionTracker[int],
    now_ms: int,
) -> None:
    """Raise unless ``live`` brokers can hold ``factor`` replicas of topic ``name``."""
    if not live:
        raise BrokerNotAvailable(_no_broker_message(name, list(brokers), sessions, now_ms))
    if factor > len(live):
        raise InvalidReplicationFactor(
            f"topic {name!r}: replication factor {factor} is larger than the {len(live)} live "
            f"broker(s) ({', '.join(map(str, live))}): start more brokers or ask for fewer replicas"
        )


def _no_broker_message(
    name: str, brokers: list[BrokerRecord], sessions: SessionTracker[int], now_ms: int
) -> str:
    if not brokers:
        return (
            f"cannot create topic {name!r}: no broker has registered with this coordinator. Start one "
            "(`sluice broker --coordinator <this address>`) or use `sluice up`, then retry"
        )
    seen = []
    for b in sorted(brokers, key=lambda r: r.broker_id):
        last = sessions.last_seen_ms(b.broker_id)
        seen.append(
            f"broker {b.broker_id} at {b.endpoint}: "
            + (
                "not heard from since this coordinator started"
                if last is None
                else f"last heartbeat {max(0, now_ms - last) / 1000:.1f}s ago"
            )
        )
    return (
        f"cannot create topic {name!r}: no live broker (none heartbeated within "
        f"{sessions.timeout_ms / 1000:g}s; "
        + "; ".join(seen)
        + "). Check that the brokers are running and can reach this coordinator, then retry"
    )
