"""`averagely` is RocketMQ's AllocateMessageQueueAveragely (seed 002), queue for queue."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.coordinator.assignors import AveragelyAssignor, RangeAssignor
from sluice.coordinator.assignors.averagely import averagely_slice
from tests.unit.assignors.groups import Case, group, groups, members


def rocketmq_allocate(current_cid: str, mq_all: list[int], cid_all: list[str]) -> list[int]:
    """Seed 002's Java, transliterated line by line (int division of non-negatives is floor)."""
    if not current_cid:
        raise ValueError("currentCID is empty")
    if not mq_all:
        raise ValueError("mqAll is null or mqAll empty")
    if not cid_all:
        raise ValueError("cidAll is null or cidAll empty")
    result: list[int] = []
    if current_cid not in cid_all:
        return result
    index = cid_all.index(current_cid)
    mod = len(mq_all) % len(cid_all)
    average_size = (
        1
        if len(mq_all) <= len(cid_all)
        else (len(mq_all) // len(cid_all) + 1 if mod > 0 and index < mod else len(mq_all) // len(cid_all))
    )
    start_index = index * average_size if (mod > 0 and index < mod) else index * average_size + mod
    range_ = min(average_size, len(mq_all) - start_index)
    for i in range(range_):
        result.append(mq_all[(start_index + i) % len(mq_all)])
    return result


# (queue count, consumer count) -> each consumer's queues, in consumer order. Worked out by hand from
# the seed's formula: averageSize, then startIndex = index*averageSize (+ mod past the first `mod`).
TABLE: dict[tuple[int, int], list[list[int]]] = {
    (8, 3): [[0, 1, 2], [3, 4, 5], [6, 7]],  # mod 2: two blocks of 3, then 2 from 6
    (10, 4): [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]],  # mod 2: start 2*2+2 = 6 for index 2
    (5, 2): [[0, 1, 2], [3, 4]],
    (12, 5): [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9], [10, 11]],
    (16, 3): [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]],
    (9, 6): [[0, 1], [2, 3], [4, 5], [6], [7], [8]],  # mod 3: averageSize 2 then 1, start 3*1+3 = 6
    (6, 3): [[0, 1], [2, 3], [4, 5]],  # mod 0: even blocks
    (7, 1): [[0, 1, 2, 3, 4, 5, 6]],
    (4, 4): [[0], [1], [2], [3]],  # queues == consumers: averageSize 1, mod 0
    # More consumers than queues: averageSize 1, the first `queues` consumers take one each and the
    # rest compute range <= 0 and get nothing.
    (3, 5): [[0], [1], [2], [], []],
    (1, 3): [[0], [], []],
    (2, 8): [[0], [1], [], [], [], [], [], []],
}


@pytest.mark.parametrize(("queues", "consumers"), list(TABLE))
def test_matches_the_seed_table(queues: int, consumers: int) -> None:
    expected = TABLE[(queues, consumers)]
    ids = [f"cid-{i:02d}" for i in range(consumers)]
    mq_all = list(range(queues))
    assert [rocketmq_allocate(cid, mq_all, ids) for cid in ids] == expected  # the table is the seed's
    assert [list(averagely_slice(i, queues, consumers)) for i in range(consumers)] == expected
    result = AveragelyAssignor().assign(group(members(*reversed(ids))), {"orders": queues})
    assert [sorted(i for _, i in result[cid]) for cid in ids] == expected


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.integers(1, 80))
def test_slice_equals_the_java_for_any_counts(queues: int, consumers: int) -> None:
    ids = [f"c{i:03d}" for i in range(consumers)]
    mq_all = list(range(queues))
    for index, cid in enumerate(ids):
        assert list(averagely_slice(index, queues, consumers)) == rocketmq_allocate(cid, mq_all, ids)


@settings(max_examples=60, deadline=None)
@given(groups(with_current=False))
def test_each_topic_is_the_java_over_its_sorted_subscribers(case: Case) -> None:
    """Per topic, like RocketMQ's per-topic rebalance: cidAll is the topic's subscribers, sorted."""
    spec, topic_partitions = case
    result = AveragelyAssignor().assign(spec, topic_partitions)
    for topic, count in topic_partitions.items():
        cid_all = sorted(m for m, member in spec.members.items() if topic in member.topics)
        if not cid_all or not count:
            continue
        for cid in cid_all:
            got = sorted(i for t, i in result[cid] if t == topic)
            assert got == rocketmq_allocate(cid, list(range(count)), cid_all)


@settings(max_examples=60, deadline=None)
@given(groups(with_current=False))
def test_same_blocks_as_kafka_range(case: Case) -> None:
    spec, topic_partitions = case
    averagely = AveragelyAssignor().assign(spec, topic_partitions)
    assert averagely == RangeAssignor().assign(spec, topic_partitions)
