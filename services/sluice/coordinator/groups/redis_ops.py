"""The Redis keys the offset store reads, derived from the group records of one write. Pure.

The coordinator writes them in the same Lua call that persists its records (``store.py``), so the offset
store's commit script always sees exactly the coordinator's view (docs/redis-schema.md):

- ``{P}:grp:{G}:members``  member -> current member epoch;
- ``{P}:grp:{G}:owners``   ``topic/partition`` -> owning member, for the ``default`` track;
  ``{P}:grp:{G}:owners:{T}`` the same for split track ``T`` (a partition has one owner per track);
- ``{P}:grp:{G}:live``     number of members;
- ``{P}:off:{G}:{T}``      a split track handed a position starts from a copy of its source track's
  offsets; a binding that expired loses its offsets of its topic (the whole key when no binding uses
  the track any more);
- ``{P}:off:{G}:{T}:handover`` the offsets a binding started from, copied in the same write (the
  record says from which track and filter, and when).

An owner field is written for ``assigned | pending``: the old owner keeps committing until it releases
a partition, and the field passes to the new owner in the write that hands it over.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice.coordinator.groups.group import Group
from sluice.coordinator.groups.model import DEFAULT_TRACK, MessageModel, Slot
from sluice.coordinator.groups.records import (
    CurrentAssignmentRecord,
    GroupMetadataRecord,
    MemberRecord,
    TrackEntry,
)
from sluice.coordinator.groups.state import GroupsState
from sluice.coordinator.ops import RedisOp
from sluice.coordinator.records import Record, Tombstone

# The offset store publishes the key layout; importing it (dataclasses only, no service code) keeps the
# two sides from drifting apart.
from sluice.offsetstore.keys import Keys, partition_field

__all__ = ["GroupKeys", "RedisOp", "full_sync_ops", "group_deletion_ops", "group_ops"]


class GroupKeys:
    def __init__(self, prefix: str) -> None:
        self._keys = Keys(prefix)

    def members(self, group: str) -> str:
        return self._keys.members(group)

    def live(self, group: str) -> str:
        return self._keys.live(group)

    def owners(self, group: str, track: str) -> str:
        return self._keys.owners(group, track)

    def offsets(self, group: str, track: str) -> str:
        return self._keys.offsets(group, track)

    def handover(self, group: str, track: str) -> str:
        return self._keys.handover(group, track)

    def member_index(self, group: str, track: str) -> str:
        return self._keys.member_index(group, track)

    def member_offsets_prefix(self, group: str, track: str) -> str:
        return self._keys.member_offsets_prefix(group, track)

    def topic_refs(self, topic: str) -> str:
        return self._keys.topic_refs(topic)


class _Overlay:
    """One group's state as the records of this write change it, seeded lazily from the replayed state."""

    def __init__(self, group: Group | None) -> None:
        self.group = group
        self.members: dict[str, MemberRecord | None] = {}
        self.current: dict[str, CurrentAssignmentRecord | None] = {}
        self.owner: dict[Slot, str | None] = {}
        self.tracks: dict[tuple[str, str], TrackEntry] | None = None
        self.membership_changed = False
        self.deleted = False

    def member(self, mid: str) -> MemberRecord | None:
        if mid in self.members:
            return self.members[mid]
        return self.group.members.get(mid) if self.group else None

    def cur(self, mid: str) -> CurrentAssignmentRecord | None:
        if mid in self.current:
            return self.current[mid]
        return self.group.current.get(mid) if self.group else None

    def owner_of(self, slot: Slot) -> str | None:
        if slot in self.owner:
            return self.owner[slot]
        return self.group.owner.get(slot) if self.group else None

    def track_table(self) -> dict[tuple[str, str], TrackEntry]:
        if self.tracks is not None:
            return self.tracks
        return dict(self.group.tracks) if self.group else {}

    def member_count(self) -> int:
        ids = set(self.group.members) if self.group else set()
        for mid, m in self.members.items():
            if m is None:
                ids.discard(mid)
            else:
                ids.add(mid)
        return len(ids)


def group_ops(state: GroupsState, records: Sequence[Record], keys: GroupKeys) -> list[RedisOp]:
    """The key operations that keep the offset store's view equal to the state after ``records``."""
    overlays: dict[str, _Overlay] = {}
    ops: list[RedisOp] = []

    def overlay(group: str) -> _Overlay:
        o = overlays.get(group)
        if o is None:
            o = overlays[group] = _Overlay(state.groups.get(group))
        return o

    for record in records:
        if isinstance(record, Tombstone):
            _tombstone_ops(record, overlay(record.id.partition("/")[0]), keys, ops)
        elif isinstance(record, MemberRecord):
            o = overlay(record.group)
            o.membership_changed = o.membership_changed or o.member(record.member_id) is None
            o.members[record.member_id] = record
        elif isinstance(record, CurrentAssignmentRecord):
            o = overlay(record.group)
            old = o.cur(record.member_id)
            ops.append(
                RedisOp("HSET", keys.members(record.group), record.member_id, str(record.member_epoch))
            )
            member = o.member(record.member_id)
            if member is None or member.message_model is MessageModel.CLUSTERING:
                _release(
                    o,
                    record.group,
                    record.member_id,
                    old.owned if old else frozenset(),
                    record.owned,
                    keys,
                    ops,
                )
                for slot in sorted(record.owned):
                    if o.owner_of(slot) != record.member_id:
                        track, topic, partition = slot
                        ops.append(
                            RedisOp(
                                "HSET",
                                keys.owners(record.group, track),
                                partition_field(topic, partition),
                                record.member_id,
                            )
                        )
                        o.owner[slot] = record.member_id
            o.current[record.member_id] = record
        elif isinstance(record, GroupMetadataRecord):
            o = overlay(record.group)
            _track_ops(state, record, o.track_table(), keys, ops)
            o.tracks = {(t.topic, t.filter): t for t in record.tracks}
    for group, o in sorted(overlays.items()):
        if o.membership_changed and not o.deleted:
            ops.append(RedisOp("SET", keys.live(group), str(o.member_count())))
    return ops


def _tombstone_ops(record: Tombstone, o: _Overlay, keys: GroupKeys, ops: list[RedisOp]) -> None:
    group, _, mid = record.id.partition("/")
    if record.type == CurrentAssignmentRecord.TYPE:
        old = o.cur(mid)
        ops.append(RedisOp("HDEL", keys.members(group), mid))
        _release(o, group, mid, old.owned if old else frozenset(), frozenset(), keys, ops)
        o.current[mid] = None
    elif record.type == MemberRecord.TYPE:
        o.members[mid] = None
        o.membership_changed = True
    elif record.type == GroupMetadataRecord.TYPE:
        ops += group_deletion_ops(group, o.track_table().values(), keys)
        o.deleted = True


def _release(
    o: _Overlay,
    group: str,
    mid: str,
    old: Iterable[Slot],
    new: frozenset[Slot],
    keys: GroupKeys,
    ops: list[RedisOp],
) -> None:
    for slot in sorted(set(old) - new):
        if o.owner_of(slot) == mid:  # never clear a field another member took over in this write
            track, topic, partition = slot
            ops.append(RedisOp("HDEL", keys.owners(group, track), partition_field(topic, partition)))
            o.owner[slot] = None


def _track_ops(
    state: GroupsState,
    record: GroupMetadataRecord,
    old: dict[tuple[str, str], TrackEntry],
    keys: GroupKeys,
    ops: list[RedisOp],
) -> None:
    new = {(t.topic, t.filter): t for t in record.tracks}
    topics = state.topics.topics
    g = record.group

    def fields(topic: str) -> list[str]:
        count = topics[topic].partitions if topic in topics else 0
        return [partition_field(topic, p) for p in range(count)]

    for key, entry in sorted(new.items()):
        before = old.get(key)
        if not entry.source or (before is not None and before.since_ms == entry.since_ms):
            continue  # no handover in this write
        src, snapshot = keys.offsets(g, entry.source), keys.handover(g, entry.track)
        for f in fields(entry.topic):
            if entry.source != entry.track:
                ops.append(RedisOp("HCOPY", keys.offsets(g, entry.track), src, f))
            ops.append(RedisOp("HCOPY", snapshot, src, f))
    live_tracks = {e.track for e in new.values()}
    for key, entry in sorted(old.items()):
        if key in new:
            continue
        if any(e.topic == entry.topic and e.track == entry.track for e in new.values()):
            continue  # taken over by another filter (reject's handover): its position stays
        if entry.track != DEFAULT_TRACK and entry.track not in live_tracks:
            # Nothing is bound to the track any more: drop it whole (also covers topics deleted meanwhile).
            for k in (
                keys.offsets(g, entry.track),
                keys.owners(g, entry.track),
                keys.handover(g, entry.track),
            ):
                ops.append(RedisOp("DEL", k))
            continue
        for f in fields(entry.topic):  # expired: its offsets of that topic go
            ops.append(RedisOp("HDEL", keys.offsets(g, entry.track), f))
            ops.append(RedisOp("HDEL", keys.handover(g, entry.track), f))


def group_deletion_ops(group: str, bindings: Iterable[TrackEntry], keys: GroupKeys) -> list[RedisOp]:
    """Delete every key of ``group`` its records name, and unregister them from the refs of the topics
    it is bound to (docs/redis-schema.md, "Topic identity"): ownership keys, and per track (``default``
    and every bound one) the committed offsets, the handover copy and a broadcasting group's per-member
    offsets with their index. Written with the group's metadata tombstone (an expired group, or
    DeleteGroup, which also deletes what its SCAN found: a track only an admin reset ever wrote)."""
    bindings = list(bindings)
    tracks = sorted({DEFAULT_TRACK} | {e.track for e in bindings})
    refs = [keys.topic_refs(t) for t in sorted({e.topic for e in bindings})]
    ops = [RedisOp("DEL", keys.members(group)), RedisOp("DEL", keys.live(group))]
    for track in tracks:
        offsets, index = keys.offsets(group, track), keys.member_index(group, track)
        prefix = keys.member_offsets_prefix(group, track)
        ops += [RedisOp("DELINDEX", index, prefix, r) for r in refs or [""]]
        ops += [RedisOp("HDEL", r, k) for r in refs for k in (offsets, index)]
        ops += [
            RedisOp("DEL", k)
            for k in (offsets, keys.handover(group, track), keys.owners(group, track), index)
        ]
    return ops


def full_sync_ops(state: GroupsState, keys: GroupKeys) -> list[RedisOp]:
    """Rewrite every group's ownership keys from the replayed state (at startup): whatever drifted, the
    offset store sees the coordinator's view again. Nothing is reassigned."""
    ops: list[RedisOp] = []
    for name, g in sorted(state.groups.items()):
        ops.append(RedisOp("DEL", keys.members(name)))
        for track in g.active_tracks():
            ops.append(RedisOp("DEL", keys.owners(name, track)))
        for mid, cur in sorted(g.current.items()):
            ops.append(RedisOp("HSET", keys.members(name), mid, str(cur.member_epoch)))
        for slot, mid in sorted(g.owner.items()):
            track, topic, partition = slot
            ops.append(RedisOp("HSET", keys.owners(name, track), partition_field(topic, partition), mid))
        ops.append(RedisOp("SET", keys.live(name), str(len(g.members))))
    return ops
