"""An operator's recovery of an offline partition whose last eligible replicas never return. Pure.

The automatic unclean recovery (``unclean.py``) happens when the *last* eligible replica (ISR / ELR)
registers after an unclean restart; a partition whose last eligible replicas never come back (a lost
disk, a dead node) stays offline. ``RecoverPartition`` (``sluice topic recover TOPIC PARTITION``) is
KIP-966's way out, instead of ``unclean_leader_election``: the operator says those replicas are gone, and
the controller elects the most complete log among the replicas that are back:

- the candidates are the live replicas in the partition's recovery pool (``PartitionState.pool``: each
  reported its log at its unclean restart, persisted across controller terms); the longest log wins (the
  highest ``(last leader epoch, log end offset)``, undamaged first, preference order on a tie: the same
  rule as the automatic recovery, ``unclean.longest_log``);
- a live replica without a pool entry (it came back after a clean shutdown, so its log is whole up to
  where it left the ISR) is a candidate with the log it listed at its registration to this controller
  (``registered``: every registration lists the broker's logs, kept in memory for this term); one with
  neither is taken only when no reported one is live;
- it becomes leader and sole ISR member at the next leader epoch (its followers truncate to it), and the
  pool is spent. What the missing replicas held beyond its log is lost, acknowledged records included:
  the answer names them, and a dry run says all this before anything changes.

Refused (typed, nothing written): a partition with a leader, an eligible replica that is live (the normal
election takes it), a single-replica partition, or no live replica at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.coordinator.cluster.elections import ElectionResult, election_result
from sluice.coordinator.cluster.replication import NO_LEADER, PartitionState, ReplicaLog
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.cluster.unclean import LogReport, longest_log
from sluice.coordinator.records import Result
from sluice.errors import BrokerNotAvailable, InvalidArgument, UnknownTopicOrPartition

__all__ = ["RecoveryPlan", "plan_recovery", "recover_partition"]


@dataclass(frozen=True)
class RecoveryPlan:
    #: The replica elected (or that would be).
    leader: int
    leader_epoch: int
    #: Every live replica with a known log, the chosen one first.
    candidates: tuple[ReplicaLog, ...]
    #: The eligible replicas (ISR / ELR) that are not back: what they held beyond the chosen log is lost.
    missing: tuple[int, ...]
    #: The partition's state after the recovery.
    state: PartitionState


def plan_recovery(
    cluster: ClusterState,
    topic: str,
    partition: int,
    now_ms: int,
    registered: Mapping[int, Mapping[tuple[str, int], LogReport]] | None = None,
) -> RecoveryPlan:
    """What :func:`recover_partition` would do, or the typed refusal (module doc). ``registered``: per
    broker, the logs it listed at its registration (the candidates' lengths where the pool has none)."""
    record = cluster.topics.get(topic)
    if record is None or not 0 <= partition < record.partitions:
        raise UnknownTopicOrPartition(f"unknown topic or partition {topic}/{partition}")
    where = f"{topic}/{partition}"
    state = record.states[partition]
    if len(state.replicas) <= 1:
        raise InvalidArgument(f"{where} has one replica: there is no other copy to recover from")
    if state.leader != NO_LEADER:
        raise InvalidArgument(f"{where} is led by broker {state.leader}: it is not offline")
    live = set(cluster.live_brokers(now_ms))
    eligible = (*state.isr, *state.elr)
    back = [b for b in eligible if b in live]
    if back:
        raise InvalidArgument(
            f"{where}: eligible replica(s) {back} are live; the controller elects them without data loss"
        )
    reported: dict[int, ReplicaLog] = {
        r.broker: r for r in state.pool if r.broker in live and r.broker in state.replicas
    }
    for b in state.replicas:
        listed = (registered or {}).get(b, {}).get((topic, partition))
        if b in live and b not in reported and listed is not None and listed.topic_id == record.topic_id:
            reported[b] = listed.of(b)
    unreported = [b for b in state.replicas if b in live and b not in reported]
    if reported:
        chosen = longest_log(reported, state.replicas)
    elif unreported:
        chosen = unreported[0]
    else:
        raise BrokerNotAvailable(
            f"{where}: none of its replicas {list(state.replicas)} is live: start one (it reports its log "
            "as it registers), then recover"
        )
    rank = sorted(reported.values(), key=lambda r: (r.broker != chosen, -r.length[0], -r.length[1], r.broker))
    recovered = dataclasses.replace(
        state,
        leader=chosen,
        isr=(chosen,),
        elr=(),
        pool=(),
        leader_epoch=state.leader_epoch + 1,
        partition_epoch=state.partition_epoch + 1,
    )
    missing = tuple(b for b in eligible if b not in live)
    return RecoveryPlan(chosen, recovered.leader_epoch, tuple(rank), missing, recovered)


def recover_partition(
    cluster: ClusterState,
    topic: str,
    partition: int,
    now_ms: int,
    registered: Mapping[int, Mapping[tuple[str, int], LogReport]] | None = None,
) -> Result[tuple[RecoveryPlan, ElectionResult]]:
    """Elect the plan's leader: persisted and pushed like every election (one metadata-version step)."""
    plan = plan_recovery(cluster, topic, partition, now_ms, registered)
    record = cluster.topics[topic]
    states = list(record.states)
    states[partition] = plan.state
    updated = dataclasses.replace(record, states=tuple(states))
    assign = {b: list(refs) for b, refs in updated.refs_by_broker([partition]).items()}
    result = election_result(cluster, [updated], assign, [(topic, partition, plan.leader)], [])
    election = dataclasses.replace(result.response, recovered=((topic, partition),))
    return Result((plan, election), result.records)
