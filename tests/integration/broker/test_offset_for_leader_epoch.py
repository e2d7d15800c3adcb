"""OffsetForLeaderEpoch over gRPC against a real broker: per-partition answers from the log's
leader-epoch cache, typed per-partition errors (docs/replication.md, "Leader epochs in the log")."""

from __future__ import annotations

from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2

from .conftest import Broker, make_batch, records, vals


def _ask(broker: Broker, *parts: tuple[str, int, int]) -> list[pb.OffsetForLeaderEpochPartitionResponse]:
    resp = broker.stub.OffsetForLeaderEpoch(
        pb.OffsetForLeaderEpochRequest(
            partitions=[
                pb.OffsetForLeaderEpochPartition(topic=t, partition=p, leader_epoch=e) for t, p, e in parts
            ]
        ),
        timeout=10,
    )
    return list(resp.partitions)


def test_answers_per_partition_from_the_epoch_cache(broker: Broker, topic: str) -> None:
    broker.assign(topic, partitions=2)
    for _ in range(3):
        assert broker.produce(topic, 0, make_batch(vals(4))).error.code == common_pb2.NONE
    # Every batch the broker appended carries the epoch it leads in: 0 until the controller says.
    fetched = broker.fetch_one(topic, 0)
    assert len(records(fetched)) == 12
    answers = _ask(
        broker,
        (topic, 0, 0),  # the latest epoch: it ends at the log end
        (topic, 0, 7),  # above the latest: undefined
        (topic, 1, 0),  # an empty log has no epoch yet
        (topic, 5, 0),  # not served here
        (f"{topic}-none", 0, 0),
        (topic, 0, -2),
    )
    got = [(a.error.code, a.leader_epoch, a.end_offset) for a in answers]
    assert got[0] == (common_pb2.NONE, 0, 12)
    assert got[1] == (common_pb2.NONE, -1, -1)
    assert got[2] == (common_pb2.NONE, -1, -1)
    assert [g[0] for g in got[3:]] == [
        common_pb2.NOT_LEADER,
        common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
        common_pb2.INVALID_ARGUMENT,
    ]
    assert all(a.error.message for a in answers[3:])
    assert [(a.topic, a.partition) for a in answers[:3]] == [(topic, 0), (topic, 0), (topic, 1)]
