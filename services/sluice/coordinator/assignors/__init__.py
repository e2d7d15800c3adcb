"""Partition assignors: pure functions from a group and its topics to a target assignment.

Look one up by the name a member sends in its heartbeat::

    assignor = get_assignor(name or DEFAULT_ASSIGNOR)
    target = assignor.assign(GroupSpec(members, current), topic_partitions)

See ``docs/assignors.md`` for how the strategies compare, and each module's docstring for a worked
example (the unit tests run every one).
"""

from __future__ import annotations

from sluice.coordinator.assignors.api import (
    Assignment,
    Assignor,
    GroupSpec,
    MemberSpec,
    TopicPartition,
    format_assignment,
)
from sluice.coordinator.assignors.averagely import AveragelyAssignor
from sluice.coordinator.assignors.averagely_by_circle import AveragelyByCircleAssignor
from sluice.coordinator.assignors.consistent_hash import ConsistentHashAssignor
from sluice.coordinator.assignors.range import RangeAssignor
from sluice.coordinator.assignors.round_robin import RoundRobinAssignor
from sluice.coordinator.assignors.sticky import StickyAssignor
from sluice.errors import UnknownAssignor

__all__ = [
    "ASSIGNORS",
    "DEFAULT_ASSIGNOR",
    "Assignment",
    "Assignor",
    "AveragelyAssignor",
    "AveragelyByCircleAssignor",
    "ConsistentHashAssignor",
    "GroupSpec",
    "MemberSpec",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyAssignor",
    "TopicPartition",
    "format_assignment",
    "get_assignor",
]

#: name -> assignor, in the order they are listed to users.
ASSIGNORS: dict[str, Assignor] = {
    a.name: a
    for a in (
        AveragelyAssignor(),
        AveragelyByCircleAssignor(),
        ConsistentHashAssignor(),
        RangeAssignor(),
        RoundRobinAssignor(),
        StickyAssignor(),
    )
}

DEFAULT_ASSIGNOR = "sticky"


def get_assignor(name: str) -> Assignor:
    """The assignor called ``name``; an unknown name is an ``UnknownAssignor`` listing the valid ones."""
    try:
        return ASSIGNORS[name]
    except KeyError:
        valid = ", ".join(ASSIGNORS)
        raise UnknownAssignor(
            f"unknown assignor {name!r}; valid assignors are: {valid} (default {DEFAULT_ASSIGNOR})",
            name=name,
            valid=list(ASSIGNORS),
        ) from None
