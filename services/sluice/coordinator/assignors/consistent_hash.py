"""``consistent-hash``: RocketMQ's AllocateMessageQueueConsistentHash, per topic.

Each subscriber of a topic is placed on a 64-bit hash ring ``virtual_nodes`` times (default 10);
partition ``i`` of the topic goes to the first virtual node at or after its own point, wrapping
round (RocketMQ's ``ring.tailMap(hash).firstKey()``). Points come from SHAKE-128, an extendable-output
hash in ``hashlib``, so they are stable across processes and versions (unlike Python's salted
``hash()``):

* member ``m``'s virtual nodes are the first ``virtual_nodes`` big-endian 64-bit words of
  ``SHAKE-128("member:" + m)``;
* partition ``i`` of topic ``t`` is word ``i`` of ``SHAKE-128("topic:" + t)``.

One hash call per member and one per topic (RocketMQ makes one MD5 call per virtual node and per
queue) keeps the hashing for 5,000 members x 10,000 partitions to about 10 ms, and the prefix property of an
extendable-output hash means raising ``virtual_nodes`` or adding partitions leaves existing points
where they were. 64-bit points make collisions practically impossible; two virtual nodes on the
same point would resolve to the smaller member id.

What it buys: when a member joins or leaves, only the partitions on its arcs of the ring move;
everything else stays put, without the assignor keeping any state. What it costs: counts are only
roughly even (more virtual nodes, evener counts), and nothing is promised about balance.

Worked example: 8 partitions of ``orders`` over ``c0``, ``c1``, ``c2``; then ``c1`` leaves and
only the partitions ``c1`` held move, while ``c0`` and ``c2`` keep everything they had.

>>> from sluice.coordinator.assignors.api import GroupSpec, MemberSpec, format_assignment
>>> def group(*ids: str) -> GroupSpec:
...     return GroupSpec(members={m: MemberSpec(m, None, frozenset({"orders"})) for m in ids})
>>> before = ConsistentHashAssignor().assign(group("c0", "c1", "c2"), {"orders": 8})
>>> for member_id, partitions in format_assignment(before).items():
...     print(member_id, partitions)
c0 ['orders-0', 'orders-2', 'orders-4']
c1 ['orders-3', 'orders-5', 'orders-6']
c2 ['orders-1', 'orders-7']
>>> after = ConsistentHashAssignor().assign(group("c0", "c2"), {"orders": 8})
>>> for member_id, partitions in format_assignment(after).items():
...     print(member_id, partitions)
c0 ['orders-0', 'orders-2', 'orders-4', 'orders-5', 'orders-6']
c2 ['orders-1', 'orders-3', 'orders-7']
"""

from __future__ import annotations

import hashlib
import struct
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.coordinator.assignors.api import (
    Assignment,
    GroupSpec,
    check_inputs,
    empty_assignment,
    freeze,
    subscribers_by_topic,
)
from sluice.errors import InvalidArgument

__all__ = ["DEFAULT_VIRTUAL_NODES", "ConsistentHashAssignor", "member_points", "partition_points"]

DEFAULT_VIRTUAL_NODES = 10
#: Enough for any sane group; the ring is rebuilt on every assignment, so this bounds its cost.
MAX_VIRTUAL_NODES = 1_000


def _words(label: str, count: int) -> tuple[int, ...]:
    """The first ``count`` big-endian 64-bit words of SHAKE-128(label)."""
    return struct.unpack(f">{count}Q", hashlib.shake_128(label.encode()).digest(8 * count))


def member_points(member_id: str, virtual_nodes: int) -> tuple[int, ...]:
    """Where ``member_id``'s virtual nodes sit on the ring."""
    return _words("member:" + member_id, virtual_nodes)


def partition_points(topic: str, partitions: int) -> tuple[int, ...]:
    """Where each of ``topic``'s partitions sits on the ring, by partition index."""
    return _words("topic:" + topic, partitions)


@dataclass(frozen=True)
class ConsistentHashAssignor:
    """Hash-ring placement: stateless, and moves little when members come and go."""

    virtual_nodes: int = DEFAULT_VIRTUAL_NODES
    name: str = "consistent-hash"

    def __post_init__(self) -> None:
        if not 1 <= self.virtual_nodes <= MAX_VIRTUAL_NODES:
            raise InvalidArgument(
                f"consistent-hash needs 1..{MAX_VIRTUAL_NODES} virtual nodes per member, "
                f"got {self.virtual_nodes}"
            )

    def assign(self, group: GroupSpec, topic_partitions: Mapping[str, int]) -> Assignment:
        check_inputs(group, topic_partitions)
        result = empty_assignment(group)
        # Topics usually share one set of subscribers: build each distinct ring once, and hash each
        # member once however many rings it is on.
        rings: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}
        points_of: dict[str, tuple[int, ...]] = {}
        for topic, subscribers in subscribers_by_topic(group, topic_partitions).items():
            key = tuple(subscribers)
            ring = rings.get(key)
            if ring is None:
                ring = rings[key] = self._build_ring(subscribers, points_of)
            points, owners = ring
            for index, point in enumerate(partition_points(topic, topic_partitions[topic])):
                i = bisect_left(points, point)  # first virtual node at or after the point...
                result[owners[i if i < len(points) else 0]].append((topic, index))  # ...or wrap
        return freeze(result)

    def _build_ring(
        self, subscribers: list[str], points_of: dict[str, tuple[int, ...]]
    ) -> tuple[list[int], list[str]]:
        """(points ascending, owner of each point)."""
        v = self.virtual_nodes
        raw: list[int] = []
        for member_id in subscribers:  # sorted by member id
            points = points_of.get(member_id)
            if points is None:
                points = points_of[member_id] = member_points(member_id, v)
            raw.extend(points)
        # A stable sort on the point alone keeps equal points in member-id order, and bisect_left
        # lands on the first of them: a collision goes to the smaller member id, reproducibly.
        order = sorted(range(len(raw)), key=raw.__getitem__)
        return [raw[k] for k in order], [subscribers[k // v] for k in order]
