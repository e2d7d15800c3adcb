"""Delayed sends: a record with ``deliver_at``/``deliver_after`` goes to the schedule topic, not its own.

The record waits in ``__sluice_schedule`` (an ordinary, replicated, partitioned topic), wrapped in an
envelope of headers naming its real topic, partition and due time; the scheduler
(``sluice.broker.schedule``) appends it to its real topic when it is due. So the send is acknowledged
once the record is stored like any record (in the schedule topic, with the producer's acks), and a
pending record never holds back the commits of the records after it in its real topic.
docs/delayed-delivery.md says why and what every reader sees.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sluice.client.producer.config import ProducerConfig
from sluice.client.producer.futures import FutureRecordMetadata
from sluice.codec.batch import Headers
from sluice.errors import (
    DelayBeyondRetention,
    DelayedDeliveryUnavailable,
    DelayTooLong,
    InvalidArgument,
    UnknownTopicOrPartition,
)

__all__ = [
    "DUE_HEADER",
    "SCHEDULE_HEADER",
    "SCHEDULE_TOPIC",
    "TARGET_HEADER",
    "TARGET_PARTITION_HEADER",
    "DelayedSender",
    "due_ms",
    "schedule_partition",
]

#: The internal topic pending records wait in (created by the scheduler).
SCHEDULE_TOPIC = "__sluice_schedule"
#: Envelope headers of a pending record; DUE_HEADER stays on the delivered record (lateness is visible).
DUE_HEADER = "sluice-deliver-at"
TARGET_HEADER = "sluice-target"
TARGET_PARTITION_HEADER = "sluice-target-partition"
#: On a delivered record: its schedule coordinates ``"partition:offset"`` (what deduplicates it).
SCHEDULE_HEADER = "sluice-schedule"
_KEYLESS_RUN = 256
_RESERVED = (DUE_HEADER, TARGET_HEADER, TARGET_PARTITION_HEADER, SCHEDULE_HEADER)


def due_ms(
    deliver_at: datetime | None, deliver_after: timedelta | None, now_ms: int, max_delay: timedelta
) -> int:
    """The due time (epoch ms) of a delayed send. A due time in the past is now (delivered at once);
    one beyond ``max_delay`` from now raises DelayTooLong naming the limit."""
    if deliver_at is not None and deliver_after is not None:
        raise InvalidArgument("give deliver_at or deliver_after, not both")
    if deliver_at is not None:
        if not isinstance(deliver_at, datetime):
            raise InvalidArgument(f"deliver_at must be a datetime, got {type(deliver_at).__name__}")
        if deliver_at.tzinfo is None:
            raise InvalidArgument(f"deliver_at must be timezone-aware (e.g. tzinfo=UTC), got {deliver_at}")
        due = int(deliver_at.astimezone(UTC).timestamp() * 1000)
    else:
        if not isinstance(deliver_after, timedelta):
            raise InvalidArgument(f"deliver_after must be a timedelta, got {type(deliver_after).__name__}")
        due = now_ms + int(deliver_after.total_seconds() * 1000)
    limit_ms = int(max_delay.total_seconds() * 1000)
    if due - now_ms > limit_ms:
        raise DelayTooLong(
            f"a delay of {(due - now_ms) / 1000:.3f} s is beyond the maximum delay of "
            f"{limit_ms / 1000:g} s (max_delay={max_delay})"
        )
    return max(due, now_ms)


def schedule_partition(topic: str, partition: int, schedule_partitions: int) -> int:
    """Where a target partition's pending records wait: one schedule partition per target partition,
    so records due at the same time reach their target in the order they were sent."""
    return zlib.crc32(f"{topic}/{partition}".encode()) % schedule_partitions


class ScheduleProducer(Protocol):
    """The part of a Producer (for the schedule topic) a DelayedSender uses."""

    @property
    def partitions(self) -> int: ...

    def send(
        self,
        value: bytes,
        key: bytes | None = None,
        tag: str | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> FutureRecordMetadata: ...

    def flush(self, timeout: float | None = None) -> None: ...

    def close(self, timeout: float | None = None) -> None: ...


class DelayedSender:
    """A producer's delayed sends: its own producer for the schedule topic, made at the first one."""

    def __init__(
        self,
        topic: str,
        partitions: int,
        config: ProducerConfig,
        make: Callable[[str], ScheduleProducer],
        retention_ms: Callable[[str], int],
    ) -> None:
        self._topic = topic
        self._partitions = partitions
        #: Keyless delayed records: this many in a row to one partition, then the next one.
        self._spread = itertools.count()
        self._config = config
        #: ``make(topic)``: a Producer with the owner's config, links and client id.
        self._make = make
        #: ``retention_ms(topic)``: the topic's time retention (0: the broker default, unknown here).
        self._retention_ms = retention_ms
        self._inner: ScheduleProducer | None = None

    def send(
        self,
        value: bytes,
        key: bytes | None,
        tag: str | None,
        headers: Headers | None,
        partition: int | None,
        timestamp: int | None,
        deliver_at: datetime | None,
        deliver_after: timedelta | None,
    ) -> FutureRecordMetadata:
        now = time.time_ns() // 1_000_000
        due = due_ms(deliver_at, deliver_after, now, self._config.max_delay)
        inner = self._schedule_producer()
        self._check_retention(due - now)
        wrapped: dict[str, bytes] = dict(headers) if headers else {}
        for name in _RESERVED:
            if name in wrapped:
                raise InvalidArgument(f"header {name!r} is reserved for delayed delivery")
        wrapped[DUE_HEADER] = str(due).encode()
        wrapped[TARGET_HEADER] = self._topic.encode()
        if partition is None:
            partition = next(self._spread) // _KEYLESS_RUN % self._partitions
        wrapped[TARGET_PARTITION_HEADER] = str(partition).encode()
        where = schedule_partition(self._topic, partition, inner.partitions)
        return inner.send(value, key=key, tag=tag, headers=wrapped, partition=where, timestamp=timestamp)

    def _schedule_producer(self) -> ScheduleProducer:
        if self._inner is None:
            try:
                self._inner = self._make(SCHEDULE_TOPIC)
            except UnknownTopicOrPartition:
                raise DelayedDeliveryUnavailable(
                    f"delayed delivery is not set up: the schedule topic {SCHEDULE_TOPIC!r} does not exist "
                    "(start `sluice scheduler`, which creates it)"
                ) from None
        assert self._inner is not None
        return self._inner

    def _check_retention(self, delay_ms: int) -> None:
        """Refuse a delay longer than the target's (or the schedule topic's) time retention: the record
        keeps its send timestamp, so it would expire as soon as it is delivered, or before."""
        for topic in (self._topic, SCHEDULE_TOPIC):
            retention = self._retention_ms(topic)
            if retention > 0 and delay_ms > retention:
                raise DelayBeyondRetention(
                    f"a delay of {delay_ms / 1000:.3f} s is longer than topic {topic!r}'s retention of "
                    f"{retention / 1000:g} s (retention_ms={retention})"
                )

    def flush(self, timeout: float | None) -> None:
        if self._inner is not None:
            self._inner.flush(timeout)

    def close(self, timeout: float | None) -> None:
        if self._inner is not None:
            self._inner.close(timeout)
