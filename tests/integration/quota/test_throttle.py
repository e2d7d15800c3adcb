"""Client quotas against real processes (docs/quotas.md): a producer over its quota is held to it by
the broker, whether or not it honours throttle_time_ms, and nobody else is slowed.

Robust on a loaded machine: the quota (2 MB/s) is far below what the broker can take, the rate is
measured over several seconds after the first burst, and the other client is compared with its own
rate measured in the same test.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest

from sluice.codec.batch import BatchBuilder
from sluice.quotas.model import Kind, Limits, QuotaKey

from .conftest import QuotaCluster
from .producers import Answers, grpc_producer, wire_producer

log = logging.getLogger(__name__)

QUOTA = 2_000_000  # bytes/s
RUN_S = 10.0
#: The measured window: after the first burst (one second of quota) is spent, before the end.
WINDOW = (3.0, 9.0)


def _batch(size: int = 64 * 1024, records: int = 16) -> bytes:
    b = BatchBuilder()
    for i in range(records):
        b.append(bytes([i % 251]) * (size // records), None, None, None, 1_000 + i)
    return b.build()


def _run(jobs: dict[str, Callable[[], Answers]]) -> tuple[dict[str, Answers], float]:
    """Run the jobs at once; returns their answers and when they started (monotonic)."""
    results: dict[str, Answers] = {}
    errors: list[BaseException] = []

    def run(name: str, job: Callable[[], Answers]) -> None:
        try:
            results[name] = job()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=item, daemon=True) for item in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_S + 90)
    assert not errors, errors
    assert set(results) == set(jobs), "a producer did not finish"
    return results, started


@pytest.mark.parametrize("transport", ["wire", "grpc"])
def test_a_producer_ignoring_throttle_is_held_to_its_quota_and_others_are_not_slowed(
    cluster: QuotaCluster, transport: str
) -> None:
    topic = f"quota-{transport}"
    cluster.client.admin.create_topic(topic, partitions=2)
    batch = _batch()
    hog_id, other_id = f"hog-{transport}", f"other-{transport}"

    def other() -> Answers:  # a client with no quota, one request at a time
        return wire_producer(cluster.wire, other_id, topic, 1, batch, RUN_S, window=1)

    def hog() -> Answers:  # pipelines as fast as it can and never looks at throttle_time_ms
        if transport == "wire":
            return wire_producer(cluster.wire, hog_id, topic, 0, batch, RUN_S, window=16)
        return grpc_producer(cluster.broker.address, hog_id, topic, 0, batch, RUN_S)

    # The other client's rate with the hog unthrottled beside it: what it gets without quotas.
    baseline, started = _run({"other": other, "hog": hog})
    before = baseline["other"].rate(started + WINDOW[0], started + WINDOW[1])
    hog_before = baseline["hog"].rate(started + WINDOW[0], started + WINDOW[1])
    assert hog_before > 1.5 * QUOTA, f"the machine is too slow for this test: {hog_before:.0f} B/s"

    cluster.set_quotas({QuotaKey(Kind.CLIENT, hog_id): Limits(produce_bytes_per_second=QUOTA)})
    results, started = _run({"other": other, "hog": hog})
    hog_rate = results["hog"].rate(started + WINDOW[0], started + WINDOW[1])
    other_rate = results["other"].rate(started + WINDOW[0], started + WINDOW[1])
    log.warning(
        "%s: hog %.0f B/s unthrottled, %.0f B/s under a %d B/s quota; other %.0f -> %.0f B/s",
        transport,
        hog_before,
        hog_rate,
        QUOTA,
        before,
        other_rate,
    )
    assert not results["hog"].errors
    assert not results["other"].errors
    assert abs(hog_rate - QUOTA) <= 0.10 * QUOTA, f"hog at {hog_rate:.0f} B/s under a {QUOTA} B/s quota"
    assert results["hog"].throttled > 0, "the answers never told the hog it was throttled"
    # The other client: never throttled, and at least as fast as beside the unthrottled hog (the
    # hog now takes less of the machine), with room for a loaded machine's noise.
    assert results["other"].throttled == 0
    assert other_rate >= 0.7 * before, f"the other client fell from {before:.0f} to {other_rate:.0f} B/s"
    throttled_s = cluster.sample(
        "sluice_quota_throttle_seconds_total", entity=f"client:{hog_id}", resource="produce_bytes_per_second"
    )
    assert throttled_s > 0, cluster.metrics("sluice_quota")
