"""Leader elections on a broker's session expiry in the pure cluster state machine (docs/replication.md,
"Failover"): its replicated partitions get a leader from the ISR (next epoch), lose it from their ISRs,
and every replica is told; one-replica partitions keep their placement, as before replication."""

from __future__ import annotations

from coordinator_context import SETTINGS, ClusterContext

from sluice.coordinator.cluster.elections import elect_after_loss, elect_offline
from sluice.coordinator.cluster.replication import NO_LEADER, ReplicationSpec


def _cluster() -> ClusterContext:
    ctx = ClusterContext(SETTINGS)
    for b in range(3):
        ctx.register_broker(b)
    ctx.create_topic("rep", 3, spec=ReplicationSpec(3, 2))
    ctx.create_topic("one", 3, spec=ReplicationSpec(1))
    return ctx


def _expire(ctx: ClusterContext, gone: int) -> None:
    """Every broker but ``gone`` heartbeats; ``gone`` misses its session."""
    for _ in range(6):
        ctx.advance(1_000)
        for b in range(3):
            if b != gone:
                ctx.heartbeat(b, ctx.state.brokers[b].broker_epoch, ctx.state.metadata_version)
    assert gone in ctx.expired


def test_the_partitions_a_gone_broker_led_get_a_leader_from_the_isr() -> None:
    ctx = _cluster()
    before = ctx.state.topics["rep"].states
    one_before = ctx.state.topics["one"].states
    _expire(ctx, 0)
    result = ctx.apply(elect_after_loss(ctx.state, 0, ctx.now_ms))
    after = ctx.state.topics["rep"].states
    for old, new in zip(before, after, strict=True):
        assert 0 not in new.isr
        assert new.partition_epoch == old.partition_epoch + 1
        if old.leader == 0:
            assert new.leader == next(b for b in old.replicas if b != 0)  # preference order, in the ISR
            assert new.leader_epoch == old.leader_epoch + 1
        else:
            assert (new.leader, new.leader_epoch) == (old.leader, old.leader_epoch)
    assert sorted(p for t, p, _ in result.leaders if t == "rep") == [
        p for p, s in enumerate(before) if s.leader == 0
    ]
    assert result.unclean == ()
    assert result.change is not None
    assert set(result.change.assign) == {0, 1, 2}  # every replica of a changed partition is told
    # A one-replica topic keeps its placement: there is no other copy to elect.
    assert ctx.state.topics["one"].states == one_before
    assert ctx.recover().topics["rep"].states == after


def test_below_min_isr_the_gone_broker_joins_the_elr() -> None:
    ctx = _cluster()
    _expire(ctx, 0)
    ctx.apply(elect_after_loss(ctx.state, 0, ctx.now_ms))
    _expire(ctx, 1)
    ctx.apply(elect_after_loss(ctx.state, 1, ctx.now_ms))
    for state in ctx.state.topics["rep"].states:
        assert state.isr == (2,)
        assert state.leader == 2
        assert 1 in state.elr  # it left while the ISR fell below min ISR 2: it holds everything committed
    # Nothing changes when an unrelated broker expires again.
    again = elect_after_loss(ctx.state, 1, ctx.now_ms)
    assert again.records == ()
    assert again.response.change is None
    assert NO_LEADER not in [s.leader for s in ctx.state.topics["rep"].states]


def test_an_offline_partition_leads_again_when_an_eligible_replica_returns() -> None:
    ctx = ClusterContext(SETTINGS)
    for b in range(3):
        ctx.register_broker(b)
    ctx.create_topic("solo", 1, spec=ReplicationSpec(3, 2))
    leader, second, third = ctx.state.topics["solo"].states[0].replicas
    order = (third, second, leader)  # the followers first, then the leader: nobody left
    for n, gone in enumerate(order):
        _expire_all_but(ctx, gone, alive=[b for b in range(3) if b not in order[: n + 1]])
        ctx.apply(elect_after_loss(ctx.state, gone, ctx.now_ms))
    state = ctx.state.topics["solo"].states[0]
    assert state.leader == NO_LEADER
    assert set(state.elr) == {second, leader}  # they left while the ISR was below min ISR
    assert elect_offline(ctx.state, ctx.now_ms).records == ()  # nobody live to lead
    ctx.register_broker(third, incarnation="again")  # not eligible: it left while the ISR was at min ISR
    assert elect_offline(ctx.state, ctx.now_ms).records == ()
    ctx.register_broker(second, incarnation="again")
    result = ctx.apply(elect_offline(ctx.state, ctx.now_ms))
    state = ctx.state.topics["solo"].states[0]
    assert (state.leader, state.isr) == (second, (second,))
    assert result.leaders == (("solo", 0, second),)
    assert result.unclean == ()


def _expire_all_but(ctx: ClusterContext, gone: int, alive: list[int]) -> None:
    """Time passes with only ``alive`` heartbeating, until ``gone``'s session has expired."""
    for _ in range(6):
        ctx.advance(1_000)
        for b in alive:
            ctx.heartbeat(b, ctx.state.brokers[b].broker_epoch, ctx.state.metadata_version)
    assert gone in ctx.expired
