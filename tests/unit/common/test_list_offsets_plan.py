"""The ListOffsets planner's pure parts: grouping by leader, merging answers, the retry rule."""

from __future__ import annotations

import pytest

from sluice.common import list_offsets as planner
from sluice.common.list_offsets import EARLIEST, LATEST, ListOffsetsPlan, RetryBound
from sluice.errors import (
    BrokerNotAvailable,
    InvalidArgument,
    NotLeader,
    RequestTimedOut,
    SluiceError,
    UnknownTopicOrPartition,
)
from sluice.v1 import broker_pb2

LEADERS = {("a", 0): "b1:1", ("a", 1): "b2:1", ("a", 2): "b1:1", ("b", 0): "b2:1", ("b", 1): None}


def leader_of(topic: str, partition: int) -> str | None:
    return LEADERS.get((topic, partition))


def asked(round_plan: ListOffsetsPlan, address: str) -> list[tuple[str, int, int]]:
    return [(p.topic, p.partition, p.timestamp) for p in round_plan.requests[address].partitions]


def test_one_request_per_broker_in_the_callers_order() -> None:
    wanted = [("a", 2), ("b", 0), ("a", 0), ("a", 1), ("b", 1)]
    round_plan = planner.plan(wanted, EARLIEST, leader_of)
    assert list(round_plan.requests) == ["b1:1", "b2:1"]
    assert asked(round_plan, "b1:1") == [("a", 2, EARLIEST), ("a", 0, EARLIEST)]
    assert asked(round_plan, "b2:1") == [("b", 0, EARLIEST), ("a", 1, EARLIEST)]
    assert round_plan.unroutable == [("b", 1)]


def answer(*items: tuple[str, int, int, SluiceError | None]) -> broker_pb2.ListOffsetsResponse:
    resp = broker_pb2.ListOffsetsResponse()
    for topic, partition, offset, error in items:
        item = resp.partitions.add(topic=topic, partition=partition, offset=offset)
        if error is not None:
            item.error.CopyFrom(error.to_proto())
    return resp


def test_merge_decodes_typed_errors_and_leaves_nothing_unanswered() -> None:
    round_plan = planner.plan([("a", 0), ("a", 2), ("a", 1), ("b", 0), ("b", 1)], LATEST, leader_of)
    merged = planner.merge(
        round_plan,
        [
            # b1 answers a/0, fails a/2 with a typed error, and adds a partition it was not asked for.
            ("b1:1", answer(("a", 0, 7, None), ("a", 2, 0, InvalidArgument("bad")), ("z", 9, 1, None))),
            ("b2:1", RequestTimedOut("deadline exceeded")),  # the whole call failed
        ],
    )
    assert merged.offsets == {("a", 0): 7}
    assert type(merged.errors[("a", 2)]) is InvalidArgument
    assert type(merged.errors[("a", 1)]) is RequestTimedOut
    assert type(merged.errors[("b", 0)]) is RequestTimedOut
    assert type(merged.errors[("b", 1)]) is BrokerNotAvailable  # no live leader
    assert set(merged.errors) == {("a", 2), ("a", 1), ("b", 0), ("b", 1)}
    # The whole call's error: the one the caller must fix comes before the ones a refresh could.
    assert type(merged.first_error()) is InvalidArgument


def test_a_partition_left_out_of_an_answer_gets_an_error() -> None:
    round_plan = planner.plan([("a", 0), ("a", 2)], LATEST, leader_of)
    merged = planner.merge(round_plan, [("b1:1", answer(("a", 0, 3, None)))])
    assert merged.offsets == {("a", 0): 3}
    with pytest.raises(SluiceError, match="without a/2"):
        raise merged.errors[("a", 2)]


def rounds(bound: RetryBound, gated: bool = True) -> planner._Rounds:
    return planner._Rounds([("a", 0), ("a", 1)], bound, gated)


def routing_round(*errors: SluiceError) -> planner.OffsetsAnswer:
    return planner.OffsetsAnswer(errors={("a", i): e for i, e in enumerate(errors)})


def test_routing_errors_retry_within_the_round_bound() -> None:
    r = rounds(RetryBound(60, rounds=3))
    waits = [r.take(routing_round(NotLeader("moved"), UnknownTopicOrPartition("x"))) for _ in range(3)]
    assert waits[0] is not None
    assert 0.09 <= waits[0] <= 0.1  # the peer backoff: 100 ms, jittered
    assert waits[1] is not None
    assert 0.18 <= waits[1] <= 0.2
    assert waits[2] is None  # the third round was the last
    assert r.rounds == 3


def test_routing_errors_retry_within_the_time_bound() -> None:
    r = rounds(RetryBound(0, rounds=100))
    assert r.take(routing_round(NotLeader("moved"))) is None


def test_a_non_routing_error_ends_the_call_at_once() -> None:
    r = rounds(RetryBound(60))
    assert r.take(routing_round(NotLeader("moved"), InvalidArgument("bad"))) is None


def test_without_a_refresh_there_is_one_round() -> None:
    r = rounds(RetryBound(60), gated=False)
    assert r.take(routing_round(NotLeader("moved"))) is None


def test_later_rounds_ask_only_for_what_is_missing() -> None:
    r = rounds(RetryBound(60))
    assert r.take(planner.OffsetsAnswer({("a", 0): 5}, {("a", 1): NotLeader("moved")})) is not None
    assert r.pending == [("a", 1)]
    assert r.take(planner.OffsetsAnswer({("a", 1): 6})) is None
    assert r.result.offsets == {("a", 0): 5, ("a", 1): 6}
    assert r.result.errors == {}
