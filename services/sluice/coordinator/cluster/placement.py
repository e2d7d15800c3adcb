"""Pure placement functions: partitions onto brokers, partitions onto dispatchers.

Both are deterministic (no Python ``hash()``, which is salted per process), so every coordinator replica
and every test computes the same answer.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence


def placement_offset(topic: str, brokers: int) -> int:
    """Where the round-robin of ``topic`` starts, so topics spread instead of all starting at broker 0."""
    return zlib.crc32(topic.encode()) % brokers


def place_partitions(topic: str, partitions: int, live_brokers: Sequence[int]) -> tuple[int, ...]:
    """Broker id of each partition: round-robin over the live brokers sorted by id, starting at an offset
    derived from the topic name.

    Worked example: brokers [3, 1, 2], topic "orders" (crc32 % 3 == 2), 4 partitions -> sorted brokers
    [1, 2, 3], start at index 2: partition 0 -> 3, 1 -> 1, 2 -> 2, 3 -> 3, i.e. ``(3, 1, 2, 3)``.
    """
    if not live_brokers:
        raise ValueError("no live brokers to place partitions on")
    brokers = sorted(set(live_brokers))
    start = placement_offset(topic, len(brokers))
    return tuple(brokers[(start + p) % len(brokers)] for p in range(partitions))


def _score(dispatcher_id: str, topic: str, partition: int) -> bytes:
    return hashlib.blake2b(f"{dispatcher_id}\0{topic}\0{partition}".encode(), digest_size=8).digest()


def route_partition(topic: str, partition: int, dispatchers: Sequence[str]) -> str:
    """The dispatcher serving (topic, partition): rendezvous (highest-random-weight) hashing.

    Every live dispatcher scores the partition and the highest score wins, so when a dispatcher joins or
    leaves only the partitions it wins or held move; all others stay. Ties cannot matter in practice
    (64-bit scores) but break by dispatcher id for determinism. "" when no dispatcher is live.
    """
    if not dispatchers:
        return ""
    return max(dispatchers, key=lambda d: (_score(d, topic, partition), d))


def route_topic(topic: str, partitions: int, dispatchers: Sequence[str]) -> tuple[str, ...]:
    """``route_partition`` for every partition of a topic."""
    if not dispatchers:
        return ("",) * partitions
    if len(dispatchers) == 1:
        return (dispatchers[0],) * partitions
    return tuple(route_partition(topic, p, dispatchers) for p in range(partitions))
