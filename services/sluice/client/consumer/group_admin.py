"""Consumer-group administration behind ``client.admin``: list, describe, configure, reset.

Group membership and configuration live on the coordinator (ListGroups,
DescribeGroup, SetGroupConfig); committed offsets live in the offset store
(FetchOffsets, ResetOffsets). These functions turn both into plain dataclasses.

Caller: :class:`sluice.client.admin.Admin` (and through it the CLI and the Spark source).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from sluice.client.consumer.offset_reset import ResetTo, offset_store_stub, reset_group_offsets
from sluice.client.metadata import MetadataCache, call_with_retry
from sluice.client.rpc import call
from sluice.common.names import validate_group, validate_topic
from sluice.common.peers import Peers
from sluice.common.units import parse_duration
from sluice.errors import InvalidArgument, OffsetOutOfRange
from sluice.v1 import common_pb2, coordinator_pb2, offset_store_pb2

__all__ = [
    "CONFLICT_POLICIES",
    "AssignedPartitionInfo",
    "GroupConfigInfo",
    "GroupDescription",
    "GroupSummary",
    "MemberInfo",
    "PartitionLag",
    "TrackInfo",
    "delete_group",
    "describe_group",
    "fetch_group_offsets",
    "list_groups",
    "reset_offsets",
    "set_group_config",
    "set_group_offsets",
]

TopicPartition = tuple[str, int]
CONFLICT_POLICIES = ("reject", "split")
DEFAULT_TRACK = "default"


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group: str
    state: str
    members: int


@dataclass(frozen=True, slots=True)
class AssignedPartitionInfo:
    topic: str
    partition: int
    filter: str
    track: str


@dataclass(frozen=True, slots=True)
class MemberInfo:
    member_id: str
    instance_id: str
    client_id: str
    member_epoch: int
    subscription: dict[str, str]
    assigned: list[AssignedPartitionInfo]
    pending_revocation: list[AssignedPartitionInfo]


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    track: str
    #: -1: nothing committed.
    committed: int
    high_watermark: int
    lag: int
    #: The member owning the partition on this track ("" when nobody does).
    member_id: str
    #: How far behind in time: now - timestamp of the first unconsumed record, in ms. 0 when caught
    #: up, -1 when unknown (lag unknown, or that record could not be read).
    lag_ms: int = -1
    #: That record's timestamp in ms; -1 when caught up or unknown.
    first_unconsumed_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class TrackInfo:
    """A (topic, filter) -> offset track binding (docs/groups.md, "Offset tracks"): it outlives its
    members until the coordinator's offsets retention expires it."""

    topic: str
    filter: str
    track: str
    #: Members reading the topic with the filter now; 0: idle (since ``idle_since_ms``, unix ms).
    members: int
    idle_since_ms: int
    #: The handover that started the binding: the track and filter whose position it took ("": none),
    #: when (unix ms), and the offset it started from per partition.
    source_track: str
    inherited_filter: str
    since_ms: int
    handover_offsets: dict[int, int]


@dataclass(frozen=True, slots=True)
class GroupConfigInfo:
    conflict_policy: str
    #: "" = the coordinator's default (sticky), or what most members ask for.
    assignor: str
    #: 0 = the coordinator's default.
    session_timeout_ms: int
    heartbeat_interval_ms: int
    rebalance_timeout_ms: int

    @classmethod
    def from_proto(cls, c: coordinator_pb2.GroupConfig) -> GroupConfigInfo:
        return cls(
            c.conflict_policy or "reject",
            c.assignor,
            c.session_timeout_ms,
            c.heartbeat_interval_ms,
            c.rebalance_timeout_ms,
        )


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group: str
    state: str
    group_epoch: int
    config: GroupConfigInfo
    members: list[MemberInfo]
    lag: list[PartitionLag]
    conflicts: list[str] = field(default_factory=list)
    tracks: list[TrackInfo] = field(default_factory=list)

    def filters(self, topic: str) -> dict[str, str]:
        """track -> the filter its live members read ``topic`` with."""
        out: dict[str, str] = {}
        for m in self.members:
            for a in (*m.assigned, *m.pending_revocation):
                if a.topic == topic:
                    out.setdefault(a.track or DEFAULT_TRACK, a.filter or "*")
        return out


def _assigned(p: coordinator_pb2.AssignedPartition) -> AssignedPartitionInfo:
    return AssignedPartitionInfo(p.topic, p.partition, p.filter or "*", p.track or DEFAULT_TRACK)


def list_groups(metadata: MetadataCache, timeout: float) -> list[GroupSummary]:
    resp = call_with_retry(
        lambda: call(metadata.coordinator_stub().ListGroups, coordinator_pb2.ListGroupsRequest(), timeout),
        timeout,
    )
    return sorted((GroupSummary(g.group, g.state, g.members) for g in resp.groups), key=lambda g: g.group)


def describe_group(metadata: MetadataCache, group: str, timeout: float) -> GroupDescription:
    validate_group(group)
    request = coordinator_pb2.DescribeGroupRequest(group=group)
    resp = call_with_retry(lambda: call(metadata.coordinator_stub().DescribeGroup, request, timeout), timeout)
    members = [
        MemberInfo(
            m.member_id,
            m.instance_id,
            m.client_id,
            m.member_epoch,
            dict(sorted(m.subscription.items())),
            sorted((_assigned(p) for p in m.assigned), key=lambda a: (a.topic, a.partition, a.track)),
            sorted(
                (_assigned(p) for p in m.pending_revocation), key=lambda a: (a.topic, a.partition, a.track)
            ),
        )
        for m in resp.members
    ]
    lag = [
        PartitionLag(
            p.topic,
            p.partition,
            p.track or DEFAULT_TRACK,
            p.committed,
            p.high_watermark,
            p.lag,
            p.member_id,
            p.lag_ms,
            p.first_unconsumed_timestamp,
        )
        for p in resp.lag
    ]
    return GroupDescription(
        resp.group or group,
        resp.state,
        resp.group_epoch,
        GroupConfigInfo.from_proto(resp.config),
        sorted(members, key=lambda m: m.member_id),
        sorted(lag, key=lambda p: (p.topic, p.partition, p.track)),
        list(resp.conflicts),
        [
            TrackInfo(
                b.topic,
                b.filter,
                b.track,
                b.members,
                b.idle_since_ms,
                b.source_track,
                b.inherited_filter,
                b.since_ms,
                dict(sorted(b.handover_offsets.items())),
            )
            for b in resp.tracks
        ],
    )


def set_group_config(
    metadata: MetadataCache,
    group: str,
    timeout: float,
    *,
    conflict_policy: str | None = None,
    assignor: str | None = None,
    session_timeout: timedelta | str | float | None = None,
    heartbeat_interval: timedelta | str | float | None = None,
    rebalance_timeout: timedelta | str | float | None = None,
) -> GroupConfigInfo:
    """Change the settings given; the others keep their values."""
    validate_group(group)
    if conflict_policy is not None and conflict_policy not in CONFLICT_POLICIES:
        raise InvalidArgument(f"conflict_policy must be 'reject' or 'split', got {conflict_policy!r}")
    config = coordinator_pb2.GroupConfig(
        conflict_policy=conflict_policy or "",
        assignor=assignor or "",
        session_timeout_ms=_ms("session_timeout", session_timeout),
        heartbeat_interval_ms=_ms("heartbeat_interval", heartbeat_interval),
        rebalance_timeout_ms=_ms("rebalance_timeout", rebalance_timeout),
    )
    request = coordinator_pb2.SetGroupConfigRequest(group=group, config=config)
    resp = call_with_retry(
        lambda: call(metadata.coordinator_stub().SetGroupConfig, request, timeout), timeout
    )
    return GroupConfigInfo.from_proto(resp.config)


def _ms(name: str, value: timedelta | str | float | None) -> int:
    if value is None:
        return 0
    if isinstance(value, bool):
        raise InvalidArgument(f"{name}: {value!r} is not a duration")
    ms = int(parse_duration(value).total_seconds() * 1000)
    if ms <= 0:
        raise InvalidArgument(f"{name} must be positive, got {value!r}")
    return ms


# ---- offsets (offset store) ------------------------------------------------------------------------


def fetch_group_offsets(
    channels: Peers,
    metadata: MetadataCache,
    group: str,
    timeout: float,
    *,
    track: str = DEFAULT_TRACK,
    partitions: Iterable[TopicPartition] | None = None,
    member_id: str = "",
) -> dict[TopicPartition, int]:
    """Committed offsets on ``track``: of the ``partitions`` given (absent: not committed), or
    every committed partition of the track."""
    validate_group(group)
    request = offset_store_pb2.FetchOffsetsRequest(
        group=group,
        partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(partitions or ())],
        track=track,
        member_id=member_id,
    )
    resp = call_with_retry(
        lambda: call(offset_store_stub(channels, metadata).FetchOffsets, request, timeout), timeout
    )
    return {(o.topic, o.partition): o.offset for o in resp.offsets if o.offset >= 0}


def reset_offsets(
    channels: Peers,
    metadata: MetadataCache,
    group: str,
    topic: str,
    spec: str | int,
    timeout: float,
    *,
    partitions: Iterable[int] | None = None,
    track: str = DEFAULT_TRACK,
    timestamp: bool = False,
) -> dict[int, int]:
    """Set a group's committed offsets of ``topic`` (on ``track``) now, possibly backwards: the short
    form of :func:`offset_reset.reset_group_offsets` with ``execute=True``.

    ``spec``: "earliest", "latest", an offset, or (``timestamp=True``) a time in ms: the first record
    at or after it. Offsets outside the log are clamped into it. Refused with GroupNotEmpty while the
    group has live members.
    """
    validate_topic(topic)
    to: ResetTo
    if isinstance(spec, str):
        if spec not in ("earliest", "latest"):
            raise InvalidArgument(f"reset spec must be 'earliest', 'latest' or a number, got {spec!r}")
        to = ResetTo.earliest() if spec == "earliest" else ResetTo.latest()
    elif isinstance(spec, bool) or not isinstance(spec, int) or spec < 0:
        raise OffsetOutOfRange(f"reset to {spec!r}: an offset or timestamp must be an integer >= 0")
    else:
        to = ResetTo.datetime(spec) if timestamp else ResetTo.offset(spec)
    rows = reset_group_offsets(
        channels, metadata, group, to, timeout, topics={topic: partitions}, track=track, execute=True
    )
    return {r.partition: r.offset for r in rows}


def delete_group(metadata: MetadataCache, group: str, timeout: float) -> int:
    """DeleteGroup: the group and all its committed offsets. Returns how many offsets were deleted.
    Raises GroupNotEmpty while it has members, UnknownGroup when there is nothing to delete."""
    validate_group(group)
    request = coordinator_pb2.DeleteGroupRequest(group=group)
    # Not retried: a delete whose answer was lost would come back as UnknownGroup.
    resp = call(metadata.coordinator_stub().DeleteGroup, request, timeout)
    return int(resp.offsets_deleted)


def set_group_offsets(
    channels: Peers,
    metadata: MetadataCache,
    group: str,
    topic: str,
    offsets: Mapping[int, int],
    timeout: float,
    *,
    track: str = DEFAULT_TRACK,
) -> dict[int, int]:
    """Set ``{partition: offset}`` of ``topic`` exactly (ResetOffsets with explicit offsets).

    One ResetOffsets request per distinct offset value (the RPC carries one value for all
    its partitions), each atomic and each refused with GroupNotEmpty while the group has
    live members: use it for groups no consumer is in (the Spark source's commitToGroup).
    """
    by_value: dict[int, list[int]] = {}
    for p, off in offsets.items():
        if isinstance(off, bool) or not isinstance(off, int) or off < 0:
            raise OffsetOutOfRange(f"{topic}[{p}]: offset must be an integer >= 0, got {off!r}")
        by_value.setdefault(off, []).append(p)
    out: dict[int, int] = {}
    for value, parts in sorted(by_value.items()):
        out.update(
            reset_offsets(channels, metadata, group, topic, value, timeout, partitions=parts, track=track)
        )
    return out
