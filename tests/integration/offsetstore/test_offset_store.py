"""The offset store over gRPC: fenced commits, fetch, reset, broadcasting, cursors, bad input, metrics."""

from __future__ import annotations

import urllib.request

import grpc
import pytest

from sluice.client.rpc import call, error_from_rpc
from sluice.errors import (
    FencedMemberEpoch,
    GroupNotEmpty,
    InvalidArgument,
    InvalidRequest,
    InvalidTopic,
    NotOwner,
    StaleMemberEpoch,
    UnknownMember,
    UnknownTopicOrPartition,
    raise_for_proto,
)
from sluice.v1 import common_pb2, coordinator_pb2, offset_store_pb2
from sluice.v1.offset_store_pb2 import (
    CommitOffsetsRequest,
    Cursor,
    FetchOffsetsRequest,
    LoadCursorRequest,
    PartitionOffset,
    ResetOffsetsRequest,
    SaveCursorsRequest,
)

from .conftest import Stack

BROADCASTING = coordinator_pb2.MESSAGE_MODEL_BROADCASTING


def commit(
    stack: Stack, group: str, member: str, epoch: int, *offsets: tuple[str, int, int], track: str = ""
) -> list[offset_store_pb2.PartitionOffsetResult]:
    request = CommitOffsetsRequest(
        group=group,
        member_id=member,
        member_epoch=epoch,
        offsets=[PartitionOffset(topic=t, partition=p, offset=o, track=track) for t, p, o in offsets],
    )
    return list(call(stack.stub.CommitOffsets, request, timeout=10).results)


def fetch(
    stack: Stack, group: str, *partitions: tuple[str, int], track: str = "", member: str = ""
) -> dict[tuple[str, int], int]:
    request = FetchOffsetsRequest(group=group, track=track, member_id=member)
    for topic, partition in partitions:
        request.partitions.add(topic=topic, partition=partition)
    response = call(stack.stub.FetchOffsets, request, timeout=10)
    return {(o.topic, o.partition): o.offset for o in response.offsets}


def error_of(result: offset_store_pb2.PartitionOffsetResult) -> int:
    return result.error.code


# ---- fenced commits -----------------------------------------------------------


def test_owner_commits_and_fetches(stack: Stack) -> None:
    stack.seed_group("g-owner", {"m1": 4}, {"orders/0": "m1", "orders/1": "m1"})
    results = commit(stack, "g-owner", "m1", 4, ("orders", 0, 100), ("orders", 1, 7))
    assert [(r.partition, r.offset, error_of(r)) for r in results] == [(0, 100, 0), (1, 7, 0)]
    assert fetch(stack, "g-owner") == {("orders", 0): 100, ("orders", 1): 7}
    # Listed partitions without a commit come back as -1.
    assert fetch(stack, "g-owner", ("orders", 1), ("orders", 5)) == {("orders", 1): 7, ("orders", 5): -1}
    # Stored exactly where the schema says.
    assert stack.redis.hget("sluice:off:{g-owner}:default", "orders/0") == b"100"


def test_zombie_commit_is_refused_with_stale_member_epoch(stack: Stack) -> None:
    """The member was fenced (the coordinator bumped its epoch): its late commit cannot move offsets."""
    stack.seed_group("g-zombie", {"m1": 1}, {"orders/0": "m1"})
    assert error_of(commit(stack, "g-zombie", "m1", 1, ("orders", 0, 10))[0]) == common_pb2.NONE
    stack.seed_group("g-zombie", {"m1": 2}, {"orders/0": "m1"})  # fenced and rejoined at epoch 2
    [zombie] = commit(stack, "g-zombie", "m1", 1, ("orders", 0, 50))
    assert zombie.error.code == common_pb2.STALE_MEMBER_EPOCH
    assert "current epoch is 2" in zombie.error.message
    assert zombie.offset == 10  # the stored offset, unchanged
    with pytest.raises(StaleMemberEpoch):
        raise_for_proto(zombie.error)
    assert fetch(stack, "g-zombie") == {("orders", 0): 10}


def test_removed_member_is_unknown(stack: Stack) -> None:
    stack.seed_group("g-gone", {"m2": 3}, {"orders/0": "m2"})
    [result] = commit(stack, "g-gone", "m1", 3, ("orders", 0, 5))
    with pytest.raises(UnknownMember, match="rejoin"):
        raise_for_proto(result.error)
    [result] = commit(stack, "g-never-existed", "m1", 1, ("orders", 0, 5))
    assert result.error.code == common_pb2.UNKNOWN_MEMBER


def test_not_owner_for_a_partition_of_another_member_or_in_handoff(stack: Stack) -> None:
    stack.seed_group("g-owners", {"m1": 5, "m2": 9}, {"orders/0": "m1", "orders/1": "m2"})
    results = commit(stack, "g-owners", "m1", 5, ("orders", 0, 3), ("orders", 1, 3), ("orders", 2, 3))
    assert [error_of(r) for r in results] == [common_pb2.NONE, common_pb2.NOT_OWNER, common_pb2.NOT_OWNER]
    assert "owned by member 'm2'" in results[1].error.message
    assert "in handoff" in results[2].error.message
    with pytest.raises(NotOwner):
        raise_for_proto(results[1].error)
    assert fetch(stack, "g-owners") == {("orders", 0): 3}


def test_commits_are_increase_only(stack: Stack) -> None:
    stack.seed_group("g-inc", {"m1": 1}, {"t/0": "m1"})
    assert commit(stack, "g-inc", "m1", 1, ("t", 0, 50))[0].offset == 50
    lower = commit(stack, "g-inc", "m1", 1, ("t", 0, 20))[0]
    assert (lower.error.code, lower.offset) == (common_pb2.NONE, 50)
    # Exact beyond 2^53, where Lua's doubles would round.
    big = 2**60 + 1
    assert commit(stack, "g-inc", "m1", 1, ("t", 0, big))[0].offset == big
    assert commit(stack, "g-inc", "m1", 1, ("t", 0, big - 1))[0].offset == big
    # Within one request the highest wins too.
    stack.seed_group("g-inc2", {"m1": 1}, {"t/0": "m1"})
    results = commit(stack, "g-inc2", "m1", 1, ("t", 0, 9), ("t", 0, 4))
    assert [r.offset for r in results] == [9, 9]


def test_tracks_are_separate(stack: Stack) -> None:
    stack.seed_group("g-tracks", {"m1": 1, "m2": 1}, {"t/0": "m1"})
    stack.seed_group("g-tracks", {"m1": 1, "m2": 1}, {"t/0": "m2"}, track="tagB")
    commit(stack, "g-tracks", "m1", 1, ("t", 0, 5))
    # Under the split policy each track has its own owner of the partition.
    assert commit(stack, "g-tracks", "m1", 1, ("t", 0, 7), track="tagB")[0].error.code == common_pb2.NOT_OWNER
    commit(stack, "g-tracks", "m2", 1, ("t", 0, 9), track="tagB")
    assert fetch(stack, "g-tracks") == {("t", 0): 5}
    assert fetch(stack, "g-tracks", track="tagB") == {("t", 0): 9}


# ---- reset ----------------------------------------------------------------------


def test_reset_is_refused_while_members_are_live_and_applied_when_empty(stack: Stack) -> None:
    stack.seed_group("g-reset", {"m1": 1}, {"t/0": "m1", "t/1": "m1"}, live=2)
    commit(stack, "g-reset", "m1", 1, ("t", 0, 500), ("t", 1, 600))
    request = ResetOffsetsRequest(
        group="g-reset", topic="t", spec=offset_store_pb2.RESET_SPEC_OFFSET, value=10
    )
    with pytest.raises(GroupNotEmpty, match=r"2 live member.*stop its consumers"):
        call(stack.stub.ResetOffsets, request, timeout=10)
    assert fetch(stack, "g-reset") == {("t", 0): 500, ("t", 1): 600}
    stack.seed_group("g-reset", {}, {}, live=0)
    # Empty partitions: every partition with a committed offset (no coordinator configured).
    response = call(stack.stub.ResetOffsets, request, timeout=10)
    assert [(o.partition, o.offset, o.track) for o in response.offsets] == [
        (0, 10, "default"),
        (1, 10, "default"),
    ]
    # A reset may go backwards, unlike a commit.
    assert fetch(stack, "g-reset") == {("t", 0): 10, ("t", 1): 10}
    # A missing live key means empty too; listed partitions may be new.
    stack.redis.delete("sluice:grp:{g-reset}:live")
    request = ResetOffsetsRequest(group="g-reset", topic="t", partitions=[3], value=42)
    call(stack.stub.ResetOffsets, request, timeout=10)
    assert fetch(stack, "g-reset")[("t", 3)] == 42


def test_reset_without_coordinator_only_sets_explicit_offsets(stack: Stack) -> None:
    request = ResetOffsetsRequest(
        group="g-r2", topic="t", partitions=[0], spec=offset_store_pb2.RESET_SPEC_EARLIEST
    )
    with pytest.raises(InvalidArgument, match="Only explicit offsets"):
        call(stack.stub.ResetOffsets, request, timeout=10)
    request = ResetOffsetsRequest(group="g-r2", topic="never-committed")
    with pytest.raises(InvalidArgument, match="list the partitions"):
        call(stack.stub.ResetOffsets, request, timeout=10)


def test_a_multi_topic_reset_checks_every_topic_before_writing_and_registers_each(stack: Stack) -> None:
    """Topic identity over main's multi-topic reset: one script checks every topic first, so a topic
    that does not exist refuses the whole reset (nothing of the others lands: it would be offsets no
    topic delete ever removes); a written reset registers the track's hash in every topic's refs."""
    stack.seed_group("g-multi", {}, {}, live=0)
    both = [
        offset_store_pb2.ResetTopic(topic="t", partitions=[0]),
        offset_store_pb2.ResetTopic(topic="orders", partitions=[1]),
    ]
    request = ResetOffsetsRequest(
        group="g-multi",
        topics=[*both, offset_store_pb2.ResetTopic(topic="zz-missing", partitions=[0])],
        spec=offset_store_pb2.RESET_SPEC_OFFSET,
        value=7,
    )
    # (It sorts last: the topics before it are checked and pass first.)
    with pytest.raises(UnknownTopicOrPartition, match="'zz-missing' does not exist"):
        call(stack.stub.ResetOffsets, request, timeout=10)
    assert fetch(stack, "g-multi") == {}
    assert not stack.redis.exists("sluice:topic:{zz-missing}:refs")
    request = ResetOffsetsRequest(
        group="g-multi", topics=both, spec=offset_store_pb2.RESET_SPEC_OFFSET, value=7
    )
    call(stack.stub.ResetOffsets, request, timeout=10)
    assert fetch(stack, "g-multi") == {("t", 0): 7, ("orders", 1): 7}
    for topic in ("t", "orders"):
        assert stack.redis.hget(f"sluice:topic:{{{topic}}}:refs", "sluice:off:{g-multi}:default") == b"h"


# ---- broadcasting --------------------------------------------------------------------


def test_broadcasting_members_keep_their_own_offsets(stack: Stack) -> None:
    # Broadcasting groups have no partition owners: only membership is checked.
    stack.seed_group("g-bc", {"a": 1, "b": 1}, {}, live=2)
    request = CommitOffsetsRequest(
        group="g-bc",
        member_id="a",
        member_epoch=1,
        offsets=[PartitionOffset(topic="t", partition=0, offset=30)],
    )
    [result] = stack.stub.CommitOffsets(with_model(request), timeout=10).results
    assert (result.error.code, result.offset) == (common_pb2.NONE, 30)
    request.member_id, request.offsets[0].offset = "b", 8
    stack.stub.CommitOffsets(with_model(request), timeout=10)
    # Increase-only per member.
    request.offsets[0].offset = 2
    [result] = stack.stub.CommitOffsets(with_model(request), timeout=10).results
    assert result.offset == 8
    assert fetch(stack, "g-bc", member="a") == {("t", 0): 30}
    assert fetch(stack, "g-bc", ("t", 0), member="b") == {("t", 0): 8}
    assert fetch(stack, "g-bc") == {}  # the shared track is untouched
    # A member that is not in the group, or at another epoch, is refused.
    request.member_id = "c"
    [result] = stack.stub.CommitOffsets(with_model(request), timeout=10).results
    assert result.error.code == common_pb2.UNKNOWN_MEMBER
    request.member_id, request.member_epoch = "a", 0
    [result] = stack.stub.CommitOffsets(with_model(request), timeout=10).results
    assert result.error.code == common_pb2.STALE_MEMBER_EPOCH
    # As a clustering commit the same request is refused: there is no owner.
    request.member_epoch = 1
    request.message_model = coordinator_pb2.MESSAGE_MODEL_CLUSTERING
    [result] = stack.stub.CommitOffsets(request, timeout=10).results
    assert result.error.code == common_pb2.NOT_OWNER
    # A reset (group empty) moves every member back to the reset position.
    stack.seed_group("g-bc", {}, {}, live=0)
    call(
        stack.stub.ResetOffsets,
        ResetOffsetsRequest(group="g-bc", topic="t", partitions=[0], value=1),
        timeout=10,
    )
    assert fetch(stack, "g-bc", ("t", 0), member="a") == {("t", 0): 1}
    assert fetch(stack, "g-bc", ("t", 0), member="b") == {("t", 0): 1}


def test_unknown_message_model_is_invalid(stack: Stack) -> None:
    request = CommitOffsetsRequest(
        group="g", member_id="a", member_epoch=1, offsets=[PartitionOffset(topic="t", partition=0, offset=1)]
    )
    request.message_model = 7  # type: ignore[assignment]
    with pytest.raises(grpc.RpcError) as info:
        stack.stub.CommitOffsets(request, timeout=10)
    err = error_from_rpc(info.value)
    assert isinstance(err, InvalidArgument)
    assert "unknown message model 7" in err.message


def with_model(request: CommitOffsetsRequest) -> CommitOffsetsRequest:
    request.message_model = BROADCASTING
    return request


# ---- cursors ---------------------------------------------------------------------


def alternate_ranges(messages: int) -> list[int]:
    flat: list[int] = []
    for offset in range(1, messages, 2):
        flat += [offset, offset + 1]
    return flat


def save(stack: Stack, *cursors: Cursor) -> list[common_pb2.Error]:
    return list(call(stack.stub.SaveCursors, SaveCursorsRequest(cursors=cursors), timeout=30).errors)


def load(stack: Stack, subscription: str, topic: str, partition: int) -> offset_store_pb2.LoadCursorResponse:
    request = LoadCursorRequest(subscription=subscription, topic=topic, partition=partition)
    return call(stack.stub.LoadCursor, request, timeout=30)


def test_cursor_round_trip_of_the_alternate_ack_pattern(stack: Stack) -> None:
    """Every other message of 1,000,000 acked: 500,000 ranges, persisted far under 2 MB."""
    ranges = alternate_ranges(1_000_000)
    redeliveries = {0: 3, 2: 1, 999_998: 7}
    cursor = Cursor(
        subscription="sub-a",
        topic="t",
        partition=2,
        mark_delete=0,
        owner_epoch=1,
        acked_ranges=ranges,
        redelivery_counts=redeliveries,
    )
    assert [e.code for e in save(stack, cursor)] == [common_pb2.NONE]
    persisted = stack.redis.get("sluice:cur:{sub-a}:t/2")
    assert persisted is not None
    print(f"\npersisted alternate-ack cursor: {len(persisted)} bytes (plain protobuf: {cursor.ByteSize()})")
    assert len(persisted) < 2 * 1024 * 1024
    assert stack.redis.get("sluice:cur:{sub-a}:t/2:epoch") == b"1"
    loaded = load(stack, "sub-a", "t", 2)
    assert loaded.found
    assert list(loaded.cursor.acked_ranges) == ranges
    assert dict(loaded.cursor.redelivery_counts) == redeliveries
    assert (loaded.cursor.mark_delete, loaded.cursor.owner_epoch) == (0, 1)
    assert (loaded.cursor.subscription, loaded.cursor.topic, loaded.cursor.partition) == ("sub-a", "t", 2)
    assert not load(stack, "sub-a", "t", 3).found


def test_cursor_epoch_fencing_in_one_batch(stack: Stack) -> None:
    def cursor(partition: int, epoch: int, mark: int, subscription: str = "sub-f") -> Cursor:
        return Cursor(
            subscription=subscription, topic="t", partition=partition, mark_delete=mark, owner_epoch=epoch
        )

    assert [e.code for e in save(stack, cursor(0, 1, 10), cursor(1, 1, 10), cursor(0, 1, 5, "sub-g"))] == [
        0,
        0,
        0,
    ]
    # A new dispatcher (epoch 2) takes partition 0 over.
    assert [e.code for e in save(stack, cursor(0, 2, 20))] == [0]
    # The old one (epoch 1) is fenced on partition 0 but still owns partition 1 and sub-g.
    errors = save(stack, cursor(0, 1, 99), cursor(1, 1, 30), cursor(0, 1, 6, "sub-g"))
    assert [e.code for e in errors] == [common_pb2.FENCED_MEMBER_EPOCH, common_pb2.NONE, common_pb2.NONE]
    assert "epoch 2" in errors[0].message
    with pytest.raises(FencedMemberEpoch):
        raise_for_proto(errors[0])
    assert load(stack, "sub-f", "t", 0).cursor.mark_delete == 20
    assert load(stack, "sub-f", "t", 0).cursor.owner_epoch == 2
    assert load(stack, "sub-f", "t", 1).cursor.mark_delete == 30
    assert load(stack, "sub-g", "t", 0).cursor.mark_delete == 6


def test_invalid_cursors_are_refused_whole(stack: Stack) -> None:
    good = Cursor(subscription="sub-bad", topic="t", partition=0, mark_delete=5, owner_epoch=1)
    bad = Cursor(
        subscription="sub-bad", topic="t", partition=1, mark_delete=5, owner_epoch=1, acked_ranges=[3, 4]
    )
    with pytest.raises(InvalidArgument, match=r"cursors\[1\] \(sub-bad@t/1\).*starts below mark_delete"):
        save(stack, good, bad)
    assert not load(stack, "sub-bad", "t", 0).found  # nothing of the batch was written
    with pytest.raises(InvalidArgument, match="invalid subscription name"):
        save(stack, Cursor(subscription="", topic="t", partition=0))
    with pytest.raises(InvalidArgument, match="owner_epoch -3"):
        save(stack, Cursor(subscription="s", topic="t", partition=0, owner_epoch=-3))
    with pytest.raises(InvalidArgument, match="odd number"):
        save(stack, Cursor(subscription="s", topic="t", partition=0, acked_ranges=[1, 2, 3]))
    with pytest.raises(InvalidArgument, match="redelivery count"):
        save(stack, Cursor(subscription="s", topic="t", partition=0, redelivery_counts={4: -1}))


def test_crash_count_fields_round_trip(stack: Stack) -> None:
    """The dispatcher's write-ahead delivered mark and range counts (docs/dispatcher.md)."""
    cursor = Cursor(
        subscription="sub-crash",
        topic="t",
        partition=0,
        mark_delete=100,
        owner_epoch=1,
        redelivery_counts={105: 4},
        delivered_up_to=1_000_356,
        redelivery_ranges=[100, 1_000_100, 1, 1_000_100, 1_000_200, 2],
    )
    assert [e.code for e in save(stack, cursor)] == [common_pb2.NONE]
    loaded = load(stack, "sub-crash", "t", 0).cursor
    assert loaded.delivered_up_to == 1_000_356
    assert list(loaded.redelivery_ranges) == [100, 1_000_100, 1, 1_000_100, 1_000_200, 2]
    assert dict(loaded.redelivery_counts) == {105: 4}
    with pytest.raises(InvalidArgument, match=r"cursors\[0\].*redelivery range 1"):
        save(stack, Cursor(subscription="s", topic="t", partition=0, redelivery_ranges=[1, 9, 1, 5, 12, 1]))
    with pytest.raises(InvalidArgument, match="delivered_up_to"):
        save(stack, Cursor(subscription="s", topic="t", partition=0, delivered_up_to=-2))


# ---- bad input ------------------------------------------------------------------------


def test_bad_input_gets_typed_errors_and_the_service_stays_healthy(stack: Stack) -> None:
    def one(group: str = "g", topic: str = "t", partition: int = 0, offset: int = 1) -> CommitOffsetsRequest:
        return CommitOffsetsRequest(
            group=group,
            member_id="m",
            member_epoch=1,
            offsets=[PartitionOffset(topic=topic, partition=partition, offset=offset)],
        )

    with pytest.raises(InvalidArgument, match="invalid group name ''"):
        call(stack.stub.CommitOffsets, one(group=""), timeout=10)
    with pytest.raises(InvalidTopic):
        call(stack.stub.CommitOffsets, one(topic=""), timeout=10)
    with pytest.raises(InvalidArgument, match="offset -4 is negative"):
        call(stack.stub.CommitOffsets, one(offset=-4), timeout=10)
    with pytest.raises(InvalidArgument, match="partition -1"):
        call(stack.stub.CommitOffsets, one(partition=-1), timeout=10)
    with pytest.raises(InvalidArgument, match="unknown reset spec 7"):
        call(stack.stub.ResetOffsets, ResetOffsetsRequest(group="g", topic="t", spec=7), timeout=10)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="offset -1 is negative"):
        call(
            stack.stub.ResetOffsets,
            ResetOffsetsRequest(group="g", topic="t", partitions=[0], value=-1),
            timeout=10,
        )
    with pytest.raises(InvalidArgument, match="invalid group name"):
        call(stack.stub.FetchOffsets, FetchOffsetsRequest(group=""), timeout=10)
    huge = one()
    huge.offsets.extend(PartitionOffset(topic="t", partition=i % 100, offset=1) for i in range(10_000))
    with pytest.raises(InvalidRequest, match="too many partition offsets"):
        call(stack.stub.CommitOffsets, huge, timeout=10)
    with pytest.raises(InvalidRequest, match="too many cursors"):
        save(stack, *(Cursor(subscription="s", topic="t", partition=i % 10) for i in range(1001)))
    # Still serving.
    stack.seed_group("g-alive", {"m": 1}, {"t/0": "m"})
    assert commit(stack, "g-alive", "m", 1, ("t", 0, 1))[0].error.code == common_pb2.NONE
    assert stack.service.process.poll() is None


# ---- metrics ---------------------------------------------------------------------------


def test_metrics_are_exported(stack: Stack) -> None:
    stack.seed_group("g-metrics", {"m": 1}, {"t/0": "m"})
    commit(stack, "g-metrics", "m", 1, ("t", 0, 77))
    commit(stack, "g-metrics", "m", 0, ("t", 0, 78))
    save(stack, Cursor(subscription="sub-m", topic="t", partition=0, owner_epoch=1, acked_ranges=[1, 2]))
    with urllib.request.urlopen(f"http://{stack.service.metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'sluice_offset_store_commits_total{code="NONE"}' in text
    assert 'sluice_offset_store_commits_total{code="STALE_MEMBER_EPOCH"}' in text
    assert (
        'sluice_offset_store_committed_offset{group="g-metrics",partition="0",topic="t",track="default"} 77.0'
        in text
    )
    assert 'sluice_offset_store_cursor_saves_total{code="NONE"}' in text
    assert "sluice_offset_store_cursor_bytes_bucket" in text
    assert 'sluice_offset_store_rpc_requests_total{code="OK",method="CommitOffsets"}' in text
