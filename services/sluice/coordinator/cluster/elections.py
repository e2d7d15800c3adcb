"""Leader elections after a broker's session expired: ``failover.on_broker_gone`` over its partitions.

Pure, like ``state.py``: :func:`elect_after_loss` returns the changed topic records (one metadata-version
step) and the change to push to every replica of a changed partition, without touching the state. Only
replicated partitions (more than one replica) are considered: a one-replica partition keeps its placement
while its broker is down, exactly as before replication (its clients get BROKER_NOT_AVAILABLE until it
returns), since there is no other copy to elect. docs/replication.md, "Failover".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sluice.coordinator.cluster.failover import elect_leader, on_broker_gone
from sluice.coordinator.cluster.model import MetadataChange, PartitionRef
from sluice.coordinator.cluster.records import TopicRecord, new_cluster_record
from sluice.coordinator.cluster.replication import NO_LEADER
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.records import Record, Result

__all__ = ["ElectionResult", "elect_after_loss", "elect_offline", "election_result"]


@dataclass(frozen=True)
class ElectionResult:
    #: (topic, partition, new leader) of every partition whose leader changed (-1: offline).
    leaders: tuple[tuple[str, int, int], ...]
    #: Partitions elected from outside the ISR and ELR (unclean: data lost).
    unclean: tuple[tuple[str, int], ...]
    #: Partitions whose state changed (ISR or leader), pushed to their replicas; None: nothing changed.
    change: MetadataChange | None


def elect_after_loss(cluster: ClusterState, gone: int, now_ms: int) -> Result[ElectionResult]:
    live = cluster.live_brokers(now_ms)
    changed_records: list[Record] = []
    assign: dict[int, list[PartitionRef]] = {}
    leaders: list[tuple[str, int, int]] = []
    unclean: list[tuple[str, int]] = []
    for record in cluster.topics.values():
        states = list(record.states)
        touched: list[int] = []
        for p, state in enumerate(states):
            if len(state.replicas) <= 1 or gone not in state.replicas:
                continue
            election = on_broker_gone(state, gone, live, record.replication)
            if election.state == state:
                continue
            states[p] = election.state
            touched.append(p)
            if election.state.leader != state.leader:
                leaders.append((record.name, p, election.state.leader))
            if election.unclean:
                unclean.append((record.name, p))
        if not touched:
            continue
        updated: TopicRecord = dataclasses.replace(record, states=tuple(states))
        changed_records.append(updated)
        for broker, refs in updated.refs_by_broker(touched).items():
            assign.setdefault(broker, []).extend(refs)
    return election_result(cluster, changed_records, assign, leaders, unclean)


def elect_offline(cluster: ClusterState, now_ms: int) -> Result[ElectionResult]:
    """Leaders for offline replicated partitions (leader -1), from the live brokers now: the same rule
    as after a loss (``failover.elect_leader``: the ISR, then the ELR, then unclean only when enabled).
    Caller: the coordinator when a broker registers or comes back to life, so a partition whose every
    eligible replica was gone leads again as soon as one returns. O(partitions), on those events only."""
    live = set(cluster.live_brokers(now_ms))
    changed_records: list[Record] = []
    assign: dict[int, list[PartitionRef]] = {}
    leaders: list[tuple[str, int, int]] = []
    unclean: list[tuple[str, int]] = []
    for record in cluster.topics.values():
        states = list(record.states)
        touched: list[int] = []
        for p, state in enumerate(states):
            if state.leader != NO_LEADER or len(state.replicas) <= 1:
                continue
            config = record.replication
            leader, isr, elr, was_unclean = elect_leader(state.replicas, state.isr, state.elr, live, config)
            if leader == NO_LEADER:
                continue
            if len(isr) >= config.min_insync_replicas:
                elr = ()
            states[p] = dataclasses.replace(
                state,
                leader=leader,
                isr=isr,
                elr=elr,
                leader_epoch=state.leader_epoch + 1,
                partition_epoch=state.partition_epoch + 1,
            )
            touched.append(p)
            leaders.append((record.name, p, leader))
            if was_unclean:
                unclean.append((record.name, p))
        if touched:
            updated: TopicRecord = dataclasses.replace(record, states=tuple(states))
            changed_records.append(updated)
            for broker, refs in updated.refs_by_broker(touched).items():
                assign.setdefault(broker, []).extend(refs)
    return election_result(cluster, changed_records, assign, leaders, unclean)


def election_result(
    cluster: ClusterState,
    changed_records: list[Record],
    assign: dict[int, list[PartitionRef]],
    leaders: list[tuple[str, int, int]],
    unclean: list[tuple[str, int]],
) -> Result[ElectionResult]:
    if not changed_records:
        return Result(ElectionResult((), (), None), ())
    version = cluster.metadata_version + 1
    change = MetadataChange(
        cluster.metadata_version, version, assign={b: tuple(refs) for b, refs in assign.items()}
    )
    counters = new_cluster_record(version, cluster.last_broker_epoch, cluster.last_dispatcher_epoch)
    return Result(ElectionResult(tuple(leaders), tuple(unclean), change), (*changed_records, counters))
