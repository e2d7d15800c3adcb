"""Which connection the SDK's producer and fetcher use: the broker's wire port when it
advertises one (docs/wire.md), the gRPC streams when told to (SLUICE_CLIENT_TRANSPORT=grpc)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sluice import Client
from sluice.client.links import TRANSPORT_ENV
from sluice.errors import InvalidArgument
from tests.wire_client import settle_connections

from .conftest import Cluster


def _round_trip_holding(cluster: Cluster, client: Client, topic: str, prefix: bytes, expected: int) -> None:
    """Produce and fetch 20 records; while both are open the broker counts ``expected`` wire
    connections (no other client of this module holds any once its test ended)."""
    settle_connections(cluster.broker.metrics, "broker", 0)
    with client.producer(topic, linger=0) as producer, client.fetcher({(topic, 0): 0}) as fetcher:
        for i in range(20):
            producer.send(prefix + b"%d" % i).result(timeout=20)
        got: list[bytes] = []
        while len(got) < 20:
            got += [r.value for r in fetcher.fetch(timeout=10)]
        assert got == [prefix + b"%d" % i for i in range(20)]
        settle_connections(cluster.broker.metrics, "broker", expected)


def test_metadata_carries_the_wire_port_and_the_sdk_uses_it(
    cluster: Cluster, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    with Client(cluster.bootstrap) as client:
        (broker,) = client.metadata(refresh=True).brokers.values()
        assert broker.wire_address is not None
        # One connection carries the producer's and the fetcher's requests (issue 20: one
        # connection per broker per client; it was one per kind before).
        _round_trip_holding(cluster, client, topic, b"v", expected=1)


def test_with_the_grpc_transport_forced_the_sdk_leaves_the_wire_port_alone(
    cluster: Cluster, new_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = new_topic(partitions=1)
    monkeypatch.setenv(TRANSPORT_ENV, "grpc")
    with Client(cluster.bootstrap) as client:
        _round_trip_holding(cluster, client, topic, b"g", expected=0)


def test_an_unknown_transport_setting_is_a_clear_error(
    cluster: Cluster, new_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = new_topic(partitions=1)
    monkeypatch.setenv(TRANSPORT_ENV, "carrier-pigeon")
    with (
        Client(cluster.bootstrap) as client,
        client.producer(topic, linger=0) as producer,
        pytest.raises(InvalidArgument, match="SLUICE_CLIENT_TRANSPORT must be auto or grpc"),
    ):
        producer.send(b"x").result(timeout=20)
