"""``client.admin.reset_group_offsets``: preview or execute a reset of a group's committed offsets.

Kafka's ``kafka-consumer-groups --reset-offsets`` is the model: a reset is planned and shown first
(``execute=False``, the default: nothing changes), and applied only when asked. Both go through the
offset store's ``ResetOffsets`` (``dry_run`` for the preview), which resolves every target against the
brokers, clamps it into ``[log start, log end]`` and says so per partition, and applies a whole reset
(several topics, every partition) in one atomic write, only while the group has no live members.

``to``: :class:`ResetTo` - earliest, latest, an offset, a time, a duration back from now, or a shift
of the committed offset.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sluice.client.metadata import MetadataCache, call_with_retry
from sluice.client.rpc import call
from sluice.common.names import validate_group, validate_topic
from sluice.common.peers import Peers
from sluice.common.units import parse_duration
from sluice.errors import BrokerNotAvailable, InvalidArgument
from sluice.v1 import offset_store_pb2, offset_store_pb2_grpc

__all__ = ["OffsetResetRow", "ResetTo", "offset_store_stub", "reset_group_offsets"]

_SPECS = {
    "earliest": offset_store_pb2.RESET_SPEC_EARLIEST,
    "latest": offset_store_pb2.RESET_SPEC_LATEST,
    "offset": offset_store_pb2.RESET_SPEC_OFFSET,
    "timestamp": offset_store_pb2.RESET_SPEC_TIMESTAMP,
    "shift": offset_store_pb2.RESET_SPEC_SHIFT,
}


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ResetTo:
    """Where a reset moves each partition. Build with the class methods."""

    #: "earliest", "latest", "offset", "timestamp" (ms) or "shift" (signed delta).
    kind: str
    value: int = 0

    @classmethod
    def earliest(cls) -> ResetTo:
        return cls("earliest")

    @classmethod
    def latest(cls) -> ResetTo:
        return cls("latest")

    @classmethod
    def offset(cls, offset: int) -> ResetTo:
        """Offset ``offset`` in every partition (clamped into each log)."""
        if _int(offset, "offset") < 0:
            raise InvalidArgument(f"offset must be >= 0, got {offset}")
        return cls("offset", offset)

    @classmethod
    def datetime(cls, when: datetime | int) -> ResetTo:
        """The first record at or after ``when`` (an aware datetime, a naive one in local time, or ms
        since the epoch). A time in the future is refused by the offset store (INVALID_ARGUMENT)."""
        ms = int(when.timestamp() * 1000) if isinstance(when, datetime) else _int(when, "timestamp")
        if ms < 0:
            raise InvalidArgument(f"timestamp must be >= 0 ms since the epoch, got {ms}")
        return cls("timestamp", ms)

    @classmethod
    def duration(cls, back: timedelta | str | float) -> ResetTo:
        """The first record at or after now - ``back`` ("15m", "2h", a timedelta)."""
        if isinstance(back, bool):
            raise InvalidArgument(f"duration: {back!r} is not a duration")
        delta = parse_duration(back)
        if delta <= timedelta(0):
            raise InvalidArgument(f"duration must be positive, got {back!r}")
        return cls("timestamp", int(time.time() * 1000) - int(delta.total_seconds() * 1000))

    @classmethod
    def shift(cls, by: int) -> ResetTo:
        """The committed offset plus ``by`` (negative: back), clamped into each log. Every partition
        must have a committed offset."""
        return cls("shift", _int(by, "shift"))


@dataclass(frozen=True, slots=True)
class OffsetResetRow:
    """One partition of a reset (previewed or executed)."""

    topic: str
    partition: int
    #: The committed offset before; None: nothing committed.
    previous: int | None
    #: The offset set (or that ``execute=True`` would set).
    offset: int
    #: None, or "log_start" / "log_end": the target lay outside the log and was clamped to that bound.
    clamped: str | None
    log_start_offset: int | None
    log_end_offset: int | None


def offset_store_stub(channels: Peers, metadata: MetadataCache) -> offset_store_pb2_grpc.OffsetStoreStub:
    address = metadata.current().offset_store or metadata.get([], refresh=True).offset_store
    if address is None:
        raise BrokerNotAvailable("the cluster has no offset store: the coordinator's Metadata names none")
    return channels.stub(address, offset_store_pb2_grpc.OffsetStoreStub)


def _targets(topics: Mapping[str, Iterable[int] | None]) -> list[offset_store_pb2.ResetTopic]:
    out = []
    for topic, partitions in sorted(topics.items()):
        validate_topic(topic)
        parts = sorted(set(partitions or ()))
        if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in parts):
            raise InvalidArgument(f"partitions of {topic!r} must be integers >= 0, got {parts!r}")
        out.append(offset_store_pb2.ResetTopic(topic=topic, partitions=parts))
    return out


def reset_group_offsets(
    channels: Peers,
    metadata: MetadataCache,
    group: str,
    to: ResetTo,
    timeout: float,
    *,
    topics: Mapping[str, Iterable[int] | None] | None = None,
    track: str = "default",
    execute: bool = False,
) -> list[OffsetResetRow]:
    """Plan (and with ``execute`` apply) a reset of ``group``'s offsets on ``track``.

    ``topics``: {topic: partitions or None for all of them}; None: every topic the group has
    committed offsets for. Raises GroupNotEmpty while the group has live members (a preview too),
    UnknownTopicOrPartition, UnknownGroup (all topics of a group that committed nothing),
    InvalidArgument (a time in the future, a shift of a partition without a committed offset).
    """
    validate_group(group)
    if to.kind not in _SPECS:
        raise InvalidArgument(f"unknown reset kind {to.kind!r}: build it with ResetTo.earliest() etc.")
    request = offset_store_pb2.ResetOffsetsRequest(
        group=group,
        spec=_SPECS[to.kind],
        value=to.value,
        track=track,
        dry_run=not execute,
        topics=_targets(topics or {}),
        all_topics=topics is None,
    )
    if execute and to.kind == "shift":
        # Not retried: a shift whose answer was lost would shift twice.
        resp = call(offset_store_stub(channels, metadata).ResetOffsets, request, timeout)
    else:
        resp = call_with_retry(
            lambda: call(offset_store_stub(channels, metadata).ResetOffsets, request, timeout), timeout
        )
    return [
        OffsetResetRow(
            o.topic,
            o.partition,
            o.previous if o.previous >= 0 else None,
            o.offset,
            o.clamped or None,
            o.log_start_offset if o.log_start_offset >= 0 else None,
            o.log_end_offset if o.log_end_offset >= 0 else None,
        )
        for o in resp.outcomes
    ]
