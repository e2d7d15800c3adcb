"""AlterPartition in the pure cluster state machine (docs/replication.md, "ISR changes"): a leader's ISR
proposal is checked against the current leader and epochs, persisted with the next partition epoch and
pushed to the partition's replicas; eligible leader replicas follow the ISR below min ISR (KIP-966)."""

from __future__ import annotations

import json

import pytest
from coordinator_context import SETTINGS, ClusterContext

from sluice.coordinator.cluster.isr import IsrProposal, alter_partition
from sluice.coordinator.cluster.replication import ReplicationSpec
from sluice.coordinator.cluster.state import ClusterSettings
from sluice.errors import (
    FencedLeaderEpoch,
    InvalidArgument,
    NotLeader,
    StalePartitionEpoch,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
)


def _cluster() -> ClusterContext:
    ctx = ClusterContext(ClusterSettings(**{**SETTINGS.__dict__, "default_replication_factor": 1}))
    for b in range(3):
        ctx.register_broker(b)
    ctx.create_topic("t", 1, spec=ReplicationSpec(3, 2))
    return ctx


def _propose(ctx: ClusterContext, isr: tuple[int, ...], **changes: int) -> IsrProposal:
    state = ctx.state.topics["t"].states[0]
    return IsrProposal(
        "t",
        changes.get("partition", 0),
        changes.get("leader_id", state.leader),
        changes.get("leader_epoch", state.leader_epoch),
        changes.get("partition_epoch", state.partition_epoch),
        isr,
    )


def test_a_shrink_and_an_expansion_are_persisted_with_the_next_partition_epoch_and_pushed() -> None:
    ctx = _cluster()
    state = ctx.state.topics["t"].states[0]
    leader, *followers = state.replicas
    version = ctx.state.metadata_version
    shrunk = ctx.apply(alter_partition(ctx.state, _propose(ctx, (leader, followers[0]))))
    assert shrunk.state.isr == (leader, followers[0])
    assert shrunk.state.partition_epoch == 1
    assert shrunk.state.leader_epoch == 0
    assert shrunk.state.elr == ()  # the ISR is still at min ISR 2
    assert shrunk.change is not None
    assert shrunk.change.version == version + 1
    assert set(shrunk.change.assign) == {0, 1, 2}  # every replica hears of it
    stored = json.loads(ctx.store["topic:t"])
    assert stored["partitions"][0]["isr"] == [leader, followers[0]]
    assert ctx.recover().topics["t"].states[0] == shrunk.state
    # Below min ISR the leaver becomes an eligible leader replica; rejoining clears it.
    alone = ctx.apply(alter_partition(ctx.state, _propose(ctx, (leader,))))
    assert alone.state.elr == (followers[0],)
    back = ctx.apply(alter_partition(ctx.state, _propose(ctx, (leader, followers[0], followers[1]))))
    assert back.state.isr == state.replicas
    assert back.state.elr == ()
    assert back.state.partition_epoch == 3
    # The same ISR again changes nothing: no records, no push.
    again = alter_partition(ctx.state, _propose(ctx, state.replicas))
    assert again.records == ()
    assert again.response.change is None


@pytest.mark.parametrize(
    ("changes", "isr", "error"),
    [
        ({"leader_epoch": -1}, None, FencedLeaderEpoch),
        ({"leader_epoch": 1}, None, UnknownLeaderEpoch),
        ({"partition_epoch": 5}, None, StalePartitionEpoch),
        ({"leader_id": 99}, None, NotLeader),
        ({"partition": 3}, None, UnknownTopicOrPartition),
        ({}, (7,), InvalidArgument),
        ({}, "followers", InvalidArgument),
    ],
)
def test_a_stale_or_invalid_proposal_is_refused_and_changes_nothing(
    changes: dict[str, int], isr: object, error: type[Exception]
) -> None:
    ctx = _cluster()
    state = ctx.state.topics["t"].states[0]
    new_isr = (
        state.replicas[1:] if isr == "followers" else (isr if isinstance(isr, tuple) else state.replicas[:2])
    )
    before = dict(ctx.store)
    with pytest.raises(error):
        alter_partition(ctx.state, _propose(ctx, new_isr, **changes))
    assert ctx.store == before
