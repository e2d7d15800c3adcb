"""The SDK's per-stage latency histograms (client/stages.py): quantiles from buckets, the Prometheus export,
and the stages the producer and fetcher feed (by name: docs/metrics.md lists them)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from sluice.client.stages import BUCKETS, StageHistogram


def test_quantiles_are_bucket_upper_bounds() -> None:
    h = StageHistogram(BUCKETS)
    assert h.quantile(0.99) == 0.0  # empty
    for _ in range(990):
        h.observe(0.0002)  # <= 250 us
    for _ in range(10):
        h.observe(0.02)  # <= 25 ms
    assert h.count == 1000
    assert math.isclose(h.sum, 990 * 0.0002 + 10 * 0.02)
    assert h.quantile(0.5) == 0.00025
    assert h.quantile(0.99) == 0.00025
    assert h.quantile(0.999) == 0.025
    h.observe(60.0)  # past the last bound
    assert h.quantile(1.0) == math.inf


@given(st.lists(st.floats(min_value=0, max_value=20, allow_nan=False), min_size=1, max_size=200))
def test_every_observation_lands_in_the_first_bucket_that_holds_it(values: list[float]) -> None:
    h = StageHistogram(BUCKETS)
    for v in values:
        h.observe(v)
    counts = h.buckets()
    assert sum(counts) == len(values) == h.count
    expected = [0] * (len(BUCKETS) + 1)
    for v in values:
        expected[next((i for i, b in enumerate(BUCKETS) if v <= b), len(BUCKETS))] += 1
    assert counts == expected


def test_timed_observes_the_block() -> None:
    h = StageHistogram(BUCKETS)
    with h.timed():
        pass
    assert h.count == 1
