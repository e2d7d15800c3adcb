"""The fetch-bytes quota against a real broker: a consumer that never waits for throttle_time_ms,
with one continuous fetch (what the SDK's consumers use over the wire) or with back-to-back
fetches, is held to its quota; an unlimited reader is not."""

from __future__ import annotations

import logging

import pytest

from sluice.quotas.model import Kind, Limits, QuotaKey

from .conftest import QuotaCluster
from .producers import fill, wire_fetcher
from .test_throttle import QUOTA, RUN_S, WINDOW, _batch

log = logging.getLogger(__name__)


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "requests"])
def test_a_consumer_over_its_fetch_quota_is_held_to_it(cluster: QuotaCluster, continuous: bool) -> None:
    mode = "continuous" if continuous else "requests"
    topic = f"fetchquota-{mode}"
    cluster.client.admin.create_topic(topic, partitions=1)
    batch = _batch()
    # More than the quota lets out in the run: the reader never catches up with the log end.
    fill(cluster.wire, topic, 0, batch, count=int(QUOTA * (RUN_S + 6) / len(batch)))
    reader = f"reader-{mode}"
    cluster.set_quotas({QuotaKey(Kind.CLIENT, reader): Limits(fetch_bytes_per_second=QUOTA)})

    rows = wire_fetcher(cluster.wire, reader, topic, RUN_S, continuous=continuous, max_bytes=256 * 1024)
    start = rows[0][0] - 0.05
    got = sum(size for at, size, _ in rows if start + WINDOW[0] <= at < start + WINDOW[1])
    rate = got / (WINDOW[1] - WINDOW[0])
    log.warning("%s fetch: %.0f B/s under a %d B/s quota", mode, rate, QUOTA)
    assert abs(rate - QUOTA) <= 0.10 * QUOTA, f"{mode}: read {rate:.0f} B/s under a {QUOTA} B/s quota"
    assert any(ms > 0 for _, _, ms in rows), "no answer said the reader was throttled"

    # An unlimited reader of the same log reads it all, far faster, and is never throttled.
    free = wire_fetcher(cluster.wire, f"free-{mode}", topic, 3.0, continuous=continuous, max_bytes=256 * 1024)
    assert all(ms == 0 for _, _, ms in free)
    assert sum(size for _, size, _ in free) > 2 * QUOTA
