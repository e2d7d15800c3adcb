"""The group protocol's persisted records (version 1), built only through the factories below.

They share the coordinator's record hash and codec (``records.py``), so one handler's group records land in
one atomic write, together with the ownership keys the offset store reads (``redis_ops.py``).

| TYPE           | id                    | holds                                                           |
|----------------|-----------------------|-----------------------------------------------------------------|
| ``grpconfig``  | group                 | conflict policy, assignor, timeouts (SetGroupConfig)            |
| ``group``      | group                 | group epoch, target assignment epoch, offset tracks            |
| ``gmember``    | ``group/member``      | subscription, instance id, assignor, message model, timeouts    |
| ``gtarget``    | ``group/member``      | the member's partitions in the target assignment               |
| ``gcurrent``   | ``group/member``      | member epoch, reconciliation state, assigned + pending revocation |

(Kafka: ConsumerGroupMetadataRecord, ConsumerGroupMemberMetadataRecord, ConsumerGroupTargetAssignment*,
ConsumerGroupCurrentMemberAssignmentRecord.) A member leaves by tombstoning its three records. Liveness
(sessions, rebalance deadlines) is soft state and never persisted: heartbeats that change nothing write
nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from sluice.coordinator.groups.model import ConflictPolicy, GroupConfig, MessageModel, Slot
from sluice.coordinator.records import RecordValue, Tombstone

__all__ = [
    "GROUP_RECORD_TYPES",
    "CurrentAssignmentRecord",
    "GroupConfigRecord",
    "GroupMetadataRecord",
    "MemberRecord",
    "TargetAssignmentRecord",
    "TrackEntry",
    "decode_slots",
    "encode_slots",
    "group_tombstones",
    "member_key",
]


def member_key(group: str, member_id: str) -> str:
    # Group names never contain '/' (validate_group), so the split is unambiguous.
    return f"{group}/{member_id}"


def encode_slots(slots: Iterable[Slot]) -> dict[str, dict[str, list[int]]]:
    """{track: {topic: [partitions]}}: compact, and stable (sorted) so equal sets encode equally."""
    out: dict[str, dict[str, list[int]]] = {}
    for track, topic, partition in sorted(slots):
        out.setdefault(track, {}).setdefault(topic, []).append(partition)
    return out


def decode_slots(data: Mapping[str, Mapping[str, Iterable[int]]]) -> frozenset[Slot]:
    return frozenset(
        (str(track), str(topic), int(p))
        for track, topics in data.items()
        for topic, partitions in topics.items()
        for p in partitions
    )


@dataclass(frozen=True)
class GroupConfigRecord(RecordValue):
    TYPE: ClassVar[str] = "grpconfig"
    VERSION: ClassVar[int] = 1

    group: str
    config: GroupConfig

    @property
    def record_id(self) -> str:
        return self.group

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "group": self.group,
            "conflict_policy": c.conflict_policy.value,
            "assignor": c.assignor,
            "session_timeout_ms": c.session_timeout_ms,
            "heartbeat_interval_ms": c.heartbeat_interval_ms,
            "rebalance_timeout_ms": c.rebalance_timeout_ms,
        }

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        return cls(
            str(data["group"]),
            GroupConfig(
                ConflictPolicy(str(data.get("conflict_policy", "reject"))),
                str(data.get("assignor", "")),
                int(data.get("session_timeout_ms", 0)),
                int(data.get("heartbeat_interval_ms", 0)),
                int(data.get("rebalance_timeout_ms", 0)),
            ),
        )


@dataclass(frozen=True, order=True)
class TrackEntry:
    """Members subscribing ``topic`` with ``filter`` commit under offset track ``track``.

    A *handover* gave the binding its start position: ``source`` is the track whose committed offsets
    of ``topic`` it started from ("" = none: it started from its own, or from ``auto_offset_reset``),
    ``inherited_filter`` the filter that had advanced that position, ``since_ms`` when. The offsets at
    that moment are kept in the offset store's ``handover`` hash of the track (``redis_ops.py``), so
    ``sluice track`` can tell records the new filter never received from ones it consumed.

    ``idle_since_ms`` is when the last member reading ``topic`` with ``filter`` went (0: read now). The
    binding and its offsets outlive the members until ``GroupSettings.offsets_retention_ms`` passes.
    """

    topic: str
    filter: str
    track: str
    source: str = ""
    inherited_filter: str = ""
    since_ms: int = 0
    idle_since_ms: int = 0

    def to_list(self) -> list[str | int]:
        return [
            self.topic,
            self.filter,
            self.track,
            self.source,
            self.inherited_filter,
            self.since_ms,
            self.idle_since_ms,
        ]

    @classmethod
    def from_list(cls, data: list[Any]) -> TrackEntry:
        """Also reads the four-field entries written before handovers and idle times were kept."""
        topic, expr, track, source = (str(x) for x in data[:4])
        extra = list(data[4:7]) + ["", 0, 0][len(data[4:7]) :]
        return cls(topic, expr, track, source, str(extra[0]), int(extra[1]), int(extra[2]))


@dataclass(frozen=True)
class GroupMetadataRecord(RecordValue):
    TYPE: ClassVar[str] = "group"
    VERSION: ClassVar[int] = 1

    group: str
    #: Bumped on every change of membership, subscriptions or subscribed topics' partitions.
    group_epoch: int
    #: The group epoch the target assignment was computed at (<= group_epoch).
    assignment_epoch: int
    tracks: tuple[TrackEntry, ...]
    created_ms: int

    @property
    def record_id(self) -> str:
        return self.group

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "group_epoch": self.group_epoch,
            "assignment_epoch": self.assignment_epoch,
            "tracks": [t.to_list() for t in self.tracks],
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        return cls(
            str(data["group"]),
            int(data["group_epoch"]),
            int(data["assignment_epoch"]),
            tuple(TrackEntry.from_list(t) for t in data.get("tracks", [])),
            int(data["created_ms"]),
        )


@dataclass(frozen=True)
class MemberRecord(RecordValue):
    TYPE: ClassVar[str] = "gmember"
    VERSION: ClassVar[int] = 1

    group: str
    member_id: str
    instance_id: str
    client_id: str
    #: topic -> normalised filter expression (``parse_filter(...).expression``).
    subscription: Mapping[str, str]
    assignor: str
    message_model: MessageModel
    rebalance_timeout_ms: int
    session_timeout_ms: int

    @property
    def record_id(self) -> str:
        return member_key(self.group, self.member_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "member_id": self.member_id,
            "instance_id": self.instance_id,
            "client_id": self.client_id,
            "subscription": dict(sorted(self.subscription.items())),
            "assignor": self.assignor,
            "message_model": self.message_model.value,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "session_timeout_ms": self.session_timeout_ms,
        }

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        return cls(
            str(data["group"]),
            str(data["member_id"]),
            str(data.get("instance_id", "")),
            str(data.get("client_id", "")),
            {str(k): str(v) for k, v in data["subscription"].items()},
            str(data.get("assignor", "")),
            MessageModel(str(data.get("message_model", "clustering"))),
            int(data.get("rebalance_timeout_ms", 0)),
            int(data.get("session_timeout_ms", 0)),
        )


@dataclass(frozen=True)
class TargetAssignmentRecord(RecordValue):
    TYPE: ClassVar[str] = "gtarget"
    VERSION: ClassVar[int] = 1

    group: str
    member_id: str
    slots: frozenset[Slot]

    @property
    def record_id(self) -> str:
        return member_key(self.group, self.member_id)

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "member_id": self.member_id, "slots": encode_slots(self.slots)}

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        return cls(str(data["group"]), str(data["member_id"]), decode_slots(data["slots"]))


@dataclass(frozen=True)
class CurrentAssignmentRecord(RecordValue):
    """What a member owns now: ``assigned`` plus ``pending`` (being revoked: still its own until its
    heartbeat no longer lists them). Ownership = assigned | pending, exclusive per slot."""

    TYPE: ClassVar[str] = "gcurrent"
    VERSION: ClassVar[int] = 1

    group: str
    member_id: str
    member_epoch: int
    previous_member_epoch: int
    state: str
    assigned: frozenset[Slot]
    pending: frozenset[Slot]

    @property
    def record_id(self) -> str:
        return member_key(self.group, self.member_id)

    @property
    def owned(self) -> frozenset[Slot]:
        return self.assigned | self.pending

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "member_id": self.member_id,
            "member_epoch": self.member_epoch,
            "previous_member_epoch": self.previous_member_epoch,
            "state": self.state,
            "assigned": encode_slots(self.assigned),
            "pending": encode_slots(self.pending),
        }

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        return cls(
            str(data["group"]),
            str(data["member_id"]),
            int(data["member_epoch"]),
            int(data["previous_member_epoch"]),
            str(data["state"]),
            decode_slots(data["assigned"]),
            decode_slots(data["pending"]),
        )


#: Replay order on recovery: a group's config and metadata before its members.
GROUP_RECORD_TYPES: tuple[type[RecordValue], ...] = (
    GroupConfigRecord,
    GroupMetadataRecord,
    MemberRecord,
    TargetAssignmentRecord,
    CurrentAssignmentRecord,
)


# ---- factories ---------------------------------------------------------------------------------


def new_group_config_record(group: str, config: GroupConfig) -> GroupConfigRecord:
    return GroupConfigRecord(group, config)


def new_group_metadata_record(
    group: str, group_epoch: int, assignment_epoch: int, tracks: Iterable[TrackEntry], created_ms: int
) -> GroupMetadataRecord:
    return GroupMetadataRecord(group, group_epoch, assignment_epoch, tuple(sorted(tracks)), created_ms)


def new_member_record(
    group: str,
    member_id: str,
    *,
    instance_id: str,
    client_id: str,
    subscription: Mapping[str, str],
    assignor: str,
    message_model: MessageModel,
    rebalance_timeout_ms: int,
    session_timeout_ms: int,
) -> MemberRecord:
    return MemberRecord(
        group,
        member_id,
        instance_id,
        client_id,
        dict(subscription),
        assignor,
        message_model,
        rebalance_timeout_ms,
        session_timeout_ms,
    )


def new_target_record(group: str, member_id: str, slots: Iterable[Slot]) -> TargetAssignmentRecord:
    return TargetAssignmentRecord(group, member_id, frozenset(slots))


def new_current_record(
    group: str,
    member_id: str,
    member_epoch: int,
    previous_member_epoch: int,
    state: str,
    assigned: Iterable[Slot],
    pending: Iterable[Slot],
) -> CurrentAssignmentRecord:
    return CurrentAssignmentRecord(
        group, member_id, member_epoch, previous_member_epoch, state, frozenset(assigned), frozenset(pending)
    )


def new_member_tombstones(group: str, member_id: str) -> tuple[Tombstone, ...]:
    """A member leaves: its current assignment first (frees its partitions), then target and metadata."""
    key = member_key(group, member_id)
    return (
        Tombstone(CurrentAssignmentRecord.TYPE, key),
        Tombstone(TargetAssignmentRecord.TYPE, key),
        Tombstone(MemberRecord.TYPE, key),
    )


def group_tombstones(group: str, member_ids: Iterable[str]) -> list[Tombstone]:
    """A group goes (DeleteGroup, or expired by the offsets retention): any member records first, then
    its config and metadata (replay drops the group with its metadata tombstone; ``redis_ops.py``
    deletes its keys with it)."""
    out: list[Tombstone] = []
    for mid in sorted(member_ids):
        out.extend(new_member_tombstones(group, mid))
    out += [Tombstone(GroupConfigRecord.TYPE, group), Tombstone(GroupMetadataRecord.TYPE, group)]
    return out
