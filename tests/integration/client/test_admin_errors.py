"""Topic administration and typed errors through the SDK."""

from __future__ import annotations

import uuid

import pytest

from sluice import Client
from sluice.errors import (
    InvalidFilter,
    InvalidPartitions,
    InvalidTopic,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)


def test_create_list_describe_delete(client: Client) -> None:
    name = f"admin-{uuid.uuid4().hex[:8]}"
    info = client.admin.create_topic(name, partitions=3, config={"retention_ms": "1d"})
    assert info.name == name
    assert [p.partition for p in info.partitions] == [0, 1, 2]
    assert all(p.broker_id == 1 for p in info.partitions)
    assert info.config["retention_ms"] == 86_400_000
    assert info.topic_id
    assert name in [t.name for t in client.admin.list_topics()]
    assert client.admin.describe_topic(name) == info
    md = client.metadata([name])
    assert md.partition_count(name) == 3
    assert md.leader_address(name, 2) is not None
    with pytest.raises(TopicAlreadyExists):
        client.admin.create_topic(name)
    client.admin.delete_topic(name)
    with pytest.raises(UnknownTopicOrPartition):
        client.admin.describe_topic(name)
    assert name in client.metadata([name], refresh=True).unknown_topics
    with pytest.raises(UnknownTopicOrPartition):
        client.admin.delete_topic(name)


def test_unknown_topic(client: Client) -> None:
    with pytest.raises(UnknownTopicOrPartition, match="does-not-exist"):
        client.producer("does-not-exist")
    with pytest.raises(UnknownTopicOrPartition):
        client.list_offsets("does-not-exist")
    with pytest.raises(UnknownTopicOrPartition):
        client.metadata(["does-not-exist"]).topic("does-not-exist")
    with client.fetcher({("does-not-exist", 0): 0}) as f, pytest.raises(UnknownTopicOrPartition):
        f.fetch(timeout=5)


@pytest.mark.parametrize("name", ["", "bad name", "a/b", "x" * 250, "..", "ünï"])
def test_invalid_topic_names(client: Client, name: str) -> None:
    with pytest.raises(InvalidTopic):
        client.admin.create_topic(name)
    with pytest.raises(InvalidTopic):
        client.producer(name)


def test_invalid_partitions_and_filters(client: Client) -> None:
    for bad in (0, -1, 100_000):
        with pytest.raises(InvalidPartitions):
            client.admin.create_topic(f"p-{uuid.uuid4().hex[:8]}", partitions=bad)
    with pytest.raises(InvalidFilter):
        client.fetcher({("t", 0): 0}, {"t": "a && b"})


def test_partition_out_of_range(client: Client) -> None:
    name = f"range-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(name, partitions=2)
    with pytest.raises(UnknownTopicOrPartition):
        client.list_offsets(name, partitions=[2])
    with client.producer(name) as producer, pytest.raises(UnknownTopicOrPartition):
        producer.send(b"v", partition=2)
    with client.fetcher({(name, 5): 0}) as f, pytest.raises(UnknownTopicOrPartition, match="no partition 5"):
        f.fetch(timeout=5)
