"""Partition reassignment in the pure cluster state machine (docs/replication.md, "Reassignment"): the
start adds the target's new replicas outside the ISR, the completion (once they are in sync) switches the
replica list, moves leadership off a leaving leader with a leader-epoch bump and removes the old replicas;
every step is persisted (and survives a recovery) and refusals are typed, all or none."""

from __future__ import annotations

import json

import pytest
from coordinator_context import SETTINGS, ClusterContext

from sluice.coordinator.cluster.health import ReplicaHealth
from sluice.coordinator.cluster.isr import IsrProposal, alter_partition
from sluice.coordinator.cluster.reassign import (
    Reassignment,
    complete_reassignment,
    start_reassignments,
)
from sluice.coordinator.cluster.replication import ReplicationSpec
from sluice.coordinator.cluster.state import ClusterSettings
from sluice.errors import (
    BrokerNotAvailable,
    InvalidArgument,
    InvalidReplicationFactor,
    ReassignmentInProgress,
    UnknownTopicOrPartition,
)


def _cluster(brokers: int = 4) -> ClusterContext:
    ctx = ClusterContext(ClusterSettings(**{**SETTINGS.__dict__, "default_replication_factor": 1}))
    for b in range(3):
        ctx.register_broker(b)
    ctx.create_topic("t", 1, spec=ReplicationSpec(3, 2))
    for b in range(3, brokers):
        ctx.register_broker(b)
    return ctx


def _expand(ctx: ClusterContext, isr: tuple[int, ...]) -> None:
    s = ctx.state.topics["t"].states[0]
    ctx.apply(
        alter_partition(ctx.state, IsrProposal("t", 0, s.leader, s.leader_epoch, s.partition_epoch, isr))
    )


def test_a_move_adds_then_switches_and_removes_with_the_leader_moving_off() -> None:
    ctx = _cluster()
    before = ctx.state.topics["t"].states[0]
    leaving = before.leader
    target = (3, *(b for b in before.replicas if b != leaving))
    started = ctx.apply(start_reassignments(ctx.state, [Reassignment("t", 0, target)], 1000, ctx.now_ms))
    state = started.states[("t", 0)]
    assert state.replicas == (*target, leaving)
    assert (state.adding, state.removing, state.throttle) == ((3,), (leaving,), 1000)
    assert (state.leader, state.isr, state.leader_epoch) == (leaving, before.isr, before.leader_epoch)
    assert started.change is not None
    assert set(started.change.assign) == {0, 1, 2, 3}  # the new replica is told, as a follower
    assert json.loads(ctx.store["topic:t"])["partitions"][0]["adding"] == [3]
    assert ctx.recover().topics["t"].states[0] == state
    # Not yet: the new replica is out of the ISR.
    assert complete_reassignment(ctx.state, "t", 0).response.change is None
    with pytest.raises(ReassignmentInProgress):
        start_reassignments(ctx.state, [Reassignment("t", 0, target)], 0, ctx.now_ms)

    _expand(ctx, (*before.isr, 3))
    done = ctx.apply(complete_reassignment(ctx.state, "t", 0))
    final = done.states[("t", 0)]
    assert final.replicas == target
    assert final.leader == target[0]  # the first in-sync replica of the target
    assert final.leader != leaving
    assert final.leader_epoch == before.leader_epoch + 1
    assert set(final.isr) == set(target)
    assert (final.adding, final.removing, final.throttle) == ((), (), 0)
    assert done.change is not None
    assert set(done.change.remove) == {leaving}  # its data is deleted
    assert leaving not in done.change.assign
    assert "adding" not in json.loads(ctx.store["topic:t"])["partitions"][0]
    assert ctx.recover().topics["t"].states[0] == final


def test_a_staying_leader_keeps_leading_without_an_epoch_bump() -> None:
    ctx = _cluster()
    before = ctx.state.topics["t"].states[0]
    follower = before.replicas[-1]
    target = tuple(3 if b == follower else b for b in before.replicas)
    ctx.apply(start_reassignments(ctx.state, [Reassignment("t", 0, target)], 0, ctx.now_ms))
    _expand(ctx, (*before.isr, 3))
    final = ctx.apply(complete_reassignment(ctx.state, "t", 0)).states[("t", 0)]
    assert (final.leader, final.leader_epoch) == (before.leader, before.leader_epoch)
    assert final.replicas == target


@pytest.mark.parametrize(
    ("items", "throttle", "error"),
    [
        ([Reassignment("nope", 0, (0, 1, 2))], 0, UnknownTopicOrPartition),
        ([Reassignment("t", 5, (0, 1, 2))], 0, UnknownTopicOrPartition),
        ([Reassignment("t", 0, (0, 1))], 0, InvalidReplicationFactor),
        ([Reassignment("t", 0, (0, 1, 1))], 0, InvalidArgument),
        ([Reassignment("t", 0, (0, 1, 9))], 0, BrokerNotAvailable),
        ([Reassignment("t", 0, (0, 1, 3))], -1, InvalidArgument),
        ([Reassignment("t", 0, (0, 1, 3)), Reassignment("t", 0, (0, 1, 2))], 0, InvalidArgument),
        ([], 0, InvalidArgument),
    ],
)
def test_refusals_are_typed_and_write_nothing(
    items: list[Reassignment], throttle: int, error: type[Exception]
) -> None:
    ctx = _cluster()
    stored = dict(ctx.store)
    with pytest.raises(error):
        start_reassignments(ctx.state, items, throttle, ctx.now_ms)
    assert dict(ctx.store) == stored


def test_a_reorder_completes_at_once() -> None:
    ctx = _cluster()
    before = ctx.state.topics["t"].states[0]
    reordered = (*before.replicas[1:], before.replicas[0])
    result = ctx.apply(start_reassignments(ctx.state, [Reassignment("t", 0, reordered)], 0, ctx.now_ms))
    state = result.states[("t", 0)]
    assert state.replicas == reordered
    assert not state.reassigning
    assert state.leader == before.leader  # the preferred leader changes; leadership moves by election


def test_a_reassignment_in_progress_is_counted_as_reassigning_not_under_replicated() -> None:
    ctx = _cluster()
    health = ReplicaHealth()
    before = ctx.state.topics["t"].states[0]
    target = (3, *before.replicas[1:])
    ctx.apply(start_reassignments(ctx.state, [Reassignment("t", 0, target)], 0, ctx.now_ms))
    assert health.count(ctx.state.topics) == (0, 0)  # the new replica catching up is no failure
    assert health.reassigning == 1
    _expand(ctx, tuple(b for b in before.isr if b != before.replicas[-1]))  # an original replica left
    assert health.count(ctx.state.topics) == (1, 0)
    assert health.reassigning == 1
