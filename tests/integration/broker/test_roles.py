"""Roles and epochs on a real broker process (docs/replication.md, "Roles on the broker"): a follower
answers NOT_LEADER to produce and fetch, and the controller and leader epochs it has seen survive a
kill -9 and a restart, so it keeps refusing the stale ones."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from sluice.errors import StaleControllerEpoch
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2

from .conftest import Broker, make_batch, part, rpc_error, start_broker, vals

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
