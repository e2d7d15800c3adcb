"""Cardinality limits on the coordinator's metadata, and the rate limit on creating and deleting it.

Every topic, partition, group and member is state the coordinator holds in memory, replays from Redis at
each election and pushes to brokers; a client that creates them in a loop grows all of it without bound
(issue 16). The limits here are checked inside the fenced write that would exceed them, against the state
the write sees, so two concurrent creations cannot both slip under a limit.

``PartitionMutationQuota`` is Kafka's controller mutation quota (KIP-599): a token bucket per principal,
counted in partitions created or deleted, that may go into debt by one request (a request for 1,000
partitions is not refused for ever by a bucket of 100), and answers THROTTLING_QUOTA_EXCEEDED with the time
until the debt is paid while it is in debt. Its bucket is the one of ``common/rate.py``, as the
per-principal byte and request quotas' (docs/limits.md, "Cardinality and rate of change").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sluice.common.names import MAX_PARTITIONS
from sluice.common.rate import BucketMap
from sluice.errors import LimitExceeded, ThrottlingQuotaExceeded
from sluice.security.context import current

__all__ = [
    "CoordinatorLimits",
    "PartitionMutationQuota",
    "check_new_partitions",
    "exceeded",
    "mutation_key",
]

#: Principals whose buckets are remembered; the least recently seen is forgotten beyond this (a forgotten
#: principal starts again with a full bucket: the memory stays bounded whatever the callers).
MAX_TRACKED_PRINCIPALS = 10_000


@dataclass(frozen=True)
class CoordinatorLimits:
    """The coordinator's cardinality limits and mutation quota. 0 means unlimited."""

    max_topics: int = 10_000
    max_partitions_per_topic: int = 10_000
    max_partitions: int = 200_000
    max_groups: int = 100_000
    max_members_per_group: int = 10_000
    #: Partitions one principal may create or delete per second (KIP-599's
    #: ``controller_mutation_rate``), and the burst its bucket holds. 0: no quota.
    partition_mutations_per_second: float = 1_000.0
    partition_mutation_burst: int = 10_000
    #: Consumer groups one principal may create per second (a join naming a group that does not exist),
    #: and its burst: the same token bucket, counted in groups. 0: no quota.
    group_creations_per_second: float = 100.0
    group_creation_burst: int = 1_000

    def validate(self) -> CoordinatorLimits:
        for name in ("max_topics", "max_partitions_per_topic", "max_partitions", "max_groups"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: unlimited)")
        if self.max_members_per_group < 0 or self.partition_mutations_per_second < 0:
            raise ValueError("max_members_per_group and partition_mutations_per_second must be >= 0")
        if self.partition_mutation_burst < 1 or self.group_creation_burst < 1:
            raise ValueError("partition_mutation_burst and group_creation_burst must be at least 1")
        if self.group_creations_per_second < 0:
            raise ValueError("group_creations_per_second must be >= 0")
        return self


def exceeded(limit: str, value: int, wanted: int, what: str) -> LimitExceeded:
    """The typed error for a limit: names the limit (its config name), its value and what was asked."""
    return LimitExceeded(
        f"{what}: {wanted} would exceed the limit {limit}={value}", limit=limit, value=value, wanted=wanted
    )


def check_new_partitions(
    limits: CoordinatorLimits,
    topic_partitions: Iterable[int],
    *,
    new_topic: bool,
    partitions: int,
    added: int,
) -> None:
    """Refuse a creation (``new_topic``) or growth to ``partitions`` (``added`` of them new) that would pass
    a limit. ``topic_partitions``: the partition count of every existing topic."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        return  # outside the format's own range: INVALID_PARTITIONS from the cluster state, as before
    counts = list(topic_partitions)
    if new_topic and limits.max_topics and len(counts) + 1 > limits.max_topics:
        raise exceeded("max_topics", limits.max_topics, len(counts) + 1, "topics")
    if limits.max_partitions_per_topic and partitions > limits.max_partitions_per_topic:
        raise exceeded(
            "max_partitions_per_topic", limits.max_partitions_per_topic, partitions, "partitions of the topic"
        )
    total = sum(counts) + added
    if limits.max_partitions and total > limits.max_partitions:
        raise exceeded("max_partitions", limits.max_partitions, total, "partitions in the cluster")


def mutation_key() -> str | None:
    """Whose bucket the current call's mutations come from: its principal's name ("" for anonymous
    callers, who share one bucket), or None for a Sluice service (the cluster principal), never throttled."""
    principal = current().principal
    return None if principal.cluster else principal.name


class PartitionMutationQuota:
    """KIP-599's token bucket per principal, in partitions mutated (created, added or deleted).

    ``check`` refuses while the principal's bucket is in debt, with the time until it is not;
    ``record`` takes what a request mutated, which may put the bucket into debt (Kafka's rule: a request
    that starts with tokens left is admitted whole). Time is the caller's monotonic milliseconds.
    """

    def __init__(self, per_second: float, burst: int, max_principals: int = MAX_TRACKED_PRINCIPALS) -> None:
        self.per_second = per_second
        self.burst = float(burst)
        self._buckets: BucketMap[str] | None = (
            BucketMap(per_second, float(burst), max_principals) if per_second > 0 else None
        )

    @property
    def enabled(self) -> bool:
        return self._buckets is not None

    def throttle_ms(self, who: str | None, now_ms: float) -> int:
        """How long ``who`` must wait before its next mutation is admitted; 0: now (None: not limited)."""
        if self._buckets is None or who is None:
            return 0
        tokens = self._buckets.get(who, now_ms / 1000).tokens(now_ms / 1000)
        # Admitted while any token is left (KIP-599), so the wait is until the debt is paid, plus 1 ms.
        return 0 if tokens > 0 else int(-tokens * 1000 / self.per_second) + 1

    def check(self, who: str | None, now_ms: float, what: str, unit: str = "partitions") -> None:
        """Raise THROTTLING_QUOTA_EXCEEDED while ``who``'s bucket is in debt."""
        wait_ms = self.throttle_ms(who, now_ms)
        if wait_ms:
            raise ThrottlingQuotaExceeded(
                f"{what}: the {unit} quota ({self.per_second:g} {unit}/s, burst {self.burst:g}) is used up; "
                f"retry in {wait_ms} ms",
                throttle_ms=wait_ms,
            )

    def record(self, who: str | None, partitions: int, now_ms: float) -> None:
        """``who`` mutated ``partitions`` partitions (the bucket may go into debt)."""
        if self._buckets is not None and who is not None and partitions > 0:
            self._buckets.get(who, now_ms / 1000).spend(partitions, now_ms / 1000)
