"""Producer.send argument handling and partition choice, without a broker.

The producer is given a metadata snapshot whose broker address is never
contacted: linger is long, so nothing becomes ready to send during a test, and
close(0) fails what is buffered.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.client.metadata import BrokerInfo, ClusterMetadata, PartitionInfo, TopicInfo
from sluice.client.producer import Producer, ProducerConfig
from sluice.common.peers import Peers
from sluice.errors import BatchTooLarge, InvalidArgument, SluiceError, UnknownTopicOrPartition


class StaticMetadata:
    def __init__(self, partitions: int) -> None:
        self.md = ClusterMetadata(
            brokers={1: BrokerInfo(1, "127.0.0.1", 9)},
            topics={"t": TopicInfo("t", "id", [PartitionInfo(i, 1) for i in range(partitions)])},
        )

    def get(self, topics: Any = None, refresh: bool = False) -> ClusterMetadata:
        return self.md


@pytest.fixture
def producer() -> Iterator[Producer]:
    # Without idempotence: an idempotent producer asks the coordinator for its id when it is made.
    cfg = ProducerConfig().replace(
        linger="1h", batch_size="64KiB", max_request_size="128KiB", enable_idempotence=False
    )
    channels = Peers()
    p = Producer("t", cfg, channels, StaticMetadata(4))  # type: ignore[arg-type]
    yield p
    p.close(0)
    channels.close()


def test_keyed_records_use_crc32_mod_partitions(producer: Producer) -> None:
    for i in range(50):
        key = f"k{i}".encode()
        fut = producer.send(b"v", key=key)
        assert fut._result.partition == zlib.crc32(key) % 4


def test_keyless_records_stick_to_one_partition(producer: Producer) -> None:
    parts = {producer.send(b"v")._result.partition for _ in range(100)}
    assert len(parts) == 1


def test_explicit_partition(producer: Producer) -> None:
    assert producer.send(b"v", key=b"k", partition=3)._result.partition == 3
    for bad in (4, -1, "1"):
        with pytest.raises(UnknownTopicOrPartition, match="no partition"):
            producer.send(b"v", partition=bad)  # type: ignore[arg-type]


def test_records_share_their_batch_result(producer: Producer) -> None:
    futs = [producer.send(b"v", partition=0) for _ in range(3)]
    assert futs[0]._result is futs[2]._result
    assert [f._index for f in futs] == [0, 1, 2]
    assert not futs[0].done()


def test_bad_arguments(producer: Producer) -> None:
    with pytest.raises(InvalidArgument, match="value must be bytes"):
        producer.send("text")
    with pytest.raises(InvalidArgument, match="key must be bytes"):
        producer.send(b"v", key=5)
    with pytest.raises(InvalidArgument, match="invalid tag"):
        producer.send(b"v", tag="a || b")
    with pytest.raises(InvalidArgument, match="invalid tag"):
        producer.send(b"v", tag="")
    with pytest.raises(InvalidArgument, match=r"header .h.: names must be str and values bytes"):
        producer.send(b"v", headers={"h": "text"})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgument, match="timestamp"):
        producer.send(b"v", timestamp=-5)
    with pytest.raises(BatchTooLarge, match="max_request_size"):
        producer.send(b"x" * 200_000)
    # bytearray and memoryview are accepted (copied).
    assert producer.send(bytearray(b"v"), key=memoryview(b"k")) is not None


def test_a_large_record_gets_a_batch_of_its_own(producer: Producer) -> None:
    small = producer.send(b"v", partition=1)
    big = producer.send(b"x" * 100_000, partition=1)
    assert big._result is not small._result
    assert big._index == 0


def test_close_fails_buffered_records_and_refuses_new_ones(producer: Producer) -> None:
    fut = producer.send(b"v", partition=2)
    producer.close(0)
    with pytest.raises(SluiceError, match="closed"):
        fut.result(timeout=5)
    with pytest.raises(SluiceError, match="closed"):
        producer.send(b"v")
    assert producer.closed
    producer.close()  # idempotent
