"""The dispatcher's partition feeds fetch over the broker's wire port (docs/wire.md)."""

from __future__ import annotations

import pytest

from sluice import Client
from sluice.client.links import TRANSPORT_ENV
from tests.integration.push.conftest import PushCluster, run_push_cluster
from tests.wire_client import settle_connections, wire_connections


def _wire_connections(cluster: PushCluster) -> float:
    return wire_connections(cluster.broker.metrics, "broker")


def test_a_subscription_feeds_over_the_wire(monkeypatch: pytest.MonkeyPatch) -> None:
    # A cluster of its own, and an SDK told to use gRPC: every wire connection the broker
    # counts belongs to the dispatcher.
    monkeypatch.setenv(TRANSPORT_ENV, "grpc")
    with run_push_cluster() as cluster, Client(cluster.bootstrap) as client:
        client.admin.create_topic("feed-wire", partitions=2)
        with client.producer("feed-wire", linger=0) as producer:
            for i in range(10):
                producer.send(b"m%d" % i).result(timeout=20)
        assert _wire_connections(cluster) == 0
        with client.push_consumer("feed-wire", "s", "shared", initial_position="earliest") as pc:
            got = []
            for _ in range(10):
                msg = pc.receive(timeout=20)
                got.append(msg.value)
                pc.ack(msg)
            assert sorted(got) == sorted(b"m%d" % i for i in range(10))
            settle_connections(cluster.broker.metrics, "broker", 2)  # one feed per partition
