"""A whole Sluice on loopback for the retry tests (the group-consumer tests' cluster, with the broker on a
fixed port too, so the coordinator and the broker can both be restarted at the same address)."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice import Client
from sluice.client.fetcher import Fetcher
from sluice.codec.batch import Record
from tests.harness import free_port, restart, run_redis, start_service
from tests.integration.consumer.conftest import HEARTBEAT, Cluster

_names = itertools.count()

#: Consumer settings of the retry tests: fast fetches (a resumed retry partition is fetched at once) and
#: short sessions.
CFG: dict[str, Any] = {
    "auto_offset_reset": "earliest",
    "fetch_max_wait": "100ms",
    "session_timeout": "2s",
    "retry": True,
}


class RetryCluster(Cluster):
    def restart_broker(self) -> None:
        self.broker.terminate()
        self.broker = restart(self.broker)

    def group(self, prefix: str = "g") -> str:
        return f"{prefix}-{os.getpid()}-{next(_names)}"


def start_retry_cluster(redis: Any, data_dir: Path) -> RetryCluster:
    coord_port, store_port, broker_port = free_port(), free_port(), free_port()
    coordinator = start_service(
        "coordinator",
        *("--port", str(coord_port), "--metrics-port", "0", "--redis-url", redis.url),
        *("--offset-store", f"127.0.0.1:{store_port}"),
        *("--group-heartbeat-interval", HEARTBEAT, "--group-assignment-interval", "0s"),
    )
    broker = start_service(
        "broker",
        *("--port", str(broker_port), "--metrics-port", "0", "--broker-id", "0"),
        *("--data-dir", str(data_dir / "broker"), "--coordinator", coordinator.address),
    )
    store = start_service(
        "offset-store",
        *("--port", str(store_port), "--metrics-port", "0", "--redis-url", redis.url),
        *("--coordinator", coordinator.address),
    )
    return RetryCluster(redis, data_dir, coordinator, broker, store)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RetryCluster]:
    with run_redis(appendonly=True) as redis, tempfile.TemporaryDirectory(prefix="sluice-retry-") as d:
        c = start_retry_cluster(redis, Path(d))
        try:
            yield c
        finally:
            c.stop()


def read_all(client: Client, topic: str, partitions: int = 1, timeout: float = 10.0) -> list[Record]:
    """Every record of ``topic`` up to its current end."""
    ends = client.list_offsets(topic, "latest")
    out: list[Record] = []
    with client.fetcher({(topic, p): 0 for p in range(partitions)}, max_wait_ms=100) as f:
        _drain(f, {(topic, p): e for p, e in ends.items()}, out, timeout)
    return out


def _drain(f: Fetcher, ends: dict[tuple[str, int], int], out: list[Record], timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while any(f.positions()[tp] < end for tp, end in ends.items()):
        assert time.monotonic() < deadline, f"could not read up to {ends}"
        out += f.fetch(0.5)
