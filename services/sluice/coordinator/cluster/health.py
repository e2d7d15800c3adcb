"""Replica health of the cluster, for the coordinator's gauges: under-replicated, offline and reassigning
partitions."""

from __future__ import annotations

from collections.abc import Mapping

from sluice.coordinator.cluster.records import TopicRecord
from sluice.coordinator.cluster.replication import NO_LEADER

__all__ = ["ReplicaHealth"]


class ReplicaHealth:
    """Counts per topic record, kept until the record is replaced (records are never edited), so a refresh
    after a write costs O(topics), not O(partitions)."""

    def __init__(self) -> None:
        self._by_topic: dict[str, tuple[TopicRecord, int, int, int]] = {}
        #: Partitions with a reassignment in progress, as of the last :meth:`count`.
        self.reassigning = 0

    def count(self, topics: Mapping[str, TopicRecord]) -> tuple[int, int]:
        """(under-replicated, offline): partitions whose ISR is smaller than their replicas; without a
        leader. A reassignment's added replicas do not count until they are in sync (KIP-352): copying a
        partition to a new broker is not a failure, and a throttled copy may take hours."""
        under = offline = reassigning = 0
        for name, record in topics.items():
            cached = self._by_topic.get(name)
            if cached is None or cached[0] is not record:
                cached = self._by_topic[name] = (
                    record,
                    sum(len(s.isr) < len(s.replicas) - len(s.adding) for s in record.states),
                    sum(s.leader == NO_LEADER for s in record.states),
                    sum(s.reassigning for s in record.states),
                )
            under += cached[1]
            offline += cached[2]
            reassigning += cached[3]
        self.reassigning = reassigning
        if len(self._by_topic) > len(topics):
            self._by_topic = {n: c for n, c in self._by_topic.items() if n in topics}
        return under, offline
