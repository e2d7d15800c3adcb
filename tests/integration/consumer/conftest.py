"""A whole Sluice on loopback for the group-consumer tests: Redis (AOF), coordinator, broker, offset store.

The coordinator and the offset store get fixed free ports, so either can be restarted at the same address
(clients and the other services keep their address). Group timings are shortened through the coordinator's
defaults (heartbeat 200 ms) and each test's ConsumerConfig (session timeouts of a second or two), so
rebalances and expiries take fractions of a second instead of the production 3 s / 45 s.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sluice import Client
from tests.answer_threads import putters  # noqa: F401  (a fixture for this package's tests)
from tests.harness import RedisServer, ServiceProcess, free_port, restart, run_redis, start_service

HEARTBEAT = "200ms"
_names = itertools.count()


@dataclass
class Cluster:
    redis: RedisServer
    data_dir: Path
    coordinator: ServiceProcess
    broker: ServiceProcess
    offset_store: ServiceProcess
    clients: list[Client] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return self.coordinator.address

    def client(self, **kwargs: Any) -> Client:
        c = Client(self.bootstrap, request_timeout=10.0, **kwargs)
        self.clients.append(c)
        return c

    def topic(self, partitions: int, prefix: str = "t") -> str:
        name = f"{prefix}-{os.getpid()}-{next(_names)}"
        admin = self.clients[0] if self.clients else self.client()
        admin.admin.create_topic(name, partitions=partitions)
        return name

    def restart_coordinator(self) -> None:
        self.coordinator.terminate()
        self.coordinator = restart(self.coordinator)

    def kill_restart_redis(self) -> None:
        self.redis.kill()
        self.redis.restart()

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        for sp in (self.offset_store, self.broker, self.coordinator):
            sp.terminate()


def start_cluster(redis: RedisServer, data_dir: Path) -> Cluster:
    coord_port, store_port = free_port(), free_port()
    coordinator = start_service(
        "coordinator",
        "--port",
        str(coord_port),
        "--metrics-port",
        "0",
        "--redis-url",
        redis.url,
        "--offset-store",
        f"127.0.0.1:{store_port}",
        "--group-heartbeat-interval",
        HEARTBEAT,
        "--group-assignment-interval",
        "0s",
    )
    broker = start_service(
        "broker",
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--broker-id",
        "0",
        "--data-dir",
        str(data_dir / "broker"),
        "--coordinator",
        coordinator.address,
    )
    store = start_service(
        "offset-store",
        "--port",
        str(store_port),
        "--metrics-port",
        "0",
        "--redis-url",
        redis.url,
        "--coordinator",
        coordinator.address,
    )
    return Cluster(redis, data_dir, coordinator, broker, store)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with run_redis(appendonly=True) as redis, tempfile.TemporaryDirectory(prefix="sluice-consumer-") as d:
        c = start_cluster(redis, Path(d))
        try:
            yield c
        finally:
            c.stop()


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    """A cluster of the test's own, for tests that restart or kill its parts."""
    with run_redis(appendonly=True) as redis, tempfile.TemporaryDirectory(prefix="sluice-consumer-") as d:
        c = start_cluster(redis, Path(d))
        try:
            yield c
        finally:
            c.stop()
