"""Planning a membership change of a consumer group, shared by every handler of :class:`GroupsState`.

``GroupsBase`` holds the state (durable groups, soft liveness, settings, the topic source) and the steps
every handler uses: bump the group epoch for a change (``_plan``), run the assignor (``_assign``), read the
subscribed topics' partitions, and the member timeouts. A handler builds a :class:`Change` and returns its
records; nothing is applied until ``GroupsState.replay``. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sluice.coordinator.cluster.records import TopicRecord
from sluice.coordinator.groups.assignment import Overlay
from sluice.coordinator.groups.deadlines import Deadlines
from sluice.coordinator.groups.group import Group
from sluice.coordinator.groups.model import GroupConfig, GroupSettings, Slot
from sluice.coordinator.groups.records import (
    MemberRecord,
    TrackEntry,
    new_group_metadata_record,
    new_member_tombstones,
    new_target_record,
)
from sluice.coordinator.groups.sessions import GroupSoftState
from sluice.coordinator.groups.targets import choose_assignor, compute_targets
from sluice.coordinator.groups.tracks import plan_tracks
from sluice.coordinator.records import Record
from sluice.errors import InconsistentSubscription


class TopicSource(Protocol):
    """What groups need of the cluster state: the topics and a version that moves when they change."""

    @property
    def metadata_version(self) -> int: ...

    @property
    def topics(self) -> Mapping[str, TopicRecord]: ...


@dataclass
class Change:
    """A membership change being planned inside one handler (nothing is applied until replay)."""

    group: Group
    members: Mapping[str, MemberRecord]
    tracks: dict[tuple[str, str], TrackEntry]
    targets: Mapping[str, frozenset[Slot]]
    group_epoch: int
    assignment_epoch: int
    config: GroupConfig
    removed: set[str] = field(default_factory=set)
    records: list[Record] = field(default_factory=list)


class GroupsBase:
    """The state every handler reads, and the planning steps they share (``state.py`` has the picture)."""

    def __init__(
        self, topics: TopicSource, settings: GroupSettings | None = None, soft: GroupSoftState | None = None
    ) -> None:
        self.settings = settings or GroupSettings()
        self.topics = topics
        self.groups: dict[str, Group] = {}
        self.soft = soft or GroupSoftState()
        #: Groups with members, in the order they became live: the only ones the timer's sessions,
        #: assignments and topic checks look at (deadlines.py).
        self.live: dict[str, None] = {}
        #: When the offsets retention next expires something of a group (deadlines.py).
        self.deadlines = Deadlines()
        #: Moves on every replay of a group record: the gauges are recomputed only when it moved.
        self.version = 0

    def _scheduled(self, group_id: str) -> None:
        """Keep ``live`` and ``deadlines`` equal to the group's replayed state. O(1) (plus a heap push
        when its deadline moved). Caller: replay."""
        self.version += 1
        g = self.groups.get(group_id)
        if g is None or not g.members:
            self.live.pop(group_id, None)
        elif group_id not in self.live:
            self.live[group_id] = None
        self.deadlines.set(group_id, self._retention_due(g) if g is not None else None)

    def _retention_due(self, g: Group) -> int | None:
        """When the offsets retention next expires something of ``g``: its oldest idle binding; an
        empty group without bindings (only configured, never read) from its creation. None: never."""
        retention = self.settings.offsets_retention_ms
        if retention <= 0 or not g.exists:
            return None
        if g.earliest_idle_ms:
            return g.earliest_idle_ms + retention
        if g.members or any(not e.idle_since_ms for e in g.tracks.values()):
            return None
        return g.created_ms + retention

    def _group(self, group_id: str) -> Group:
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = Group(group_id)
        return g

    # ---- planning a membership change -----------------------------------------------------------

    def _plan(
        self,
        g: Group,
        now_ms: int,
        upsert: MemberRecord | None,
        remove: Iterable[str],
        *,
        force: bool,
        config: GroupConfig | None = None,
    ) -> Change:
        """Bump the group epoch for a membership/subscription change and, unless throttled, compute the
        new target assignment. Raises InconsistentSubscription under the ``reject`` policy."""
        removed = set(remove)
        config = config or g.config
        excluded = removed | ({upsert.member_id} if upsert is not None else set())
        previous = g.members.get(upsert.member_id) if upsert is not None else None
        tracks, conflict = plan_tracks(
            g.tracks,
            g.holders,
            excluded,
            config.conflict_policy,
            upsert.subscription if upsert is not None else None,
            previous.subscription if previous is not None else None,
            now_ms,
        )
        if upsert is not None and conflict is not None:
            message = conflict.message(g.group_id, upsert.member_id)
            self.soft.group(g.group_id).rejections.append(message)
            raise InconsistentSubscription(
                message,
                topic=conflict.topic,
                expression=conflict.expression,
                other_expression=conflict.other_expression,
                other_member=conflict.other_member,
            )
        # Views, not copies: a join into a group of thousands of members costs O(1) here.
        members = Overlay(g.members, removed, (upsert.member_id, upsert) if upsert is not None else None)
        change = Change(
            g,
            members,
            tracks,
            Overlay(g.targets, removed),
            g.group_epoch + 1,
            g.assignment_epoch,
            config,
            removed,
        )
        for mid in sorted(removed):
            change.records.extend(new_member_tombstones(g.group_id, mid))
        if upsert is not None:
            change.records.append(upsert)
        small = len(members) < self.settings.assignment_batch_min_members
        rejoin = force and previous is not None
        if small or g.assignment_epoch == 0:
            self._assign(change, now_ms)
        elif (
            rejoin
            and not removed
            and upsert == previous
            and config == g.config
            and g.assignment_epoch == g.group_epoch
        ):
            # Same members, subscriptions and config: the (deterministic) assignor would return the
            # current target, so only the epoch moves - the re-joined member gets a new epoch, fencing its
            # previous incarnation, without an assignor run.
            change.assignment_epoch = change.group_epoch
        elif rejoin:
            self._assign(change, now_ms)  # rare; the new incarnation must get a new epoch now
        # Otherwise a big group's target is computed by the timer, off the event loop (assignment.py).
        # The group record goes first, so a brand-new group exists before its members replay.
        change.records.insert(
            0,
            new_group_metadata_record(
                g.group_id,
                change.group_epoch,
                change.assignment_epoch,
                tracks.values(),
                g.created_ms or now_ms,
            ),
        )
        return change

    def _assign(self, change: Change, now_ms: int) -> None:
        partitions = self._partitions(change.members.values())
        targets = compute_targets(
            change.members,
            change.tracks,
            change.targets,
            choose_assignor(change.config, change.members),
            partitions,
        )
        for mid in sorted(targets):
            if change.targets.get(mid) != targets[mid] or mid not in change.group.targets:
                change.records.append(new_target_record(change.group.group_id, mid, targets[mid]))
        change.targets = targets
        change.assignment_epoch = change.group_epoch
        soft = self.soft.group(change.group.group_id)
        soft.last_assignment_ms = now_ms
        soft.metadata_version = self.topics.metadata_version
        soft.topics = self._snapshot(change.members.values())

    def _partitions(self, members: Iterable[MemberRecord]) -> dict[str, int]:
        known = self.topics.topics
        wanted = {t for m in members for t in m.subscription}
        return {t: known[t].partitions for t in sorted(wanted) if t in known}

    def _snapshot(self, members: Iterable[MemberRecord]) -> dict[str, tuple[str, int]]:
        known = self.topics.topics
        wanted = {t for m in members for t in m.subscription}
        return {t: (known[t].topic_id, known[t].partitions) for t in sorted(wanted) if t in known}

    # ---- member timeouts ------------------------------------------------------------------------

    def _rebalance_timeout(self, g: Group, member: MemberRecord) -> int:
        """How long the member may hold a revoked partition: its own ``rebalance_timeout_ms``, bounded by
        the group's when SetGroupConfig set one (the group's operator decides how long one stuck member
        may hold up everyone's rebalance; a member may still ask for less). Without a group setting:
        the member's, else the coordinator default."""
        asked = member.rebalance_timeout_ms
        imposed = g.config.rebalance_timeout_ms
        if imposed:
            return min(asked, imposed) if asked else imposed
        return asked or self.settings.rebalance_timeout_ms

    def _session_timeout(self, g: Group, member: MemberRecord) -> int:
        return member.session_timeout_ms or g.settings_for(self.settings)[1]
