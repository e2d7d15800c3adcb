"""A push subscription sees a delayed record only when it is due (the dispatcher reads the target topic,
where the scheduler appends the record at its due time)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from sluice import Client
from sluice.client.producer.delay import DUE_HEADER
from sluice.client.push import Message
from sluice.errors import RequestTimedOut
from tests.harness import ServiceProcess, start_service
from tests.integration.push.conftest import PushCluster, run_push_cluster


@pytest.fixture
def push_cluster() -> Iterator[tuple[PushCluster, ServiceProcess]]:
    with run_push_cluster() as cluster:
        scheduler = start_service(
            "scheduler",
            *("--coordinator", cluster.bootstrap, "--data-dir", str(cluster.data_dir / "scheduler")),
            timeout=60,
        )
        try:
            yield cluster, scheduler
        finally:
            scheduler.terminate()


def test_push_subscription_sees_delayed_records_only_when_due(
    push_cluster: tuple[PushCluster, ServiceProcess],
) -> None:
    cluster, _ = push_cluster
    with Client(cluster.bootstrap, request_timeout=10) as client:
        topic = f"delay-push-{time.monotonic_ns()}"
        client.admin.create_topic(topic, partitions=2)
        with client.push_consumer(topic, "s", "shared", initial_position="earliest") as consumer:
            with client.producer(topic) as producer:
                for i in range(20):
                    producer.send(b"%d" % i, key=b"%d" % i, deliver_after=timedelta(seconds=2))
                producer.flush(10)
            got: list[tuple[Message, int]] = []
            deadline = time.monotonic() + 30
            while len(got) < 20 and time.monotonic() < deadline:
                try:
                    msg = consumer.receive(timeout=1.0)
                except RequestTimedOut:
                    continue
                got.append((msg, time.time_ns() // 1_000_000))
                consumer.ack(msg)
    assert sorted(int(m.value) for m, _ in got) == list(range(20))
    assert all(at >= int(m.headers[DUE_HEADER]) for m, at in got), "a push consumer got a record early"
