"""One consumer group's durable state, changed only by :meth:`Group.replay`, plus derived indexes.

The ownership index (slot -> member) is derived from the members' current assignments and is the
invariant's guard: replaying a current assignment that would give a slot a second owner fails loudly
(AssertionError) instead of silently letting two members process one partition.
"""

from __future__ import annotations

from sluice.coordinator.groups.model import (
    DEFAULT_TRACK,
    GroupConfig,
    GroupSettings,
    GroupState,
    MessageModel,
    Slot,
)
from sluice.coordinator.groups.reconcile import MemberState, Reconciled
from sluice.coordinator.groups.records import (
    CurrentAssignmentRecord,
    GroupConfigRecord,
    GroupMetadataRecord,
    MemberRecord,
    TargetAssignmentRecord,
    TrackEntry,
)

__all__ = ["Group"]


class Group:
    def __init__(self, group_id: str, created_ms: int = 0) -> None:
        self.group_id = group_id
        self.created_ms = created_ms
        self.config = GroupConfig()
        self.group_epoch = 0
        self.assignment_epoch = 0
        #: (topic, normalised filter) -> its track.
        self.tracks: dict[tuple[str, str], TrackEntry] = {}
        self.members: dict[str, MemberRecord] = {}
        self.targets: dict[str, frozenset[Slot]] = {}
        self.current: dict[str, CurrentAssignmentRecord] = {}
        # Derived (rebuilt by replay).
        self.owner: dict[Slot, str] = {}
        self.by_instance: dict[str, str] = {}
        #: topic -> filter -> members subscribing it so: conflict checks and track planning read this
        #: instead of scanning every member on every join.
        self.holders: dict[str, dict[str, set[str]]] = {}
        #: member -> the (topic, partition)s it owns (assigned | pending): what its heartbeat's ``owned``
        #: is compared with, once per heartbeat, so it is kept ready.
        self.owned_tps: dict[str, frozenset[tuple[str, int]]] = {}
        #: Members with partitions pending revocation: the only ones a rebalance deadline applies to.
        self.revoking: set[str] = set()
        #: Members waiting for partitions other members still hold (UNRELEASED_PARTITIONS): the ones to
        #: tell at once when a partition comes free.
        self.waiting: set[str] = set()
        #: slot -> the member whose target has it (clustering: one each), so a freed slot finds the
        #: member waiting for it without scanning the waiting members.
        self.target_owner: dict[Slot, str] = {}
        #: Members not (yet) STABLE at the assignment epoch: the group is stable when it is empty, so
        #: state() costs O(1) however big the group (it runs after every group write).
        self.unsettled: set[str] = set()
        #: The oldest ``idle_since_ms`` among the bindings (0: none idle): the timer's retention check
        #: reads only this, so a sweep costs one compare per group.
        self.earliest_idle_ms = 0
        #: Whether a metadata record exists (a config may be set before anyone joins).
        self.exists = False

    # ---- replay ---------------------------------------------------------------------------------

    def replay_config(self, record: GroupConfigRecord) -> None:
        self.config = record.config

    def replay_metadata(self, record: GroupMetadataRecord) -> None:
        self.exists = True
        self.group_epoch = record.group_epoch
        moved = record.assignment_epoch != self.assignment_epoch
        self.assignment_epoch = record.assignment_epoch
        if moved:  # once per computed target, not per heartbeat
            self.unsettled = {mid for mid, cur in self.current.items() if not self._settled(cur)}
        self.created_ms = record.created_ms
        self.tracks = {(t.topic, t.filter): t for t in record.tracks}
        self.earliest_idle_ms = min((t.idle_since_ms for t in record.tracks if t.idle_since_ms), default=0)

    def replay_member(self, record: MemberRecord) -> None:
        self.remove_member(record.member_id)
        self.members[record.member_id] = record
        if record.instance_id:
            self.by_instance[record.instance_id] = record.member_id
        for topic, expr in record.subscription.items():
            self.holders.setdefault(topic, {}).setdefault(expr, set()).add(record.member_id)

    def remove_member(self, member_id: str) -> None:
        old = self.members.pop(member_id, None)
        if old is None:
            return
        if old.instance_id and self.by_instance.get(old.instance_id) == member_id:
            del self.by_instance[old.instance_id]
        for topic, expr in old.subscription.items():
            filters = self.holders.get(topic, {})
            filters.get(expr, set()).discard(member_id)
            if not filters.get(expr, True):
                del filters[expr]
            if not filters:
                self.holders.pop(topic, None)

    def replay_target(self, record: TargetAssignmentRecord) -> None:
        self.remove_target(record.member_id)
        self.targets[record.member_id] = record.slots
        for slot in record.slots:
            self.target_owner[slot] = record.member_id

    def remove_target(self, member_id: str) -> None:
        old = self.targets.pop(member_id, None)
        for slot in old or ():
            if self.target_owner.get(slot) == member_id:
                del self.target_owner[slot]

    def replay_current(self, record: CurrentAssignmentRecord) -> None:
        self.remove_current(record.member_id)
        member = self.members.get(record.member_id)
        if member is None or member.message_model is MessageModel.CLUSTERING:
            for slot in record.owned:
                holder = self.owner.get(slot)
                assert holder is None, (
                    f"group {self.group_id}: {slot} would be owned by {record.member_id} and {holder}"
                )
                self.owner[slot] = record.member_id
        self.current[record.member_id] = record
        self.owned_tps[record.member_id] = frozenset((t, p) for _, t, p in record.owned)
        if record.pending:
            self.revoking.add(record.member_id)
        if record.state == MemberState.UNRELEASED_PARTITIONS.value:
            self.waiting.add(record.member_id)
        if not self._settled(record):
            self.unsettled.add(record.member_id)

    def _settled(self, record: CurrentAssignmentRecord) -> bool:
        return record.member_epoch == self.assignment_epoch and record.state == MemberState.STABLE.value

    def remove_current(self, member_id: str) -> None:
        old = self.current.pop(member_id, None)
        self.owned_tps.pop(member_id, None)
        self.revoking.discard(member_id)
        self.waiting.discard(member_id)
        self.unsettled.discard(member_id)
        if old is not None:
            for slot in old.owned:
                if self.owner.get(slot) == member_id:
                    del self.owner[slot]

    # ---- derived views --------------------------------------------------------------------------

    def settings_for(self, defaults: GroupSettings) -> tuple[int, int, int]:
        """(heartbeat interval, session timeout, rebalance timeout) for this group."""
        c = self.config
        return (
            c.heartbeat_interval_ms or defaults.heartbeat_interval_ms,
            c.session_timeout_ms or defaults.session_timeout_ms,
            c.rebalance_timeout_ms or defaults.rebalance_timeout_ms,
        )

    @property
    def message_model(self) -> MessageModel:
        for m in self.members.values():
            return m.message_model
        return MessageModel.CLUSTERING

    def message_model_of(self, member_id: str) -> MessageModel:
        member = self.members.get(member_id)
        return member.message_model if member is not None else MessageModel.CLUSTERING

    def active_tracks(self) -> list[str]:
        return sorted({DEFAULT_TRACK} | {t.track for t in self.tracks.values()})

    def reconciled(self, member_id: str) -> Reconciled:
        cur = self.current.get(member_id)
        if cur is None:
            return Reconciled(0, -1, MemberState.STABLE, frozenset(), frozenset())
        return Reconciled(
            cur.member_epoch,
            cur.previous_member_epoch,
            MemberState.parse(cur.state),
            cur.assigned,
            cur.pending,
        )

    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if self.assignment_epoch < self.group_epoch:
            return GroupState.ASSIGNING
        return GroupState.RECONCILING if self.unsettled else GroupState.STABLE

    def filter_of(self, member_id: str, topic: str) -> str:
        member = self.members.get(member_id)
        return member.subscription.get(topic, "*") if member is not None else "*"
