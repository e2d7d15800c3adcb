"""Partition reassignment: move replicas to other brokers while the partition keeps serving.

Pure, like ``isr.py``: each function returns the changed topic records (one metadata-version step) and the
change to push, or raises the typed error that refuses the request. docs/replication.md, "Reassignment".

The protocol (Kafka's, KIP-455, on this controller):

1. **Start** (:func:`start_reassignments`): the replica list becomes ``target + (current - target)``, with
   ``adding`` = target - current and ``removing`` = current - target. Every replica of the union is told;
   the new ones start as followers outside the ISR and catch up through the normal follower fetch (throttled
   at ``throttle`` bytes/s each). The ISR and the leader do not change, so producers see nothing.
2. **Complete** (:func:`complete_reassignment`), once every added replica is in the ISR (the leader's usual
   ISR expansion, ``AlterPartition``, brings it in): the replica list becomes the target, the ISR and ELR lose
   the removed replicas, leadership moves to the target's first in-sync replica if the leader is leaving
   (with a leader-epoch bump, which fences the old leader), and the removed replicas get a ``remove`` (their
   log is deleted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sluice.coordinator.cluster.model import MetadataChange, PartitionRef
from sluice.coordinator.cluster.records import TopicRecord, new_cluster_record
from sluice.coordinator.cluster.replication import NO_LEADER, PartitionState
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.records import Record, Result
from sluice.errors import (
    BrokerNotAvailable,
    InvalidArgument,
    InvalidReplicationFactor,
    ReassignmentInProgress,
    UnknownTopicOrPartition,
)

__all__ = [
    "MAX_REASSIGNMENTS",
    "ReassignResult",
    "Reassignment",
    "cancel_reassignments",
    "complete_reassignment",
    "completed",
    "reverted_state",
    "start_reassignments",
    "started_state",
]

#: Partitions one request may reassign: a plan for a whole cluster is split by the CLI into requests of
#: this size, so one controller write (one Redis transaction) stays bounded.
MAX_REASSIGNMENTS = 10_000


@dataclass(frozen=True)
class Reassignment:
    topic: str
    partition: int
    #: The target replicas in preference order.
    replicas: tuple[int, ...]


@dataclass(frozen=True)
class ReassignResult:
    #: (topic, partition) -> its new state, for every partition the step changed.
    states: dict[tuple[str, int], PartitionState]
    #: None when nothing changed (every target was the replica list already).
    change: MetadataChange | None


def start_reassignments(
    cluster: ClusterState, reassignments: Sequence[Reassignment], throttle: int, now_ms: int
) -> Result[ReassignResult]:
    """Start every reassignment, all or none: one bad entry refuses the request (nothing is written)."""
    if not reassignments or len(reassignments) > MAX_REASSIGNMENTS:
        raise InvalidArgument(
            f"a reassignment names 1-{MAX_REASSIGNMENTS} partitions, got {len(reassignments)}"
        )
    if throttle < 0:
        raise InvalidArgument(f"the replication throttle must be >= 0 bytes/s (0: none), got {throttle}")
    keys = [(r.topic, r.partition) for r in reassignments]
    if len(set(keys)) != len(keys):
        raise InvalidArgument("a reassignment names a partition twice")
    live = set(cluster.live_brokers(now_ms))
    records: dict[str, TopicRecord] = {}
    states: dict[tuple[str, int], PartitionState] = {}
    for item in reassignments:
        record = records.get(item.topic) or cluster.topics.get(item.topic)
        if record is None or not 0 <= item.partition < record.partitions:
            raise UnknownTopicOrPartition(f"unknown topic or partition {item.topic}/{item.partition}")
        new_state = started_state(
            record.states[item.partition], item, live, throttle, record.replication.factor
        )
        if new_state is None:
            continue
        records[item.topic] = _with_state(record, item.partition, new_state)
        states[(item.topic, item.partition)] = new_state
    return _step(cluster, records, states, removed={})


def started_state(
    current: PartitionState, item: Reassignment, live: set[int], throttle: int, factor: int
) -> PartitionState | None:
    """``current`` with the reassignment ``item`` started (or completed, when nothing is to be copied);
    None: the target is the replica list already. ``factor``: the topic's replication factor."""
    where = f"{item.topic}/{item.partition}"
    if current.reassigning:
        raise ReassignmentInProgress(
            f"{where} is being reassigned already (adding {list(current.adding)}, removing "
            f"{list(current.removing)}): wait until it completes"
        )
    target = tuple(item.replicas)
    if len(set(target)) != len(target):
        raise InvalidArgument(f"{where}: the target replicas {list(target)} are not distinct")
    if len(target) != factor:
        raise InvalidReplicationFactor(
            f"{where}: {len(target)} target replicas for a topic of replication factor {factor}"
        )
    added = tuple(b for b in target if b not in current.replicas)
    dead = [b for b in added if b not in live]
    if dead:
        raise BrokerNotAvailable(f"{where}: target brokers {dead} are not live brokers of the cluster")
    if target == current.replicas:
        return None
    removing = tuple(b for b in current.replicas if b not in target)
    started = dataclasses.replace(
        current,
        replicas=target + removing,
        adding=added,
        removing=removing,
        throttle=throttle if added else 0,
        original=current.replicas,
        partition_epoch=current.partition_epoch + 1,
    )
    # A pure reorder (nothing to copy) completes at once: only the preferred leader changed.
    return completed(started) or started


def completed(state: PartitionState) -> PartitionState | None:
    """``state`` with its reassignment completed, or None while an added replica is out of the ISR (or
    none of the target's replicas is in sync to lead)."""
    if not state.reassigning or not set(state.adding) <= set(state.isr):
        return None
    target = state.target
    isr = tuple(r for r in target if r in state.isr)
    leader = state.leader
    if leader not in target:
        leader = isr[0] if isr else NO_LEADER
        if leader == NO_LEADER:
            return None
    return dataclasses.replace(
        state,
        replicas=target,
        leader=leader,
        isr=isr,
        elr=tuple(r for r in state.elr if r in target),
        adding=(),
        removing=(),
        throttle=0,
        original=(),
        leader_epoch=state.leader_epoch + (leader != state.leader),
        partition_epoch=state.partition_epoch + 1,
    )


def complete_reassignment(cluster: ClusterState, topic: str, partition: int) -> Result[ReassignResult]:
    """Complete ``topic/partition``'s reassignment if it can complete now (else change nothing)."""
    record = cluster.topics.get(topic)
    if record is None or not 0 <= partition < record.partitions:
        return Result(ReassignResult({}, None), ())
    before = record.states[partition]
    done = completed(before)
    if done is None:
        return Result(ReassignResult({}, None), ())
    updated = _with_state(record, partition, done)
    removed = {b: (updated.ref(partition),) for b in before.removing}
    return _step(cluster, {topic: updated}, {(topic, partition): done}, removed)


def cancel_reassignments(cluster: ClusterState, keys: Sequence[tuple[str, int]]) -> Result[ReassignResult]:
    """Cancel the reassignments in progress of ``keys`` (all or none): each partition goes back to its
    original replicas (in their original order), the added ones are removed (their logs deleted).

    Nothing acknowledged is lost: the original replicas that are in the ISR hold every committed record,
    and the leader is one of them (it moves, with a leader-epoch bump, only if an election had picked an
    added replica). Refused when no original replica is in the ISR: the added ones hold the only complete
    copies then, and the reassignment must complete instead."""
    if not keys or len(keys) > MAX_REASSIGNMENTS:
        raise InvalidArgument(f"a cancel names 1-{MAX_REASSIGNMENTS} partitions, got {len(keys)}")
    if len(set(keys)) != len(keys):
        raise InvalidArgument("a cancel names a partition twice")
    records: dict[str, TopicRecord] = {}
    states: dict[tuple[str, int], PartitionState] = {}
    removed: dict[int, list[PartitionRef]] = {}
    for topic, partition in keys:
        record = records.get(topic) or cluster.topics.get(topic)
        if record is None or not 0 <= partition < record.partitions:
            raise UnknownTopicOrPartition(f"unknown topic or partition {topic}/{partition}")
        state = record.states[partition]
        if not state.reassigning:
            raise InvalidArgument(f"{topic}/{partition} has no reassignment in progress to cancel")
        reverted = reverted_state(state, f"{topic}/{partition}")
        record = _with_state(record, partition, reverted)
        records[topic] = record
        states[(topic, partition)] = reverted
        for b in state.adding:
            removed.setdefault(b, []).append(record.ref(partition))
    records = {name: _settled_factor(r) for name, r in records.items()}
    return _step(cluster, records, states, {b: tuple(refs) for b, refs in removed.items()})


def reverted_state(state: PartitionState, where: str) -> PartitionState:
    """``state`` back on its original replicas (:func:`cancel_reassignments`)."""
    original = state.original or tuple(r for r in state.replicas if r not in state.adding)
    isr = tuple(r for r in original if r in state.isr)
    if not isr:
        raise InvalidArgument(
            f"{where}: none of the original replicas {list(original)} is in sync (ISR {list(state.isr)}): "
            "cancelling would drop every complete copy; let the reassignment complete"
        )
    leader = state.leader if state.leader in original else isr[0]
    return dataclasses.replace(
        state,
        replicas=original,
        leader=leader,
        isr=isr,
        elr=tuple(r for r in state.elr if r in original),
        adding=(),
        removing=(),
        throttle=0,
        original=(),
        leader_epoch=state.leader_epoch + (leader != state.leader),
        partition_epoch=state.partition_epoch + 1,
    )


def _settled_factor(record: TopicRecord) -> TopicRecord:
    """After a cancel: when every partition holds the same number of replicas again and it is not the
    topic's factor (a factor change was cancelled everywhere), the factor is that number again (min ISR
    capped by it). A partly completed factor change keeps the new factor: run it again to finish."""
    counts = {len(s.replicas) for s in record.states if not s.reassigning}
    if len(counts) != 1 or any(s.reassigning for s in record.states):
        return record
    (factor,) = counts
    config = record.replication
    if factor == config.factor:
        return record
    replication = dataclasses.replace(
        config, factor=factor, min_insync_replicas=min(config.min_insync_replicas, factor)
    )
    return dataclasses.replace(record, replication=replication)


def _with_state(record: TopicRecord, partition: int, state: PartitionState) -> TopicRecord:
    states = list(record.states)
    states[partition] = state
    return dataclasses.replace(record, states=tuple(states))


def _step(
    cluster: ClusterState,
    records: dict[str, TopicRecord],
    states: dict[tuple[str, int], PartitionState],
    removed: Mapping[int, tuple[PartitionRef, ...]],
) -> Result[ReassignResult]:
    if not states:
        return Result(ReassignResult({}, None), ())
    assign: dict[int, list[PartitionRef]] = {}
    for name, record in records.items():
        touched = [p for (t, p) in states if t == name]
        for broker, refs in record.refs_by_broker(touched).items():
            assign.setdefault(broker, []).extend(refs)
    version = cluster.metadata_version + 1
    change = MetadataChange(
        cluster.metadata_version,
        version,
        assign={b: tuple(refs) for b, refs in assign.items()},
        remove=dict(removed),
    )
    counters = new_cluster_record(version, cluster.last_broker_epoch, cluster.last_dispatcher_epoch)
    written: list[Record] = [*records.values(), counters]
    return Result(ReassignResult(states, change), tuple(written))


def reassigning(cluster: ClusterState) -> Iterable[tuple[str, int, PartitionState]]:
    """Every partition with a reassignment in progress."""
    for record in cluster.topics.values():
        for p, state in enumerate(record.states):
            if state.reassigning:
                yield record.name, p, state
