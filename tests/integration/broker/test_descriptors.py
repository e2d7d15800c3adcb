"""A real broker and its open-files limit (issue 20, "Descriptors"; docs/storage.md).

- Started with the soft limit lowered (64, hard 4,096), it raises it to the hard limit, logs
  both, and serves several times more partitions than 64 descriptors would hold.
- It holds one descriptor per partition plus a constant, whether the partitions were just
  created or reopened after a restart, and reads sealed segments through a bounded LRU.
- With a hard limit it cannot raise, a partition past its descriptor budget is refused with
  a typed, retriable STORAGE_ERROR while everything it already serves, and new connections,
  keep working; once partitions are removed the same request succeeds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import grpc
import pytest

from sluice.client.rpc import CHANNEL_OPTIONS
from sluice.errors import StorageError
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import broker_pb2_grpc

from .conftest import Broker, make_batch, part, rpc_error, start_broker, vals

SOFT, HARD = 64, 4096
PARTITIONS = 300
#: Descriptors a broker holds besides its partition logs: the interpreter, gRPC (epoll,
#: wakeup fds, listeners), the metrics server, the data dir lock, connections.
CONSTANT = 40
READ_HANDLES = 8


def open_fds(broker: Broker) -> int:
    return len(os.listdir(f"/proc/{broker.proc.process.pid}/fd"))


def soft_limit(broker: Broker) -> int:
    limits = Path(f"/proc/{broker.proc.process.pid}/limits").read_text()
    m = re.search(r"^Max open files\s+(\d+)\s+(\d+)", limits, re.MULTILINE)
    assert m, limits
    return int(m.group(1))


def assign(broker: Broker, topic: str, partitions: int, remove: bool = False, **config: int) -> None:
    items = [
        pb.PartitionAssignment(topic=topic, topic_id="id-1", partition=p, config=pb.TopicConfig(**config))
        for p in range(partitions)
    ]
    req = pb.UpdatePartitionsRequest(remove=items) if remove else pb.UpdatePartitionsRequest(assign=items)
    broker.stub.UpdatePartitions(req, timeout=60)


def produce_all(broker: Broker, topic: str, partitions: int, batch: bytes) -> None:
    resp = broker.stub.Produce(
        pb.ProduceRequest(
            acks=1,
            partitions=[
                pb.ProducePartition(topic=topic, partition=p, records=batch) for p in range(partitions)
            ],
        ),
        timeout=30,
    )
    assert [p.error.code for p in resp.partitions] == [0] * partitions


def fetch_all(broker: Broker, topic: str, partitions: int) -> list[int]:
    """Bytes fetched from offset 0 of every partition."""
    resp = broker.fetch(*(part(topic, 0, p) for p in range(partitions)), max_bytes=64 << 20)
    assert [p.error.code for p in resp.partitions] == [0] * partitions
    return [len(p.records) for p in resp.partitions]


def test_raises_its_soft_limit_and_keeps_one_descriptor_per_partition(tmp_path: Path) -> None:
    broker = start_broker(tmp_path, "--segment-read-handles", str(READ_HANDLES), nofile=(SOFT, HARD))
    try:
        assert soft_limit(broker) == HARD
        assert (
            f"open files limit: soft {SOFT} raised to {HARD} (the hard limit is {HARD})" in broker.proc.log()
        )
        baseline = open_fds(broker)
        # 1 KiB segments and ~600-byte batches: every partition rolls, so fetches from
        # offset 0 read sealed segments (through the LRU) as well as the active one.
        assign(broker, "many", PARTITIONS, segment_bytes=1024)
        batch = make_batch(vals(10, size=50))
        for _ in range(3):
            produce_all(broker, "many", PARTITIONS, batch)
        sizes = fetch_all(broker, "many", PARTITIONS)
        assert all(size >= len(batch) for size in sizes)
        created = open_fds(broker)
        # Before: 3 per newly created partition (900 here, past the lowered soft limit).
        assert created <= baseline + PARTITIONS + CONSTANT, (baseline, created)
        opens = broker.metric("sluice_broker_segment_handle_opens_total")
        assert opens is not None
        assert opens >= PARTITIONS
        assert broker.metric("sluice_broker_segment_handles_open") == READ_HANDLES
        assert broker.metric("sluice_broker_segment_handle_evictions_total") == opens - READ_HANDLES
        assert broker.stop() == 0

        broker = start_broker(tmp_path, "--segment-read-handles", str(READ_HANDLES), nofile=(SOFT, HARD))
        restarted = open_fds(broker)
        assert restarted <= baseline + PARTITIONS + CONSTANT, (baseline, restarted)
        assert fetch_all(broker, "many", PARTITIONS) == sizes
        produce_all(broker, "many", PARTITIONS, batch)
        assert open_fds(broker) <= baseline + PARTITIONS + CONSTANT
    finally:
        broker.stop()


def test_a_partition_past_the_descriptor_budget_is_a_typed_error_and_recovers(tmp_path: Path) -> None:
    # Hard = soft = 200: nothing to raise. Budget: 200 - 8 read handles - 64 reserved = 128 logs.
    broker = start_broker(
        tmp_path,
        "--segment-read-handles", "8",
        "--descriptor-reserve", "64",
        nofile=(200, 200),
    )  # fmt: skip
    try:
        assert "could not raise" not in broker.proc.log()
        assert broker.metric("sluice_broker_partition_budget") == 128
        assign(broker, "a", 60)
        with pytest.raises(grpc.RpcError) as info:
            assign(broker, "b", 100)
        err = rpc_error(info.value)
        assert isinstance(err, StorageError)
        assert err.retriable
        assert "out of file descriptors" in err.message
        # Not half-working: what it served still works, over a new connection too.
        assert broker.produce("a", 0, make_batch(vals(2))).error.code == 0
        with grpc.insecure_channel(broker.proc.address, options=CHANNEL_OPTIONS) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            resp = stub.Fetch(pb.FetchRequest(partitions=[part("a", 0, 0)], max_bytes=1 << 20), timeout=10)
            assert resp.partitions[0].error.code == 0
            assert resp.partitions[0].records
        # Descriptors freed: the same request now succeeds, and every partition works.
        assign(broker, "a", 60, remove=True)
        assign(broker, "b", 100)
        produce_all(broker, "b", 100, make_batch(vals(3)))
        assert all(fetch_all(broker, "b", 100))
        assert broker.alive()
    finally:
        broker.stop()
