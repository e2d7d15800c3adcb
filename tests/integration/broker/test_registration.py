"""The broker registers with a real coordinator (on a real Redis), follows its partition
placement, keeps serving while the coordinator is down, and re-registers when it is back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from sluice.v1 import common_pb2, coordinator_pb2_grpc
from sluice.v1 import coordinator_pb2 as cpb
from tests.harness import ServiceProcess, free_port, run_redis

from .conftest import Broker, make_batch, reap, running_broker, start_tracked, vals


def _eventually(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    # Heartbeats are periodic (200 ms here): wait for their effect.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return True
        except grpc.RpcError:
            pass
        time.sleep(0.05)
    return False


def _start_coordinator(redis_url: str, port: int) -> tuple[ServiceProcess, list[threading.Thread]]:
    return start_tracked(
        "coordinator",
        "--port", str(port),
        "--metrics-port", "0",
        "--redis-url", redis_url,
        "--broker-heartbeat-interval", "200ms",
        "--broker-session-timeout", "3s",
    )  # fmt: skip


def _alive_brokers(stub: coordinator_pb2_grpc.CoordinatorStub) -> set[int]:
    meta = stub.Metadata(cpb.MetadataRequest(), timeout=5)
    return {b.broker_id for b in meta.brokers if b.alive}


def _partition_served(broker: Broker, topic: str, p: int) -> bool:
    return broker.fetch_one(topic, 0, partition=p).error.code == common_pb2.NONE


def test_register_follow_placement_and_survive_a_coordinator_restart(tmp_path: Path) -> None:
    port = free_port()
    with run_redis() as redis:
        coordinator, pumps = _start_coordinator(redis.url, port)
        channel = grpc.insecure_channel(coordinator.address)
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            with running_broker(tmp_path / "b", "--coordinator", coordinator.address) as broker:
                assert _eventually(lambda: _alive_brokers(stub) == {1})
                stub.CreateTopic(cpb.CreateTopicRequest(name="orders", partitions=2), timeout=10)
                assert _eventually(lambda: all(_partition_served(broker, "orders", p) for p in (0, 1)))
                assert broker.produce("orders", 1, make_batch(vals(3))).error.code == common_pb2.NONE

                # The coordinator dies: the broker goes on serving what it has.
                coordinator.kill()
                reap(coordinator, pumps)
                r = broker.produce("orders", 1, make_batch(vals(2)))
                assert r.error.code == common_pb2.NONE
                assert r.base_offset == 3

                # Back on the same address and Redis: the broker registers again and keeps
                # following placement changes.
                coordinator, pumps = _start_coordinator(redis.url, port)
                assert _eventually(lambda: _alive_brokers(stub) == {1})
                stub.DeleteTopic(cpb.DeleteTopicRequest(name="orders"), timeout=10)
                assert _eventually(
                    lambda: broker.fetch_one("orders", 0).error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
                )
                assert not (broker.data_dir / "orders-0").exists()
        finally:
            channel.close()
            coordinator.terminate()
            reap(coordinator, pumps)
