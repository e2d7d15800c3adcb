"""Roles and epochs on a real broker process (docs/replication.md, "Roles on the broker"): a follower
answers NOT_LEADER to produce and fetch, and the controller and leader epochs it has seen survive a
kill -9 and a restart, so it keeps refusing the stale ones."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
import redis

from sluice.errors import StaleControllerEpoch
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2, coordinator_pb2_grpc
from sluice.v1 import coordinator_pb2 as cpb
from tests.harness import ServiceProcess, free_port, run_redis

from .conftest import (
    Broker,
    make_batch,
    part,
    reap,
    rpc_error,
    running_broker,
    start_broker,
    start_tracked,
    vals,
)
from .test_registration import _alive_brokers, _eventually

#: start_broker runs broker id 1.
ME = 1


def assign(
    broker: Broker, topic: str, leader: int, leader_epoch: int, controller_epoch: int, version: int
) -> None:
    broker.stub.UpdatePartitions(
        pb.UpdatePartitionsRequest(
            metadata_version=version,
            full=True,
            controller_epoch=controller_epoch,
            assign=[
                pb.PartitionAssignment(
                    topic=topic,
                    topic_id="tid",
                    partition=0,
                    leader=leader,
                    leader_epoch=leader_epoch,
                    partition_epoch=leader_epoch,
                    replicas=[0, 1, 2],
                    isr=[0, 1, 2],
                    min_insync_replicas=2,
                )
            ],
        ),
        timeout=10,
    )


def test_a_follower_refuses_clients_and_a_restarted_broker_keeps_refusing_stale_epochs(
    tmp_path: Path,
) -> None:
    data = tmp_path / "b"
    broker = start_broker(data)
    try:
        assign(broker, "rt", leader=ME, leader_epoch=3, controller_epoch=5, version=1)
        assert broker.produce("rt", 0, make_batch(vals(2))).error.code == common_pb2.NONE
        # Leadership moves to broker 0: this one follows and refuses clients, naming the leader.
        assign(broker, "rt", leader=0, leader_epoch=4, controller_epoch=5, version=2)
        answer = broker.produce("rt", 0, make_batch(vals(1)))
        assert answer.error.code == common_pb2.NOT_LEADER
        assert "led by broker 0" in answer.error.message
        fetched = broker.fetch(part("rt")).partitions[0]
        assert fetched.error.code == common_pb2.NOT_LEADER
        broker.kill()  # kill -9: only what was journaled (fsynced) before each answer survives

        broker = start_broker(data)
        # An older controller (epoch 4) is refused with a typed error, and changes nothing.
        with pytest.raises(grpc.RpcError) as refused:
            assign(broker, "rt", leader=ME, leader_epoch=9, controller_epoch=4, version=3)
        assert isinstance(rpc_error(refused.value), StaleControllerEpoch)
        # A current controller replaying an old leader epoch (3, this broker as leader) is ignored: the
        # broker does not start serving on an order older than the one it last obeyed.
        assign(broker, "rt", leader=ME, leader_epoch=3, controller_epoch=5, version=4)
        assert broker.produce("rt", 0, make_batch(vals(1))).error.code == common_pb2.NOT_LEADER
        # A newer leader epoch makes it leader again, with its data.
        assign(broker, "rt", leader=ME, leader_epoch=5, controller_epoch=6, version=5)
        appended = broker.produce("rt", 0, make_batch(vals(1)))
        assert appended.error.code == common_pb2.NONE
        assert appended.base_offset == 2
    finally:
        if broker.alive():
            broker.stop()


def _coordinator(redis_url: str, port: int, election: str) -> tuple[ServiceProcess, list[threading.Thread]]:
    return start_tracked(
        "coordinator",
        "--port", str(port),
        "--metrics-port", "0",
        "--redis-url", redis_url,
        "--broker-heartbeat-interval", "200ms",
        "--broker-session-timeout", "3s",
        "--election", election,
        # A killed leader's lease must not hold its successor (on the same address) back for long.
        "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms",
    )  # fmt: skip


@pytest.mark.parametrize("election", ["none", "redis"])
def test_a_coordinator_whose_redis_lost_the_epoch_takes_one_above_what_the_brokers_obeyed(
    tmp_path: Path, election: str
) -> None:
    # Without the catch-up, the broker would refuse every order of the new coordinator
    # (STALE_CONTROLLER_EPOCH) and a topic created after the loss would never be served.
    port = free_port()
    with run_redis() as server:
        coordinator, pumps = _coordinator(server.url, port, election)
        channel = grpc.insecure_channel(coordinator.address)
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            with running_broker(tmp_path / "b", "--coordinator", coordinator.address) as broker:
                assert _eventually(lambda: _alive_brokers(stub) == {ME})
                stub.CreateTopic(cpb.CreateTopicRequest(name="first", partitions=1), timeout=10)
                # A second term (epoch 2) gives the broker an order: it has obeyed epoch 2.
                coordinator.kill()
                reap(coordinator, pumps)
                coordinator, pumps = _coordinator(server.url, port, election)
                assert _eventually(lambda: _alive_brokers(stub) == {ME}, 30)
                stub.CreateTopic(cpb.CreateTopicRequest(name="second", partitions=1), timeout=10)
                assert _eventually(lambda: _served(broker, "second"))
                # Redis loses the epoch (a failover to a replica that missed it, a restore).
                coordinator.kill()
                reap(coordinator, pumps)
                with redis.Redis.from_url(server.url) as r:
                    obeyed = int(r.get("sluice:coordinator:epoch") or 0)
                    assert obeyed >= 2
                    r.set("sluice:coordinator:epoch", 0)
                    r.delete("sluice:coordinator:leader")  # the lease went with it
                coordinator, pumps = _coordinator(server.url, port, election)  # takes epoch 1
                assert _eventually(lambda: _create(stub, "third"), 30)
                assert _eventually(lambda: _served(broker, "third"))
                with redis.Redis.from_url(server.url) as r:
                    assert int(r.get("sluice:coordinator:epoch") or 0) > obeyed
                assert "the metadata store lost its epoch" in coordinator.log()
        finally:
            channel.close()
            coordinator.terminate()
            reap(coordinator, pumps)


def _create(stub: coordinator_pb2_grpc.CoordinatorStub, topic: str) -> bool:
    """CreateTopic, true once it succeeded: under an election the coordinator stands down once to take
    a new term (NOT_COORDINATOR meanwhile)."""
    try:
        stub.CreateTopic(cpb.CreateTopicRequest(name=topic, partitions=1), timeout=10)
    except grpc.RpcError as exc:
        if "TOPIC_ALREADY_EXISTS" in str(exc.details()):
            return True
        raise
    return True


def _served(broker: Broker, topic: str) -> bool:
    return broker.fetch_one(topic, 0).error.code == common_pb2.NONE
