"""The SDK's producer honours throttle_time_ms (KIP-219): held to its quota like any client, but
by waiting itself, so the broker almost never has to hold one of its requests."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from sluice import Client
from sluice.quotas.model import Kind, Limits, QuotaKey

from .conftest import QuotaCluster
from .test_throttle import QUOTA, RUN_S, WINDOW

HELD = "sluice_quota_held_requests_total"


@pytest.mark.parametrize("transport", ["wire", "grpc"])
def test_the_sdk_producer_waits_out_its_throttle_time(
    cluster: QuotaCluster, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if transport == "grpc":  # the SDK's gRPC streams announce the client id in their metadata
        monkeypatch.setenv("SLUICE_CLIENT_TRANSPORT", "grpc")
    topic = f"quota-sdk-{transport}"
    polite = f"polite-{transport}"
    cluster.client.admin.create_topic(topic, partitions=1)
    cluster.set_quotas({QuotaKey(Kind.CLIENT, polite): Limits(produce_bytes_per_second=QUOTA)})
    value = b"v" * 4096
    acked: list[float] = []
    lock = threading.Lock()

    def done(_future: object) -> None:
        with lock:
            acked.append(time.monotonic())

    held_before = cluster.metric(HELD)
    with Client(cluster.coordinator.address, client_id=polite) as client:
        producer = client.producer(
            topic, batch_size=64 * 1024, buffer_memory=2 * 1024 * 1024, linger=timedelta(milliseconds=5)
        )
        started = time.monotonic()
        while time.monotonic() - started < RUN_S:
            producer.send(value).add_done_callback(done)
        producer.close(timeout=60)
    held = cluster.metric(HELD) - held_before

    with lock:
        got = sum(1 for at in acked if started + WINDOW[0] <= at < started + WINDOW[1])
    rate = got * len(value) / (WINDOW[1] - WINDOW[0])
    # Record bytes as the broker meters them include each batch's framing: a little over the values.
    assert 0.85 * QUOTA <= rate <= 1.05 * QUOTA, f"the SDK producer got {rate:.0f} B/s under {QUOTA}"
    # The SDK waits out each throttle itself: the broker holds its requests at most when one was
    # already on its way when a throttle was announced.
    # Measured: 0 held with the SDK's backoff, 12 with it disabled (ThrottleWindows.blocked -> False).
    assert held <= 5, f"the broker held the SDK's requests {held:.0f} times"
