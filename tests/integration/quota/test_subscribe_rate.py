"""The subscribe-rate quota (Pulsar's subscribeRatePerConsumer) on a real dispatcher: Subscribe calls
beyond the rate are delayed, not refused, and the rate holds."""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid

from sluice import Client
from sluice.quotas.model import Kind, Limits, QuotaKey
from sluice.quotas.throttle import BURST_S
from tests.integration.push.conftest import run_push_cluster
from tests.push_streams import PushStreams

RATE = 5.0
COUNT = 20


def _quota_version(metrics: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    return max(
        (float(line.split()[-1]) for line in text.splitlines() if line.startswith("sluice_quota_version ")),
        default=0.0,
    )


async def _subscribe_all(streams: PushStreams, prefix: str) -> float:
    started = time.monotonic()
    await streams.open([f"{prefix}-{i}" for i in range(COUNT)])
    return time.monotonic() - started


def test_subscribes_beyond_the_rate_are_delayed_to_it() -> None:
    with run_push_cluster() as cluster, Client(cluster.bootstrap, request_timeout=10) as client:
        topic = f"subrate-{uuid.uuid4().hex[:8]}"
        client.admin.create_topic(topic, partitions=1)
        dispatcher = cluster.dispatcher

        async def run(prefix: str) -> float:
            streams = PushStreams("grpc", topic, dispatcher.address, "")
            try:
                return await _subscribe_all(streams, prefix)
            finally:
                await streams.close()

        unlimited = asyncio.run(run("free"))
        # Anonymous gRPC consumers announce no client id: the default client quota governs them.
        version = client.admin.alter_quotas({QuotaKey(Kind.CLIENT, ""): Limits(subscribes_per_second=RATE)})
        deadline = time.monotonic() + 30
        while _quota_version(dispatcher.metrics) < version:
            assert time.monotonic() < deadline, "the dispatcher never got the quota"
            time.sleep(0.05)
        limited = asyncio.run(run("held"))
        # BURST_S seconds' worth at once, the rest at RATE per second.
        expected = (COUNT - RATE * BURST_S) / RATE
        assert limited >= 0.9 * expected, f"{COUNT} subscribes took {limited:.2f} s at {RATE}/s"
        assert limited <= expected + 30, f"{COUNT} subscribes took {limited:.2f} s at {RATE}/s"
        assert limited > unlimited
        # Lifted: at full speed again (the meter's debt is gone with the quota).
        client.admin.delete_quotas([QuotaKey(Kind.CLIENT, "")])
        deadline = time.monotonic() + 30
        while _quota_version(dispatcher.metrics) < version + 1:
            assert time.monotonic() < deadline, "the dispatcher never saw the quota go"
            time.sleep(0.05)
        again = asyncio.run(run("again"))
        assert again < limited, f"{again:.2f} s with no quota, {limited:.2f} s with it"
