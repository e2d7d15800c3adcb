"""Delay levels, topic names and the retry headers (docs/retry.md).

Pure functions: the SDK's ``reconsume_later`` and the ``sluice dlq`` CLI share them, and the unit tests
check them without a cluster.

Naming. RocketMQ spells the topics ``%RETRY%<group>`` and ``%DLQ%<group>``; Sluice topic names follow
Kafka's alphabet ``[a-zA-Z0-9._-]`` (the broker makes directories of them), so they are ``RETRY.<group>``
and ``DLQ.<group>``: the same role, no new name rules for every tool that handles topic names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from sluice.common.names import MAX_NAME_LENGTH
from sluice.common.units import parse_duration
from sluice.errors import DelayLevelOutOfRange, InvalidArgument, NotADlqTopic, SluiceError

__all__ = [
    "DEFAULT_DELAY_LEVELS",
    "DEFAULT_MAX_RECONSUME_TIMES",
    "FIRST_RETRY_LEVEL",
    "H_COUNT",
    "H_DLQ_SOURCE",
    "H_DUE",
    "H_FIRST_FAILURE",
    "H_LEVEL",
    "H_OFFSET",
    "H_PARTITION",
    "H_REDRIVE_COUNT",
    "H_SOURCE",
    "H_TOPIC",
    "REDRIVE_SUFFIX",
    "SUB_DLQ_SUFFIX",
    "DelayLevels",
    "RetryInfo",
    "check_retry_names",
    "check_sub_redrive_names",
    "dlq_group",
    "dlq_topic",
    "parse_levels",
    "redrive_topic",
    "retry_info",
    "retry_topic",
    "source_key",
    "sub_dlq_topic",
]

#: RocketMQ's ``messageDelayLevel``.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_MAX_RECONSUME_TIMES = 16
#: As in RocketMQ, the first retry waits at level 3 (10 s) and each further retry one level more.
FIRST_RETRY_LEVEL = 3
MAX_LEVELS = 64
RETRY_PREFIX = "RETRY."
DLQ_PREFIX = "DLQ."

# The headers of a retried (or dead-lettered, or redriven) record. Values are ASCII decimal or text.
H_TOPIC = "sluice-retry-topic"  # the original topic (kept across retries)
H_PARTITION = "sluice-retry-partition"
H_OFFSET = "sluice-retry-offset"
H_FIRST_FAILURE = "sluice-retry-first-failure-ms"
H_COUNT = "sluice-retry-count"  # reconsume count: 1 on the first retry
H_LEVEL = "sluice-retry-level"
H_DUE = "sluice-retry-due-ms"  # when the consumer may hand it out (unix ms)
#: ``topic/partition/offset`` of the record this one was made from: the dedup key at the target.
H_SOURCE = "sluice-retry-source"
H_REDRIVE_COUNT = "sluice-redrive-count"
#: ``topic/partition/offset`` in the DLQ of a redriven record: the redrive's dedup key at the target.
H_DLQ_SOURCE = "sluice-redrive-source"


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def dlq_group(topic: str) -> str:
    """The group whose DLQ ``topic`` is; NotADlqTopic for any other topic."""
    if not topic.startswith(DLQ_PREFIX) or len(topic) == len(DLQ_PREFIX):
        raise NotADlqTopic(f"{topic!r} is not a dead-letter topic: DLQ topics are named {DLQ_PREFIX}<group>")
    return topic[len(DLQ_PREFIX) :]


#: A push subscription's dead letters: ``<topic>.<subscription>.DLQ`` (the dispatcher's name).
SUB_DLQ_SUFFIX = ".DLQ"
#: Where a push subscription's redrive writes: ``<topic>.<subscription>.REDRIVE``, read by a push
#: subscription of the same name only (docs/retry.md, "Redrive of push subscriptions").
REDRIVE_SUFFIX = ".REDRIVE"


def sub_dlq_topic(topic: str, subscription: str) -> str:
    """The dead-letter topic of a push subscription. The subscription ``S`` of a redrive topic
    ``<topic>.S.REDRIVE`` dead-letters to ``<topic>.S.DLQ``, the DLQ it was redriven from: a record
    failing again returns there and its redrive cap keeps counting."""
    redriven_from = f".{subscription}{REDRIVE_SUFFIX}"
    if topic.endswith(redriven_from) and len(topic) > len(redriven_from):
        return topic[: -len(REDRIVE_SUFFIX)] + SUB_DLQ_SUFFIX
    return f"{topic}.{subscription}{SUB_DLQ_SUFFIX}"


def redrive_topic(topic: str, subscription: str) -> str:
    return f"{topic}.{subscription}{REDRIVE_SUFFIX}"


def check_sub_redrive_names(topic: str, subscription: str) -> None:
    """The redrive topic of ``subscription`` on ``topic`` must be a valid topic name."""
    name = redrive_topic(topic, subscription)
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidArgument(
            f"redrive topic {name[:30]!r}... would have {len(name)} characters (limit {MAX_NAME_LENGTH})"
        )


def check_retry_names(group: str) -> None:
    """The retry and DLQ topic names of ``group`` must be valid topic names (at most 249 characters)."""
    longest = len(RETRY_PREFIX) + len(group)
    if longest > MAX_NAME_LENGTH:
        raise InvalidArgument(
            f"group name of {len(group)} characters is too long for retry: {retry_topic(group)[:40]!r}... "
            f"would have {longest} characters, the limit is {MAX_NAME_LENGTH}"
        )


def source_key(topic: str, partition: int, offset: int) -> str:
    return f"{topic}/{partition}/{offset}"


@dataclass(frozen=True, slots=True)
class DelayLevels:
    """The group's delay levels, level 1 first."""

    delays: tuple[timedelta, ...]

    def __len__(self) -> int:
        return len(self.delays)

    def level_for_retry(self, count: int) -> int:
        """Level of the ``count``-th retry (1-based): 3, 4, ... capped at the last level."""
        return min(FIRST_RETRY_LEVEL + count - 1, len(self.delays))

    def delay(self, level: int) -> timedelta:
        self.check(level)
        return self.delays[level - 1]

    def check(self, level: object) -> int:
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= len(self.delays):
            raise DelayLevelOutOfRange(
                f"delay level {level!r} is out of range: levels are 1..{len(self.delays)} "
                f"({' '.join(_fmt(d) for d in self.delays)})"
            )
        return level

    def level_of_delay(self, delay: timedelta) -> int:
        """The smallest level at least ``delay`` (the last level for longer delays): its partition holds
        the record, so due times within a partition stay close to append order."""
        for i, d in enumerate(self.delays):
            if d >= delay:
                return i + 1
        return len(self.delays)


def parse_levels(text: str) -> DelayLevels:
    """``"1s 5s 10s"`` -> DelayLevels; InvalidArgument naming the bad item and its position."""
    if not isinstance(text, str):
        raise InvalidArgument(f"retry_delay_levels must be a string such as {DEFAULT_DELAY_LEVELS!r}")
    items = text.split()
    if not 1 <= len(items) <= MAX_LEVELS:
        raise InvalidArgument(f"retry_delay_levels must hold 1 to {MAX_LEVELS} delays, got {len(items)}")
    out: list[timedelta] = []
    for i, item in enumerate(items, 1):
        try:
            d = parse_duration(item)
        except (SluiceError, ValueError) as exc:
            raise InvalidArgument(
                f"retry_delay_levels: level {i} ({item!r}) is not a duration: {exc}"
            ) from None
        if d <= timedelta(0):
            raise InvalidArgument(f"retry_delay_levels: level {i} ({item!r}) must be positive")
        out.append(d)
    return DelayLevels(tuple(out))


def _fmt(d: timedelta) -> str:
    ms = int(d.total_seconds() * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@dataclass(frozen=True, slots=True)
class RetryInfo:
    """What the retry headers of a record say (``retry_info(record.headers)``)."""

    topic: str
    partition: int
    offset: int
    first_failure_ms: int
    count: int
    due_ms: int
    redrive_count: int


def _int(headers: Mapping[str, bytes], name: str, default: int = 0) -> int:
    raw = headers.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return default


def retry_info(headers: Mapping[str, bytes] | None) -> RetryInfo | None:
    """The retry headers of a record, or None for a record that was never retried."""
    if not headers or H_TOPIC not in headers:
        return None
    return RetryInfo(
        topic=headers[H_TOPIC].decode("utf-8", "replace"),
        partition=_int(headers, H_PARTITION),
        offset=_int(headers, H_OFFSET),
        first_failure_ms=_int(headers, H_FIRST_FAILURE),
        count=_int(headers, H_COUNT),
        due_ms=_int(headers, H_DUE),
        redrive_count=_int(headers, H_REDRIVE_COUNT),
    )
