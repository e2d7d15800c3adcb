"""``client.consumer(..., retry=True)``: the retry and DLQ topics of the group, and the retrier's ports.

Kept out of ``client.py`` (which only calls ``retry_subscription`` and ``make_retrier``) and out of the
consumer package (which may not import the Client). docs/retry.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, Protocol

from sluice.client.admin import Admin
from sluice.client.consumer import ConsumerConfig
from sluice.client.consumer.parker import Parker
from sluice.client.consumer.retry import Retrier, RetryPorts
from sluice.client.consumer.retry_dedup import FetcherLike
from sluice.errors import TopicAlreadyExists
from sluice.retry.levels import check_retry_names, dlq_topic, parse_levels, retry_topic
from sluice.retry.parkbook import park_topic

__all__ = ["ensure_topic", "make_parker", "make_retrier", "retry_subscription"]

TopicPartition = tuple[str, int]


class _RetryClient(Protocol):
    def fetcher(
        self,
        positions: Mapping[TopicPartition, int],
        filters: Mapping[str, str] | None = None,
        *,
        max_wait_ms: int = ...,
    ) -> Any: ...
    @property
    def admin(self) -> Admin: ...
    def producer(self, topic: str, **overrides: Any) -> Any: ...
    def list_offsets(
        self, topic: str, spec: str | int = ..., partitions: Iterable[int] | None = ...
    ) -> dict[int, int]: ...


def ensure_topic(admin: Admin, name: str, partitions: int, retention: timedelta | None = None) -> int:
    """Create ``name`` unless it exists; its partition count."""
    config = {"retention_ms": retention} if retention is not None else None
    with contextlib.suppress(TopicAlreadyExists):  # another member made it first
        admin.create_topic(name, partitions=partitions, config=config)
    return len(admin.describe_topic(name).partitions)


def retry_subscription(
    client: _RetryClient, group: str, cfg: ConsumerConfig, subscription: Mapping[str, str]
) -> dict[str, str]:
    """Create the group's retry (one partition per delay level) and DLQ topics when missing; the
    subscription with the retry topic added (all of it: ``*``)."""
    check_retry_names(group)
    levels = parse_levels(cfg.retry_delay_levels)
    ensure_topic(client.admin, retry_topic(group), len(levels))
    ensure_topic(client.admin, dlq_topic(group), 1)
    return {**subscription, retry_topic(group): "*"}


def make_retrier(client: _RetryClient, group: str, cfg: ConsumerConfig, timeout: float) -> Retrier:
    return Retrier(
        group,
        parse_levels(cfg.retry_delay_levels),
        cfg.max_reconsume_times,
        cfg.retry_dedup_window,
        _ports(client),
        timeout,
    )


def make_parker(client: _RetryClient, group: str, cfg: ConsumerConfig, timeout: float) -> Parker:
    """``park_poison_keys=True``: ``PARK.<group>`` (one partition: one event log, replayed in order) and
    ``DLQ.<group>`` when missing (docs/poison-keys.md, "Pull consumers")."""
    check_retry_names(group)
    ensure_topic(client.admin, park_topic(group), 1)
    ensure_topic(client.admin, dlq_topic(group), 1)
    parker = Parker(
        group, cfg.max_redeliver, cfg.park_max_messages, cfg.parked_policy, cfg.park_retry_delay,
        _ports(client), cfg.retry_dedup_window, timeout,
    )  # fmt: skip
    parker.catch_up()
    return parker


def _ports(client: _RetryClient) -> RetryPorts:
    counts: dict[str, int] = {}

    def partitions(topic: str) -> int:
        if topic not in counts:
            counts[topic] = len(client.admin.describe_topic(topic).partitions)
        return counts[topic]

    def fetcher(positions: Mapping[TopicPartition, int]) -> FetcherLike:
        return client.fetcher(positions, max_wait_ms=100)  # type: ignore[no-any-return]

    def producer(topic: str) -> Any:
        # No linger: reconsume_later waits for the write, one record at a time.
        return client.producer(topic, linger=timedelta(0))

    make: Callable[[str], Any] = producer
    return RetryPorts(
        producer=make,
        list_offsets=client.list_offsets,
        fetcher=fetcher,
        partitions=partitions,
    )
