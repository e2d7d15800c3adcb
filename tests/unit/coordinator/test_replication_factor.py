"""A replication factor change and a reassignment cancel in the pure cluster state machine
(docs/replication.md, "Changing the replication factor", "Cancelling a reassignment"): growing adds
followers outside the ISR and completes through the usual ISR expansion; shrinking keeps the leader and
the in-sync replicas and completes in one write; a cancel restores the original replicas in their order,
with the factor; every refusal is typed and writes nothing; a failover keeps a reassignment in progress."""

from __future__ import annotations

import pytest
from coordinator_context import SETTINGS, ClusterContext
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.coordinator.cluster.elections import elect_after_loss
from sluice.coordinator.cluster.isr import IsrProposal, alter_partition
from sluice.coordinator.cluster.reassign import (
    Reassignment,
    cancel_reassignments,
    complete_reassignment,
    start_reassignments,
)
from sluice.coordinator.cluster.replication import PartitionState, ReplicationSpec
from sluice.coordinator.cluster.replication_factor import change_replication_factor, shrunk
from sluice.coordinator.cluster.state import ClusterSettings
from sluice.errors import InvalidArgument, InvalidReplicationFactor, ReassignmentInProgress


def _cluster(brokers: int = 3, factor: int = 1, partitions: int = 2) -> ClusterContext:
    ctx = ClusterContext(ClusterSettings(**{**SETTINGS.__dict__, "default_replication_factor": 1}))
    for b in range(brokers):
        ctx.register_broker(b)
    ctx.create_topic("t", partitions, spec=ReplicationSpec(factor, 1))
    return ctx


def _expand(ctx: ClusterContext, partition: int, isr: tuple[int, ...]) -> None:
    s = ctx.state.topics["t"].states[partition]
    proposal = IsrProposal("t", partition, s.leader, s.leader_epoch, s.partition_epoch, isr)
    ctx.apply(alter_partition(ctx.state, proposal))


def test_growing_adds_followers_spread_over_the_brokers_then_completes_when_in_sync() -> None:
    ctx = _cluster(partitions=3)
    before = ctx.state.topics["t"].states
    result = ctx.apply(change_replication_factor(ctx.state, "t", 3, 0, None, 500, ctx.now_ms))
    record = ctx.state.topics["t"]
    assert record.replication.factor == 3
    for p, state in enumerate(record.states):
        assert state.replicas[0] == before[p].replicas[0] == state.leader
        assert sorted(state.replicas) == [0, 1, 2]
        assert (state.isr, state.throttle, state.original) == (before[p].isr, 500, before[p].replicas)
        assert set(state.adding) == {0, 1, 2} - {state.leader}
    assert result.change is not None
    assert ctx.recover().topics["t"] == record  # persisted, the reassignment included
    for p, state in enumerate(record.states):
        _expand(ctx, p, state.replicas)
        done = ctx.apply(complete_reassignment(ctx.state, "t", p)).states[("t", p)]
        assert (done.adding, done.original, len(done.isr)) == ((), (), 3)


def test_shrinking_keeps_the_leader_and_the_in_sync_replicas_and_deletes_the_rest_at_once() -> None:
    ctx = _cluster(brokers=4, factor=4, partitions=1)
    state = ctx.state.topics["t"].states[0]
    # Out of sync: the second preferred replica; it goes first.
    lagging = next(b for b in state.replicas if b != state.leader)
    _expand(ctx, 0, tuple(b for b in state.replicas if b != lagging))
    result = ctx.apply(change_replication_factor(ctx.state, "t", 2, 0, None, 0, ctx.now_ms))
    after = ctx.state.topics["t"].states[0]
    assert after.leader == state.leader
    assert lagging not in after.replicas
    assert len(after.replicas) == 2
    assert set(after.isr) == set(after.replicas)
    assert not after.reassigning
    assert result.change is not None
    assert set(result.change.remove) == set(state.replicas) - set(after.replicas)
    assert after.leader_epoch == state.leader_epoch


def test_shrunk_prefers_leader_isr_elr_then_preference_order() -> None:
    state = PartitionState((1, 2, 3, 4), leader=3, isr=(3, 4), elr=(2,))
    assert shrunk(state, 1) == (3,)
    assert shrunk(state, 2) == (3, 4)
    assert shrunk(state, 3) == (2, 3, 4)


def test_factor_refusals_are_typed_and_write_nothing() -> None:
    ctx = _cluster()
    stored = dict(ctx.store)
    with pytest.raises(InvalidReplicationFactor):
        change_replication_factor(ctx.state, "t", 4, 0, None, 0, ctx.now_ms)
    with pytest.raises(InvalidReplicationFactor):
        change_replication_factor(ctx.state, "t", 0, 0, None, 0, ctx.now_ms)
    with pytest.raises(InvalidArgument):
        change_replication_factor(ctx.state, "t", 1, 2, None, 0, ctx.now_ms)
    assert dict(ctx.store) == stored
    ctx.apply(change_replication_factor(ctx.state, "t", 2, 0, None, 0, ctx.now_ms))
    with pytest.raises(ReassignmentInProgress):
        change_replication_factor(ctx.state, "t", 3, 0, None, 0, ctx.now_ms)


def test_a_cancel_restores_the_original_order_leader_and_factor() -> None:
    ctx = _cluster(brokers=4, factor=3, partitions=1)
    before = ctx.state.topics["t"].states[0]
    target = (3, *before.replicas[1:])
    ctx.apply(start_reassignments(ctx.state, [Reassignment("t", 0, target)], 0, ctx.now_ms))
    result = ctx.apply(cancel_reassignments(ctx.state, [("t", 0)]))
    after = ctx.state.topics["t"].states[0]
    assert after.replicas == before.replicas
    assert (after.leader, after.leader_epoch, after.isr) == (before.leader, before.leader_epoch, before.isr)
    assert not after.reassigning
    assert result.change is not None
    assert set(result.change.remove) == {3}
    with pytest.raises(InvalidArgument):
        cancel_reassignments(ctx.state, [("t", 0)])

    ctx.apply(change_replication_factor(ctx.state, "t", 4, 0, None, 0, ctx.now_ms))
    assert ctx.state.topics["t"].replication.factor == 4
    ctx.apply(cancel_reassignments(ctx.state, [("t", 0)]))
    assert ctx.state.topics["t"].replication.factor == 3
    assert ctx.recover().topics["t"].states[0].replicas == before.replicas


def test_a_cancel_that_would_drop_every_in_sync_replica_is_refused() -> None:
    ctx = _cluster(brokers=4, factor=1, partitions=1)
    (old,) = ctx.state.topics["t"].states[0].replicas
    new = 3 if old != 3 else 2
    ctx.apply(start_reassignments(ctx.state, [Reassignment("t", 0, (new,))], 0, ctx.now_ms))
    # Caught up, then the original broker's session expired: the added replica leads, alone in sync.
    _expand(ctx, 0, (old, new))
    for _ in range(6):
        ctx.advance(1_000)
        for b in range(4):
            if b != old:
                ctx.heartbeat(b, ctx.state.brokers[b].broker_epoch, ctx.state.metadata_version)
    ctx.apply(elect_after_loss(ctx.state, old, ctx.now_ms))
    s = ctx.state.topics["t"].states[0]
    assert s.reassigning, "a failover keeps the reassignment in progress"
    assert s.leader == new
    assert old not in s.isr
    with pytest.raises(InvalidArgument):
        cancel_reassignments(ctx.state, [("t", 0)])


@settings(max_examples=60, deadline=None)
@given(
    brokers=st.integers(1, 6),
    factor=st.integers(1, 4),
    partitions=st.integers(1, 6),
    new_factor=st.integers(-2, 8),
    min_isr=st.integers(0, 4),
)
def test_any_factor_change_is_refused_typed_or_keeps_leaders_and_spreads(
    brokers: int, factor: int, partitions: int, new_factor: int, min_isr: int
) -> None:
    if factor > brokers:
        return
    ctx = _cluster(brokers=brokers, factor=factor, partitions=partitions)
    before = ctx.state.topics["t"].states
    try:
        result = ctx.apply(
            change_replication_factor(ctx.state, "t", new_factor, min_isr, None, 0, ctx.now_ms)
        )
    except (InvalidArgument, InvalidReplicationFactor):
        assert not 1 <= new_factor <= brokers or min_isr > new_factor or min_isr > max(new_factor, factor)
        assert ctx.state.topics["t"].states == before
        return
    record = ctx.state.topics["t"]
    assert record.replication.factor == new_factor
    for p, state in enumerate(record.states):
        assert len(set(state.replicas)) == len(state.replicas) == new_factor
        assert state.leader == before[p].leader
        assert all(0 <= b < brokers for b in state.replicas)
        if new_factor <= factor:
            assert not state.reassigning  # a shrink completes at once
            assert set(state.replicas) <= set(before[p].replicas)
        else:
            assert state.replicas[:factor] == before[p].replicas
    assert (result.change is not None) or new_factor == factor
