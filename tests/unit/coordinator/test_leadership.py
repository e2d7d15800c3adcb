"""Controlled shutdown and preferred leaders in the pure cluster state machine (docs/replication.md,
"Controlled shutdown", "Preferred leaders"): leaderships move to live ISR members that are not shutting
down, the broker leaves the ISRs (to the ELR below min ISR), nothing goes leaderless or unclean; preferred
replicas back in the ISR lead again; the imbalance check counts per broker."""

from __future__ import annotations

import dataclasses

from coordinator_context import SETTINGS, ClusterContext

from sluice.coordinator.cluster.leadership import elect_preferred, imbalanced_brokers, shut_down_broker
from sluice.coordinator.cluster.replication import NO_LEADER, ReplicationSpec


def _cluster(partitions: int = 6, min_isr: int = 2) -> ClusterContext:
    ctx = ClusterContext(SETTINGS)
    for b in range(3):
        ctx.register_broker(b)
    ctx.create_topic("rep", partitions, spec=ReplicationSpec(3, min_isr))
    ctx.create_topic("one", 3, spec=ReplicationSpec(1))
    return ctx


def _set_isr(ctx: ClusterContext, isr_of: dict[int, tuple[int, ...]]) -> None:
    record = ctx.state.topics["rep"]
    states = list(record.states)
    for p, isr in isr_of.items():
        states[p] = dataclasses.replace(states[p], isr=isr)
    ctx.state.topics["rep"] = dataclasses.replace(record, states=tuple(states))


def test_a_shutting_down_broker_hands_every_leadership_to_the_isr_and_leaves_the_isrs() -> None:
    ctx = _cluster()
    before = ctx.state.topics["rep"].states
    one_before = ctx.state.topics["one"].states
    result = ctx.apply(shut_down_broker(ctx.state, 0, {0}, ctx.now_ms))
    after = ctx.state.topics["rep"].states
    assert result.remaining == ()
    for old, new in zip(before, after, strict=True):
        assert 0 not in new.isr
        assert new.elr == ()
        assert new.partition_epoch == old.partition_epoch + 1
        if old.leader == 0:
            assert new.leader == next(b for b in old.replicas if b != 0)
            assert new.leader_epoch == old.leader_epoch + 1
        else:
            assert (new.leader, new.leader_epoch) == (old.leader, old.leader_epoch)
    assert {p for _, p, _ in result.election.leaders} == {p for p, s in enumerate(before) if s.leader == 0}
    assert result.election.change is not None
    assert set(result.election.change.assign) == {0, 1, 2}
    assert ctx.state.topics["one"].states == one_before  # one replica: nowhere to move
    assert ctx.recover().topics["rep"].states == after
    # Asked again (a retry): nothing left to do.
    again = shut_down_broker(ctx.state, 0, {0}, ctx.now_ms)
    assert again.records == ()
    assert again.response.remaining == ()


def test_a_partition_without_another_eligible_replica_stays_led_and_in_sync() -> None:
    ctx = _cluster(partitions=3)
    led = [p for p, s in enumerate(ctx.state.topics["rep"].states) if s.leader == 0]
    _set_isr(ctx, {p: (0,) for p in led})  # the followers fell out of the ISR
    result = ctx.apply(shut_down_broker(ctx.state, 0, {0}, ctx.now_ms))
    assert sorted(p for _, p in result.remaining) == led
    assert result.may_move == len(led)  # the followers are live: they may catch up, so ask again
    # The other brokers are stopping too: nobody can take over, asking again cannot help.
    assert shut_down_broker(ctx.state, 0, {0, 1, 2}, ctx.now_ms).response.may_move == 0
    for p in led:
        state = ctx.state.topics["rep"].states[p]
        assert state.leader == 0
        assert state.isr == (0,)


def test_below_min_isr_the_shutting_follower_joins_the_elr_and_others_shutting_are_not_elected() -> None:
    ctx = _cluster(partitions=3)
    states = ctx.state.topics["rep"].states
    p = next(i for i, s in enumerate(states) if s.leader == 0)
    first_follower = next(b for b in states[p].replicas if b != 0)
    other = next(b for b in states[p].replicas if b not in (0, first_follower))
    # The first follower is shutting down too: the leadership goes past it.
    ctx.apply(shut_down_broker(ctx.state, first_follower, {first_follower}, ctx.now_ms))
    ctx.apply(shut_down_broker(ctx.state, 0, {0, first_follower}, ctx.now_ms))
    state = ctx.state.topics["rep"].states[p]
    assert state.leader == other
    assert state.isr == (other,)
    assert 0 in state.elr  # left while the ISR fell below min ISR 2: it holds everything committed


def test_preferred_replicas_in_the_isr_lead_again() -> None:
    ctx = _cluster()
    preferred = [s.leader for s in ctx.state.topics["rep"].states]
    ctx.apply(shut_down_broker(ctx.state, 0, {0}, ctx.now_ms))
    assert imbalanced_brokers(ctx.state, ctx.now_ms, 10) == set()  # 0 is not in the ISRs: cannot lead
    _set_isr(ctx, {p: (0, 1, 2) for p in range(6)})  # it caught up and rejoined
    assert imbalanced_brokers(ctx.state, ctx.now_ms, 10) == {0}
    assert imbalanced_brokers(ctx.state, ctx.now_ms, 10, excluded={0}) == set()
    assert imbalanced_brokers(ctx.state, ctx.now_ms, 100) == set()  # at most 100% moved: not above
    before = ctx.state.topics["rep"].states
    result = ctx.apply(elect_preferred(ctx.state, ctx.now_ms, brokers={0}))
    after = ctx.state.topics["rep"].states
    assert [s.leader for s in after] == preferred
    for old, new in zip(before, after, strict=True):
        moved = old.leader != new.leader
        assert new.leader_epoch == old.leader_epoch + (1 if moved else 0)
        assert new.isr == old.isr
    assert len(result.leaders) == preferred.count(0)
    assert elect_preferred(ctx.state, ctx.now_ms).records == ()  # balanced: nothing to do
    assert NO_LEADER not in [s.leader for s in after]


def test_preferred_election_narrows_to_topics() -> None:
    ctx = _cluster()
    ctx.apply(shut_down_broker(ctx.state, 0, {0}, ctx.now_ms))
    _set_isr(ctx, {p: (0, 1, 2) for p in range(6)})
    assert elect_preferred(ctx.state, ctx.now_ms, topics={"other"}).records == ()
    assert elect_preferred(ctx.state, ctx.now_ms, topics={"rep"}).response.leaders != ()
