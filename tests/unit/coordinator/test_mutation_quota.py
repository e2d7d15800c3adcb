"""The partition mutation quota (KIP-599) and the partition-count limits of coordinator/limits.py."""

from __future__ import annotations

import pytest

from sluice.coordinator.limits import CoordinatorLimits, PartitionMutationQuota, check_new_partitions
from sluice.errors import LimitExceeded, ThrottlingQuotaExceeded


def test_a_request_with_tokens_left_is_admitted_whole_then_the_debt_throttles() -> None:
    quota = PartitionMutationQuota(per_second=10, burst=20)
    quota.check("alice", 0, "create")
    quota.record("alice", 50, 0)  # 20 - 50: 30 partitions of debt, 3 s at 10/s
    with pytest.raises(ThrottlingQuotaExceeded, match="retry in 3001 ms") as info:
        quota.check("alice", 0, "create topic x")
    assert info.value.fields["throttle_ms"] == 3001
    assert quota.throttle_ms("alice", 1_500) == 1501  # paid back at the rate
    quota.check("alice", 3_001, "create")  # in credit again: admitted


def test_buckets_are_per_principal_and_services_are_not_limited() -> None:
    quota = PartitionMutationQuota(per_second=1, burst=1)
    quota.record("alice", 10, 0)
    quota.check("bob", 0, "create")
    quota.record(None, 1_000, 0)
    quota.check(None, 0, "create")
    assert quota.throttle_ms("alice", 0) > 0


def test_the_bucket_refills_to_its_burst_only() -> None:
    quota = PartitionMutationQuota(per_second=100, burst=5)
    quota.record("a", 5, 0)
    assert quota.throttle_ms("a", 0) > 0
    assert quota.throttle_ms("a", 1_000_000) == 0
    quota.record("a", 6, 1_000_000)  # the bucket held 5, not 100,000
    assert quota.throttle_ms("a", 1_000_000) > 0


def test_remembered_principals_are_bounded() -> None:
    quota = PartitionMutationQuota(per_second=1, burst=1, max_principals=3)
    for i in range(10):
        quota.record(f"p{i}", 5, 0)
    assert quota.throttle_ms("p9", 0) > 0
    assert quota.throttle_ms("p0", 0) == 0  # forgotten: a full bucket again


def test_a_disabled_quota_admits_everything() -> None:
    quota = PartitionMutationQuota(per_second=0, burst=1)
    quota.record("a", 10**9, 0)
    quota.check("a", 0, "create")


def test_partition_limits_name_the_limit_and_the_count() -> None:
    limits = CoordinatorLimits(max_topics=2, max_partitions_per_topic=4, max_partitions=6)
    check_new_partitions(limits, [3], new_topic=True, partitions=3, added=3)
    with pytest.raises(LimitExceeded, match="topics: 3 would exceed the limit max_topics=2"):
        check_new_partitions(limits, [1, 1], new_topic=True, partitions=1, added=1)
    with pytest.raises(LimitExceeded, match="max_partitions_per_topic=4"):
        check_new_partitions(limits, [], new_topic=True, partitions=5, added=5)
    with pytest.raises(LimitExceeded, match="7 would exceed the limit max_partitions=6"):
        check_new_partitions(limits, [3, 2], new_topic=False, partitions=4, added=2)
    # Outside the format's range the cluster state answers INVALID_PARTITIONS, as before the limits.
    check_new_partitions(limits, [], new_topic=True, partitions=10_001, added=10_001)
    unlimited = CoordinatorLimits(max_topics=0, max_partitions_per_topic=0, max_partitions=0)
    check_new_partitions(unlimited, [10_000] * 50, new_topic=True, partitions=10_000, added=10_000)


def test_limits_refuse_negative_values() -> None:
    with pytest.raises(ValueError, match="max_topics"):
        CoordinatorLimits(max_topics=-1).validate()
    with pytest.raises(ValueError, match="burst"):
        CoordinatorLimits(partition_mutation_burst=0).validate()
