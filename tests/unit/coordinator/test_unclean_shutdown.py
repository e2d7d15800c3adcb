"""KIP-966's unclean-shutdown handling and unclean recovery in the pure controller (cluster/unclean.py;
docs/replication.md, "Unclean shutdowns and damaged replicas"): a broker restarted unclean leaves every
ISR and ELR before it can be elected; the last eligible replica gives way to the longest reported log;
damage found while leading moves leadership to a healthy ISR member."""

from __future__ import annotations

import pytest
from coordinator_context import SETTINGS, ClusterContext

from sluice.coordinator.cluster.elections import elect_after_loss
from sluice.coordinator.cluster.isr import IsrProposal, alter_partition
from sluice.coordinator.cluster.recovery import plan_recovery, recover_partition
from sluice.coordinator.cluster.replication import (
    NO_LEADER,
    PartitionState,
    ReplicationConfig,
    ReplicationSpec,
)
from sluice.coordinator.cluster.unclean import LogReport, longest_log, on_unfit, remove_unfit
from sluice.coordinator.state import CoordinatorState
from sluice.errors import InvalidArgument

CONFIG = ReplicationConfig(3, 2)


def _report(epoch: int, end: int, damaged: bool = False) -> LogReport:
    return LogReport("t", "", 0, epoch, end, damaged)


def test_an_unclean_follower_leaves_the_isr_and_the_leader_stays() -> None:
    state = PartitionState((0, 1, 2), 0, 3, 7, (0, 1, 2), ())
    new, recovered = on_unfit(state, 2, {}, {0, 1, 2}, CONFIG, recover=True) or (state, None)
    assert new == PartitionState((0, 1, 2), 0, 3, 8, (0, 1), ())
    assert recovered is False


def test_an_unclean_leader_gives_way_to_a_healthy_isr_member() -> None:
    state = PartitionState((0, 1, 2), 0, 3, 7, (0, 1, 2), ())
    new, _ = on_unfit(state, 0, {}, {0, 1, 2}, CONFIG, recover=True) or (state, None)
    assert (new.leader, new.leader_epoch, new.isr) == (1, 4, (1, 2))


def test_an_unclean_elr_member_leaves_the_elr_and_is_never_elected() -> None:
    # The ISR is gone (dead brokers), broker 1 holds the ELR with broker 2; broker 1 returns unclean.
    state = PartitionState((0, 1, 2), NO_LEADER, 5, 9, (), (1, 2))
    new, recovered = on_unfit(state, 1, {1: _report(5, 100)}, {0, 1}, CONFIG, recover=True) or (state, None)
    assert (new.leader, new.isr, new.elr) == (NO_LEADER, (), (2,))  # broker 2 may still return clean
    assert recovered is False


def test_the_last_eligible_replica_gives_way_to_the_longest_reported_log() -> None:
    state = PartitionState((0, 1, 2), 2, 5, 9, (2,), ())
    pool = {0: _report(5, 120), 1: _report(5, 110), 2: _report(5, 100)}
    new, recovered = on_unfit(state, 2, pool, {0, 1, 2}, CONFIG, recover=True) or (state, None)
    assert (new.leader, new.leader_epoch, new.isr, new.elr) == (0, 6, (0,), ())
    assert recovered is True


def test_a_newer_epoch_beats_a_longer_log_and_damage_loses_to_health() -> None:
    order = (0, 1, 2)
    assert longest_log({0: _report(4, 500), 1: _report(5, 100)}, order) == 1
    assert longest_log({0: _report(5, 500, damaged=True), 1: _report(5, 100)}, order) == 1
    assert longest_log({0: _report(5, 100, damaged=True)}, order) == 0  # the only copy
    assert longest_log({2: _report(5, 100), 1: _report(5, 100)}, order) == 1  # a tie: preference order


def test_damage_while_leading_moves_leadership_but_the_last_copy_stays() -> None:
    state = PartitionState((0, 1, 2), 0, 3, 7, (0, 1, 2), ())
    new, _ = on_unfit(state, 0, {}, {0, 1, 2}, CONFIG, recover=False) or (state, None)
    assert (new.leader, new.isr) == (1, (1, 2))
    alone = PartitionState((0, 1, 2), 0, 3, 7, (0,), ())
    assert on_unfit(alone, 0, {0: _report(3, 10, True)}, {0, 1, 2}, CONFIG, recover=False) is None


def test_every_replica_restarting_unclean_elects_the_longest_log_once_the_last_reports() -> None:
    ctx = ClusterContext(SETTINGS)
    for b in range(3):
        ctx.register_broker(b)
    ctx.create_topic("t", 1, spec=ReplicationSpec(3, 2))
    lengths = {0: 300, 1: 200, 2: 250}  # the old leader (0) is longest
    for b in (0, 1, 2):  # each restarts unclean, in turn; none of their sessions expired
        result = ctx.apply(
            remove_unfit(ctx.state, b, {("t", 0): _report(0, lengths[b])}, ctx.now_ms, recover=True)
        )
        state = ctx.state.topics["t"].states[0]
        if b < 2:
            assert b not in state.isr
            assert b != state.leader
            assert result.recovered == ()
            assert [r.broker for r in state.pool] == list(range(b + 1))
            # Persisted: a new controller term (state recovered from the store) still has the reports.
            assert ctx.recover().topics["t"].states[0].pool == state.pool
    assert result.recovered == (("t", 0),)
    assert (state.leader, state.isr, state.elr) == (0, (0,), ())
    assert state.pool == ()  # the pool is spent
    assert ctx.recover().topics["t"].states[0] == state  # persisted


def test_a_recovery_that_keeps_the_same_leader_still_starts_a_new_leader_epoch() -> None:
    state = PartitionState((0, 1, 2), 2, 5, 9, (2,), ())
    new, recovered = on_unfit(state, 2, {2: _report(5, 100)}, {0, 1, 2}, CONFIG, recover=True) or (
        state,
        None,
    )
    assert (new.leader, new.leader_epoch, recovered) == (2, 6, True)


def test_the_pool_survives_a_new_controller_term_and_an_isr_rejoin_drops_the_entry() -> None:
    ctx = ClusterContext(SETTINGS)
    for b in range(3):
        ctx.register_broker(b)
    ctx.create_topic("t", 1, spec=ReplicationSpec(3, 2))
    ctx.apply(remove_unfit(ctx.state, 0, {("t", 0): _report(0, 300)}, ctx.now_ms, recover=True))
    ctx.apply(remove_unfit(ctx.state, 1, {("t", 0): _report(0, 200)}, ctx.now_ms, recover=True))
    # A new term: the state rebuilt from the store (the brokers heartbeat to it as they did before).
    fresh = CoordinatorState(settings=ctx.state.settings)
    fresh.replay_all([ctx.root.codec.decode(f, v) for f, v in ctx.store.items()])
    ctx.root, ctx.state = fresh, fresh.cluster
    for b in range(3):
        ctx.heartbeat(b, ctx.state.brokers[b].broker_epoch, ctx.state.metadata_version)
    result = ctx.apply(remove_unfit(ctx.state, 2, {("t", 0): _report(0, 100)}, ctx.now_ms, recover=True))
    state = ctx.state.topics["t"].states[0]
    assert result.recovered == (("t", 0),)
    assert state.leader == 0, "the longest log, reported to the previous term"

    ctx.apply(remove_unfit(ctx.state, 1, {("t", 0): _report(0, 200)}, ctx.now_ms, recover=True))
    assert [r.broker for r in ctx.state.topics["t"].states[0].pool] == [1]
    s = ctx.state.topics["t"].states[0]
    ctx.apply(
        alter_partition(ctx.state, IsrProposal("t", 0, s.leader, s.leader_epoch, s.partition_epoch, (0, 1)))
    )
    assert ctx.state.topics["t"].states[0].pool == ()


def test_an_operator_recovery_elects_the_longest_returned_log_and_names_the_gone() -> None:
    ctx = ClusterContext(SETTINGS)
    for b in range(3):
        ctx.register_broker(b)
    ctx.create_topic("t", 1, spec=ReplicationSpec(3, 2))
    with pytest.raises(InvalidArgument):  # led: not offline
        plan_recovery(ctx.state, "t", 0, ctx.now_ms)
    ctx.apply(remove_unfit(ctx.state, 1, {("t", 0): _report(0, 200)}, ctx.now_ms, recover=True))
    ctx.apply(remove_unfit(ctx.state, 2, {("t", 0): _report(0, 250)}, ctx.now_ms, recover=True))
    # Broker 0, the last eligible, never returns: its session expires, the partition goes offline.
    for _ in range(6):
        ctx.advance(1_000)
        for b in (1, 2):
            ctx.heartbeat(b, ctx.state.brokers[b].broker_epoch, ctx.state.metadata_version)
    ctx.apply(elect_after_loss(ctx.state, 0, ctx.now_ms))
    before = ctx.state.topics["t"].states[0]
    assert before.leader == NO_LEADER
    plan = plan_recovery(ctx.state, "t", 0, ctx.now_ms)
    assert (plan.leader, plan.missing) == (2, (0,))
    assert [c.broker for c in plan.candidates] == [2, 1]
    assert ctx.state.topics["t"].states[0] == before  # a plan changes nothing
    ctx.apply(recover_partition(ctx.state, "t", 0, ctx.now_ms))
    after = ctx.recover().topics["t"].states[0]
    assert (after.leader, after.isr, after.elr, after.pool) == (2, (2,), (), ())
    assert after.leader_epoch == before.leader_epoch + 1
    with pytest.raises(InvalidArgument):
        plan_recovery(ctx.state, "t", 0, ctx.now_ms)


def test_an_operator_recovery_weighs_a_cleanly_returned_replica_by_the_log_it_listed() -> None:
    """One replica reported at an unclean restart (in the pool); another came back after a clean shutdown
    with a longer log, listed at its registration: the recovery elects the latter, where it took the
    former when only the pool counted."""
    ctx = ClusterContext(SETTINGS)
    for b in range(3):
        ctx.register_broker(b)
    ctx.create_topic("t", 1, spec=ReplicationSpec(3, 2))
    topic_id = ctx.state.topics["t"].topic_id
    leader = ctx.state.topics["t"].states[0].leader
    unclean, clean = (b for b in range(3) if b != leader)
    # The clean one falls behind and leaves the ISR (2 remain: min ISR holds, so it is not kept eligible);
    # its log then has 260 records. The other restarts unclean (200 records, in the pool), and the leader
    # is lost for good.
    s = ctx.state.topics["t"].states[0]
    ctx.apply(
        alter_partition(
            ctx.state, IsrProposal("t", 0, leader, s.leader_epoch, s.partition_epoch, (leader, unclean))
        )
    )
    ctx.apply(remove_unfit(ctx.state, unclean, {("t", 0): _report(0, 200)}, ctx.now_ms, recover=True))
    for _ in range(6):
        ctx.advance(1_000)
        for b in (unclean, clean):
            ctx.heartbeat(b, ctx.state.brokers[b].broker_epoch, ctx.state.metadata_version)
    ctx.apply(elect_after_loss(ctx.state, leader, ctx.now_ms))
    assert ctx.state.topics["t"].states[0].leader == NO_LEADER
    assert plan_recovery(ctx.state, "t", 0, ctx.now_ms).leader == unclean  # the pool alone
    listed = {clean: {("t", 0): LogReport("t", topic_id, 0, 0, 260)}}
    plan = plan_recovery(ctx.state, "t", 0, ctx.now_ms, listed)
    assert (plan.leader, [c.broker for c in plan.candidates]) == (clean, [clean, unclean])
    # A log of another incarnation of the topic is no copy of this one.
    stale = {clean: {("t", 0): LogReport("t", "id-older", 0, 0, 900)}}
    assert plan_recovery(ctx.state, "t", 0, ctx.now_ms, stale).leader == unclean
    ctx.apply(recover_partition(ctx.state, "t", 0, ctx.now_ms, listed))
    assert ctx.state.topics["t"].states[0].leader == clean
