"""``round-robin``: Kafka's RoundRobinAssignor.

All partitions of all topics, in (topic, index) order, are dealt one at a time round the members
sorted by member id. One cursor goes round the whole group (not one per topic); a member that does
not subscribe to the partition's topic is skipped, and the partition goes to the next one that
does. With identical subscriptions counts differ by at most one across the whole group, not just
per topic; with differing subscriptions they can be uneven.

Worked example: ``c0`` subscribes to ``a`` and ``b``, ``c1`` to ``a`` only, ``c2`` to ``b``
only; 3 partitions each. ``a-2`` skips ``c2`` and wraps to ``c0``; ``b-0`` then skips ``c1``.

>>> from sluice.coordinator.assignors.api import GroupSpec, MemberSpec, format_assignment
>>> group = GroupSpec(members={
...     "c0": MemberSpec("c0", None, frozenset({"a", "b"})),
...     "c1": MemberSpec("c1", None, frozenset({"a"})),
...     "c2": MemberSpec("c2", None, frozenset({"b"})),
... })
>>> result = RoundRobinAssignor().assign(group, {"a": 3, "b": 3})
>>> for member_id, partitions in format_assignment(result).items():
...     print(member_id, partitions)
c0 ['a-0', 'a-2', 'b-1']
c1 ['a-1']
c2 ['b-0', 'b-2']
"""

from __future__ import annotations

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

__all__ = ["RoundRobinAssignor"]


@dataclass(frozen=True)
class RoundRobinAssignor:
    """One cursor round the sorted members, skipping non-subscribers."""

    name: str = "round-robin"

    def assign(self, group: GroupSpec, topic_partitions: Mapping[str, int]) -> Assignment:
        check_inputs(group, topic_partitions)
        result = empty_assignment(group)
        members = list(result)  # sorted by member id
        position = {member_id: i for i, member_id in enumerate(members)}
        cursor = 0  # position in `members` of the next member to be offered a partition
        for topic, subscribers in subscribers_by_topic(group, topic_partitions).items():
            # Kafka steps the cursor member by member until one subscribes; with thousands of
            # members and a topic few subscribe to that is O(partitions x members). Jumping to the
            # next subscriber's position by bisection gives the same answer in O(log members).
            seats = [position[member_id] for member_id in subscribers]  # ascending
            for index in range(topic_partitions[topic]):
                k = bisect_left(seats, cursor)
                seat = seats[k] if k < len(seats) else seats[0]
                result[members[seat]].append((topic, index))
                cursor = (seat + 1) % len(members)
        return freeze(result)
