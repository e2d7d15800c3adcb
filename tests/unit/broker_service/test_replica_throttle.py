"""The reassignment throttle's token bucket (broker/replica_throttle.py): a second of burst, debt from a
batch above the allowance paid back before the next fetch, and the wait until a byte is there again."""

from __future__ import annotations

import pytest

from sluice.broker.replica_throttle import Throttle


def test_the_bucket_holds_one_second_and_refills_at_the_rate() -> None:
    t = Throttle(1000, now=0.0)
    assert t.allowance(0.0) == 1000
    assert t.allowance(10.0) == 1000  # never more than one second's worth
    t.spend(1000, 10.0)
    assert t.allowance(10.0) == 0
    assert t.wait_s(10.0) == pytest.approx(0.001)
    assert t.allowance(10.5) == 500


def test_a_batch_above_the_allowance_is_debt_paid_back_first() -> None:
    t = Throttle(1000, now=0.0)
    t.spend(3000, 0.0)  # one batch the leader would not split
    assert t.allowance(1.0) == 0
    assert t.wait_s(1.0) == pytest.approx(1.001)
    assert t.allowance(2.5) == 500
