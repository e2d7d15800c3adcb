"""KIP-966's unclean-shutdown handling and unclean recovery in the pure controller (cluster/unclean.py;
docs/replication.md, "Unclean shutdowns and damaged replicas"): a broker restarted unclean leaves every
ISR and ELR before it can be elected; the last eligible replica gives way to the longest reported log;
damage found while leading moves leadership to a healthy ISR member."""

from __future__ import annotations

from coordinator_context import SETTINGS, ClusterContext

from sluice.coordinator.cluster.replication import (
    NO_LEADER,
    PartitionState,
    ReplicationConfig,
    ReplicationSpec,
)
from sluice.coordinator.cluster.unclean import Candidates, LogReport, longest_log, on_unfit, remove_unfit

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
    candidates = Candidates()
    lengths = {0: 300, 1: 200, 2: 250}  # the old leader (0) is longest
    for b in (0, 1, 2):  # each restarts unclean, in turn; none of their sessions expired
        result = ctx.apply(
            remove_unfit(
                ctx.state, b, {("t", 0): _report(0, lengths[b])}, candidates, ctx.now_ms, recover=True
            )
        )
        state = ctx.state.topics["t"].states[0]
        if b < 2:
            assert b not in state.isr
            assert b != state.leader
            assert result.recovered == ()
    assert result.recovered == (("t", 0),)
    assert (state.leader, state.isr, state.elr) == (0, (0,), ())
    assert candidates.by_partition == {}  # the pool is spent
    assert ctx.recover().topics["t"].states[0] == state  # persisted


def test_a_recovery_that_keeps_the_same_leader_still_starts_a_new_leader_epoch() -> None:
    state = PartitionState((0, 1, 2), 2, 5, 9, (2,), ())
    new, recovered = on_unfit(state, 2, {2: _report(5, 100)}, {0, 1, 2}, CONFIG, recover=True) or (
        state,
        None,
    )
    assert (new.leader, new.leader_epoch, recovered) == (2, 6, True)
