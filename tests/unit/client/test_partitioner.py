"""The partitioner: deterministic key hashing, even spread, sticky switching."""

from __future__ import annotations

import random
import zlib
from collections import Counter

import pytest

from sluice.client.producer.partitioner import (
    RoundRobinPartitioner,
    StickyPartitioner,
    key_partition,
    make_partitioner,
)


def test_key_partition_is_crc32_mod_partitions() -> None:
    # Pinned values: another SDK (or a future version of this one) must agree.
    assert zlib.crc32(b"order-17") == 0x5AEA0614
    for key in (b"", b"a", b"order-17", bytes(range(256))):
        for n in (1, 3, 4, 16, 1000):
            assert key_partition(key, n) == zlib.crc32(key) % n
    assert key_partition(b"user-1", 4) == 0
    assert key_partition(b"user-2", 4) == 2
    assert key_partition(b"user-3", 4) == 0


def test_same_key_same_partition_every_time() -> None:
    keys = [random.Random(7).randbytes(16) for _ in range(100)]
    first = [key_partition(k, 8) for k in keys]
    assert [key_partition(k, 8) for k in keys] == first


def test_key_hash_spreads_evenly() -> None:
    rng = random.Random(1)
    counts = Counter(key_partition(rng.randbytes(16), 4) for _ in range(40_000))
    assert set(counts) == {0, 1, 2, 3}
    for c in counts.values():
        assert 9_000 < c < 11_000, counts


def test_sticky_stays_until_its_batch_closes() -> None:
    p = StickyPartitioner(4, random.Random(3))
    first = p.keyless()
    assert all(p.keyless() == first for _ in range(100))
    other = (first + 1) % 4
    p.on_batch_closed(other, _never_busy)  # a keyed batch elsewhere closing does not move it
    assert p.keyless() == first
    p.on_batch_closed(first, _never_busy)
    assert p.keyless() != first


def test_sticky_visits_every_partition_over_time() -> None:
    p = StickyPartitioner(5, random.Random(9))
    seen: Counter[int] = Counter()
    for _ in range(5_000):
        cur = p.keyless()
        seen[cur] += 1
        p.on_batch_closed(cur, _never_busy)
    assert set(seen) == set(range(5))
    assert min(seen.values()) > 800


def _never_busy(partition: int) -> bool:
    return False


def test_sticky_moves_to_an_idle_partition_when_there_is_one() -> None:
    """Records sent to a partition with a batch in flight wait behind it: prefer an idle one."""
    for seed in range(50):
        p = StickyPartitioner(4, random.Random(seed))
        cur = p.keyless()
        idle = (cur + 2) % 4

        def busy(q: int, idle: int = idle) -> bool:
            return q != idle

        p.on_batch_closed(cur, busy)
        assert p.keyless() == idle
    # Every other partition busy: it still moves on (randomly), never stays.
    moved: Counter[int] = Counter()
    for seed in range(200):
        p = StickyPartitioner(4, random.Random(seed))
        cur = p.keyless()
        p.on_batch_closed(cur, lambda q: True)
        assert p.keyless() != cur
        moved[(p.keyless() - cur) % 4] += 1
    assert set(moved) == {1, 2, 3}


def test_sticky_single_partition() -> None:
    p = StickyPartitioner(1)
    p.on_batch_closed(0, _never_busy)
    assert p.keyless() == 0


def test_round_robin_rotates() -> None:
    p = RoundRobinPartitioner(3)
    assert [p.keyless() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_make_partitioner() -> None:
    assert isinstance(make_partitioner("default", 2), StickyPartitioner)
    assert isinstance(make_partitioner("round_robin", 2), RoundRobinPartitioner)
    with pytest.raises(ValueError, match="unknown partitioner"):
        make_partitioner("murmur", 2)
    with pytest.raises(ValueError, match="at least one partition"):
        StickyPartitioner(0)
