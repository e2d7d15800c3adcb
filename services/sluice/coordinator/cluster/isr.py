"""ISR changes proposed by a partition's leader (``AlterPartition``), decided by the controller.

Pure, like ``state.py``: :func:`alter_partition` returns the new state, the records to persist (the topic's
record with the partition's new state, one metadata-version step) and the change to push to the partition's
replicas, or raises the typed error that refuses the proposal. docs/replication.md, "ISR changes".

The checks, in order, each a refusal the leader can act on:

- the topic and partition exist (UNKNOWN_TOPIC_OR_PARTITION);
- the proposer is the current leader (NOT_LEADER) in the current leader epoch (FENCED_LEADER_EPOCH if
  older: a deposed leader; UNKNOWN_LEADER_EPOCH if newer, which the controller never issued);
- the proposal was made from the current partition epoch (STALE_PARTITION_EPOCH): a proposal built on a
  state that changed since would undo that change;
- the new ISR is non-empty, distinct, within the replicas and holds the leader (INVALID_ARGUMENT).

Eligible leader replicas (KIP-966) follow the ISR: a replica leaving the ISR while it falls below
``min_insync_replicas`` joins the ELR (the HW stops then, so it still holds every committed record); a
replica back in the ISR leaves it, and the ELR empties once the ISR is at least min ISR again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.coordinator.cluster.model import MetadataChange
from sluice.coordinator.cluster.records import new_cluster_record
from sluice.coordinator.cluster.replication import PartitionState
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.records import Result
from sluice.errors import (
    FencedLeaderEpoch,
    InvalidArgument,
    NotLeader,
    StalePartitionEpoch,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
)

__all__ = ["AlterPartitionResult", "IsrProposal", "alter_partition"]


@dataclass(frozen=True)
class IsrProposal:
    """What a leader proposes: the ISR it wants, and the state it saw when it decided."""

    topic: str
    partition: int
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]


@dataclass(frozen=True)
class AlterPartitionResult:
    state: PartitionState
    #: None when the proposal changed nothing (the same ISR again): no write, no push.
    change: MetadataChange | None


def alter_partition(cluster: ClusterState, proposal: IsrProposal) -> Result[AlterPartitionResult]:
    record = cluster.topics.get(proposal.topic)
    if record is None or not 0 <= proposal.partition < record.partitions:
        raise UnknownTopicOrPartition(f"unknown topic or partition {proposal.topic}/{proposal.partition}")
    current = record.states[proposal.partition]
    _check_current(proposal, current)
    isr = _checked_isr(proposal.new_isr, current)
    if isr == current.isr:
        return Result(AlterPartitionResult(current, None), ())
    min_isr = record.replication.min_insync_replicas
    if len(isr) >= min_isr:
        elr: tuple[int, ...] = ()
    else:
        left = [r for r in current.isr if r not in isr]
        elr = tuple(r for r in current.replicas if r not in isr and (r in current.elr or r in left))
    # ISR members hold everything committed again: their unclean-restart reports no longer describe them.
    pool = tuple(r for r in current.pool if r.broker not in isr)
    new_state = dataclasses.replace(
        current, isr=isr, elr=elr, pool=pool, partition_epoch=current.partition_epoch + 1
    )
    states = list(record.states)
    states[proposal.partition] = new_state
    updated = dataclasses.replace(record, states=tuple(states))
    version = cluster.metadata_version + 1
    change = MetadataChange(
        cluster.metadata_version, version, assign=updated.refs_by_broker([proposal.partition])
    )
    counters = new_cluster_record(version, cluster.last_broker_epoch, cluster.last_dispatcher_epoch)
    return Result(AlterPartitionResult(new_state, change), (updated, counters))


def _check_current(proposal: IsrProposal, current: PartitionState) -> None:
    where = f"{proposal.topic}/{proposal.partition}"
    if proposal.leader_epoch < current.leader_epoch:
        raise FencedLeaderEpoch(
            f"{where}: leader epoch {proposal.leader_epoch} is older than {current.leader_epoch}"
        )
    if proposal.leader_epoch > current.leader_epoch:
        raise UnknownLeaderEpoch(
            f"{where}: leader epoch {proposal.leader_epoch} is newer than {current.leader_epoch}"
        )
    if proposal.leader_id != current.leader:
        raise NotLeader(f"{where} is led by broker {current.leader}, not {proposal.leader_id}")
    if proposal.partition_epoch != current.partition_epoch:
        raise StalePartitionEpoch(
            f"{where}: proposed from partition epoch {proposal.partition_epoch}, "
            f"the current one is {current.partition_epoch}"
        )


def _checked_isr(new_isr: Sequence[int], current: PartitionState) -> tuple[int, ...]:
    if len(set(new_isr)) != len(new_isr) or not set(new_isr) <= set(current.replicas):
        raise InvalidArgument(
            f"the new ISR {list(new_isr)} must be distinct replicas of {list(current.replicas)}"
        )
    if current.leader not in new_isr:
        raise InvalidArgument(f"the new ISR {list(new_isr)} must hold the leader {current.leader}")
    # Kept in preference order, so equal sets compare equal.
    return tuple(r for r in current.replicas if r in new_isr)
