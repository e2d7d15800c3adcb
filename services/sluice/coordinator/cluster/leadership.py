"""Leadership moves of live brokers: controlled shutdown and preferred-leader elections. Pure.

Like ``elections.py``, each function returns the changed topic records (one metadata-version step) and the
change to push to every replica of a changed partition, without touching the state.
docs/replication.md, "Controlled shutdown" and "Preferred leaders".

- :func:`shut_down_broker` (Kafka's controlled shutdown): the broker leaves the ISR of every replicated
  partition it holds, by the same rule as a lost broker (``failover.on_broker_gone``: below min ISR it
  joins the ELR instead, KIP-966), and each partition it leads gets the first live ISR member that is not
  shutting down (then the ELR). Never unclean, and never leaderless: a partition with no other eligible
  replica keeps this broker as leader and in its ISR (it is *remaining*; the broker retries, and after its
  timeout stops anyway, as Kafka's broker does), so a controlled shutdown never drops an ISR below what
  holds the committed data.
- :func:`elect_preferred`: partitions whose preferred replica (the first of ``replicas``) is live, not
  shutting down, in the ISR and not leading get it back as leader (leader epoch + 1; ISR unchanged).
- :func:`imbalanced_brokers`: Kafka's ``leader.imbalance.per.broker.percentage`` check, for the automatic
  rebalance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from sluice.coordinator.cluster.elections import ElectionResult, election_result
from sluice.coordinator.cluster.failover import on_broker_gone
from sluice.coordinator.cluster.model import PartitionRef
from sluice.coordinator.cluster.records import TopicRecord
from sluice.coordinator.cluster.replication import NO_LEADER, PartitionState
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.records import Record, Result

__all__ = ["ShutdownResult", "elect_preferred", "imbalanced_brokers", "shut_down_broker"]


@dataclass(frozen=True)
class ShutdownResult:
    election: ElectionResult
    #: (topic, partition) the broker still leads: no other live replica is eligible.
    remaining: tuple[tuple[str, int], ...]
    #: How many of ``remaining`` have another live replica, not shutting down, that may catch up and
    #: take over (0: asking again cannot help, the broker may stop at once).
    may_move: int = 0


def shut_down_broker(
    cluster: ClusterState, broker: int, shutting: Collection[int], now_ms: int
) -> Result[ShutdownResult]:
    """Move leadership off ``broker`` and take it out of the ISRs. ``shutting``: every broker in a
    controlled shutdown now (``broker`` included); none of them is elected."""
    live = set(cluster.live_brokers(now_ms)) - set(shutting) - {broker}
    changed: list[Record] = []
    assign: dict[int, list[PartitionRef]] = {}
    leaders: list[tuple[str, int, int]] = []
    remaining: list[tuple[str, int]] = []
    may_move = 0
    for record in cluster.topics.values():
        states = list(record.states)
        touched: list[int] = []
        clean = dataclasses.replace(record.replication, unclean_leader_election=False)
        for p, state in enumerate(states):
            if len(state.replicas) <= 1 or broker not in state.replicas or state.leader == NO_LEADER:
                continue
            new = on_broker_gone(state, broker, live, clean).state
            if state.leader == broker and new.leader == NO_LEADER:
                remaining.append((record.name, p))
                may_move += any(r in live for r in state.replicas)
                continue
            if new == state:
                continue
            states[p] = new
            touched.append(p)
            if new.leader != state.leader:
                leaders.append((record.name, p, new.leader))
        _collect(record, states, touched, changed, assign)
    result = election_result(cluster, changed, assign, leaders, [])
    return Result(ShutdownResult(result.response, tuple(remaining), may_move), result.records)


def elect_preferred(
    cluster: ClusterState,
    now_ms: int,
    excluded: Collection[int] = (),
    topics: Collection[str] | None = None,
    brokers: Collection[int] | None = None,
) -> Result[ElectionResult]:
    """Preferred replicas back to leading, where eligible. ``topics`` / ``brokers`` (preferred
    replicas) narrow it; ``excluded``: brokers in a controlled shutdown."""
    live = set(cluster.live_brokers(now_ms)) - set(excluded)
    changed: list[Record] = []
    assign: dict[int, list[PartitionRef]] = {}
    leaders: list[tuple[str, int, int]] = []
    for record in cluster.topics.values():
        if topics is not None and record.name not in topics:
            continue
        states = list(record.states)
        touched: list[int] = []
        for p, state in enumerate(states):
            if not _can_move_back(state, live) or (brokers is not None and state.replicas[0] not in brokers):
                continue
            states[p] = dataclasses.replace(
                state,
                leader=state.replicas[0],
                leader_epoch=state.leader_epoch + 1,
                partition_epoch=state.partition_epoch + 1,
            )
            touched.append(p)
            leaders.append((record.name, p, state.replicas[0]))
        _collect(record, states, touched, changed, assign)
    return election_result(cluster, changed, assign, leaders, [])


def imbalanced_brokers(
    cluster: ClusterState, now_ms: int, percentage: int, excluded: Collection[int] = ()
) -> set[int]:
    """Brokers for which more than ``percentage`` % of the partitions they are preferred for are led by
    another broker while they could lead (live, in the ISR): Kafka's imbalance check, per broker, so one
    moved partition among hundreds does not trigger a round of elections."""
    live = set(cluster.live_brokers(now_ms)) - set(excluded)
    preferred: dict[int, int] = {}
    movable: dict[int, int] = {}
    for record in cluster.topics.values():
        for state in record.states:
            if len(state.replicas) <= 1:
                continue
            first = state.replicas[0]
            preferred[first] = preferred.get(first, 0) + 1
            if _can_move_back(state, live):
                movable[first] = movable.get(first, 0) + 1
    return {b for b, n in movable.items() if n * 100 > percentage * preferred[b]}


def _can_move_back(state: PartitionState, live: Collection[int]) -> bool:
    if len(state.replicas) <= 1 or state.leader == NO_LEADER:
        return False
    first = state.replicas[0]
    return state.leader != first and first in live and first in state.isr


def _collect(
    record: TopicRecord,
    states: list[PartitionState],
    touched: list[int],
    changed: list[Record],
    assign: dict[int, list[PartitionRef]],
) -> None:
    if not touched:
        return
    updated: TopicRecord = dataclasses.replace(record, states=tuple(states))
    changed.append(updated)
    for b, refs in updated.refs_by_broker(touched).items():
        assign.setdefault(b, []).extend(refs)
