"""The controller's election function (cluster/failover.py): worked cases of Kafka's rules and KIP-966's
eligible leader replicas, and properties over random partitions (Hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.coordinator.cluster.failover import on_broker_gone
from sluice.coordinator.cluster.health import ReplicaHealth
from sluice.coordinator.cluster.model import TopicConfig
from sluice.coordinator.cluster.records import new_replicated_topic_record
from sluice.coordinator.cluster.replication import NO_LEADER, PartitionState, ReplicationConfig

F3 = ReplicationConfig(3, 2, False)
F3_UNCLEAN = ReplicationConfig(3, 2, True)


def test_the_leader_gone_the_next_in_sync_replica_in_preference_order_leads() -> None:
    state = PartitionState.new((1, 2, 3))
    out = on_broker_gone(state, 1, {2, 3}, F3)
    assert out.state == PartitionState((1, 2, 3), 2, 1, 1, (2, 3), ())
    assert not out.unclean
    assert not out.offline


def test_a_follower_gone_leaves_the_isr_and_the_leader_stays() -> None:
    out = on_broker_gone(PartitionState.new((1, 2, 3)), 3, {1, 2}, F3)
    assert out.state == PartitionState((1, 2, 3), 1, 0, 1, (1, 2), ())


def test_below_min_isr_the_gone_replica_becomes_eligible_and_can_lead_again() -> None:
    state = PartitionState((1, 2, 3), 1, 4, 6, (1, 2), ())
    # 2 goes: the ISR (1) is below min ISR 2, so the HW stops and 2 still has everything committed.
    after_2 = on_broker_gone(state, 2, {1}, F3).state
    assert (after_2.leader, after_2.isr, after_2.elr) == (1, (1,), (2,))
    # Then the leader goes, with 2 back alive: 2 leads from the ELR and is the ISR.
    after_1 = on_broker_gone(after_2, 1, {2}, F3).state
    assert after_1 == PartitionState((1, 2, 3), 2, 5, 8, (2,), (1,))


def test_no_eligible_replica_means_offline_unless_unclean_election_is_on() -> None:
    state = PartitionState((1, 2, 3), 1, 0, 0, (1,), ())  # 2 and 3 fell out of sync earlier
    offline = on_broker_gone(state, 1, {2, 3}, F3)
    assert offline.offline
    assert offline.state.leader_epoch == 1
    assert offline.state.isr == ()
    assert offline.state.elr == (1,)
    assert not offline.unclean
    unclean = on_broker_gone(state, 1, {2, 3}, F3_UNCLEAN)
    assert unclean.unclean
    assert unclean.state == PartitionState((1, 2, 3), 2, 1, 1, (2,), ())


def test_a_broker_holding_no_replica_changes_nothing() -> None:
    state = PartitionState.new((1, 2, 3))
    assert on_broker_gone(state, 7, {1, 2, 3}, F3).state is state


@st.composite
def _partitions(draw: st.DrawFn) -> tuple[PartitionState, int, set[int], ReplicationConfig]:
    replicas = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=5, unique=True)))
    factor = len(replicas)
    config = ReplicationConfig(factor, draw(st.integers(1, factor)), draw(st.booleans()))
    isr = tuple(b for b in replicas if draw(st.booleans()))
    # The invariant the controller keeps: an ELR only while the ISR is below min ISR.
    small = len(isr) < config.min_insync_replicas
    elr = tuple(b for b in replicas if small and b not in isr and draw(st.booleans()))
    leader = draw(st.sampled_from((*isr, NO_LEADER))) if isr else NO_LEADER
    state = PartitionState(replicas, leader, draw(st.integers(0, 9)), draw(st.integers(0, 9)), isr, elr)
    gone = draw(st.sampled_from(replicas))
    live = {b for b in range(7) if b != gone and draw(st.booleans())}
    return state, gone, live, config


@settings(max_examples=500, deadline=None)
@given(_partitions())
def test_election_properties(case: tuple[PartitionState, int, set[int], ReplicationConfig]) -> None:
    state, gone, live, config = case
    out = on_broker_gone(state, gone, live, config)
    new = out.state
    assert gone not in new.isr
    assert set(new.isr) <= set(new.replicas) == set(state.replicas)
    assert set(new.elr) <= set(new.replicas)
    assert not set(new.isr) & set(new.elr)
    if new.leader != NO_LEADER:
        assert new.leader in new.isr
        # A leader that stays is none of this event's business (another broker's expiry handles it).
        assert new.leader in live or new.leader == state.leader
    # Epochs: the leader epoch moves exactly with the leader, the partition epoch with any change.
    assert new.leader_epoch == state.leader_epoch + (new.leader != state.leader)
    changed = (new.leader, new.isr, new.elr) != (state.leader, state.isr, state.elr)
    assert new.partition_epoch == state.partition_epoch + changed
    eligible = [b for b in state.replicas if b in live and (b in state.isr or b in state.elr)]
    if out.unclean:
        assert config.unclean_leader_election
        assert not eligible
    elif new.leader not in (state.leader, NO_LEADER):
        # A clean election picks an in-sync (or eligible) replica, in-sync ones first, in preference order.
        in_sync = [b for b in state.replicas if b in live and b in state.isr]
        assert new.leader == (in_sync or eligible)[0]
    if state.leader in (gone, NO_LEADER) and new.leader == NO_LEADER:
        assert not eligible
        assert not (config.unclean_leader_election and live & set(state.replicas))
    if len(new.isr) >= config.min_insync_replicas:
        assert new.elr == ()


def test_replica_health_counts_under_replicated_and_offline_partitions_per_record() -> None:
    healthy = PartitionState.new((1, 2, 3))
    shrunk = on_broker_gone(healthy, 3, {1, 2}, F3).state
    offline = on_broker_gone(PartitionState((1, 2, 3), 1, 0, 0, (1,), ()), 1, {2, 3}, F3).state
    topic = new_replicated_topic_record("t", "id", [healthy, shrunk, offline], TopicConfig(), 0, F3)
    health = ReplicaHealth()
    assert health.count({"t": topic}) == (2, 1)  # the offline one's ISR is empty: under-replicated too
    # A replaced record is counted again; a deleted topic is forgotten.
    fixed = new_replicated_topic_record("t", "id", [healthy] * 3, TopicConfig(), 0, F3)
    assert health.count({"t": fixed}) == (0, 0)
    assert health.count({}) == (0, 0)
