"""``averagely-by-circle``: RocketMQ's AllocateMessageQueueAveragelyByCircle, per topic.

For each topic, its subscribers (sorted by member id) are dealt its partitions like cards:
partition ``i`` goes to subscriber ``i % n``. Counts are as even as ``averagely``'s, but each
member's partitions are spread across the topic instead of contiguous, so a hot range of partitions
is shared out.

Worked example: 8 partitions over ``c0``, ``c1``, ``c2``.

>>> from sluice.coordinator.assignors.api import GroupSpec, MemberSpec, format_assignment
>>> group = GroupSpec(members={m: MemberSpec(m, None, frozenset({"orders"})) for m in ("c2", "c0", "c1")})
>>> result = AveragelyByCircleAssignor().assign(group, {"orders": 8})
>>> for member_id, partitions in format_assignment(result).items():
...     print(member_id, partitions)
c0 ['orders-0', 'orders-3', 'orders-6']
c1 ['orders-1', 'orders-4', 'orders-7']
c2 ['orders-2', 'orders-5']
"""

from __future__ import annotations

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

__all__ = ["AveragelyByCircleAssignor"]


@dataclass(frozen=True)
class AveragelyByCircleAssignor:
    """Deal each topic's partitions round its subscribers."""

    name: str = "averagely-by-circle"

    def assign(self, group: GroupSpec, topic_partitions: Mapping[str, int]) -> Assignment:
        check_inputs(group, topic_partitions)
        result = empty_assignment(group)
        for topic, subscribers in subscribers_by_topic(group, topic_partitions).items():
            n = len(subscribers)
            for index, member_id in enumerate(subscribers[: topic_partitions[topic]]):
                # RocketMQ walks i = index, index+1, ... keeping i % n == index: a stride of n.
                result[member_id].extend((topic, i) for i in range(index, topic_partitions[topic], n))
        return freeze(result)
