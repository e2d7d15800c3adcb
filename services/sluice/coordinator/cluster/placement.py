"""Pure placement functions: partitions (and their replicas) onto brokers, partitions onto dispatchers.

All are deterministic (no Python ``hash()``, which is salted per process), so every coordinator replica
and every test computes the same answer.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping, Sequence


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


def assign_replicas(
    topic: str,
    partitions: int,
    live_brokers: Sequence[int],
    factor: int,
    racks: Mapping[int, str] | None = None,
) -> tuple[tuple[int, ...], ...]:
    """The replicas of each partition, preferred leader first (docs/replication.md, "Placement").

    Kafka's assignment: leaders go round-robin over the brokers from an offset derived from the topic (so
    with ``factor`` 1 this is exactly :func:`place_partitions`), and the followers of a partition are the
    brokers at growing distances from its leader, the distances shifting by one every ``len(brokers)``
    partitions, so that the followers of one broker's partitions spread over all the others instead of
    always landing on its neighbour. When every live broker has a rack, the brokers are first ordered to
    alternate racks, and a follower is skipped while its rack already holds a replica of the partition and
    some rack holds none; each partition then spans ``min(factor, racks)`` racks. When only some brokers
    have a rack, racks are ignored (a partial label is more likely a mistake than a topology).

    Raises ValueError when ``factor`` exceeds the live brokers (the caller checks first, with a typed
    error).
    """
    brokers = sorted(set(live_brokers))
    n = len(brokers)
    if not 1 <= factor <= n:
        raise ValueError(f"replication factor {factor} needs 1 to {n} live brokers")
    rack_of = {b: racks.get(b, "") for b in brokers} if racks else {}
    if rack_of and all(rack_of.values()):
        return _rack_aware(topic, partitions, _alternate_racks(brokers, rack_of), factor, rack_of)
    start = placement_offset(topic, n)
    out = []
    shift = start
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (start + p) % n
        out.append(
            (brokers[first], *(brokers[_follower_index(first, shift, j, n)] for j in range(factor - 1)))
        )
    return tuple(out)


def _follower_index(first: int, shift: int, j: int, n: int) -> int:
    """Kafka's ``replicaIndex``: never ``first`` itself (the distance is 1 to n-1)."""
    return (first + 1 + (shift + j) % (n - 1)) % n


def _alternate_racks(brokers: Sequence[int], rack_of: Mapping[int, str]) -> list[int]:
    """Brokers ordered rack by rack in turn (a1, b1, c1, a2, b2, ...), so consecutive brokers, which the
    round-robin makes leaders and followers of one partition, sit in different racks."""
    by_rack: dict[str, list[int]] = {}
    for b in brokers:
        by_rack.setdefault(rack_of[b], []).append(b)
    columns = [by_rack[r] for r in sorted(by_rack)]
    return [col[i] for i in range(max(len(c) for c in columns)) for col in columns if i < len(col)]


def _rack_aware(
    topic: str, partitions: int, arranged: Sequence[int], factor: int, rack_of: Mapping[int, str]
) -> tuple[tuple[int, ...], ...]:
    n = len(arranged)
    racks = len(set(rack_of.values()))
    start = placement_offset(topic, n)
    shift = start
    out = []
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (start + p) % n
        chosen = [arranged[first]]
        used_racks = {rack_of[arranged[first]]}
        k = 0
        # Each follower needs at most n candidates (every broker is one of them); bounded by n*factor.
        while len(chosen) < factor and k < n * factor:
            broker = arranged[_follower_index(first, shift * racks, k, n)]
            k += 1
            if broker in chosen:
                continue
            if rack_of[broker] in used_racks and len(used_racks) < racks:
                continue
            chosen.append(broker)
            used_racks.add(rack_of[broker])
        if len(chosen) < factor:  # the skip rules starved it (cannot happen with n >= factor)
            chosen += [b for b in arranged if b not in chosen][: factor - len(chosen)]
        out.append(tuple(chosen))
    return tuple(out)


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
