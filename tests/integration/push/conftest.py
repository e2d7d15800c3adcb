"""A whole cluster for push-consumer tests: redis, coordinator, broker, offset store, dispatcher.

Real processes on loopback (tests/harness.py). The cluster is shared by the module's tests
(each test uses its own topic); ``restart_dispatcher(kill=True)`` is kill -9 and a restart
with the same dispatcher id (on a new port: consumers learn it from the coordinator).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sluice import Client
from sluice.v1 import dispatcher_pb2, dispatcher_pb2_grpc
from tests.cluster import run_services
from tests.harness import RedisServer, ServiceProcess, run_redis, start_service


@dataclass
class PushCluster:
    redis: RedisServer
    coordinator: ServiceProcess
    broker: ServiceProcess
    offset_store: ServiceProcess
    dispatcher: ServiceProcess
    data_dir: Path
    #: Further dispatchers (``run_push_cluster(dispatchers=2)``), ids d2, d3, ...
    more_dispatchers: list[ServiceProcess] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return self.coordinator.address

    def restart_dispatcher(self, kill: bool = True) -> None:
        if kill:
            self.dispatcher.kill()
        else:
            self.dispatcher.terminate()
        self.dispatcher = start_service("dispatcher", *self.dispatcher.args)
        wait_for_dispatcher(self.bootstrap, self.dispatcher.address)

    def describe(
        self, client: Client, topic: str, subscription: str
    ) -> dispatcher_pb2.DescribeSubscriptionResponse:
        """DescribeSubscription straight from the dispatcher process."""
        stub = client._channels.stub(self.dispatcher.address, dispatcher_pb2_grpc.DispatcherStub)
        return stub.DescribeSubscription(
            dispatcher_pb2.DescribeSubscriptionRequest(topic=topic, subscription=subscription), timeout=5
        )


def wait_for_dispatcher(bootstrap: str, address: str, timeout: float = 20.0) -> None:
    """Setup only: wait until the coordinator lists the dispatcher at ``address`` as alive."""
    deadline = time.monotonic() + timeout
    with Client(bootstrap, request_timeout=5) as c:
        while True:
            md = c.metadata(refresh=True)
            if any(d.alive and d.address == address for d in md.dispatchers.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"dispatcher {address} did not register: {md.dispatchers}")
            time.sleep(0.05)


@contextlib.contextmanager
def run_push_cluster(dispatchers: int = 1, dispatcher_args: tuple[str, ...] = ()) -> Iterator[PushCluster]:
    with (
        run_redis() as redis,
        tempfile.TemporaryDirectory(prefix="sluice-push-") as d,
        run_services(redis, Path(d), dispatcher_args=dispatcher_args) as svc,
    ):
        more: list[ServiceProcess] = []
        cluster: PushCluster | None = None
        try:
            for i in range(2, dispatchers + 1):
                more.append(
                    start_service(
                        "dispatcher",
                        *("--port", "0", "--metrics-port", "0", "--coordinator", svc.coordinator.address),
                        *("--dispatcher-id", f"d{i}", "--cursor-flush-interval", "50ms"),
                        *dispatcher_args,
                    )
                )
            cluster = PushCluster(
                redis, svc.coordinator, svc.broker, svc.offset_store, svc.dispatcher, Path(d), more
            )
            for sp in (svc.dispatcher, *more):
                wait_for_dispatcher(svc.coordinator.address, sp.address)
            yield cluster
        finally:
            for sp in more:
                sp.terminate()
            if cluster is not None and cluster.dispatcher is not svc.dispatcher:
                cluster.dispatcher.terminate()  # the one running now, after restarts


@pytest.fixture(scope="package")
def cluster() -> Iterator[PushCluster]:
    with run_push_cluster() as c:
        yield c


@pytest.fixture
def client(cluster: PushCluster) -> Iterator[Client]:
    with Client(cluster.bootstrap, request_timeout=10) as c:
        yield c


@pytest.fixture
def topic(client: Client) -> str:
    name = f"push-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(name, partitions=4)
    return name
