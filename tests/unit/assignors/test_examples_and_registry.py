"""Each assignor's worked example (its docstring runs as a doctest, and is restated here), the
registry, and bad input."""

from __future__ import annotations

import doctest
import importlib
from types import ModuleType

import pytest

from sluice.coordinator import assignors
from sluice.coordinator.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    AveragelyAssignor,
    AveragelyByCircleAssignor,
    ConsistentHashAssignor,
    GroupSpec,
    MemberSpec,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    format_assignment,
    get_assignor,
)
from sluice.errors import InvalidArgument, UnknownAssignor
from tests.unit.assignors.groups import group, members

MODULES = [
    importlib.import_module(f"sluice.coordinator.assignors.{name}")
    for name in ("averagely", "averagely_by_circle", "consistent_hash", "range", "round_robin", "sticky")
]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_docstring_worked_example_runs(module: ModuleType) -> None:
    failures, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True)
    assert attempted >= 3, "each assignor documents a worked example"
    assert failures == 0


def test_averagely_example() -> None:
    both = frozenset({"orders", "audit"})
    spec = GroupSpec(
        members={
            "c0": MemberSpec("c0", None, frozenset({"orders"})),
            "c1": MemberSpec("c1", None, both),
            "c2": MemberSpec("c2", None, both),
        }
    )
    assert format_assignment(AveragelyAssignor().assign(spec, {"orders": 8, "audit": 2})) == {
        "c0": ["orders-0", "orders-1", "orders-2"],
        "c1": ["audit-0", "orders-3", "orders-4", "orders-5"],
        "c2": ["audit-1", "orders-6", "orders-7"],
    }


def test_averagely_by_circle_example() -> None:
    result = AveragelyByCircleAssignor().assign(group(members("c2", "c0", "c1")), {"orders": 8})
    assert format_assignment(result) == {
        "c0": ["orders-0", "orders-3", "orders-6"],
        "c1": ["orders-1", "orders-4", "orders-7"],
        "c2": ["orders-2", "orders-5"],
    }


def test_consistent_hash_example() -> None:
    before = ConsistentHashAssignor().assign(group(members("c0", "c1", "c2")), {"orders": 8})
    after = ConsistentHashAssignor().assign(group(members("c0", "c2")), {"orders": 8})
    assert format_assignment(before) == {
        "c0": ["orders-0", "orders-2", "orders-4"],
        "c1": ["orders-3", "orders-5", "orders-6"],
        "c2": ["orders-1", "orders-7"],
    }
    assert format_assignment(after) == {
        "c0": ["orders-0", "orders-2", "orders-4", "orders-5", "orders-6"],
        "c2": ["orders-1", "orders-3", "orders-7"],
    }


def test_range_example() -> None:
    spec = group(members("c1", "c0", topics=["orders", "payments"]))
    assert format_assignment(RangeAssignor().assign(spec, {"orders": 3, "payments": 3})) == {
        "c0": ["orders-0", "orders-1", "payments-0", "payments-1"],
        "c1": ["orders-2", "payments-2"],
    }


def test_round_robin_example() -> None:
    spec = group(
        {
            **members("c0", topics=["a", "b"]),
            **members("c1", topics=["a"]),
            **members("c2", topics=["b"]),
        }
    )
    assert format_assignment(RoundRobinAssignor().assign(spec, {"a": 3, "b": 3})) == {
        "c0": ["a-0", "a-2", "b-1"],
        "c1": ["a-1"],
        "c2": ["b-0", "b-2"],
    }


def test_sticky_example() -> None:
    current = {f"c{m}": frozenset(("orders", 4 * m + i) for i in range(4)) for m in range(3)}
    joined = StickyAssignor().assign(group(members("c0", "c1", "c2", "c3"), current), {"orders": 12})
    assert format_assignment(joined) == {
        "c0": ["orders-0", "orders-1", "orders-2"],
        "c1": ["orders-4", "orders-5", "orders-6"],
        "c2": ["orders-8", "orders-9", "orders-10"],
        "c3": ["orders-3", "orders-7", "orders-11"],
    }
    left = StickyAssignor().assign(group(members("c1", "c2", "c3"), joined), {"orders": 12})
    assert format_assignment(left) == {
        "c1": ["orders-0", "orders-4", "orders-5", "orders-6"],
        "c2": ["orders-1", "orders-8", "orders-9", "orders-10"],
        "c3": ["orders-2", "orders-3", "orders-7", "orders-11"],
    }


def test_registry_names_and_default() -> None:
    assert list(ASSIGNORS) == [
        "averagely",
        "averagely-by-circle",
        "consistent-hash",
        "range",
        "round-robin",
        "sticky",
    ]
    assert DEFAULT_ASSIGNOR == "sticky"
    for name, assignor in ASSIGNORS.items():
        assert get_assignor(name) is assignor
        assert assignor.name == name
    assert assignors.get_assignor(DEFAULT_ASSIGNOR).name == "sticky"


@pytest.mark.parametrize("name", ["", "Sticky", "roundrobin", "cooperative-sticky"])
def test_unknown_assignor_lists_the_valid_ones(name: str) -> None:
    with pytest.raises(UnknownAssignor) as caught:
        get_assignor(name)
    message = str(caught.value)
    assert repr(name) in message
    for valid in ASSIGNORS:
        assert valid in message
    assert caught.value.fields["valid"] == list(ASSIGNORS)


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
def test_bad_inputs_are_typed_errors(name: str) -> None:
    assignor = get_assignor(name)
    with pytest.raises(InvalidArgument, match="negative partition count"):
        assignor.assign(group(members("a")), {"orders": -1})
    mislabelled = GroupSpec(members={"a": MemberSpec("b", None, frozenset({"orders"}))})
    with pytest.raises(InvalidArgument, match="must match"):
        assignor.assign(mislabelled, {"orders": 1})


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
def test_degenerate_groups(name: str) -> None:
    assignor = get_assignor(name)
    assert assignor.assign(GroupSpec(members={}), {"orders": 4}) == {}
    assert assignor.assign(group(members("a", "b")), {}) == {"a": frozenset(), "b": frozenset()}
    assert assignor.assign(group(members("a"), {"gone": frozenset({("orders", 9)})}), {"orders": 0}) == {
        "a": frozenset()
    }
