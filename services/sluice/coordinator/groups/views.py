"""Reads of the consumer groups (list, describe, the lag view) and which members a write concerns
(the nudges of streaming members, the groups it touches). Read-only over :class:`GroupsBase`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sluice.common.names import validate_group
from sluice.coordinator.groups.model import (
    AssignedPartition,
    GroupDescription,
    GroupSummary,
    MemberDescription,
    MessageModel,
    Slot,
    TrackBinding,
)
from sluice.coordinator.groups.planning import GroupsBase
from sluice.coordinator.groups.reconcile import MemberState
from sluice.coordinator.groups.records import (
    GROUP_RECORD_TYPES,
    CurrentAssignmentRecord,
    MemberRecord,
    TargetAssignmentRecord,
)
from sluice.coordinator.groups.tracks import split_conflicts
from sluice.coordinator.records import Record, Tombstone
from sluice.errors import UnknownGroup


@dataclass(frozen=True)
class NudgeBasis:
    """The state :meth:`GroupsState.members_to_nudge` compares with, taken before a write's replay."""

    #: Touched group -> its assignment epoch.
    assignment_epochs: Mapping[str, int]
    #: Group -> slots the write takes from their owners (released, revoked, or the owner removed).
    freed: Mapping[str, set[Slot]]


class GroupViews(GroupsBase):
    """Read-only views of the groups. Mixed into :class:`GroupsState`."""

    # ---- reads ----------------------------------------------------------------------------------

    def list_groups(self) -> list[GroupSummary]:
        return [
            GroupSummary(name, g.state(), len(g.members))
            for name, g in sorted(self.groups.items())
            if g.exists
        ]

    def describe(self, group: str) -> GroupDescription:
        validate_group(group)
        g = self.groups.get(group)
        if g is None or not g.exists:
            raise UnknownGroup(f"group {group!r} does not exist")
        members = []
        for mid in sorted(g.members):
            m = g.members[mid]
            cur = g.current.get(mid)

            def describe_slots(slots: Iterable[Slot], m: MemberRecord = m) -> tuple[AssignedPartition, ...]:
                return tuple(
                    sorted(AssignedPartition(t, p, tr, m.subscription.get(t, "*")) for tr, t, p in slots)
                )

            members.append(
                MemberDescription(
                    mid,
                    m.instance_id,
                    m.client_id,
                    cur.member_epoch if cur else 0,
                    dict(m.subscription),
                    describe_slots(cur.assigned if cur else ()),
                    describe_slots(cur.pending if cur else ()),
                    m.message_model,
                    cur.state if cur else MemberState.STABLE.value,
                )
            )
        soft = self.soft.group(group)
        return GroupDescription(
            group=group,
            state=g.state(),
            group_epoch=g.group_epoch,
            config=g.config,
            members=tuple(members),
            conflicts=tuple(split_conflicts(g)) + tuple(soft.rejections),
            tracks=tuple(g.active_tracks()),
            track_entries=tuple(sorted((e.topic, e.filter, e.track) for e in g.tracks.values())),
            message_model=g.message_model,
            owners=dict(g.owner),
            topics=self._partitions(g.members.values()),
            bindings=tuple(
                TrackBinding(
                    e.topic,
                    e.filter,
                    e.track,
                    len(g.holders.get(e.topic, {}).get(e.filter, ())),
                    e.idle_since_ms,
                    e.source,
                    e.inherited_filter,
                    e.since_ms,
                )
                for e in sorted(g.tracks.values())
            ),
        )

    def lag_view(self, group: str) -> GroupDescription:
        """What the lag refresh needs of a group, cheaply: DescribeGroup's shape without per-member
        detail for a clustering group (its partitions are all covered by ``track_entries`` x ``topics``),
        so refreshing the lag of a group of thousands of members builds no per-member objects."""
        validate_group(group)
        g = self.groups.get(group)
        if g is None or not g.exists:
            raise UnknownGroup(f"group {group!r} does not exist")
        if g.message_model is MessageModel.BROADCASTING:
            return self.describe(group)
        return GroupDescription(
            group=group,
            state=g.state(),
            group_epoch=g.group_epoch,
            config=g.config,
            members=(),
            conflicts=(),
            tracks=tuple(g.active_tracks()),
            track_entries=tuple(sorted((e.topic, e.filter, e.track) for e in g.tracks.values())),
            message_model=g.message_model,
            owners=dict(g.owner),
            topics=self._partitions(g.members.values()),
        )

    def nudge_basis(self, records: Iterable[Record], groups: Iterable[str]) -> NudgeBasis:
        """What :meth:`members_to_nudge` compares with, read *before* ``records`` are replayed: each
        touched group's assignment epoch, and the slots the records take from their owners."""
        epochs = {}
        for name in groups:
            g = self.groups.get(name)
            epochs[name] = g.assignment_epoch if g is not None else 0
        freed: dict[str, set[Slot]] = {}
        for r in records:
            if isinstance(r, CurrentAssignmentRecord):
                group_id, member_id, now_owned = r.group, r.member_id, r.owned
            elif isinstance(r, Tombstone) and r.type == CurrentAssignmentRecord.TYPE:
                group_id, _, member_id = r.id.partition("/")
                now_owned = frozenset()
            else:
                continue
            g = self.groups.get(group_id)
            old = g.current.get(member_id) if g is not None else None
            if old is not None and not old.owned <= now_owned:
                freed.setdefault(group_id, set()).update(old.owned - now_owned)
        return NudgeBasis(epochs, freed)

    def members_to_nudge(self, records: Iterable[Record], basis: NudgeBasis) -> list[tuple[str, str]]:
        """After ``records`` were replayed: the (group, member)s that can make progress only by
        heartbeating, so a streaming member is told to heartbeat now instead of at its next interval.

        - a member whose target changed (it has partitions to release or to take); in a big group only
          once its target has caught up with its membership (a join storm moves targets every
          assignment interval: members acting on each intermediate one would multiply the writes, so
          meanwhile they heartbeat at their interval, as with unary heartbeats);
        - a member waiting for partitions (UNRELEASED_PARTITIONS) one of which the write freed;
        - a removed member (fenced, expired): it learns at once that it must rejoin;
        - when a small group's assignment epoch moved, every member not at it yet (the group is
          reconciling until each has heartbeated). Big groups' members with an unchanged target move
          their epoch at their regular heartbeat: telling thousands at once would be a heartbeat storm.
        """
        out: dict[str, set[str]] = {}
        settled: dict[str, bool] = {}
        for r in records:
            if isinstance(r, TargetAssignmentRecord):
                if r.group not in settled:
                    g = self.groups.get(r.group)
                    settled[r.group] = g is not None and (
                        len(g.members) < self.settings.assignment_batch_min_members
                        or g.assignment_epoch == g.group_epoch
                    )
                if settled[r.group]:
                    out.setdefault(r.group, set()).add(r.member_id)
            elif isinstance(r, Tombstone) and r.type == MemberRecord.TYPE:
                group_id, _, member_id = r.id.partition("/")
                out.setdefault(group_id, set()).add(member_id)
        for group_id, slots in basis.freed.items():
            g = self.groups.get(group_id)
            if g is None or not g.waiting:
                continue
            for slot in slots:
                mid = g.target_owner.get(slot)
                if mid is not None and mid in g.waiting:
                    out.setdefault(group_id, set()).add(mid)
        for group_id, before in basis.assignment_epochs.items():
            g = self.groups.get(group_id)
            if (
                g is not None
                and g.assignment_epoch != before
                and len(g.members) < self.settings.assignment_batch_min_members
            ):
                epoch = g.assignment_epoch
                behind = {mid for mid, cur in g.current.items() if cur.member_epoch != epoch}
                out.setdefault(group_id, set()).update(behind)
        return [(group_id, mid) for group_id in sorted(out) for mid in sorted(out[group_id])]

    def touched_groups(self, records: Iterable[Record]) -> set[str]:
        """Groups that ``records`` change (for metrics after a write)."""
        out = set()
        for r in records:
            if isinstance(r, Tombstone):
                if r.type in {t.TYPE for t in GROUP_RECORD_TYPES}:
                    out.add(r.id.partition("/")[0])
            elif isinstance(r, GROUP_RECORD_TYPES):
                out.add(r.group)  # type: ignore[attr-defined]
        return out
