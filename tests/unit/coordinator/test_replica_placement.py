"""Replica placement (cluster/placement.py ``assign_replicas``): properties over random clusters
(Hypothesis), and the worked cases that pin the algorithm down."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.examples import examples

from sluice.coordinator.cluster.placement import assign_replicas, place_partitions

_brokers = st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True)


@st.composite
def _clusters(draw: st.DrawFn) -> tuple[str, int, list[int], int]:
    brokers = draw(_brokers)
    factor = draw(st.integers(1, min(len(brokers), 5)))
    partitions = draw(st.integers(1, 60))
    topic = draw(st.text("abcdefghij-._", min_size=1, max_size=12))
    return topic, partitions, brokers, factor


@settings(max_examples=examples(120), deadline=None)
@given(_clusters())
def test_replicas_are_distinct_live_brokers_and_leaders_balance_within_one(
    cluster: tuple[str, int, list[int], int],
) -> None:
    topic, partitions, brokers, factor = cluster
    placed = assign_replicas(topic, partitions, brokers, factor)
    assert len(placed) == partitions
    for replicas in placed:
        assert len(replicas) == factor
        assert len(set(replicas)) == factor
        assert set(replicas) <= set(brokers)
    leaders = Counter(r[0] for r in placed)
    counts = [leaders.get(b, 0) for b in brokers]
    assert max(counts) - min(counts) <= 1
    # Factor 1 is exactly the placement of before replication: existing setups see no change.
    assert tuple(r[0] for r in placed) == place_partitions(topic, partitions, brokers)


@settings(max_examples=examples(120), deadline=None)
@given(_clusters(), st.integers(1, 4))
def test_with_racks_each_partition_spans_min_factor_racks(
    cluster: tuple[str, int, list[int], int], rack_count: int
) -> None:
    topic, partitions, brokers, factor = cluster
    racks = {b: f"zone-{i % rack_count}" for i, b in enumerate(sorted(brokers))}
    placed = assign_replicas(topic, partitions, brokers, factor, racks)
    distinct_racks = len(set(racks.values()))
    leaders = Counter(r[0] for r in placed)
    counts = [leaders.get(b, 0) for b in brokers]
    assert max(counts) - min(counts) <= 1
    for replicas in placed:
        assert len(set(replicas)) == factor
        assert set(replicas) <= set(brokers)
        assert len({racks[b] for b in replicas}) == min(factor, distinct_racks)


def test_followers_of_one_leader_spread_over_the_other_brokers() -> None:
    # 4 brokers, 8 partitions, factor 2: each broker leads 2 partitions, and the shift after every
    # round of 4 gives its second partition a different follower than its first.
    placed = assign_replicas("t", 8, [0, 1, 2, 3], 2)
    followers: dict[int, set[int]] = {}
    for leader, follower in placed:
        followers.setdefault(leader, set()).add(follower)
    assert all(len(f) == 2 for f in followers.values())


def test_racks_are_ignored_unless_every_broker_has_one() -> None:
    partial = assign_replicas("t", 6, [0, 1, 2], 2, {0: "a", 1: "b"})
    assert partial == assign_replicas("t", 6, [0, 1, 2], 2)


def test_rack_aware_spreads_across_zones_where_rack_unaware_would_not() -> None:
    # Brokers 0,1 in zone a and 2,3 in zone b: consecutive ids share a zone, so the plain round-robin
    # puts some partitions' two replicas in one zone; the rack-aware order never does.
    racks = {0: "a", 1: "a", 2: "b", 3: "b"}
    plain = assign_replicas("t", 8, [0, 1, 2, 3], 2)
    assert any(racks[x] == racks[y] for x, y in plain)
    aware = assign_replicas("t", 8, [0, 1, 2, 3], 2, racks)
    assert all(racks[x] != racks[y] for x, y in aware)


def test_more_replicas_than_brokers_is_refused() -> None:
    with pytest.raises(ValueError, match="needs 1 to 2"):
        assign_replicas("t", 1, [0, 1], 3)
