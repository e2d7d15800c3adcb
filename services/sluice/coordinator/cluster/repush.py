"""Handlers that push a recorded topic change to the brokers again (a retried create or delete).

The retry of a CreateTopic, AddPartitions or DeleteTopic that a broker did not apply
(``coordinator/topic_acks.py``). Pure, like ``state.py``: each returns the response and the records (one
counter step) without changing the state.

A new metadata version, not a resend of the old one: a broker applies only versions newer than its own
(docs/coordinator.md), and the push queue sends a delta only to a broker known to be at its base, so the
retry travels the ordinary path (a delta, or the broker's full assignment when its version is unknown).
Assigning a partition a broker already has is a no-op there, and a removal is matched by topic_id.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluice.coordinator.cluster.model import (
    CreateTopicResult,
    DeleteTopicResult,
    MetadataChange,
    PartitionRef,
)
from sluice.coordinator.cluster.records import ClusterRecord, new_cluster_record
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.records import Result

__all__ = ["repush_removals", "repush_topic"]


def repush_topic(state: ClusterState, name: str, now_ms: int) -> Result[CreateTopicResult]:
    """Assign every partition of ``name`` to its replicas again, at the next version."""
    record = state.topics[name]
    version = state.metadata_version + 1
    change = MetadataChange(state.metadata_version, version, assign=record.refs_by_broker())
    return Result(
        CreateTopicResult(state.describe_topic(name, now_ms), change),
        (_step(state, version),),
    )


def repush_removals(
    state: ClusterState, name: str, removals: Mapping[int, tuple[PartitionRef, ...]]
) -> Result[DeleteTopicResult]:
    """Send a deleted topic's removals again, at the next version."""
    version = state.metadata_version + 1
    change = MetadataChange(state.metadata_version, version, remove=dict(removals))
    return Result(DeleteTopicResult(name, change), (_step(state, version),))


def _step(state: ClusterState, version: int) -> ClusterRecord:
    return new_cluster_record(version, state.last_broker_epoch, state.last_dispatcher_epoch)
