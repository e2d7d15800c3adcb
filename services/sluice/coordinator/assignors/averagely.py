"""``averagely``: RocketMQ's AllocateMessageQueueAveragely, exactly, applied per topic.

For each topic, its ``n`` subscribers (sorted by member id) split its ``q`` partitions into
contiguous blocks. With ``mod = q % n``, the first ``mod`` subscribers take ``q // n + 1``
partitions, the rest take ``q // n``; when ``q <= n`` the first ``q`` subscribers take one each and
the others get nothing. This is RocketMQ's arithmetic kept as written (``averageSize``,
``startIndex``, ``range``; see seed 002), so a mixed fleet would agree partition for partition. It
gives the same answer as Kafka's range assignor; the two names exist for the two communities.

Worked example: topic ``orders`` with 8 partitions, consumers ``c0``, ``c1``, ``c2``
(``mod = 2``, so ``c0`` and ``c1`` take 3 each and ``c2`` takes 2); ``audit`` with 2 partitions
and only ``c1``, ``c2`` subscribed; a third consumer of ``audit`` would get nothing.

>>> from sluice.coordinator.assignors.api import GroupSpec, MemberSpec, format_assignment
>>> both = frozenset({"orders", "audit"})
>>> group = GroupSpec(members={
...     "c0": MemberSpec("c0", None, frozenset({"orders"})),
...     "c1": MemberSpec("c1", None, both),
...     "c2": MemberSpec("c2", None, both),
... })
>>> result = AveragelyAssignor().assign(group, {"orders": 8, "audit": 2})
>>> for member_id, partitions in format_assignment(result).items():
...     print(member_id, partitions)
c0 ['orders-0', 'orders-1', 'orders-2']
c1 ['audit-0', 'orders-3', 'orders-4', 'orders-5']
c2 ['audit-1', 'orders-6', 'orders-7']
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

__all__ = ["AveragelyAssignor", "averagely_slice"]


def averagely_slice(index: int, queue_count: int, consumer_count: int) -> range:
    """The queue indexes RocketMQ's AllocateMessageQueueAveragely gives consumer ``index``.

    Transliterated from the Java (variable names kept) so it can be checked against the seed line
    by line. ``range`` may come out zero or negative when there are more consumers than queues: the
    Java ``for`` loop then runs no times, and so does Python's ``range``.
    """
    mod = queue_count % consumer_count
    if queue_count <= consumer_count:
        average_size = 1
    elif mod > 0 and index < mod:
        average_size = queue_count // consumer_count + 1
    else:
        average_size = queue_count // consumer_count
    start_index = index * average_size if (mod > 0 and index < mod) else index * average_size + mod
    span = min(average_size, queue_count - start_index)
    # The Java takes `(startIndex + i) % mqAll.size()`; start_index + i < queue_count always holds
    # inside the loop, so the modulo never wraps and a plain range is the same list.
    return range(start_index, start_index + max(span, 0))


@dataclass(frozen=True)
class AveragelyAssignor:
    """Contiguous, RocketMQ-compatible blocks per topic."""

    name: str = "averagely"

    def assign(self, group: GroupSpec, topic_partitions: Mapping[str, int]) -> Assignment:
        check_inputs(group, topic_partitions)
        result = empty_assignment(group)
        for topic, subscribers in subscribers_by_topic(group, topic_partitions).items():
            queue_count, consumer_count = topic_partitions[topic], len(subscribers)
            # Consumers at index >= queue_count get nothing (the Java's `range` comes out <= 0), so
            # with 5,000 members and 10 queues only the first 10 are worth visiting.
            for index, member_id in enumerate(subscribers[:queue_count]):
                queues = averagely_slice(index, queue_count, consumer_count)
                result[member_id].extend((topic, q) for q in queues)
        return freeze(result)
