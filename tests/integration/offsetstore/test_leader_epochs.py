"""KIP-320's committed leader epoch in the offset store (docs/redis-schema.md, "Committed offsets"): kept with
the offset it came with, in a hash of its own (every reader of the offsets hash reads what it always did);
a commit without one (an older client) forgets the epoch of the older offset; a lower offset changes
neither; a reset offset has none; broadcasting offsets carry none."""

from __future__ import annotations

from sluice.client.rpc import call
from sluice.v1 import coordinator_pb2
from sluice.v1.offset_store_pb2 import (
    CommitOffsetsRequest,
    FetchOffsetsRequest,
    PartitionOffset,
    ResetOffsetsRequest,
)

from .conftest import Stack


def commit(stack: Stack, group: str, offset: int, epoch: int | None, *, broadcasting: bool = False) -> int:
    request = CommitOffsetsRequest(
        group=group,
        member_id="m1",
        member_epoch=1,
        offsets=[PartitionOffset(topic="t", partition=0, offset=offset, leader_epoch=epoch)],
        message_model=(
            coordinator_pb2.MESSAGE_MODEL_BROADCASTING
            if broadcasting
            else coordinator_pb2.MESSAGE_MODEL_CLUSTERING
        ),
    )
    (result,) = call(stack.stub.CommitOffsets, request, timeout=10).results
    assert result.error.code == 0, result.error.message
    return result.offset


def fetched(stack: Stack, group: str, member: str = "") -> tuple[int, int | None]:
    request = FetchOffsetsRequest(group=group, member_id=member)
    request.partitions.add(topic="t", partition=0)
    (o,) = call(stack.stub.FetchOffsets, request, timeout=10).offsets
    return o.offset, (o.leader_epoch if o.HasField("leader_epoch") else None)


def test_the_leader_epoch_is_kept_with_its_offset(stack: Stack) -> None:
    stack.seed_group("g-le", {"m1": 1}, {"t/0": "m1"})
    commit(stack, "g-le", 100, 3)
    assert fetched(stack, "g-le") == (100, 3)
    # The offsets hash is what it always was; the epoch sits beside it.
    assert stack.redis.hget("sluice:off:{g-le}:default", "t/0") == b"100"
    assert stack.redis.hget("sluice:off:{g-le}:default:le", "t/0") == b"3"
    # A lower offset (increase-only) changes neither.
    assert commit(stack, "g-le", 90, 7) == 100
    assert fetched(stack, "g-le") == (100, 3)
    # A higher offset with a newer epoch replaces both.
    commit(stack, "g-le", 120, 4)
    assert fetched(stack, "g-le") == (120, 4)
    # A higher offset without an epoch (an older client): the old epoch must not pair with it.
    commit(stack, "g-le", 130, None)
    assert fetched(stack, "g-le") == (130, None)
    # A listing of every committed partition carries the epochs too.
    commit(stack, "g-le", 140, 5)
    request = FetchOffsetsRequest(group="g-le")
    (o,) = call(stack.stub.FetchOffsets, request, timeout=10).offsets
    assert (o.offset, o.leader_epoch) == (140, 5)
    # The topic's refs name the epochs hash, so a topic delete purges it with the offsets.
    assert stack.redis.hexists("sluice:topic:{t}:refs", "sluice:off:{g-le}:default:le")


def test_a_reset_offset_has_no_leader_epoch(stack: Stack) -> None:
    stack.seed_group("g-le-reset", {"m1": 1}, {"t/0": "m1"})
    commit(stack, "g-le-reset", 50, 2)
    stack.seed_group("g-le-reset", {}, {}, live=0)
    call(stack.stub.ResetOffsets, ResetOffsetsRequest(group="g-le-reset", topic="t", value=10), timeout=10)
    assert fetched(stack, "g-le-reset") == (10, None)


def test_broadcasting_offsets_carry_no_leader_epoch(stack: Stack) -> None:
    stack.seed_group("g-le-bc", {"m1": 1}, {})
    commit(stack, "g-le-bc", 30, 2, broadcasting=True)
    assert fetched(stack, "g-le-bc", member="m1") == (30, None)
