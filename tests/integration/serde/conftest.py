"""One whole cluster (coordinator, broker, offset store, dispatcher) for the serializer tests: they
produce, consume in a group and consume by push, each test on its own topic."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from sluice import Client
from tests.integration.push.conftest import PushCluster, run_push_cluster


@pytest.fixture(scope="package")
def cluster() -> Iterator[PushCluster]:
    with run_push_cluster() as c:
        yield c


@pytest.fixture
def client(cluster: PushCluster) -> Iterator[Client]:
    with Client(cluster.bootstrap, request_timeout=10) as c:
        yield c


@pytest.fixture
def new_topic(client: Client) -> Callable[..., str]:
    def make(partitions: int = 1) -> str:
        name = f"serde-{uuid.uuid4().hex[:10]}"
        client.admin.create_topic(name, partitions=partitions)
        return name

    return make
