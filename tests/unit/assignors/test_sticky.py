"""`sticky`: balanced, and moving exactly as few partitions as balance needs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from sluice.coordinator.assignors import Assignment, MemberSpec, StickyAssignor
from sluice.coordinator.assignors.sticky import _Balancer
from tests.examples import examples
from tests.unit.assignors.groups import (
    Case,
    check_complete_and_subscribed,
    group,
    groups,
    kept_counts,
    locally_balanced,
    members,
    minimum_moves,
    moves,
)

STICKY = StickyAssignor()


def counts(result: Assignment) -> list[int]:
    return [len(p) for p in result.values()]


def test_a_join_takes_only_the_excess() -> None:
    """3 members x 4 partitions, a 4th joins: 3/3/3/3 needs exactly 3 moves, one from each."""
    before = STICKY.assign(group(members("c0", "c1", "c2")), {"orders": 12})
    assert counts(before) == [4, 4, 4]
    spec = group(members("c0", "c1", "c2", "c3"), before)
    after = STICKY.assign(spec, {"orders": 12})
    assert moves(spec, {"orders": 12}, after) == 3
    assert counts(after) == [3, 3, 3, 3]
    for old in ("c0", "c1", "c2"):
        assert after[old] < before[old]  # kept 3 of its 4, gained nothing
    assert after["c3"] == frozenset().union(*(before[m] - after[m] for m in ("c0", "c1", "c2")))


def test_a_leave_spreads_only_its_partitions() -> None:
    """4 members x 3 partitions, one leaves: its 3 go one each to the others, nothing else moves."""
    before = STICKY.assign(group(members("c0", "c1", "c2", "c3")), {"orders": 12})
    spec = group(members("c0", "c2", "c3"), before)
    after = STICKY.assign(spec, {"orders": 12})
    assert moves(spec, {"orders": 12}, after) == 0
    assert counts(after) == [4, 4, 4]
    for m in ("c0", "c2", "c3"):
        assert before[m] < after[m]
        assert len(after[m] - before[m]) == 1
    assert frozenset().union(*(after[m] - before[m] for m in after)) == before["c1"]


@pytest.mark.parametrize(
    ("n", "partitions", "expected_moves"),
    [
        (10, 100, 9),  # 10 x 10 -> 11 members, q=9 r=1: one keeps 10, nine give one each
        (3, 12, 3),
        (4, 10, 2),  # 3/3/2/2 -> 5 members, q=2 r=0: the two 3s give one each
        (5, 3, 0),  # more members than partitions: the joiner gets nothing, nothing moves
        (1, 7, 3),  # 7 -> 4/3
    ],
)
def test_join_moves_the_minimum(n: int, partitions: int, expected_moves: int) -> None:
    ids = [f"m{i:02d}" for i in range(n)]
    before = STICKY.assign(group(members(*ids)), {"orders": partitions})
    spec = group(members(*ids, "new"), before)
    after = STICKY.assign(spec, {"orders": partitions})
    assert moves(spec, {"orders": partitions}, after) == expected_moves
    assert max(counts(after)) - min(counts(after)) <= 1
    check_complete_and_subscribed(spec, {"orders": partitions}, after)


def test_churn_one_by_one_never_moves_more_than_needed() -> None:
    """Members join one at a time, then leave one at a time, over 8 partitions (issue 3's churn)."""
    topic_partitions = {"orders": 8}
    ids: list[str] = []
    current: Assignment = {}
    for step in [*(f"+m{i}" for i in range(5)), *(f"-m{i}" for i in range(4))]:
        ids = [*ids, step[1:]] if step[0] == "+" else [m for m in ids if m != step[1:]]
        spec = group(members(*ids), current)
        current = STICKY.assign(spec, topic_partitions)
        assert moves(spec, topic_partitions, current) == minimum_moves(kept_counts(spec, topic_partitions), 8)
        assert max(counts(current)) - min(counts(current)) <= 1
    assert current == {"m4": frozenset(("orders", i) for i in range(8))}


def test_new_partitions_go_to_the_least_loaded() -> None:
    before = STICKY.assign(group(members("a", "b", "c")), {"orders": 4})  # 2/1/1
    after = STICKY.assign(group(members("a", "b", "c"), before), {"orders": 6})
    assert all(before[m] <= after[m] for m in before)
    assert counts(after) == [2, 2, 2]


def test_differing_subscriptions_balance_across_shared_topics() -> None:
    """`a` reads orders only, `b` and `c` read orders and audit: 10 + 2 partitions come out 4/4/4,
    with all of audit on b and c."""
    specs = {**members("a", topics=["orders"]), **members("b", "c", topics=["orders", "audit"])}
    result = STICKY.assign(group(specs), {"orders": 10, "audit": 2})
    assert counts(result) == [4, 4, 4]
    assert all(t == "orders" for t, _ in result["a"])
    check_complete_and_subscribed(group(specs), {"orders": 10, "audit": 2}, result)


@settings(max_examples=examples(60), deadline=None)
@given(groups(homogeneous=True))
def test_identical_subscriptions_move_exactly_the_minimum(case: Case) -> None:
    """From any starting point (lopsided, stale, overlapping), with identical subscriptions: balanced
    to within one, and the partitions taken from their holders are exactly the unavoidable ones."""
    spec, topic_partitions = case
    result = STICKY.assign(spec, topic_partitions)
    check_complete_and_subscribed(spec, topic_partitions, result)
    assert max(counts(result)) - min(counts(result)) <= 1
    total = sum(len(p) for p in result.values())
    assert moves(spec, topic_partitions, result) == minimum_moves(kept_counts(spec, topic_partitions), total)


@settings(max_examples=examples(60), deadline=None)
@given(groups())
def test_any_subscriptions_end_locally_balanced_and_stable(case: Case) -> None:
    spec, topic_partitions = case
    result = STICKY.assign(spec, topic_partitions)
    check_complete_and_subscribed(spec, topic_partitions, result)
    assert locally_balanced(spec, result)
    # Members with identical subscriptions end within one of each other.
    by_subscription: dict[frozenset[str], list[int]] = {}
    for member_id, member in spec.members.items():
        by_subscription.setdefault(member.topics, []).append(len(result[member_id]))
    assert all(max(c) - min(c) <= 1 for c in by_subscription.values())
    # Nothing moves once settled: the output is a fixed point.
    again = STICKY.assign(group(spec.members, result), topic_partitions)
    assert again == result


def test_many_distinct_subscriptions() -> None:
    """Every member reads a different pair of five topics: the balancer indexes by topic instead of by
    subscription class here, and must give the same guarantees."""
    topics = ["t0", "t1", "t2", "t3", "t4"]
    pairs = [(a, b) for i, a in enumerate(topics) for b in topics[i + 1 :]]
    specs = {f"m{i}": MemberSpec(f"m{i}", None, frozenset(pair)) for i, pair in enumerate(pairs)}
    topic_partitions = {t: 7 + 3 * k for k, t in enumerate(topics)}
    assert all(len(p) == 1 for p in _Balancer(group(specs), topic_partitions).pools_of_topic.values())
    first = STICKY.assign(group(specs), topic_partitions)
    check_complete_and_subscribed(group(specs), topic_partitions, first)
    assert locally_balanced(group(specs), first)
    assert STICKY.assign(group(specs, first), topic_partitions) == first
    # One member leaves.
    del specs["m3"]
    after = STICKY.assign(group(specs, first), topic_partitions)
    check_complete_and_subscribed(group(specs), topic_partitions, after)
    assert locally_balanced(group(specs), after)
    # Re-balancing may cascade across topics, but never churns more than the leaver orphaned.
    assert moves(group(specs, first), topic_partitions, after) <= len(first["m3"])
