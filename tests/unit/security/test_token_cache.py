"""The verified-token cache: answers until valid_until, never after; bounded by size."""

from __future__ import annotations

import pytest

from sluice.security.token_cache import TokenCache


def test_a_cached_value_is_returned_until_valid_until() -> None:
    cache: TokenCache[str] = TokenCache()
    cache.put("t", "alice", valid_until=100.0, now=0.0)
    assert cache.get("t", 99.9) == "alice"
    assert cache.get("t", 100.0) is None
    assert len(cache) == 0  # dropped on the lookup that found it expired


def test_an_already_expired_value_is_not_stored() -> None:
    cache: TokenCache[str] = TokenCache()
    cache.put("t", "alice", valid_until=10.0, now=10.0)
    assert len(cache) == 0


def test_expired_entries_are_swept_on_insert() -> None:
    cache: TokenCache[str] = TokenCache()
    for n in range(5):
        cache.put(f"t{n}", "x", valid_until=10.0 + n, now=0.0)
    cache.put("late", "y", valid_until=100.0, now=12.5)
    assert len(cache) == 3  # t0..t2 (valid until 10, 11, 12) are gone
    assert cache.get("t3", 12.5) == "x"


def test_a_full_cache_evicts_the_entry_that_expires_soonest() -> None:
    cache: TokenCache[str] = TokenCache(max_entries=3)
    cache.put("a", "a", valid_until=50.0, now=0.0)
    cache.put("b", "b", valid_until=20.0, now=0.0)
    cache.put("c", "c", valid_until=80.0, now=0.0)
    cache.put("d", "d", valid_until=60.0, now=0.0)
    assert len(cache) == 3
    assert cache.get("b", 1.0) is None
    assert [cache.get(t, 1.0) for t in "acd"] == ["a", "c", "d"]


def test_replacing_an_entry_does_not_evict_it_later_by_its_old_expiry() -> None:
    cache: TokenCache[str] = TokenCache(max_entries=2)
    cache.put("a", "old", valid_until=10.0, now=0.0)
    cache.put("a", "new", valid_until=90.0, now=0.0)
    cache.put("b", "b", valid_until=50.0, now=0.0)
    cache.put("c", "c", valid_until=70.0, now=11.0)  # sweeps a's stale heap item, evicts b
    assert cache.get("a", 12.0) == "new"
    assert cache.get("b", 12.0) is None
    assert cache.get("c", 12.0) == "c"


def test_clear_and_bad_size() -> None:
    cache: TokenCache[str] = TokenCache()
    cache.put("a", "a", valid_until=10.0, now=0.0)
    cache.clear()
    assert cache.get("a", 1.0) is None
    with pytest.raises(ValueError, match="positive"):
        TokenCache(0)
