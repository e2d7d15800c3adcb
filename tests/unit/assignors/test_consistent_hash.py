"""`consistent-hash`: a stable ring; members coming and going move only their own arcs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.coordinator.assignors import ConsistentHashAssignor
from sluice.coordinator.assignors.consistent_hash import member_points, partition_points
from sluice.errors import InvalidArgument
from tests.unit.assignors.groups import check_complete_and_subscribed, group, members

HASH = ConsistentHashAssignor()
ids_st = st.lists(
    st.text(alphabet="abcdef0123-", min_size=1, max_size=5), min_size=2, max_size=12, unique=True
)


@settings(max_examples=100, deadline=None)
@given(ids_st, st.integers(1, 64), st.data())
def test_a_leaving_member_moves_only_its_own_partitions(
    ids: list[str], partitions: int, data: st.DataObject
) -> None:
    leaver = data.draw(st.sampled_from(ids))
    topic_partitions = {"orders": partitions}
    before = HASH.assign(group(members(*ids)), topic_partitions)
    after = HASH.assign(group(members(*(m for m in ids if m != leaver))), topic_partitions)
    for m in after:
        assert before[m] <= after[m]  # the others keep everything...
    assert frozenset().union(*(after[m] - before[m] for m in after)) == before[leaver]  # ...and share its


@settings(max_examples=100, deadline=None)
@given(ids_st, st.integers(1, 64))
def test_a_joining_member_only_takes(ids: list[str], partitions: int) -> None:
    *old, joiner = ids
    topic_partitions = {"orders": partitions}
    before = HASH.assign(group(members(*old)), topic_partitions)
    after = HASH.assign(group(members(*ids)), topic_partitions)
    for m in old:
        assert after[m] <= before[m]  # partitions only move to the joiner
    assert after[joiner] == frozenset().union(*(before[m] - after[m] for m in old))


def test_ring_points_are_pinned() -> None:
    """The ring must not depend on the process (Python's hash() is salted): pin a few points."""
    assert member_points("c0", 2) == (0x11579A280A614AC8, 0x11EA03C79BF1A349)
    assert partition_points("orders", 2) == (0x91B9CC7317F39737, 0x6237D48F82B60EF9)
    assert member_points("c0", 10)[:2] == member_points("c0", 2)  # more virtual nodes keep the old ones


def test_more_virtual_nodes_even_out_the_counts() -> None:
    ids = [f"consumer-{i}" for i in range(8)]
    spread = {}
    for v in (1, 200):
        result = ConsistentHashAssignor(virtual_nodes=v).assign(group(members(*ids)), {"orders": 800})
        check_complete_and_subscribed(group(members(*ids)), {"orders": 800}, result)
        counts = [len(p) for p in result.values()]
        spread[v] = max(counts) - min(counts)
    assert spread[200] < spread[1]


@pytest.mark.parametrize("virtual_nodes", [0, -1, 1_001])
def test_virtual_node_count_is_checked(virtual_nodes: int) -> None:
    with pytest.raises(InvalidArgument, match="virtual nodes"):
        ConsistentHashAssignor(virtual_nodes=virtual_nodes)
