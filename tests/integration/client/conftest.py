"""A real cluster for SDK tests: private redis-server, coordinator and broker processes."""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice import Client
from tests.answer_threads import putters  # noqa: F401  (a fixture for this package's tests)
from tests.harness import RedisServer, ServiceProcess, run_redis, start_service


@dataclass
class Cluster:
    redis: RedisServer
    coordinator: ServiceProcess
    broker: ServiceProcess
    data_dir: Path

    @property
    def bootstrap(self) -> str:
        return self.coordinator.address

    def restart_broker(self, kill: bool = False) -> None:
        """Stop the broker (kill -9 or SIGTERM) and start it again with the same flags.

        It binds a new port (``--port 0``): clients must learn it from the coordinator.
        """
        if kill:
            self.broker.kill()
        else:
            self.broker.terminate()
        self.broker = start_service("broker", *self.broker.args)
        wait_for_broker(self.bootstrap, self.broker.address)


def wait_for_broker(bootstrap: str, address: str, timeout: float = 20.0) -> None:
    """Wait until the coordinator lists the broker at ``address`` as alive (setup only)."""
    deadline = time.monotonic() + timeout
    with Client(bootstrap, request_timeout=5) as c:
        while True:
            md = c.metadata(refresh=True)
            if any(b.alive and b.address == address for b in md.brokers.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker {address} did not register: {md.brokers}")
            time.sleep(0.05)


@contextlib.contextmanager
def run_cluster(flush: str = "interval") -> Iterator[Cluster]:
    with run_redis() as redis, tempfile.TemporaryDirectory(prefix="sluice-sdk-") as d:
        coord = start_service("coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url)
        cluster: Cluster | None = None
        try:
            broker = start_service(
                "broker",
                "--port",
                "0",
                "--metrics-port",
                "0",
                "--data-dir",
                d,
                "--broker-id",
                "1",
                "--coordinator",
                coord.address,
                "--flush",
                flush,
            )
            cluster = Cluster(redis, coord, broker, Path(d))
            wait_for_broker(coord.address, broker.address)
            yield cluster
        finally:
            if cluster is not None:
                cluster.broker.terminate()
            coord.terminate()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with run_cluster() as c:
        yield c


@pytest.fixture
def client(cluster: Cluster) -> Iterator[Client]:
    with Client(cluster.bootstrap, request_timeout=10) as c:
        yield c


@pytest.fixture
def new_topic(client: Client) -> Callable[..., str]:
    """Create a topic with a fresh name: ``new_topic(partitions=4)``."""

    def make(partitions: int = 1, **config: int) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        client.admin.create_topic(name, partitions=partitions, config=config or None)
        return name

    return make
