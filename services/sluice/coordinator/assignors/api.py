"""The assignor interface and the helpers every assignor shares.

An assignor is a pure function of the group and the topics' partition counts: no I/O, no clock, no
randomness, and no dependence on the order in which members or topics were inserted into a mapping.
The coordinator calls it whenever membership, subscriptions or partition counts change, and then
reconciles the result incrementally (a partition moves only after its old owner released it).

Ordering is fixed here, once, so every assignor sees the same thing:

* members sorted by ``member_id``;
* a topic's partitions sorted by index, topics by name.

A topic's partitions go only to members that subscribe to it. A topic nobody subscribes to stays
unassigned; a subscribed topic the coordinator does not know about (absent from ``topic_partitions``)
has no partitions to give out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sluice.errors import InvalidArgument

__all__ = [
    "Assignment",
    "Assignor",
    "GroupSpec",
    "MemberSpec",
    "TopicPartition",
    "check_inputs",
    "empty_assignment",
    "format_assignment",
    "freeze",
    "subscribers_by_topic",
]

#: (topic, partition index).
TopicPartition = tuple[str, int]

#: member_id -> the partitions it should own. Every member of the group is a key (possibly empty).
Assignment = dict[str, frozenset[TopicPartition]]


@dataclass(frozen=True)
class MemberSpec:
    """One member as an assignor sees it."""

    member_id: str
    #: Static membership id (``group.instance.id``), or None for a dynamic member. Assignors order
    #: members by ``member_id``; the coordinator keeps a static member's id across restarts.
    instance_id: str | None
    #: The topics this member subscribes to (its filters do not matter to assignment).
    topics: frozenset[str]


@dataclass(frozen=True)
class GroupSpec:
    """The group's members and its current target assignment (what ``sticky`` sticks to)."""

    members: Mapping[str, MemberSpec]
    #: member_id -> partitions of the current target assignment. May name members that have left
    #: and partitions that no longer exist; assignors ignore both.
    current: Mapping[str, frozenset[TopicPartition]] = field(default_factory=dict)


class Assignor(Protocol):
    """A named, pure assignment strategy."""

    @property
    def name(self) -> str:
        """The name members ask for in their heartbeat (e.g. ``"sticky"``)."""
        ...

    def assign(self, group: GroupSpec, topic_partitions: Mapping[str, int]) -> Assignment:
        """Return the target assignment: member_id -> partitions, every member present."""
        ...


def check_inputs(group: GroupSpec, topic_partitions: Mapping[str, int]) -> None:
    """Reject inputs no assignor can make sense of, with a typed error instead of a wrong answer."""
    for member_id, member in group.members.items():
        if member.member_id != member_id:
            raise InvalidArgument(
                f"member spec keyed {member_id!r} carries member_id {member.member_id!r}; they must match"
            )
    for topic, count in topic_partitions.items():
        if count < 0:
            raise InvalidArgument(f"topic {topic!r} has a negative partition count ({count})")


def empty_assignment(group: GroupSpec) -> dict[str, list[TopicPartition]]:
    """A mutable, empty assignment with every member present, keys in member-id order."""
    return {member_id: [] for member_id in sorted(group.members)}


def subscribers_by_topic(group: GroupSpec, topic_partitions: Mapping[str, int]) -> dict[str, list[str]]:
    """topic -> its subscribers sorted by member id, for every known topic with at least one partition
    and at least one subscriber; topics in name order."""
    subscribers: dict[str, list[str]] = {}
    for member_id in sorted(group.members):
        for topic in group.members[member_id].topics:
            if topic_partitions.get(topic, 0) > 0:
                subscribers.setdefault(topic, []).append(member_id)
    return {topic: subscribers[topic] for topic in sorted(subscribers)}


def freeze(assignment: Mapping[str, Iterable[TopicPartition]]) -> Assignment:
    """Turn the working lists into the immutable result (keys keep their member-id order)."""
    return {member_id: frozenset(partitions) for member_id, partitions in assignment.items()}


def format_assignment(assignment: Mapping[str, Iterable[TopicPartition]]) -> dict[str, list[str]]:
    """A readable, ordered view (``{"c0": ["orders-0", "orders-1"]}``) for docs, logs and describe."""
    return {
        member_id: [f"{topic}-{index}" for topic, index in sorted(assignment[member_id])]
        for member_id in sorted(assignment)
    }
