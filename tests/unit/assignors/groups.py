"""Builders, hypothesis strategies and invariant checks shared by the assignor tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from hypothesis import strategies as st

from sluice.coordinator.assignors import Assignment, GroupSpec, MemberSpec, TopicPartition

TOPICS = ("orders", "payments", "audit")

#: What the `groups` strategy draws: a group and its topics' partition counts.
Case = tuple[GroupSpec, dict[str, int]]


def members(*ids: str, topics: Iterable[str] = ("orders",)) -> dict[str, MemberSpec]:
    """Members with identical subscriptions."""
    subscribed = frozenset(topics)
    return {m: MemberSpec(m, None, subscribed) for m in ids}


def group(
    specs: Mapping[str, MemberSpec], current: Mapping[str, Iterable[TopicPartition]] | None = None
) -> GroupSpec:
    return GroupSpec(members=dict(specs), current={m: frozenset(p) for m, p in (current or {}).items()})


def subscribed_partitions(spec: GroupSpec, topic_partitions: Mapping[str, int]) -> set[TopicPartition]:
    """Every partition of every topic at least one member subscribes to."""
    topics = {t for m in spec.members.values() for t in m.topics}
    return {(t, i) for t in topics for i in range(topic_partitions.get(t, 0))}


def check_complete_and_subscribed(
    spec: GroupSpec, topic_partitions: Mapping[str, int], result: Assignment
) -> None:
    """Every member present; every subscribed partition owned exactly once, by a subscriber."""
    assert list(result) == sorted(spec.members), "every member present, in member-id order"
    owners = Counter(tp for partitions in result.values() for tp in partitions)
    assert set(owners) == subscribed_partitions(spec, topic_partitions)
    assert all(n == 1 for n in owners.values()), "a partition owned twice"
    for member_id, partitions in result.items():
        assert {t for t, _ in partitions} <= spec.members[member_id].topics


def moves(spec: GroupSpec, topic_partitions: Mapping[str, int], result: Assignment) -> int:
    """Partitions a present, still-subscribed member held before (first claimant by member id) and no
    longer holds: the partitions that really change hands."""
    moved = 0
    claimed: set[TopicPartition] = set()
    for member_id in sorted(spec.members):
        for tp in spec.current.get(member_id, frozenset()):
            topic, index = tp
            valid = topic in spec.members[member_id].topics and 0 <= index < topic_partitions.get(topic, 0)
            if valid and tp not in claimed:
                claimed.add(tp)
                moved += tp not in result[member_id]
    return moved


def kept_counts(spec: GroupSpec, topic_partitions: Mapping[str, int]) -> dict[str, int]:
    """How many partitions each member could keep from ``spec.current``."""
    counts = dict.fromkeys(spec.members, 0)
    claimed: set[TopicPartition] = set()
    for member_id in sorted(spec.members):
        for tp in sorted(spec.current.get(member_id, frozenset())):
            topic, index = tp
            valid = topic in spec.members[member_id].topics and 0 <= index < topic_partitions.get(topic, 0)
            if valid and tp not in claimed:
                claimed.add(tp)
                counts[member_id] += 1
    return counts


def minimum_moves(kept: Mapping[str, int], total: int) -> int:
    """The fewest partitions any balanced assignment must take from their holders, when every member
    subscribes to everything: give the ``total % n`` "+1" slots to the members holding the most."""
    q, extra = divmod(total, len(kept))
    targets = [q + 1] * extra + [q] * (len(kept) - extra)
    held = sorted(kept.values(), reverse=True)
    return sum(max(0, h - t) for h, t in zip(held, targets, strict=True))


def locally_balanced(spec: GroupSpec, result: Assignment) -> bool:
    """No partition could move to a subscriber holding two or more fewer than its owner."""
    counts = {m: len(p) for m, p in result.items()}
    for owner, partitions in result.items():
        for topic in {t for t, _ in partitions}:
            for other, member in spec.members.items():
                if topic in member.topics and counts[other] <= counts[owner] - 2:
                    return False
    return True


# ---- hypothesis strategies -------------------------------------------------------------

member_ids = st.lists(
    st.text(alphabet="abcxyz0189-_.", min_size=1, max_size=6), min_size=1, max_size=9, unique=True
)
topic_sets = st.frozensets(st.sampled_from((*TOPICS, "unknown-topic")), min_size=1, max_size=4)
topic_partition_counts = st.fixed_dictionaries({t: st.integers(0, 24) for t in TOPICS})


@st.composite
def groups(draw: st.DrawFn, homogeneous: bool = False, with_current: bool = True) -> Case:
    """A group (members in a random insertion order, random current assignment) and its topics."""
    ids = draw(member_ids)
    topic_partitions = draw(topic_partition_counts)
    if homogeneous:
        topics = draw(topic_sets)
        specs = {m: MemberSpec(m, None, topics) for m in ids}
    else:
        specs = {}
        for m in ids:
            instance_id = draw(st.one_of(st.none(), st.just("i-" + m)))
            specs[m] = MemberSpec(m, instance_id, draw(topic_sets))
    current: dict[str, frozenset[TopicPartition]] = {}
    if with_current:
        # Current owners may have left, may no longer subscribe, may name partitions that are gone, and
        # may even overlap: the assignors must cope with all of it.
        owners = [*ids, "departed-1", "departed-2"]
        everything = [(t, i) for t in TOPICS for i in range(30)]
        for owner in draw(st.lists(st.sampled_from(owners), unique=True)):
            current[owner] = frozenset(draw(st.lists(st.sampled_from(everything), max_size=20)))
    return GroupSpec(members=specs, current=current), topic_partitions
