"""Reassignment plans computed from metadata (``client/reassign_plan.py``): rebalance onto a new broker,
drain a broker, and the plan file's round trip and errors."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

import pytest

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
