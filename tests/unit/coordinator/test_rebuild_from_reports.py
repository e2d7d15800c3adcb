"""The controller rebuilds its view from the brokers' reports after its store lost changes
(docs/replication.md, "Controller state that cannot roll back"): a partition whose reported epochs are
above the stored ones takes the newest reported state, with both epochs raised above everything seen;
stale reports, reports of another topic incarnation and of unknown partitions change nothing."""

from __future__ import annotations

import dataclasses

from coordinator_context import SETTINGS, ClusterContext

from sluice.coordinator.cluster.elections import elect_after_loss
from sluice.coordinator.cluster.rebuild import EpochReport, merge_reports, newest_reports
from sluice.coordinator.cluster.replication import ReplicationSpec


def _cluster() -> ClusterContext:
    ctx = ClusterContext(SETTINGS)
    for b in range(3):
        ctx.register_broker(b)
    ctx.create_topic("rep", 2, spec=ReplicationSpec(3, 2))
    return ctx


def _report(
    ctx: ClusterContext, reporter: int, p: int, le: int, pe: int, leader: int, isr: tuple[int, ...]
) -> EpochReport:
    record = ctx.state.topics["rep"]
    return EpochReport(reporter, "rep", record.topic_id, p, le, pe, leader, record.states[p].replicas, isr)


def test_a_newer_report_is_taken_with_epochs_above_everything_seen() -> None:
    ctx = _cluster()
    state = ctx.state.topics["rep"].states[0]
    new_leader = state.replicas[1]
    # What a lost election had decided: leader epoch 1, partition epoch 1, the old leader out of the ISR.
    isr = (state.replicas[1], state.replicas[2])
    follower = _report(ctx, state.replicas[2], 0, 1, 1, new_leader, state.replicas)  # an older ISR view
    leader = _report(ctx, new_leader, 0, 1, 1, new_leader, isr)
    version = ctx.state.metadata_version
    result = ctx.apply(merge_reports(ctx.state, [follower, leader]))
    rebuilt = ctx.state.topics["rep"].states[0]
    assert rebuilt.leader == new_leader
    assert rebuilt.isr == isr  # the tie goes to the leader's own report
    assert (rebuilt.leader_epoch, rebuilt.partition_epoch) == (2, 2)  # above the reported (1, 1)
    assert ctx.state.topics["rep"].states[1] == ctx.recover().topics["rep"].states[1]
    assert ctx.state.metadata_version == version + 1
    assert [(t, p) for t, p, _ in result.rebuilt] == [("rep", 0)]
    assert result.change is not None
    assert set(result.change.assign) == set(state.replicas)  # every replica is told
    assert ctx.recover().topics["rep"].states[0] == rebuilt  # persisted


def test_the_highest_epochs_win_whatever_the_order() -> None:
    ctx = _cluster()
    replicas = ctx.state.topics["rep"].states[1].replicas
    old = _report(ctx, replicas[0], 1, 1, 1, replicas[1], replicas)
    new = _report(ctx, replicas[2], 1, 2, 3, replicas[2], (replicas[2],))
    for order in ([old, new], [new, old]):
        best = newest_reports(order)[("rep", 1)]
        assert best is new
    ctx.apply(merge_reports(ctx.state, [new, old]))
    rebuilt = ctx.state.topics["rep"].states[1]
    assert (rebuilt.leader, rebuilt.isr, rebuilt.leader_epoch, rebuilt.partition_epoch) == (
        replicas[2],
        (replicas[2],),
        3,
        4,
    )
    # The ISR below min ISR 2 keeps no ELR it did not have.
    assert rebuilt.elr == ()


def test_stale_foreign_and_unknown_reports_change_nothing() -> None:
    ctx = _cluster()
    # The store is ahead: an election it persisted, which the brokers have not seen yet.
    for _ in range(6):
        ctx.advance(1_000)
        for b in (1, 2):
            ctx.heartbeat(b, ctx.state.brokers[b].broker_epoch, ctx.state.metadata_version)
    ctx.apply(elect_after_loss(ctx.state, 0, ctx.now_ms))
    before = dict(ctx.state.topics)
    version = ctx.state.metadata_version
    state = ctx.state.topics["rep"].states[0]
    stale = _report(ctx, 1, 0, 0, 0, state.replicas[0], state.replicas)
    equal = _report(ctx, 1, 0, state.leader_epoch, state.partition_epoch, 2, (2,))
    foreign = dataclasses.replace(_report(ctx, 1, 0, 9, 9, 1, (1,)), topic_id="another-incarnation")
    unknown_partition = _report(ctx, 1, 0, 9, 9, 1, (1,))
    unknown_partition = dataclasses.replace(unknown_partition, partition=7)
    unknown_topic = dataclasses.replace(_report(ctx, 1, 0, 9, 9, 1, (1,)), topic="gone")
    result = merge_reports(ctx.state, [stale, equal, foreign, unknown_partition, unknown_topic])
    assert result.records == ()
    assert result.response.change is None
    assert ctx.state.topics == before
    assert ctx.state.metadata_version == version


def test_a_report_without_a_known_leader_raises_the_epochs_and_keeps_the_stored_leader() -> None:
    ctx = _cluster()
    state = ctx.state.topics["rep"].states[0]
    record = ctx.state.topics["rep"]
    blind = EpochReport(state.replicas[1], "rep", record.topic_id, 0, 4, 6)  # a restarted broker: epochs only
    ctx.apply(merge_reports(ctx.state, [blind]))
    rebuilt = ctx.state.topics["rep"].states[0]
    assert (rebuilt.leader, rebuilt.replicas, rebuilt.isr) == (state.leader, state.replicas, state.isr)
    assert (rebuilt.leader_epoch, rebuilt.partition_epoch) == (5, 7)
