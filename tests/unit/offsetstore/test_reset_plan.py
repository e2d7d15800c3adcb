"""The targets of a reset, clamped into each log: ``reset.plan_outcomes`` (pure)."""

from __future__ import annotations

import pytest

from sluice.errors import InvalidArgument
from sluice.offsetstore.model import ResetOutcome, ResetSpec, TopicPartition
from sluice.offsetstore.reset import check_not_future, plan_outcomes

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
BOUNDS = {A0: (10, 50), A1: (0, 5), B0: (0, 0)}


def test_an_offset_outside_the_log_is_clamped_and_says_to_which_bound() -> None:
    out = plan_outcomes(ResetSpec.OFFSET, 7, [A0, A1, B0], {A0: 30}, BOUNDS)
    assert out == [
        ResetOutcome("a", 0, 30, 10, "log_start", 10, 50),
        ResetOutcome("a", 1, -1, 5, "log_end", 0, 5),
        ResetOutcome("b", 0, -1, 0, "log_end", 0, 0),
    ]
    inside = plan_outcomes(ResetSpec.OFFSET, 20, [A0], {}, BOUNDS)
    assert inside == [ResetOutcome("a", 0, -1, 20, "", 10, 50)]


def test_without_bounds_an_offset_is_set_as_given() -> None:
    """An offset store without a coordinator to ask cannot clamp: it sets what it was told."""
    assert plan_outcomes(ResetSpec.OFFSET, 99, [A0], {}, None) == [ResetOutcome("a", 0, -1, 99, "", -1, -1)]


def test_a_shift_moves_from_the_committed_offset_and_is_clamped() -> None:
    out = plan_outcomes(ResetSpec.SHIFT, -25, [A0, A1], {A0: 30, A1: 4}, BOUNDS)
    assert [(o.offset, o.clamped) for o in out] == [(10, "log_start"), (0, "log_start")]
    out = plan_outcomes(ResetSpec.SHIFT, 3, [A0, A1], {A0: 30, A1: 4}, BOUNDS)
    assert [(o.previous, o.offset, o.clamped) for o in out] == [(30, 33, ""), (4, 5, "log_end")]


def test_a_shift_of_a_partition_without_a_committed_offset_is_refused_naming_it() -> None:
    with pytest.raises(InvalidArgument, match="without a committed offset: a/1"):
        plan_outcomes(ResetSpec.SHIFT, -1, [A0, A1], {A0: 30}, BOUNDS)


def test_earliest_latest_and_a_time_take_what_the_brokers_said() -> None:
    assert [o.offset for o in plan_outcomes(ResetSpec.EARLIEST, 0, [A0, A1], {}, BOUNDS)] == [10, 0]
    assert [o.offset for o in plan_outcomes(ResetSpec.LATEST, 0, [A0, A1], {}, BOUNDS)] == [50, 5]
    out = plan_outcomes(ResetSpec.TIMESTAMP, 1234, [A0, A1], {}, BOUNDS, {A0: 17, A1: 5})
    assert [(o.offset, o.clamped) for o in out] == [(17, ""), (5, "")]


def test_a_time_in_the_future_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="in the future"):
        check_not_future(2_000, 1_000)
    check_not_future(1_000, 1_000)
