"""One whole Sluice (redis, coordinator, broker, offset store, dispatcher) shared by the asyncio SDK's
suite (package scope: starting one takes seconds); each test makes its own topics and groups. Group
heartbeats are 200 ms (the coordinator's setting for this stack), so joins take fractions of a second."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from sluice import Client
from tests.cluster import Services, run_services
from tests.harness import run_redis
from tests.integration.client.conftest import wait_for_broker
from tests.integration.push.conftest import wait_for_dispatcher

#: Consumer settings that keep the tests fast (short fetch waits, a session timeout that survives load).
FAST: dict[str, Any] = {"session_timeout": "5s", "fetch_max_wait": "100ms"}
_names = count()


def _flags(service: str) -> Sequence[str]:
    if service == "coordinator":
        return ("--group-heartbeat-interval", "200ms", "--group-assignment-interval", "0s")
    return ()


@dataclass
class Stack:
    services: Services

    @property
    def bootstrap(self) -> str:
        return self.services.coordinator.address

    def topic(self, partitions: int = 4, prefix: str = "aio") -> str:
        """A new topic (made with the sync client: set-up, not what the tests check)."""
        name = f"{prefix}-{os.getpid()}-{next(_names)}"
        with Client(self.bootstrap, request_timeout=10) as c:
            c.admin.create_topic(name, partitions=partitions)
        return name

    def produce(self, topic: str, n: int, start: int = 0) -> None:
        with (
            Client(self.bootstrap, request_timeout=10) as c,
            c.producer(topic, partitioner="round_robin") as p,
        ):
            for i in range(start, start + n):
                p.send(f"v{i}".encode())


def name(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture(scope="package")
def stack() -> Iterator[Stack]:
    with (
        run_redis() as redis,
        tempfile.TemporaryDirectory(prefix="sluice-aio-") as d,
        run_services(redis, Path(d), flags=_flags) as svc,
    ):
        wait_for_broker(svc.coordinator.address, svc.broker.address)
        wait_for_dispatcher(svc.coordinator.address, svc.dispatcher.address)
        yield Stack(svc)
