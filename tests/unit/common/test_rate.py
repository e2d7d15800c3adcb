"""The one token bucket (common/rate.py): refill, debt, floors, waits and the bounded key map."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.common.rate import BucketMap, TokenBucket


def test_starts_full_and_refills_up_to_capacity() -> None:
    bucket = TokenBucket(rate=10, capacity=5, now=0.0)
    assert bucket.tokens(0.0) == 5
    assert bucket.spend(5, 0.0) == 0
    assert bucket.tokens(0.2) == pytest.approx(2)
    assert bucket.tokens(100.0) == 5


def test_debt_is_paid_back_before_the_next_token() -> None:
    bucket = TokenBucket(rate=10, capacity=5, now=0.0)
    assert bucket.spend(25, 0.0) == -20  # one request may go into debt whole
    assert bucket.wait_s(0.0, need=0.0) == pytest.approx(2.0)
    assert bucket.wait_s(0.0) == pytest.approx(2.1)
    assert bucket.wait_s(2.1) == pytest.approx(0.0)


def test_floor_bounds_the_debt() -> None:
    bucket = TokenBucket(rate=1, capacity=3, now=0.0)
    assert bucket.spend(100, 0.0, floor=-10) == -10
    assert bucket.spend(1, 0.0, floor=0.0) == 0.0  # a floor of 0 forgives the debt (the login limiter)


def test_time_going_backwards_adds_nothing() -> None:
    bucket = TokenBucket(rate=100, capacity=100, now=10.0)
    bucket.spend(100, 10.0)
    assert bucket.tokens(5.0) == 0


def test_retune_keeps_what_is_held_within_the_new_capacity() -> None:
    bucket = TokenBucket(rate=10, capacity=10, now=0.0)
    bucket.retune(rate=2, capacity=4, now=0.0)
    assert bucket.tokens(0.0) == 4
    bucket.spend(8, 0.0)
    assert bucket.wait_s(0.0, need=0.0) == pytest.approx(2.0)


def test_give_back_never_exceeds_capacity() -> None:
    bucket = TokenBucket(rate=1, capacity=2, now=0.0)
    bucket.give_back(5, 0.0)
    assert bucket.is_full(0.0)
    assert bucket.tokens(0.0) == 2


def test_a_bad_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="positive rate"):
        TokenBucket(rate=0, capacity=1, now=0.0)


def test_the_map_forgets_the_least_recently_used_key_first() -> None:
    buckets: BucketMap[str] = BucketMap(rate=1, capacity=1, max_keys=2)
    buckets.get("a", 0.0).spend(1, 0.0)
    buckets.get("b", 0.0).spend(1, 0.0)
    buckets.get("a", 0.0)  # a is now the most recent
    buckets.get("c", 0.0)
    assert len(buckets) == 2
    assert buckets.find("b") is None  # forgotten: starts full again
    found = buckets.find("a")
    assert found is not None
    assert found.tokens(0.0) == 0


@given(
    rate=st.floats(0.1, 1e6),
    capacity=st.floats(0, 1e6),
    steps=st.lists(st.tuples(st.floats(0, 10), st.floats(0, 1e6)), max_size=30),
)
def test_over_any_run_the_spent_amount_is_bounded_by_rate_times_time_plus_burst(
    rate: float, capacity: float, steps: list[tuple[float, float]]
) -> None:
    """The property every user relies on: whoever spends only when the bucket is not in debt gets
    at most capacity + rate * elapsed (+ the last request's overshoot)."""
    bucket = TokenBucket(rate, capacity, now=0.0)
    now = 0.0
    spent = 0.0
    last = 0.0
    for gap, amount in steps:
        now += gap
        if bucket.tokens(now) > 0:
            bucket.spend(amount, now)
            spent += amount
            last = amount
    assert spent <= capacity + rate * now + last + 1e-6 * max(1.0, spent)
    assert not math.isnan(bucket.tokens(now))
