"""The idle close does not break the SDK: a producer and a fetcher whose broker connection was
closed for idleness go on at their next call (the SDK connects again, ``client/shared_wire.py``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from sluice import Client
from tests.cluster import run_services
from tests.harness import run_redis
from tests.integration.limits.conftest import closed, wait_for


def _flags(service: str) -> list[str]:
    return ["--connections-max-idle", "1s"] if service == "broker" else []


def test_an_sdk_client_goes_on_after_its_idle_connection_was_closed() -> None:
    with (
        run_redis() as redis,
        tempfile.TemporaryDirectory() as d,
        run_services(redis, Path(d), _flags) as svc,
        Client(svc.coordinator.address) as client,
    ):
        client.admin.create_topic("idle", partitions=1)
        with client.producer("idle", linger=0) as producer:
            producer.send(b"before").result(timeout=30)
            # The producer's connection is idle from here: the broker closes it.
            wait_for(lambda: closed(svc.broker, "idle") >= 1, 30, "the idle close")
            producer.send(b"after").result(timeout=30)
        with client.fetcher({("idle", 0): 0}) as fetcher:
            got: list[bytes] = []
            for _ in range(50):
                got += [r.value for r in fetcher.fetch(timeout=5)]
                if len(got) >= 2:
                    break
        assert got == [b"before", b"after"]
