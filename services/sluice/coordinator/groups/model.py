"""Domain values of the consumer-group protocol: what handlers take and return (no protobuf here).

A partition of a group is identified by its *slot* ``(track, topic, partition)``: the same partition may be
owned once per offset track (``split`` conflict policy), never twice on one track.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from sluice.errors import InvalidArgument, SluiceError

__all__ = [
    "DEFAULT_TRACK",
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "STATIC_LEAVE_EPOCH",
    "AssignedPartition",
    "ConflictPolicy",
    "GroupConfig",
    "GroupDescription",
    "GroupSettings",
    "GroupState",
    "GroupSummary",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "MemberDescription",
    "MessageModel",
    "Slot",
    "TickOutcome",
    "TopicPartition",
    "TrackBinding",
]

#: (topic, partition).
TopicPartition = tuple[str, int]
#: (track, topic, partition): one unit of exclusive ownership.
Slot = tuple[str, str, int]

DEFAULT_TRACK = "default"

#: Heartbeat ``member_epoch`` values with a meaning of their own (KIP-848).
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

# Bounds on client-chosen timeouts: below them a member would flap; above them a dead one lingers.
MIN_TIMEOUT_MS = 100
MAX_TIMEOUT_MS = 30 * 60 * 1000


class MessageModel(enum.Enum):
    CLUSTERING = "clustering"
    BROADCASTING = "broadcasting"


class ConflictPolicy(enum.Enum):
    #: Refuse a member whose filter for a topic differs from another member's (INCONSISTENT_SUBSCRIPTION).
    REJECT = "reject"
    #: Give each distinct (topic, filter) its own offset track, assigned independently.
    SPLIT = "split"

    @classmethod
    def parse(cls, text: str) -> ConflictPolicy:
        try:
            return cls(text)
        except ValueError:
            raise InvalidArgument(
                f"invalid conflict_policy {text!r}: use 'reject' (default) or 'split'"
            ) from None


class GroupState(enum.Enum):
    """Derived from the durable state, never stored (KIP-848's group states)."""

    EMPTY = "empty"
    #: Membership changed; the new target assignment is not computed yet.
    ASSIGNING = "assigning"
    #: The target is computed; some members have not converged to it yet.
    RECONCILING = "reconciling"
    STABLE = "stable"


@dataclass(frozen=True)
class GroupSettings:
    """Coordinator-wide defaults; a group's config (SetGroupConfig) overrides them per group."""

    heartbeat_interval_ms: int = 3_000
    session_timeout_ms: int = 45_000
    rebalance_timeout_ms: int = 60_000
    #: A group's target assignment is recomputed at most once per this interval; membership changes
    #: arriving faster are batched into the next computation (a join storm of N members costs a few
    #: assignor runs, not N). 0 computes on every change.
    assignment_interval_ms: int = 100
    #: Groups with fewer members are assigned on every change: their assignor run costs well under a
    #: millisecond, and answering a joiner at once beats batching.
    assignment_batch_min_members: int = 100
    #: While a member waits for partitions (or the group for its assignment) it is told to heartbeat
    #: this often, so handoffs complete well within one regular heartbeat interval.
    reconcile_heartbeat_interval_ms: int = 300
    #: A (topic, filter) that no member has read for this long loses its binding and its committed
    #: offsets of that topic (Kafka's ``offsets.retention.minutes``, 7 days there too). 0: never.
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    #: Cardinality limits (docs/limits.md): a join that would create one group more than ``max_groups``, or
    #: add one member more than ``max_members_per_group``, is refused with LIMIT_EXCEEDED. 0: no limit.
    max_groups: int = 100_000
    max_members_per_group: int = 10_000


@dataclass(frozen=True)
class GroupConfig:
    """Per-group settings. 0 / "" mean "the coordinator default"."""

    conflict_policy: ConflictPolicy = ConflictPolicy.REJECT
    assignor: str = ""
    session_timeout_ms: int = 0
    heartbeat_interval_ms: int = 0
    rebalance_timeout_ms: int = 0

    def validate(self) -> GroupConfig:
        for name in ("session_timeout_ms", "heartbeat_interval_ms", "rebalance_timeout_ms"):
            value = getattr(self, name)
            if value != 0 and not MIN_TIMEOUT_MS <= value <= MAX_TIMEOUT_MS:
                raise InvalidArgument(
                    f"group config {name}={value} is outside {MIN_TIMEOUT_MS}..{MAX_TIMEOUT_MS} "
                    "(0 = the coordinator default)"
                )
        if self.session_timeout_ms and self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise InvalidArgument(
                f"group config heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be shorter than "
                f"session_timeout_ms ({self.session_timeout_ms})"
            )
        return self

    def merged(self, update: GroupConfig, policy_given: bool) -> GroupConfig:
        """SetGroupConfig semantics: fields given (non-zero, non-empty) replace; the others stay."""
        return GroupConfig(
            update.conflict_policy if policy_given else self.conflict_policy,
            update.assignor or self.assignor,
            update.session_timeout_ms or self.session_timeout_ms,
            update.heartbeat_interval_ms or self.heartbeat_interval_ms,
            update.rebalance_timeout_ms or self.rebalance_timeout_ms,
        )


@dataclass(frozen=True)
class HeartbeatRequest:
    group: str
    member_id: str
    member_epoch: int
    instance_id: str = ""
    #: topic -> filter expression, as the member sent it (normalised by the state machine).
    subscription: Mapping[str, str] = field(default_factory=dict)
    assignor: str = ""
    message_model: MessageModel = MessageModel.CLUSTERING
    #: The partitions the member holds right now (it omits one only after committing and releasing it).
    owned: frozenset[TopicPartition] = frozenset()
    rebalance_timeout_ms: int = 0
    session_timeout_ms: int = 0
    client_id: str = ""


@dataclass(frozen=True, order=True)
class AssignedPartition:
    topic: str
    partition: int
    track: str
    filter: str


@dataclass(frozen=True)
class HeartbeatResponse:
    member_id: str = ""
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    #: None when the member already holds exactly this assignment.
    assignment: tuple[AssignedPartition, ...] | None = None
    #: Protocol refusals travel here (the RPC itself succeeds), like BrokerHeartbeat's.
    error: SluiceError | None = None


@dataclass(frozen=True)
class GroupSummary:
    group: str
    state: GroupState
    members: int


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    instance_id: str
    client_id: str
    member_epoch: int
    subscription: Mapping[str, str]
    assigned: tuple[AssignedPartition, ...]
    pending_revocation: tuple[AssignedPartition, ...]
    message_model: MessageModel
    state: str


@dataclass(frozen=True)
class TrackBinding:
    """One (topic, filter) -> offset track binding, for DescribeGroup (see ``records.TrackEntry``)."""

    topic: str
    filter: str
    track: str
    members: int
    idle_since_ms: int
    source_track: str
    inherited_filter: str
    since_ms: int
    #: partition -> the offset the binding started from (filled from the offset store's keys).
    handover_offsets: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupDescription:
    group: str
    state: GroupState
    group_epoch: int
    config: GroupConfig
    members: tuple[MemberDescription, ...]
    conflicts: tuple[str, ...]
    #: Every offset track the group uses now (always includes ``default``).
    tracks: tuple[str, ...]
    #: (topic, filter, track) bindings: which track each filter of each topic commits under.
    track_entries: tuple[tuple[str, str, str], ...]
    message_model: MessageModel
    #: (track, topic, partition) -> owning member id, for the partitions the group owns now.
    owners: Mapping[Slot, str]
    #: Topics the group's members subscribe to, with their partition counts.
    topics: Mapping[str, int]
    #: Every binding, read now or idle (DescribeGroup only; the lag refresh leaves it empty).
    bindings: tuple[TrackBinding, ...] = ()


@dataclass(frozen=True)
class TickOutcome:
    """What the timer did: members removed, by reason (``session_timeout`` / ``rebalance_timeout``)."""

    removed: tuple[tuple[str, str, str], ...] = ()
    assigned_groups: tuple[str, ...] = ()
    #: (group, topic, filter, track) bindings expired by the offsets retention, with their offsets.
    expired_tracks: tuple[tuple[str, str, str, str], ...] = ()
    #: Empty groups removed whole by the offsets retention, with every key they had.
    expired_groups: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether the timer wrote: the caller calls again (one group per call)."""
        return bool(self.removed or self.assigned_groups or self.expired_tracks or self.expired_groups)
