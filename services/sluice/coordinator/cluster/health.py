"""Replica health of the cluster, for the coordinator's gauges: under-replicated and offline partitions."""

from __future__ import annotations

from collections.abc import Mapping

from sluice.coordinator.cluster.records import TopicRecord
from sluice.coordinator.cluster.replication import NO_LEADER

__all__ = ["ReplicaHealth"]


class ReplicaHealth:
    """Counts per topic record, kept until the record is replaced (records are never edited), so a refresh
    after a write costs O(topics), not O(partitions)."""

    def __init__(self) -> None:
        self._by_topic: dict[str, tuple[TopicRecord, int, int]] = {}

    def count(self, topics: Mapping[str, TopicRecord]) -> tuple[int, int]:
        """(under-replicated, offline): partitions whose ISR is smaller than their replicas; without a
        leader."""
        under = offline = 0
        for name, record in topics.items():
            cached = self._by_topic.get(name)
            if cached is None or cached[0] is not record:
                cached = self._by_topic[name] = (
                    record,
                    sum(len(s.isr) < len(s.replicas) for s in record.states),
                    sum(s.leader == NO_LEADER for s in record.states),
                )
            under += cached[1]
            offline += cached[2]
        if len(self._by_topic) > len(topics):
            self._by_topic = {n: c for n, c in self._by_topic.items() if n in topics}
        return under, offline
