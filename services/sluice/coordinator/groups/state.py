"""The consumer-group state machine (KIP-848 model). Pure: no I/O, no clock (time is passed in).

Handlers (``heartbeat``, ``leave``, ``set_config``, ``tick``) validate, decide, and return a
:class:`Result` of a response plus the records to persist; only :meth:`GroupsState.replay` changes durable
state. Soft state (sessions, deadlines, caches: ``sessions.py``) is touched by handlers directly.

Epochs (KIP-848):

- the **group epoch** moves on every change of membership, subscriptions, or subscribed topics;
- the **assignment epoch** is the group epoch the target assignment was computed at. Computing it runs the
  assignor, so it happens at most once per ``assignment_interval_ms`` (a join storm is batched);
- a **member epoch** moves to the assignment epoch when the member has released everything its new target
  takes away (``reconcile.py``). A heartbeat must carry the member's current epoch: a future one or an old
  one is FENCED_MEMBER_EPOCH, except the previous epoch with nothing new claimed (the answer carrying the
  new epoch was lost), which is answered again.

A heartbeat that changes nothing returns no records: liveness is soft, so steady heartbeats cost Redis
nothing.

The handlers live in one module per role, each a mixin over ``planning.GroupsBase`` (the state and the
planning steps they share): ``heartbeats.py`` (heartbeat, join, leave), ``timer.py`` (tick, assignment
jobs), ``views.py`` (describe, lag view, nudges). This module adds replay and SetGroupConfig.
"""

from __future__ import annotations

from sluice.common.names import validate_group
from sluice.coordinator.assignors import get_assignor
from sluice.coordinator.groups.group import Group
from sluice.coordinator.groups.heartbeats import HeartbeatHandlers
from sluice.coordinator.groups.model import GroupConfig
from sluice.coordinator.groups.planning import GroupsBase, TopicSource
from sluice.coordinator.groups.records import (
    GROUP_RECORD_TYPES,
    CurrentAssignmentRecord,
    GroupConfigRecord,
    GroupMetadataRecord,
    MemberRecord,
    TargetAssignmentRecord,
    new_group_config_record,
    new_group_metadata_record,
)
from sluice.coordinator.groups.targets import choose_assignor
from sluice.coordinator.groups.timer import GroupTimer
from sluice.coordinator.groups.views import GroupViews, NudgeBasis
from sluice.coordinator.records import Record, RecordValue, Result, Tombstone

__all__ = ["GroupsBase", "GroupsState", "NudgeBasis", "TopicSource"]


class GroupsState(HeartbeatHandlers, GroupTimer, GroupViews):
    """Every consumer group: durable (rebuilt by replay) plus soft liveness."""

    RECORD_TYPES: tuple[type[RecordValue], ...] = GROUP_RECORD_TYPES

    # ---- replay: the only mutation of durable state ---------------------------------------------

    def replay(self, record: Record) -> None:
        self._replay(record)  # raises on a record that is not a group's
        if isinstance(record, Tombstone):
            self._scheduled(record.id.partition("/")[0])
        elif isinstance(record, GROUP_RECORD_TYPES):
            self._scheduled(record.group)  # type: ignore[attr-defined]

    def _replay(self, record: Record) -> None:
        if isinstance(record, Tombstone):
            if record.type in (GroupConfigRecord.TYPE, GroupMetadataRecord.TYPE):
                self.groups.pop(record.id, None)
                return
            group_id, _, member_id = record.id.partition("/")
            g = self.groups.get(group_id)
            if g is None:
                return
            if record.type == CurrentAssignmentRecord.TYPE:
                g.remove_current(member_id)
            elif record.type == TargetAssignmentRecord.TYPE:
                g.remove_target(member_id)
            elif record.type == MemberRecord.TYPE:
                g.remove_member(member_id)
            else:
                raise ValueError(f"group state cannot replay a tombstone of type {record.type!r}")
            return
        if isinstance(record, GroupConfigRecord):
            self._group(record.group).replay_config(record)
        elif isinstance(record, GroupMetadataRecord):
            self._group(record.group).replay_metadata(record)
        elif isinstance(record, MemberRecord):
            self._group(record.group).replay_member(record)
        elif isinstance(record, TargetAssignmentRecord):
            self._group(record.group).replay_target(record)
        elif isinstance(record, CurrentAssignmentRecord):
            self._group(record.group).replay_current(record)
        else:
            raise ValueError(f"group state cannot replay {type(record).__name__}")

    # ---- configuration --------------------------------------------------------------------------

    def set_config(
        self, group: str, update: GroupConfig, policy_given: bool, now_ms: int
    ) -> Result[GroupConfig]:
        """SetGroupConfig: given fields replace, the others stay. Creates the group if needed, so a policy
        can be set before anyone joins. A new assignor recomputes the target at once."""
        validate_group(group)
        update.validate()
        if update.assignor:
            get_assignor(update.assignor)
        g = self.groups.get(group) or Group(group, now_ms)
        merged = g.config.merged(update, policy_given).validate()
        records: list[Record] = []
        if merged != g.config:
            records.append(new_group_config_record(group, merged))
        if not g.exists:
            records.append(new_group_metadata_record(group, 0, 0, (), now_ms))
        elif g.members and choose_assignor(merged, g.members) != choose_assignor(g.config, g.members):
            records.extend(self._plan(g, now_ms, None, (), force=True, config=merged).records)
        return Result(merged, tuple(records))
