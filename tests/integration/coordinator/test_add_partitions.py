"""Growing a topic: new partitions are placed, served by the broker, and can't shrink."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.harness import run_redis, start_service

from sluice.client.client import Client
from sluice.errors import InvalidPartitions, UnknownTopicOrPartition


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    data: Path = tmp_path_factory.mktemp("grow")
    with run_redis(appendonly=False) as redis:
        coord = start_service("coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url)
        broker = start_service(
            "broker",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--data-dir",
            str(data),
            "--coordinator",
            coord.address,
        )
        try:
            with Client(coord.address) as c:
                yield c
        finally:
            broker.terminate()
            coord.terminate()


def test_added_partitions_take_records_and_old_ones_keep_theirs(client: Client) -> None:
    topic = f"grow-{uuid.uuid4().hex[:6]}"
    client.admin.create_topic(topic, partitions=2)
    with client.producer(topic) as p:
        first = p.send(b"old", partition=1).result(10)
    info = client.admin.add_partitions(topic, 5)
    assert [x.partition for x in info.partitions] == [0, 1, 2, 3, 4]
    assert len(client.admin.describe_topic(topic).partitions) == 5
    with client.producer(topic) as p:
        meta = p.send(b"new", partition=4).result(10)
    assert (meta.partition, meta.offset) == (4, 0)
    assert client.list_offsets(topic, "latest") == {0: 0, 1: first.offset + 1, 2: 0, 3: 0, 4: 1}


def test_partitions_never_shrink_and_unknown_topics_are_refused(client: Client) -> None:
    topic = f"grow-{uuid.uuid4().hex[:6]}"
    client.admin.create_topic(topic, partitions=3)
    with pytest.raises(InvalidPartitions, match="can be added, never removed"):
        client.admin.add_partitions(topic, 3)
    with pytest.raises(InvalidPartitions):
        client.admin.add_partitions(topic, 1)
    with pytest.raises(UnknownTopicOrPartition):
        client.admin.add_partitions("no-such-topic", 4)
