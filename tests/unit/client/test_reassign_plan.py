"""Reassignment plans computed from metadata (``client/reassign_plan.py``): rebalance onto a new broker,
drain a broker, and the plan file's round trip and errors."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.client.metadata import PartitionInfo, TopicInfo
from sluice.client.reassign_plan import Plan, drain_plan, parse_plan, plan_to_json, rebalance_plan
from sluice.errors import InvalidArgument


def _topic(name: str, placements: Sequence[tuple[int, ...]]) -> TopicInfo:
    parts = [PartitionInfo(p, r[0], "", r, r) for p, r in enumerate(placements)]
    return TopicInfo(name, "id-" + name, parts)


def _apply(
    topics: list[TopicInfo], plan: dict[tuple[str, int], tuple[int, ...]]
) -> dict[tuple[str, int], tuple[int, ...]]:
    out = {(t.name, p.partition): p.replicas for t in topics for p in t.partitions}
    out.update(plan)
    return out


def test_rebalance_spreads_replicas_and_leaders_onto_a_new_broker() -> None:
    placements = [(0, 1, 2), (1, 2, 0), (2, 0, 1), (0, 1, 2), (1, 2, 0), (2, 0, 1)]
    topics = [_topic("a", placements), _topic("b", placements[:2])]
    plan = rebalance_plan(topics, [0, 1, 2, 3])
    after = _apply(topics, plan)
    load = Counter(b for r in after.values() for b in r)
    assert max(load.values()) - min(load.values()) <= 1  # 24 replicas over 4 brokers: 6 each
    leaders = Counter(r[0] for r in after.values())
    assert max(leaders.values()) - min(leaders.values()) <= 1
    for replicas in after.values():
        assert len(set(replicas)) == 3
    # Applying the plan, then planning again, moves nothing.
    again = [_topic(t.name, [after[(t.name, p.partition)] for p in t.partitions]) for t in topics]
    assert rebalance_plan(again, [0, 1, 2, 3]) == {}


def test_drain_moves_every_replica_off_the_broker() -> None:
    topics = [_topic("a", [(0, 1, 2), (1, 2, 0), (1, 2, 3)])]
    plan = drain_plan(topics, [0, 1, 2, 3], 0)
    assert set(plan) == {("a", 0), ("a", 1)}
    assert plan[("a", 0)] == (3, 1, 2)  # the replacement takes the drained broker's place
    assert all(0 not in r and len(set(r)) == 3 for r in plan.values())
    with pytest.raises(InvalidArgument, match="add a broker"):
        drain_plan(topics, [0, 1, 2], 0)


def test_a_plan_file_round_trips_and_bad_ones_are_typed() -> None:
    plan: Plan = {("a", 0): (3, 1, 2), ("b", 1): (0, 1, 2)}

    assert parse_plan(json.dumps(plan_to_json(plan))) == plan
    for bad in ("{", '{"partitions": []}', '{"partitions": [{"topic": "a"}]}', "[]"):
        with pytest.raises(InvalidArgument):
            parse_plan(bad)
    twice = {"partitions": [{"topic": "a", "partition": 0, "replicas": [1]}] * 2}
    with pytest.raises(InvalidArgument, match="twice"):
        parse_plan(json.dumps(twice))


RACKS = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}


def test_rebalance_spreads_each_partitions_replicas_over_racks() -> None:
    # Balanced in count (every broker holds 2), but partitions 0 and 1 keep two replicas in one rack.
    placements = [(0, 1, 2), (2, 3, 4), (4, 5, 0), (1, 3, 5)]
    topics = [_topic("r", placements)]
    assert rebalance_plan(topics, list(RACKS)) == {}  # racks unknown: nothing to fix
    plan = rebalance_plan(topics, list(RACKS), RACKS)
    after = _apply(topics, plan)
    for replicas in after.values():
        assert len({RACKS[b] for b in replicas}) == 3, after
    load = Counter(b for r in after.values() for b in r)
    assert max(load.values()) <= 2
    again = [_topic("r", [after[("r", p)] for p in range(len(placements))])]
    assert rebalance_plan(again, list(RACKS), RACKS) == {}


def test_drain_prefers_a_rack_the_partition_does_not_use_over_a_less_loaded_broker() -> None:
    # Broker 1 (rack a, like the drained 0... and like nothing else in the partition) is the least loaded,
    # but broker 4 is in rack c, which the partition (racks a, b, b) lacks.
    topics = [_topic("d", [(0, 2, 3)]), _topic("e", [(4, 5, 2), (4, 5, 3)])]
    racks = {**RACKS, 3: "b"}
    assert drain_plan(topics, list(racks), 0) == {("d", 0): (1, 2, 3)}  # no racks: least loaded
    assert drain_plan(topics, list(racks), 0, racks) == {("d", 0): (1, 2, 3)}  # rack a is unused by 2, 3
    racks[1] = "b"  # now only rack c is free
    assert drain_plan(topics, list(racks), 0, racks) == {("d", 0): (4, 2, 3)}


@settings(deadline=None, max_examples=60)
@given(
    brokers=st.sampled_from([3, 6, 9]),
    data=st.data(),
)
def test_with_even_racks_a_rebalance_gives_every_partition_three_racks_within_the_load_ceiling(
    brokers: int, data: st.DataObject
) -> None:
    racks = {b: "abc"[b % 3] for b in range(brokers)}
    # Placements made before some brokers were added (or with racks ignored): any three distinct brokers.
    placements = data.draw(
        st.lists(st.permutations(range(brokers)).map(lambda p: tuple(p[:3])), min_size=1, max_size=24)
    )
    topics = [_topic("p", placements)]
    plan = rebalance_plan(topics, list(racks), racks)
    after = _apply(topics, plan)
    for replicas in after.values():
        assert {racks[b] for b in replicas} == {"a", "b", "c"}
    load = Counter(b for r in after.values() for b in r)
    assert max(load.values()) <= -(-3 * len(placements) // brokers)
    again = [_topic("p", [after[("p", i)] for i in range(len(placements))])]
    assert rebalance_plan(again, list(racks), racks) == {}
