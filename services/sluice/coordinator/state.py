"""The coordinator's state machine root: routes each persisted record to the sub-machine owning its type.

Two sub-machines: ``cluster`` (brokers, dispatchers, topics) and ``groups`` (consumer groups), each a class
with ``RECORD_TYPES`` and ``replay(record)``, registered in :meth:`CoordinatorState.__init__`. They share one
record codec and one Redis hash, so a handler touching both persists its records in one atomic write.
Groups read topics from the cluster sub-machine (never the other way round).
"""

from __future__ import annotations

from typing import Protocol

from sluice.coordinator.cluster.state import ClusterSettings, ClusterState
from sluice.coordinator.groups.model import GroupSettings
from sluice.coordinator.groups.sessions import GroupSoftState
from sluice.coordinator.groups.state import GroupsState
from sluice.coordinator.records import Record, RecordCodec, RecordValue, Tombstone

__all__ = ["CoordinatorState", "SubMachine"]


class SubMachine(Protocol):
    """One part of the coordinator's state: owns some record types and replays them."""

    RECORD_TYPES: tuple[type[RecordValue], ...]

    def replay(self, record: Record) -> None: ...


class CoordinatorState:
    """All durable coordinator state. Only :meth:`replay` changes it."""

    def __init__(
        self,
        cluster: ClusterState | None = None,
        settings: ClusterSettings | None = None,
        group_settings: GroupSettings | None = None,
        group_soft: GroupSoftState | None = None,
    ) -> None:
        self.cluster = cluster if cluster is not None else ClusterState(settings)
        self.groups = GroupsState(self.cluster, group_settings, group_soft)
        machines: list[SubMachine] = [self.cluster, self.groups]
        self._owner: dict[str, SubMachine] = {}
        types: list[type[RecordValue]] = []
        for machine in machines:
            for tp in machine.RECORD_TYPES:
                if tp.TYPE in self._owner:
                    raise ValueError(f"record type {tp.TYPE!r} owned twice")
                self._owner[tp.TYPE] = machine
                types.append(tp)
        self.codec = RecordCodec(types)

    def replay(self, record: Record) -> None:
        type_name = record.type if isinstance(record, Tombstone) else record.TYPE
        owner = self._owner.get(type_name)
        if owner is None:
            raise ValueError(f"no state machine owns record type {type_name!r}")
        owner.replay(record)

    def replay_all(self, records: list[RecordValue]) -> None:
        """Recovery: replay every stored record in codec order (cluster counters first, then by type)."""
        for record in sorted(records, key=lambda r: self.codec.order[r.TYPE]):
            self.replay(record)
