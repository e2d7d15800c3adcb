"""Leader elections after a broker's session expired: ``failover.on_broker_gone`` over its partitions.

Pure, like ``state.py``: :func:`elect_after_loss` returns the changed topic records (one metadata-version
step) and the change to push to every replica of a changed partition, without touching the state. Only
replicated partitions (more than one replica) are considered: a one-replica partition keeps its placement
while its broker is down, exactly as before replication (its clients get BROKER_NOT_AVAILABLE until it
returns), since there is no other copy to elect. docs/replication.md, "Failover".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from sluice.coordinator.cluster.failover import elect_leader, on_broker_gone
from sluice.coordinator.cluster.model import MetadataChange, PartitionRef
from sluice.coordinator.cluster.records import TopicRecord, new_cluster_record
from sluice.coordinator.cluster.replication import NO_LEADER, PartitionState
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.records import Record, Result

__all__ = ["ElectionResult", "elect_after_loss", "elect_offline", "elect_over", "election_result"]


@dataclass(frozen=True)
class ElectionResult:
    #: (topic, partition, new leader) of every partition whose leader changed (-1: offline).
    leaders: tuple[tuple[str, int, int], ...]
    #: Partitions elected from outside the ISR and ELR (unclean: data lost).
    unclean: tuple[tuple[str, int], ...]
    #: Partitions whose state changed (ISR or leader), pushed to their replicas; None: nothing changed.
    change: MetadataChange | None
    #: Partitions whose leader an unclean recovery chose (the longest log: ``unclean.py``).
    recovered: tuple[tuple[str, int], ...] = ()


def elect_after_loss(cluster: ClusterState, gone: int, now_ms: int) -> Result[ElectionResult]:
    live = cluster.live_brokers(now_ms)

    def decide(record: TopicRecord, p: int, state: PartitionState) -> tuple[PartitionState, bool] | None:
        if len(state.replicas) <= 1 or gone not in state.replicas:
            return None
        election = on_broker_gone(state, gone, live, record.replication)
        return None if election.state == state else (election.state, election.unclean)

    return elect_over(cluster, decide)


def elect_offline(cluster: ClusterState, now_ms: int) -> Result[ElectionResult]:
    """Leaders for offline replicated partitions (leader -1), from the live brokers now: the same rule
    as after a loss (``failover.elect_leader``: the ISR, then the ELR, then unclean only when enabled).
    Caller: the coordinator when a broker registers or comes back to life, so a partition whose every
    eligible replica was gone leads again as soon as one returns. O(partitions), on those events only."""
    live = set(cluster.live_brokers(now_ms))

    def decide(record: TopicRecord, p: int, state: PartitionState) -> tuple[PartitionState, bool] | None:
        if state.leader != NO_LEADER or len(state.replicas) <= 1:
            return None
        config = record.replication
        leader, isr, elr, was_unclean = elect_leader(state.replicas, state.isr, state.elr, live, config)
        if leader == NO_LEADER:
            return None
        if len(isr) >= config.min_insync_replicas:
            elr = ()
        elected = dataclasses.replace(
            state,
            leader=leader,
            isr=isr,
            elr=elr,
            leader_epoch=state.leader_epoch + 1,
            partition_epoch=state.partition_epoch + 1,
        )
        return elected, was_unclean

    return elect_over(cluster, decide)


def elect_over(
    cluster: ClusterState,
    decide: Callable[[TopicRecord, int, PartitionState], tuple[PartitionState, bool] | None],
    *,
    flags_recovery: bool = False,
) -> Result[ElectionResult]:
    """Apply ``decide`` (a partition's new state and whether it was unclean, or None: unchanged) to every
    partition, and gather the changed records, the pushes and the leader changes into one result. With
    ``flags_recovery`` the flag means an unclean recovery (``ElectionResult.recovered``)."""
    changed_records: list[Record] = []
    assign: dict[int, list[PartitionRef]] = {}
    leaders: list[tuple[str, int, int]] = []
    unclean: list[tuple[str, int]] = []
    for record in cluster.topics.values():
        states = list(record.states)
        touched: list[int] = []
        for p, state in enumerate(states):
            decided = decide(record, p, state)
            if decided is None:
                continue
            states[p], was_unclean = decided
            touched.append(p)
            if states[p].leader != state.leader:
                leaders.append((record.name, p, states[p].leader))
            if was_unclean:
                unclean.append((record.name, p))
        if touched:
            updated: TopicRecord = dataclasses.replace(record, states=tuple(states))
            changed_records.append(updated)
            for broker, refs in updated.refs_by_broker(touched).items():
                assign.setdefault(broker, []).extend(refs)
    result = election_result(cluster, changed_records, assign, leaders, [] if flags_recovery else unclean)
    if flags_recovery and unclean:
        return Result(dataclasses.replace(result.response, recovered=tuple(unclean)), result.records)
    return result


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
