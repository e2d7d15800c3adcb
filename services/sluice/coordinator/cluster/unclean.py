"""Replicas that may lack what they had: an unclean restart, or damage found while serving. Pure.

KIP-966's unclean-shutdown handling, and its "unclean recovery" (docs/replication.md, "Unclean shutdowns
and damaged replicas"):

- A broker whose data directory had no clean-shutdown marker (a crash, ``kill -9``, a power loss) may have
  lost a tail it had acknowledged as an ISR member (its page cache, or a tail its recovery cut), and one
  whose recovery found damaged batches lacks those. Its registration says so (``unclean_shutdown``), with
  the log it found per partition. :func:`remove_unfit` takes it out of the ISR and the ELR of every
  replicated partition it holds, *before* it can be elected, and moves leadership away from it. It rejoins
  the ISR the normal way, by catching up from the leader (the leader's AlterPartition).
- Under every flush policy: under ``flush=always`` the high watermark waits for ``min_insync_replicas``
  fsyncs, not every ISR member's, so an ISR member cut back by a power loss may lack committed records too;
  and the broker cannot tell a ``kill -9`` (page cache kept) from a power loss (page cache gone).
- If taking it out would leave the partition no eligible replica (it is the last ISR / ELR member: every
  other was taken out the same way, or never returned), the controller instead elects the *longest log*
  among it and the live replicas taken out earlier for the same reason (their log reports are persisted
  with the partition's state, ``PartitionState.pool``, KIP-966's LastKnownElr, so a new controller term
  still has them): the highest ``(last leader epoch, log end offset)``. Every replica's log
  is a prefix of the log of the leader of its last epoch, so the longest log of the newest epoch holds
  what any other holds; under ``flush=always`` every acknowledged record was fsynced by
  ``min_insync_replicas`` replicas (the leader among them), so it holds every acknowledged record. What
  can be lost is stated in the doc. Damaged logs are taken only when no undamaged candidate exists.
- Damage found while *leading* (heartbeat ``damaged``): the same removal, for those partitions only; if
  the broker is the last eligible replica it stays (no healthier copy exists: it keeps serving everything
  but the damaged batches, which answer STORAGE_ERROR).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sluice.coordinator.cluster.elections import ElectionResult, elect_over
from sluice.coordinator.cluster.failover import elect_leader
from sluice.coordinator.cluster.records import TopicRecord
from sluice.coordinator.cluster.replication import NO_LEADER, PartitionState, ReplicaLog, ReplicationConfig
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.records import Result

__all__ = ["LogReport", "Logged", "longest_log", "on_unfit", "remove_unfit"]

PartitionKey = tuple[str, int]


@dataclass(frozen=True)
class LogReport:
    """One partition's log as a broker found it (``PartitionLogReport``)."""

    topic: str
    topic_id: str
    partition: int
    last_leader_epoch: int
    log_end_offset: int
    damaged: bool = False

    @property
    def length(self) -> tuple[int, int]:
        return (self.last_leader_epoch, self.log_end_offset)

    def of(self, broker: int) -> ReplicaLog:
        """This report as ``broker``'s entry of a partition's recovery pool."""
        return ReplicaLog(broker, self.last_leader_epoch, self.log_end_offset, self.damaged)


#: A replica's log as the pool holds it, or as a registration just reported it.
Logged = ReplicaLog | LogReport


def longest_log(pool: Mapping[int, Logged], preference: tuple[int, ...]) -> int:
    """The replica of ``pool`` with the longest log: highest (last leader epoch, log end offset); undamaged
    ones first; a tie goes to the earlier replica in preference order. ``pool`` must not be empty."""
    healthy = {b: r for b, r in pool.items() if not r.damaged}
    chosen = healthy or dict(pool)
    rank = {b: i for i, b in enumerate(preference)}
    return max(chosen, key=lambda b: (chosen[b].length, -rank.get(b, len(rank))))


def on_unfit(
    state: PartitionState,
    broker: int,
    pool: Mapping[int, Logged],
    live: Collection[int],
    config: ReplicationConfig,
    *,
    recover: bool,
) -> tuple[PartitionState, bool] | None:
    """``state`` once ``broker`` is unfit to lead (module doc); None: unchanged. The flag: an unclean
    recovery elected the leader. ``pool``: the reported logs of the recovery candidates, ``broker``'s own
    included when it reported one. ``recover``: whether the last eligible replica may be replaced by the
    longest log (an unclean registration), or stays (damage found while leading)."""
    if broker not in state.isr and broker not in state.elr:
        return None
    others = [b for b in (*state.isr, *state.elr) if b != broker]
    if others:
        isr = tuple(b for b in state.isr if b != broker)
        elr = tuple(b for b in state.elr if b != broker)
        leader = state.leader
        if leader in (broker, NO_LEADER):
            # Never the unclean path here: the unfit broker is exactly who it would pick.
            strict = dataclasses.replace(config, unclean_leader_election=False)
            leader, isr, elr, _ = elect_leader(state.replicas, isr, elr, set(live) - {broker}, strict)
        if len(isr) >= config.min_insync_replicas:
            elr = ()
        return _next(state, leader, isr, elr), False
    candidates = {b: r for b, r in pool.items() if b in state.replicas and (b == broker or b in live)}
    if not recover or not candidates:
        return None  # the last copy stays: nothing healthier to elect
    chosen = longest_log(candidates, state.replicas)
    # Always a new leader epoch, even for the same broker: a new process, whose log may be shorter than
    # what its followers fetched in the old epoch; the new epoch starts at its log end (KIP-279).
    return _next(state, chosen, (chosen,), (), new_epoch=True), True


def _next(
    state: PartitionState,
    leader: int,
    isr: tuple[int, ...],
    elr: tuple[int, ...],
    *,
    new_epoch: bool = False,
) -> PartitionState:
    # replace(), not a new state: a reassignment in progress survives it.
    return dataclasses.replace(
        state,
        leader=leader,
        leader_epoch=state.leader_epoch + (1 if new_epoch or leader != state.leader else 0),
        partition_epoch=state.partition_epoch + 1,
        isr=isr,
        elr=elr,
    )


def remove_unfit(
    cluster: ClusterState,
    broker: int,
    reports: Mapping[PartitionKey, LogReport],
    now_ms: int,
    *,
    only: Collection[PartitionKey] | None = None,
    recover: bool,
) -> Result[ElectionResult]:
    """:func:`on_unfit` over the replicated partitions ``broker`` holds (``only``: just these), one
    persisted result like every election (``elections.elect_over``). The recovery pool is read from and
    written to the partitions' states (``PartitionState.pool``), in the same write as the decisions."""
    live = set(cluster.live_brokers(now_ms))
    wanted = None if only is None else set(only)

    def decide(record: TopicRecord, p: int, state: PartitionState) -> tuple[PartitionState, bool] | None:
        key = (record.name, p)
        if len(state.replicas) <= 1 or broker not in state.replicas:
            return None
        if wanted is not None and key not in wanted:
            return None
        report = reports.get(key)
        if report is not None and report.topic_id and report.topic_id != record.topic_id:
            report = None  # a log of an older incarnation of the topic: not a copy of this one
        mine = None if report is None else report.of(broker)
        pool: dict[int, Logged] = {r.broker: r for r in state.pool}
        if mine is not None:
            pool[broker] = mine
        decided = on_unfit(state, broker, pool, live, record.replication, recover=recover)
        if decided is not None and decided[1]:
            return dataclasses.replace(decided[0], pool=()), True  # recovered: the pool is spent
        if not recover or mine is None:
            return decided
        # Out of the ISR and ELR already or not, its log is a candidate of a later recovery: the longest
        # log may be on a replica whose session expired before the others' did.
        base = state if decided is None else decided[0]
        kept = tuple(r for r in base.pool if r.broker != broker)
        new_pool = tuple(sorted((*kept, mine), key=lambda r: r.broker))
        if new_pool == base.pool:
            return decided
        if decided is None:
            return dataclasses.replace(state, pool=new_pool, partition_epoch=state.partition_epoch + 1), False
        return dataclasses.replace(decided[0], pool=new_pool), decided[1]

    return elect_over(cluster, decide, flags_recovery=True)
