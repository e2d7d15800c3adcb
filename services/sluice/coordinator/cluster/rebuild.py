"""Rebuilding the controller's view from the brokers' reports, after its metadata store lost changes.

Redis replicates asynchronously: a Sentinel failover can promote a replica that missed the latest leader,
ISR or epoch changes. The brokers obeyed those changes and persisted their epochs, so they know better: each
reports the partitions whose state it has seen at epochs newer than the controller sent it
(``EpochReport``). :func:`merge_reports` takes, per partition, the newest reported state (highest
``(leader_epoch, partition_epoch)``; on a tie the leader's own report) when it is newer than the stored one,
with both epochs raised one above everything seen, so every replica accepts the push that follows (a broker
ignores an assignment older than its marks) and no epoch is ever reused for a different decision.

Pure, like ``state.py``: it returns the changed topic records and the change to push; the service persists
and replays. docs/replication.md, "Controller state that cannot roll back".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from sluice.coordinator.cluster.model import MetadataChange, PartitionRef
from sluice.coordinator.cluster.records import TopicRecord, new_cluster_record
from sluice.coordinator.cluster.replication import NO_LEADER, PartitionState
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.records import Record, Result

__all__ = ["EpochReport", "RebuildResult", "merge_reports", "newest_reports"]

#: Reports taken from one heartbeat (the broker sends at most this many; more is a bad request's waste).
MAX_REPORTS = 1_000


@dataclass(frozen=True)
class EpochReport:
    """One partition's state as broker ``reporter`` last obeyed it. ``leader`` -1: unknown."""

    reporter: int
    topic: str
    topic_id: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    leader: int = NO_LEADER
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()

    @property
    def epochs(self) -> tuple[int, int]:
        return (self.leader_epoch, self.partition_epoch)

    @property
    def from_leader(self) -> bool:
        return self.leader == self.reporter and self.leader != NO_LEADER


@dataclass(frozen=True)
class RebuildResult:
    #: (topic, partition, state taken) of every partition rebuilt from a report.
    rebuilt: tuple[tuple[str, int, PartitionState], ...]
    #: Partitions changed, pushed to their replicas; None: the store was not behind any report.
    change: MetadataChange | None


def newest_reports(reports: Iterable[EpochReport]) -> dict[tuple[str, int], EpochReport]:
    """Per (topic, partition), the report of the newest state; on a tie, one that knows the leader and
    the ISR, and of those the leader's own (it knows its ISR best: it proposed the last change)."""
    best: dict[tuple[str, int], EpochReport] = {}
    for r in reports:
        key = (r.topic, r.partition)
        held = best.get(key)
        if held is None or _rank(r) > _rank(held):
            best[key] = r
    return best


def _rank(r: EpochReport) -> tuple[tuple[int, int], bool, bool, bool]:
    return (r.epochs, r.leader != NO_LEADER, bool(r.isr), r.from_leader)


def _rebuilt(state: PartitionState, report: EpochReport, min_isr: int) -> PartitionState:
    """``state`` after taking ``report``: its replicas, leader and ISR when known, epochs above both."""
    replicas = report.replicas or state.replicas
    leader = report.leader if report.leader in replicas else state.leader
    isr = tuple(b for b in report.isr if b in replicas) or tuple(b for b in state.isr if b in replicas)
    elr = () if len(isr) >= min_isr else tuple(b for b in state.elr if b in replicas and b not in isr)
    same = replicas == state.replicas
    # The recovery pool is kept (its reports are still what those brokers found at their restart); a
    # reassignment in progress too, unless the replicas differ from the stored ones.
    return dataclasses.replace(
        state if same else PartitionState(replicas, leader),
        replicas=replicas,
        leader=leader,
        leader_epoch=max(state.leader_epoch, report.leader_epoch) + 1,
        partition_epoch=max(state.partition_epoch, report.partition_epoch) + 1,
        isr=isr,
        elr=elr,
        pool=tuple(r for r in state.pool if r.broker in replicas and r.broker not in isr),
    )


def merge_reports(cluster: ClusterState, reports: Iterable[EpochReport]) -> Result[RebuildResult]:
    """Take every report newer than the stored state (same topic incarnation, partition in range);
    reports of deleted or re-created topics and stale ones are dropped. One metadata-version step."""
    by_topic: dict[str, dict[int, EpochReport]] = {}
    for (topic, partition), report in newest_reports(reports).items():
        by_topic.setdefault(topic, {})[partition] = report
    changed: list[Record] = []
    assign: dict[int, list[PartitionRef]] = {}
    rebuilt: list[tuple[str, int, PartitionState]] = []
    for topic, taken in sorted(by_topic.items()):
        record = cluster.topics.get(topic)
        if record is None:
            continue
        states = list(record.states)
        touched = []
        for p, report in sorted(taken.items()):
            if report.topic_id != record.topic_id or not 0 <= p < len(states):
                continue
            stored = states[p]
            if report.epochs <= (stored.leader_epoch, stored.partition_epoch):
                continue
            states[p] = _rebuilt(stored, report, record.replication.min_insync_replicas)
            touched.append(p)
            rebuilt.append((topic, p, states[p]))
        if touched:
            updated: TopicRecord = dataclasses.replace(record, states=tuple(states))
            changed.append(updated)
            for broker, refs in updated.refs_by_broker(touched).items():
                assign.setdefault(broker, []).extend(refs)
    if not changed:
        return Result(RebuildResult((), None), ())
    version = cluster.metadata_version + 1
    change = MetadataChange(
        cluster.metadata_version, version, assign={b: tuple(refs) for b, refs in assign.items()}
    )
    counters = new_cluster_record(version, cluster.last_broker_epoch, cluster.last_dispatcher_epoch)
    return Result(RebuildResult(tuple(rebuilt), change), (*changed, counters))
