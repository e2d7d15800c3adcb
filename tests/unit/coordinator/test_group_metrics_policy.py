"""Which groups get per-group series (issue 20): at most --group-metrics-max, live first, then asked,
then by name; --group-metrics-groups exports only the groups it names."""

from __future__ import annotations

import pytest

from sluice.coordinator.config import CoordinatorConfig
from sluice.coordinator.group_metrics import GroupMetricsPolicy
from sluice.errors import InvalidArgument

GROUPS = [f"g{i:05d}" for i in range(10_000)]


def test_the_cap_keeps_live_then_asked_then_the_first_by_name() -> None:
    policy = GroupMetricsPolicy.parse(5, "")
    chosen = policy.select(GROUPS, live={"g09999", "g05000"}, asked={"g07777", "g05000"})
    assert chosen == ["g05000", "g09999", "g07777", "g00000", "g00001"]
    assert GroupMetricsPolicy.parse(0, "").select(GROUPS, {"g00001"}, set()) == []


def test_named_groups_only_by_name_or_full_regular_expression() -> None:
    policy = GroupMetricsPolicy.parse(200, "g00007, g0999[0-9]")
    assert policy.select(GROUPS, live={"g00001"}, asked=set()) == [
        "g00007",
        *(f"g0999{i}" for i in range(10)),
    ]
    assert policy.named("g00007")
    assert not policy.named("g000070")  # matched in full


def test_bad_flags_are_refused_naming_the_flag() -> None:
    with pytest.raises(InvalidArgument, match="--group-metrics-groups"):
        CoordinatorConfig(redis_url="redis://x", group_metrics_groups="orders-(").validate()
    with pytest.raises(InvalidArgument, match="--group-metrics-max"):
        CoordinatorConfig(redis_url="redis://x", group_metrics_max=-1).validate()
