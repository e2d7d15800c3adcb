"""``range``: Kafka's (eager) RangeAssignor, per topic.

For each topic, its ``n`` subscribers (sorted by member id) get contiguous ranges: every one gets
``q // n`` partitions and the first ``q % n`` get one more. Because members are ordered the same way
for every topic, members with identical subscriptions get the *same partition numbers* of
co-partitioned topics (``orders-0`` and ``payments-0`` land together), which is what a join on the
partition key needs. The arithmetic equals RocketMQ's ``averagely`` (a unit test holds the two
together); it is written here the way Kafka writes it.

Worked example: ``orders`` and ``payments`` with 3 partitions each over ``c0`` and ``c1``; ``c0``
gets partitions 0-1 of both and ``c1`` partition 2 of both.

>>> from sluice.coordinator.assignors.api import GroupSpec, MemberSpec, format_assignment
>>> topics = frozenset({"orders", "payments"})
>>> group = GroupSpec(members={m: MemberSpec(m, None, topics) for m in ("c1", "c0")})
>>> result = RangeAssignor().assign(group, {"orders": 3, "payments": 3})
>>> for member_id, partitions in format_assignment(result).items():
...     print(member_id, partitions)
c0 ['orders-0', 'orders-1', 'payments-0', 'payments-1']
c1 ['orders-2', 'payments-2']
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

__all__ = ["RangeAssignor"]


@dataclass(frozen=True)
class RangeAssignor:
    """Contiguous ranges per topic, aligned across co-partitioned topics."""

    name: str = "range"

    def assign(self, group: GroupSpec, topic_partitions: Mapping[str, int]) -> Assignment:
        check_inputs(group, topic_partitions)
        result = empty_assignment(group)
        for topic, subscribers in subscribers_by_topic(group, topic_partitions).items():
            per_member, extra = divmod(topic_partitions[topic], len(subscribers))
            # Only the first `partitions` subscribers can get anything.
            for i, member_id in enumerate(subscribers[: topic_partitions[topic]]):
                start = per_member * i + min(i, extra)
                length = per_member + (1 if i < extra else 0)
                result[member_id].extend((topic, p) for p in range(start, start + length))
        return freeze(result)
