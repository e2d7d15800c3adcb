"""Behind a load balancer that maps ports (the chart's external access, docs/kubernetes.md) a broker
registers the host and ports clients must dial, not the ones it bound: --advertised-port and
--advertised-wire-port. Without them it registers what it bound."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from sluice.broker.config import BrokerConfig
from sluice.errors import InvalidArgument
from sluice.v1 import coordinator_pb2 as cpb
from sluice.v1 import coordinator_pb2_grpc
from tests.harness import run_redis, run_service

from .conftest import running_broker


def _registered(stub: coordinator_pb2_grpc.CoordinatorStub, timeout: float = 20.0) -> cpb.BrokerDescription:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            brokers = [b for b in stub.Metadata(cpb.MetadataRequest(), timeout=5).brokers if b.alive]
        except grpc.RpcError:
            brokers = []
        if brokers:
            return brokers[0]
        time.sleep(0.05)
    raise AssertionError("the broker never registered")


def test_the_broker_registers_its_advertised_ports(tmp_path: Path) -> None:
    with (
        run_redis(appendonly=False) as redis,
        run_service("coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url) as coord,
        grpc.insecure_channel(coord.address) as channel,
    ):
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        with running_broker(
            tmp_path / "b",
            *("--coordinator", coord.address, "--advertised-host", "b1.sluice.example.com"),
            *("--advertised-port", "443", "--advertised-wire-port", "9443"),
        ):
            endpoint = _registered(stub).endpoint
            assert (endpoint.host, endpoint.port, endpoint.wire_port) == ("b1.sluice.example.com", 443, 9443)


def test_without_them_the_bound_ports_are_registered(tmp_path: Path) -> None:
    with (
        run_redis(appendonly=False) as redis,
        run_service("coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url) as coord,
        grpc.insecure_channel(coord.address) as channel,
    ):
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        with running_broker(tmp_path / "b", "--coordinator", coord.address) as broker:
            endpoint = _registered(stub).endpoint
            assert endpoint.port == int(broker.proc.address.rsplit(":", 1)[1])
            assert endpoint.wire_port == int(broker.wire_address.rsplit(":", 1)[1])


def test_an_advertised_port_out_of_range_is_a_typed_error() -> None:
    with pytest.raises(InvalidArgument, match="advertised_wire_port must be a port"):
        BrokerConfig(advertised_wire_port=70000)
