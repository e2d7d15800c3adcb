"""CreateTopic and AddPartitions report a broker that could not create the log, and a retry converges.

The broker's partition directory path is occupied by a dangling symlink: ``mkdir`` fails there even for
root (a read-only directory does not stop root), which is what a full or broken disk looks like to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.harness import ROOT, run_redis, start_service

from sluice.client.client import Client
from sluice.errors import BrokerUpdateFailed, InvalidPartitions, TopicAlreadyExists


@dataclass
class Cluster:
    client: Client
    data: Path
    bootstrap: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data: Path = tmp_path_factory.mktemp("broken") / "broker"
    with run_redis(appendonly=False) as redis:
        coord = start_service("coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url)
        broker = start_service(
            "broker", "--port", "0", "--metrics-port", "0", "--data-dir", str(data),
            "--coordinator", coord.address,
        )  # fmt: skip
        try:
            with Client(coord.address) as c:
                yield Cluster(c, data, coord.address)
        finally:
            broker.terminate()
            coord.terminate()


def _block(data: Path, topic: str, partition: int) -> Path:
    path = data / f"{topic}-{partition}"
    os.symlink(data / "nowhere" / "at-all", path)
    return path


def test_create_topic_reports_a_broker_that_cannot_create_the_log_and_a_retry_completes_it(
    cluster: Cluster,
) -> None:
    blocked = _block(cluster.data, "broken", 1)
    with pytest.raises(BrokerUpdateFailed) as failed:
        cluster.client.admin.create_topic("broken", partitions=3)
    message = failed.value.message
    assert "create topic broken" in message
    assert "broker 0" in message
    assert "STORAGE_ERROR" in message
    assert "broken-1" in message
    assert failed.value.retriable
    # The topic is recorded; asking for another spec is refused as for any existing topic.
    assert len(cluster.client.admin.describe_topic("broken").partitions) == 3
    with pytest.raises(TopicAlreadyExists):
        cluster.client.admin.create_topic("broken", partitions=4)
    # Still broken: a retry fails the same way.
    with pytest.raises(BrokerUpdateFailed):
        cluster.client.admin.create_topic("broken", partitions=3)
    # The operator fixes the disk; the same request completes the creation.
    blocked.unlink()
    info = cluster.client.admin.create_topic("broken", partitions=3)
    assert [p.partition for p in info.partitions] == [0, 1, 2]
    with cluster.client.producer("broken") as producer:
        assert producer.send(b"after the fix", partition=1).result(10).offset == 0
    # Complete now: creating it again is TOPIC_ALREADY_EXISTS, as before.
    with pytest.raises(TopicAlreadyExists):
        cluster.client.admin.create_topic("broken", partitions=3)


def test_add_partitions_reports_the_failure_and_a_retry_completes_it(cluster: Cluster) -> None:
    cluster.client.admin.create_topic("grows", partitions=1)
    blocked = _block(cluster.data, "grows", 2)
    with pytest.raises(BrokerUpdateFailed, match="add partitions to grows"):
        cluster.client.admin.add_partitions("grows", 3)
    blocked.unlink()
    assert len(cluster.client.admin.add_partitions("grows", 3).partitions) == 3
    with cluster.client.producer("grows") as producer:
        assert producer.send(b"x", partition=2).result(10).offset == 0
    with pytest.raises(InvalidPartitions):
        cluster.client.admin.add_partitions("grows", 3)  # complete: not larger, as before


def test_the_cli_prints_the_typed_error_and_exits_non_zero(cluster: Cluster) -> None:
    blocked = _block(cluster.data, "cli-broken", 0)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "services"), "SLUICE_BOOTSTRAP": cluster.bootstrap}
    argv = [sys.executable, "-m", "sluice", "topic", "create", "cli-broken", "--partitions", "1"]
    run = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
    assert run.returncode == 1
    assert run.stderr.decode().startswith("error: BROKER_UPDATE_FAILED: create topic cli-broken: ")
    blocked.unlink()
    again = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
    assert again.returncode == 0, again.stderr
