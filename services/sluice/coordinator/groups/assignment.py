"""Target assignments of big groups, computed off the event loop; and the cheap views a join plans with.

A group of thousands of members cannot run its assignor inside a heartbeat: the assignor is
O(members x partitions) and the event loop would stop answering every other heartbeat meanwhile. So
(``docs/groups.md``, "Big groups"):

1. joins and leaves only move the group epoch (records written at once, no assignor run);
2. the service's timer takes an :class:`AssignmentJob` - a snapshot of the inputs, copied under the write
   lock - and runs :meth:`AssignmentJob.compute` in a worker thread, outside the lock;
3. ``GroupsState.apply_assignment`` then writes the result as target records under the lock, for the
   group epoch of the snapshot. Whatever changed meanwhile is assigned by the next job: a member that left
   gets no target, a member whose record changed keeps its previous target until then.

Safety never depends on the targets being current: a slot is handed to a member only once no other
member owns it (``reconcile.py``), whatever the targets say.

Caller: ``GroupsState`` (jobs, application) and ``CoordinatorService`` (the thread).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from sluice.coordinator.groups.model import Slot
from sluice.coordinator.groups.records import MemberRecord, TrackEntry
from sluice.coordinator.groups.targets import compute_targets

__all__ = ["AssignmentJob", "Overlay"]

K = TypeVar("K")
V = TypeVar("V")


class Overlay(Mapping[K, V]):
    """``base`` minus ``removed``, plus ``upsert``: what a membership change plans with, without copying
    a table of thousands of members on every join. Read-only; ``base`` must not change while in use
    (it does not: the plan runs inside one handler, before replay)."""

    def __init__(self, base: Mapping[K, V], removed: set[K], upsert: tuple[K, V] | None = None) -> None:
        self._base = base
        self._removed = removed
        self._upsert = upsert

    def __getitem__(self, key: K) -> V:
        if self._upsert is not None and key == self._upsert[0]:
            return self._upsert[1]
        if key in self._removed:
            raise KeyError(key)
        return self._base[key]

    def __contains__(self, key: object) -> bool:
        if self._upsert is not None and key == self._upsert[0]:
            return True
        return key not in self._removed and key in self._base

    def __iter__(self) -> Iterator[K]:
        upsert_key = self._upsert[0] if self._upsert is not None else None
        for key in self._base:
            if key not in self._removed and key != upsert_key:
                yield key
        if self._upsert is not None:
            yield self._upsert[0]

    def __len__(self) -> int:
        removed = sum(1 for k in self._removed if k in self._base)
        added = 0
        if self._upsert is not None:
            key = self._upsert[0]
            added = 0 if key in self._base and key not in self._removed else 1
        return len(self._base) - removed + added


@dataclass(frozen=True)
class AssignmentJob:
    """The inputs of one target computation, copied so that a worker thread can read them while the event
    loop goes on changing the group (records are frozen dataclasses; the containers are copies)."""

    group: str
    group_epoch: int
    members: Mapping[str, MemberRecord]
    tracks: Mapping[tuple[str, str], TrackEntry]
    current: Mapping[str, frozenset[Slot]]
    assignor: str
    partitions: Mapping[str, int]
    #: The cluster metadata version and subscribed topics (name -> (topic id, partitions)) the job saw.
    metadata_version: int
    topics: dict[str, tuple[str, int]]

    def compute(self) -> dict[str, frozenset[Slot]]:
        """The assignor run (pure; safe in a thread)."""
        return compute_targets(self.members, self.tracks, self.current, self.assignor, self.partitions)
