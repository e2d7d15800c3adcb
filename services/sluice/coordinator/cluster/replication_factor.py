"""Changing a topic's replication factor: a reassignment of each of its partitions. Pure.

``AlterTopic(replication_factor=N)`` (``sluice topic alter --replication-factor N``) reuses the
reassignment machinery (``reassign.py``) so a factor change moves data exactly as a reassignment does,
while the partition serves:

- **Growing** adds, per partition, the least-loaded live brokers it is not on (counting every replica the
  cluster holds, the ones this change adds included; across racks first when every live broker has one).
  They start as followers outside the ISR (throttled like any reassignment), and the leader's ISR
  expansion completes each partition once its added replicas are in sync.
- **Shrinking** keeps the leader, then the in-sync replicas, then the eligible ones (ELR), then the rest, in
  that order of priority, and keeps their preference order. Nothing is added, so each partition completes
  in the same write: the dropped replicas leave the ISR and get a ``remove`` (their logs are deleted).
  Nothing acknowledged is lost: the leader and as many in-sync replicas as fit stay.

The topic's factor is the new one from this write on (partitions added later get it, and a reassignment
must name that many replicas). Refused, all or none: above the live brokers (``INVALID_REPLICATION_FACTOR``,
as at creation: never placed under-replicated), a partition being reassigned or offline, or a min ISR above
the new factor (lower it in the same call). docs/replication.md, "Changing the replication factor".
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from sluice.coordinator.cluster.model import MetadataChange
from sluice.coordinator.cluster.reassign import Reassignment, ReassignResult, started_state
from sluice.coordinator.cluster.records import TopicRecord, new_cluster_record
from sluice.coordinator.cluster.replication import (
    MAX_REPLICATION_FACTOR,
    NO_LEADER,
    PartitionState,
    ReplicationConfig,
    altered,
)
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.records import Result
from sluice.errors import (
    InvalidArgument,
    InvalidReplicationFactor,
    ReassignmentInProgress,
    UnknownTopicOrPartition,
)

__all__ = ["change_replication_factor", "grown", "shrunk"]


def change_replication_factor(
    cluster: ClusterState,
    name: str,
    factor: int,
    min_insync_replicas: int,
    unclean_leader_election: bool | None,
    throttle: int,
    now_ms: int,
) -> Result[ReassignResult]:
    """Start the factor change of topic ``name`` (module doc), with the other AlterTopic settings."""
    record = cluster.topics.get(name)
    if record is None:
        raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
    if not 1 <= factor <= MAX_REPLICATION_FACTOR:
        raise InvalidReplicationFactor(
            f"topic {name!r}: replication factor must be between 1 and {MAX_REPLICATION_FACTOR}, got {factor}"
        )
    live = cluster.live_brokers(now_ms)
    if factor > len(live):
        raise InvalidReplicationFactor(
            f"topic {name!r}: replication factor {factor} is above the {len(live)} live brokers {live}"
        )
    if throttle < 0:
        raise InvalidArgument(f"the replication throttle must be >= 0 bytes/s (0: none), got {throttle}")
    widened = dataclasses.replace(record.replication, factor=max(factor, record.replication.factor))
    config = altered(widened, name, min_insync_replicas, unclean_leader_election)
    if config.min_insync_replicas > factor:
        raise InvalidArgument(
            f"topic {name!r}: min_insync_replicas {config.min_insync_replicas} is above the new replication "
            f"factor {factor}: lower it in the same call"
        )
    config = ReplicationConfig(factor, config.min_insync_replicas, config.unclean_leader_election)
    for p, state in enumerate(record.states):
        if state.reassigning:
            raise ReassignmentInProgress(
                f"{name}/{p} is being reassigned: wait until it completes or cancel it"
            )
        if state.leader == NO_LEADER and len(state.replicas) != factor:
            raise InvalidArgument(f"{name}/{p} is offline: bring a replica back (or recover it) first")
    return _started(cluster, dataclasses.replace(record, replication=config), live, throttle)


def _started(
    cluster: ClusterState, record: TopicRecord, live: list[int], throttle: int
) -> Result[ReassignResult]:
    factor = record.replication.factor
    load = Counter(b for t in cluster.topics.values() for s in t.states for b in s.replicas)
    racks = {b: cluster.brokers[b].rack for b in live if b in cluster.brokers}
    rack_aware = bool(racks) and all(racks.get(b) for b in live)
    states = list(record.states)
    changed: dict[tuple[str, int], PartitionState] = {}
    dropped: dict[int, list[int]] = {}
    live_set = set(live)
    for p, state in enumerate(record.states):
        if len(state.replicas) == factor:
            continue
        if len(state.replicas) < factor:
            target = grown(state, factor, live, load, racks if rack_aware else {})
            load.update(b for b in target if b not in state.replicas)
        else:
            target = shrunk(state, factor)
        new_state = started_state(state, Reassignment(record.name, p, target), live_set, throttle, factor)
        if new_state is None:
            continue
        states[p] = new_state
        changed[(record.name, p)] = new_state
        # A shrink completes in this write (nothing to add): the dropped replicas are told to remove it.
        for b in state.replicas:
            if b not in new_state.replicas:
                dropped.setdefault(b, []).append(p)
    updated = dataclasses.replace(record, states=tuple(states))
    removed = {b: tuple(updated.ref(p) for p in ps) for b, ps in dropped.items()}
    version = cluster.metadata_version + 1
    # Every partition is pushed (like any AlterTopic): the min ISR may have changed for all of them.
    change = MetadataChange(
        cluster.metadata_version,
        version,
        assign=updated.refs_by_broker(),
        remove=removed,
    )
    counters = new_cluster_record(version, cluster.last_broker_epoch, cluster.last_dispatcher_epoch)
    return Result(ReassignResult(changed, change), (updated, counters))


def grown(
    state: PartitionState, factor: int, live: list[int], load: Counter[int], racks: dict[int, str]
) -> tuple[int, ...]:
    """``state``'s replicas plus the least-loaded live brokers it is not on, up to ``factor`` (racks the
    partition does not span yet first, when ``racks`` is given); ties go to the lower broker id."""
    target = list(state.replicas)
    while len(target) < factor:
        spanned = {racks.get(b) for b in target}
        free = [b for b in live if b not in target]
        target.append(min(free, key=lambda b: (bool(racks) and racks.get(b) in spanned, load[b], b)))
    return tuple(target)


def shrunk(state: PartitionState, factor: int) -> tuple[int, ...]:
    """The ``factor`` replicas of ``state`` to keep: the leader, the ISR, the ELR, the rest, in that
    priority; in their preference order."""
    rank = {b: i for i, b in enumerate(state.replicas)}

    def priority(b: int) -> tuple[int, int]:
        return (0 if b == state.leader else 1 if b in state.isr else 2 if b in state.elr else 3, rank[b])

    kept = set(sorted(state.replicas, key=priority)[:factor])
    return tuple(b for b in state.replicas if b in kept)
