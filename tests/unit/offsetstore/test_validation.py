"""Request validation, proto translation helpers, the key layout and reset planning: no network."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.common import list_offsets as planner
from sluice.errors import (
    BrokerNotAvailable,
    InvalidArgument,
    InvalidRequest,
    InvalidTopic,
    SluiceError,
    UnknownTopicOrPartition,
)
from sluice.offsetstore import scripts, validation
from sluice.offsetstore.keys import Keys, partition_field, split_field
from sluice.offsetstore.model import CursorKey, OffsetCommit, ResetRequest, ResetSpec, TopicPartition
from sluice.offsetstore.resolver import EARLIEST, LATEST, Placement, list_offsets_timestamp
from sluice.offsetstore.servicer import reset_spec
from sluice.v1 import broker_pb2, common_pb2, coordinator_pb2


def commit(topic: str = "t", partition: int = 0, offset: int = 5, track: str = "default") -> OffsetCommit:
    return OffsetCommit(topic, partition, offset, track)


def test_a_valid_commit_passes() -> None:
    validation.validate_commit("g", "member-1", 3, [commit(), commit(partition=1, offset=0)])
    validation.validate_commit("g", "member-1", 0, [])  # an empty commit is a no-op, not an error


@pytest.mark.parametrize(
    ("group", "member", "epoch", "commits", "error", "message"),
    [
        ("", "m", 1, [commit()], InvalidArgument, "invalid group name ''"),
        ("a b", "m", 1, [commit()], InvalidArgument, "invalid group name"),
        ("g", "", 1, [commit()], InvalidArgument, "invalid member_id"),
        ("g", "has space", 1, [commit()], InvalidArgument, "invalid member_id"),
        ("g", "m", -1, [commit()], InvalidArgument, "member_epoch -1"),
        ("g", "m", 1, [commit(topic="")], InvalidTopic, "invalid topic name"),
        ("g", "m", 1, [commit(topic="a/b")], InvalidTopic, "invalid topic name"),
        ("g", "m", 1, [commit(partition=-1)], InvalidArgument, r"offsets\[0\] \(t/-1\): partition -1"),
        ("g", "m", 1, [commit(), commit(offset=-1)], InvalidArgument, r"offsets\[1\].*offset -1 is negative"),
        ("g", "m", 1, [commit(track="x:y")], InvalidArgument, "invalid track name"),
    ],
)
def test_bad_commits_get_typed_errors(
    group: str, member: str, epoch: int, commits: list[OffsetCommit], error: type[SluiceError], message: str
) -> None:
    with pytest.raises(error, match=message):
        validation.validate_commit(group, member, epoch, commits)


def test_oversized_requests_are_refused() -> None:
    too_many = [commit(partition=i % 100) for i in range(validation.MAX_COMMIT_PARTITIONS + 1)]
    with pytest.raises(InvalidRequest, match=r"too many partition offsets.*split the request"):
        validation.validate_commit("g", "m", 1, too_many)
    fetch = [TopicPartition("t", 0)] * (validation.MAX_FETCH_PARTITIONS + 1)
    with pytest.raises(InvalidRequest, match="too many partitions"):
        validation.validate_fetch("g", "", fetch, "")
    with pytest.raises(InvalidRequest, match="too many cursors"):
        validation.validate_cursor_batch(validation.MAX_CURSORS_PER_SAVE + 1, 0, 0)
    with pytest.raises(InvalidRequest, match="too many acked-range values"):
        validation.validate_cursor_batch(1, validation.MAX_RANGE_VALUES_PER_SAVE + 2, 0)


def reset(**overrides: object) -> ResetRequest:
    fields: dict[str, Any] = {
        "group": "g",
        "targets": (("t", (0, 1)),),
        "spec": ResetSpec.OFFSET,
        "value": 0,
        "track": "",
    }
    fields.update(overrides)
    return ResetRequest(**fields)


def test_reset_validation() -> None:
    validation.validate_reset(reset())
    validation.validate_reset(reset(spec=ResetSpec.EARLIEST, value=-77))  # value unused
    with pytest.raises(InvalidArgument, match="offset -1 is negative"):
        validation.validate_reset(reset(value=-1))
    with pytest.raises(InvalidArgument, match="timestamp -5 is negative"):
        validation.validate_reset(reset(spec=ResetSpec.TIMESTAMP, value=-5))
    validation.validate_reset(reset(spec=ResetSpec.SHIFT, value=-5))  # a shift goes either way
    with pytest.raises(InvalidArgument, match="twice"):
        validation.validate_reset(reset(targets=(("t", (1, 1)),)))
    with pytest.raises(InvalidArgument, match="topic 't' is listed twice"):
        validation.validate_reset(reset(targets=(("t", (0,)), ("t", (1,)))))
    with pytest.raises(InvalidArgument, match="partition -2"):
        validation.validate_reset(reset(targets=(("t", (-2,)),)))
    with pytest.raises(InvalidArgument, match="name the topics"):
        validation.validate_reset(reset(targets=()))
    validation.validate_reset(reset(targets=(), all_topics=True))
    with pytest.raises(InvalidArgument, match="invalid group name"):
        validation.validate_reset(reset(group=""))


def test_unknown_reset_spec_is_an_invalid_argument() -> None:
    assert reset_spec(common_pb2.NONE) is ResetSpec.OFFSET  # RESET_SPEC_OFFSET is 0
    with pytest.raises(InvalidArgument, match="unknown reset spec 9"):
        reset_spec(9)


def test_cursor_keys_and_epochs() -> None:
    validation.validate_cursor_key(CursorKey("sub", "t", 3), "cursors[0]")
    with pytest.raises(InvalidArgument, match="invalid subscription name"):
        validation.validate_cursor_key(CursorKey("", "t", 3), "cursors[0]")
    with pytest.raises(InvalidArgument, match=r"cursors\[2\]: partition -1"):
        validation.validate_cursor_key(CursorKey("s", "t", -1), "cursors[2]")
    with pytest.raises(InvalidArgument, match="owner_epoch -1"):
        validation.validate_owner_epoch(-1, "cursors[0]")


def test_empty_track_is_default() -> None:
    assert validation.track_name("") == "default"
    assert validation.track_name("split-2") == "split-2"


def test_key_layout_matches_redis_schema() -> None:
    """docs/redis-schema.md, with literal braces as Redis Cluster hash tags."""
    k = Keys("sluice")
    assert k.members("g") == "sluice:grp:{g}:members"
    assert k.owners("g") == "sluice:grp:{g}:owners"
    assert k.live("g") == "sluice:grp:{g}:live"
    assert k.offsets("g", "default") == "sluice:off:{g}:default"
    assert k.member_offsets("g", "default", "m1") == "sluice:off:{g}:default:m:m1"
    assert k.cursor("s", "t", 4) == "sluice:cur:{s}:t/4"
    assert k.cursor_epoch("s", "t", 4) == "sluice:cur:{s}:t/4:epoch"
    assert partition_field("a.b-c", 12) == "a.b-c/12"
    assert split_field("a.b-c/12") == ("a.b-c", 12)


def test_lua_scripts_carry_the_wire_codes() -> None:
    assert f"member_code = {common_pb2.STALE_MEMBER_EPOCH}" in scripts.COMMIT
    assert f"code = {common_pb2.NOT_OWNER}" in scripts.COMMIT
    assert f"return {{{common_pb2.GROUP_NOT_EMPTY}, live}}" in scripts.RESET


def metadata() -> coordinator_pb2.MetadataResponse:
    md = coordinator_pb2.MetadataResponse()
    md.brokers.add(broker_id=1, endpoint={"host": "10.0.0.1", "port": 7601}, alive=True)
    md.brokers.add(broker_id=2, endpoint={"host": "10.0.0.2", "port": 7601}, alive=True)
    md.brokers.add(broker_id=3, endpoint={"host": "10.0.0.3", "port": 7601}, alive=False)
    topic = md.topics.add(name="t")
    for partition, broker in enumerate([1, 2, 1, 3]):
        topic.partitions.add(partition=partition, broker_id=broker)
    return md


def plan_list_offsets(
    md: coordinator_pb2.MetadataResponse, topic: str, partitions: list[int], timestamp: int
) -> dict[str, broker_pb2.ListOffsetsRequest]:
    """The offset store's first round: its placement checks, then the peer layer's planner."""
    placement = Placement(md, topic)
    placement.check(partitions)
    round_plan = planner.plan([(topic, p) for p in partitions], timestamp, placement.leader_of)
    error = planner.merge(round_plan, []).first_error()
    if error is not None:
        raise error
    return round_plan.requests


def test_reset_plan_asks_each_broker_once() -> None:
    plan = plan_list_offsets(metadata(), "t", [0, 1, 2], list_offsets_timestamp(ResetSpec.EARLIEST, 0))
    assert sorted(plan) == ["10.0.0.1:7601", "10.0.0.2:7601"]
    first = plan["10.0.0.1:7601"].partitions
    assert [(p.topic, p.partition, p.timestamp) for p in first] == [("t", 0, EARLIEST), ("t", 2, EARLIEST)]
    assert list_offsets_timestamp(ResetSpec.LATEST, 0) == LATEST
    assert list_offsets_timestamp(ResetSpec.TIMESTAMP, 1234) == 1234


def test_reset_plan_errors() -> None:
    with pytest.raises(UnknownTopicOrPartition, match="topic 'nope' does not exist"):
        plan_list_offsets(metadata(), "nope", [0], EARLIEST)
    with pytest.raises(UnknownTopicOrPartition, match="no partition 9"):
        plan_list_offsets(metadata(), "t", [9], EARLIEST)
    with pytest.raises(BrokerNotAvailable, match="t/3"):
        plan_list_offsets(metadata(), "t", [3], EARLIEST)
