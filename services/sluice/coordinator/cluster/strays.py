"""Stray replicas: logs a registering broker holds of partitions it is no longer a replica of. Pure.

A broker that was down when its replica was moved away (a reassignment, a replication factor shrink, a
cancelled move) never received the removal: removals are pushed to live brokers only, and the full
assignment a returning broker gets names what it serves, never what to delete (brokers delete data only on
an explicit ``remove``: docs/coordinator.md). Kafka's KRaft brokers find such "stray" logs themselves
against the metadata image (KAFKA-14616). Here the controller decides, from the logs the broker lists in
``RegisterBroker``, and sends ordinary removals, so the one rule that deletes data stays explicit.

Only a log the controller can judge is a stray:

- its topic exists with the same ``topic_id`` (another id: a deleted topic, which DeleteTopic removes
  itself, or metadata the controller lost; neither is this controller's to delete);
- the broker is not among the partition's replicas (a reassignment's added and removed replicas count as
  replicas until it completes);
- the log's newest leader epoch is not above the partition's: a log that saw a newer epoch than the
  controller knows means the controller's view is older than the broker's (restored from a backup), and
  its data is kept.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.coordinator.cluster.model import PartitionRef
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.cluster.unclean import LogReport

__all__ = ["stray_replicas", "unknown_logs"]


def stray_replicas(cluster: ClusterState, broker_id: int, logs: Iterable[LogReport]) -> list[PartitionRef]:
    """The removals ``broker_id`` is owed for the logs it listed (see the module's rules)."""
    strays = []
    for report in logs:
        record = cluster.topics.get(report.topic)
        if record is None or record.topic_id != report.topic_id or not report.topic_id:
            continue
        if not 0 <= report.partition < record.partitions:
            continue
        state = record.states[report.partition]
        if broker_id in state.replicas or report.last_leader_epoch > state.leader_epoch:
            continue
        strays.append(record.ref(report.partition))
    return strays


def unknown_logs(cluster: ClusterState, logs: Iterable[LogReport]) -> list[LogReport]:
    """The logs of topic incarnations the controller does not know (kept; see the module's rules)."""
    return [
        r for r in logs if (record := cluster.topics.get(r.topic)) is None or record.topic_id != r.topic_id
    ]
