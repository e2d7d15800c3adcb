"""A topic change a broker does not acknowledge in time: a degraded success that says so.

The coordinator records the change and answers OK with ``unacknowledged`` naming the broker
(docs/coordinator.md, "What a topic change answers"). The SDK returns it, typed, in
``TopicInfo.unacknowledged`` (``delete_topic`` returns the tuple); the CLI prints a ``warning:`` line
per broker on stderr and exits 0, the documented code of a recorded change. The broker here is
frozen (SIGSTOP) for the call and thawed after: its heartbeat then brings it the change.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from tests.harness import ROOT, ServiceProcess, run_redis, start_service

from sluice.client.client import Client
from sluice.errors import BrokerNotAvailable


@dataclass
class Cluster:
    client: Client
    broker: ServiceProcess
    bootstrap: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data = tmp_path_factory.mktemp("frozen") / "broker"
    with run_redis(appendonly=False) as redis:
        # A short push deadline and heartbeat, a session long enough that the frozen broker stays
        # alive (partitions are still placed on it) for the whole wait.
        coord = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url,
            "--broker-update-timeout", "300ms", "--broker-heartbeat-interval", "500ms",
            "--broker-session-timeout", "30s",
        )  # fmt: skip
        broker = start_service(
            "broker", "--port", "0", "--metrics-port", "0", "--data-dir", str(data),
            "--coordinator", coord.address,
        )  # fmt: skip
        try:
            with Client(coord.address, request_timeout=30) as c:
                c.admin.create_topic("warm", partitions=1)  # the broker is registered and serving
                yield Cluster(c, broker, coord.address)
        finally:
            os.kill(broker.process.pid, signal.SIGCONT)
            broker.terminate()
            coord.terminate()


@contextmanager
def frozen(broker: ServiceProcess) -> Iterator[None]:
    os.kill(broker.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)


def test_the_sdk_returns_the_brokers_that_did_not_acknowledge(cluster: Cluster) -> None:
    with frozen(cluster.broker):
        info = cluster.client.admin.create_topic("late", partitions=2)
    assert [p.partition for p in info.partitions] == [0, 1]  # recorded
    (err,) = info.unacknowledged
    assert isinstance(err, BrokerNotAvailable)
    assert "create topic late" in err.message
    assert "broker 0 did not acknowledge" in err.message
    # Thawed, the broker's heartbeat brings it the change: the topic becomes usable.
    with cluster.client.producer("late") as producer:
        assert producer.send(b"after", partition=1).result(30).offset == 0
    # A change every broker acknowledged has nothing to report.
    assert cluster.client.admin.create_topic("prompt", partitions=1).unacknowledged == ()
    with frozen(cluster.broker):
        gone = cluster.client.admin.delete_topic("prompt")
    assert [type(e) for e in gone] == [BrokerNotAvailable]
    assert "broker 0 did not acknowledge" in gone[0].message


def test_the_cli_warns_naming_the_broker_and_exits_zero(cluster: Cluster) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "services"), "SLUICE_BOOTSTRAP": cluster.bootstrap}
    argv = [sys.executable, "-m", "sluice", "topic", "create", "cli-late", "--partitions", "1"]
    with frozen(cluster.broker):
        run = subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    stderr = run.stderr.decode()
    assert "warning: BROKER_NOT_AVAILABLE: create topic cli-late: broker 0 did not acknowledge" in stderr
    assert "Created topic cli-late with 1 partition(s)" in run.stdout.decode()
