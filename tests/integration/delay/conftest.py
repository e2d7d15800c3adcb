"""A Sluice for the delayed-delivery tests: Redis, coordinator, broker and a scheduler, as real processes.

Each test gets its own cluster (they kill and restart parts of it). The scheduler runs with a clock-offset
file (the injectable clock: the test writes a number of ms into it) and small time buckets, so a test
crosses many buckets in seconds.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sluice import Client
from sluice.client.producer.delay import DUE_HEADER, SCHEDULE_HEADER
from sluice.codec.batch import Record
from tests.harness import RedisServer, ServiceProcess, free_port, restart, run_redis, start_service

_names = itertools.count()


@dataclass
class DelayCluster:
    redis: RedisServer
    data_dir: Path
    coordinator: ServiceProcess
    broker: ServiceProcess
    scheduler: ServiceProcess
    clients: list[Client] = field(default_factory=list)

    @property
    def clock_file(self) -> Path:
        return self.data_dir / "clock-offset"

    def set_clock_offset(self, ms: int) -> None:
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(str(ms))
        os.replace(tmp, self.clock_file)

    def client(self, **kwargs: Any) -> Client:
        c = Client(self.coordinator.address, request_timeout=10.0, **kwargs)
        self.clients.append(c)
        return c

    def topic(self, partitions: int, config: dict[str, Any] | None = None) -> str:
        name = f"d-{os.getpid()}-{next(_names)}"
        admin = self.clients[0] if self.clients else self.client()
        admin.admin.create_topic(name, partitions=partitions, config=config)
        return name

    def kill_scheduler(self) -> None:
        self.scheduler.kill()

    def restart_scheduler(self, drop: tuple[str, ...] = ()) -> None:
        """Start the scheduler again (``drop``: flags, with their value, to leave out this time)."""
        self.scheduler.terminate()
        args = list(self.scheduler.args)
        for flag in drop:
            i = args.index(flag)
            del args[i : i + 2]
        self.scheduler = start_service("scheduler", *args, timeout=60)

    def kill_broker(self) -> None:
        self.broker.kill()

    def restart_broker(self) -> None:
        self.broker.terminate()
        self.broker = restart(self.broker, timeout=60)

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        for sp in (self.scheduler, self.broker, self.coordinator):
            sp.terminate()


def start_delay_cluster(
    redis: RedisServer, data_dir: Path, scheduler_args: tuple[str, ...] = ()
) -> DelayCluster:
    coordinator = start_service(
        "coordinator",
        *("--port", str(free_port()), "--metrics-port", "0", "--redis-url", redis.url),
        *("--offset-store", f"127.0.0.1:{free_port()}"),
    )
    broker = start_service(
        "broker",
        *("--port", str(free_port()), "--metrics-port", "0", "--broker-id", "0"),
        *("--data-dir", str(data_dir / "broker"), "--coordinator", coordinator.address),
    )
    scheduler = start_service(
        "scheduler",
        *("--coordinator", coordinator.address, "--data-dir", str(data_dir / "scheduler")),
        *("--clock-offset-file", str(data_dir / "clock-offset"), "--partitions", "4", "--metrics-port", "0"),
        *scheduler_args,
        timeout=60,
    )
    return DelayCluster(redis, data_dir, coordinator, broker, scheduler)


@pytest.fixture
def delay_cluster(request: pytest.FixtureRequest) -> Iterator[DelayCluster]:
    marker = request.node.get_closest_marker("scheduler_args")
    args = tuple(marker.args) if marker else ()
    with run_redis(appendonly=True) as redis, tempfile.TemporaryDirectory(prefix="sluice-delay-") as d:
        c = start_delay_cluster(redis, Path(d), args)
        try:
            yield c
        finally:
            c.stop()


@dataclass
class Arrival:
    record: Record
    received_ms: int

    @property
    def due(self) -> int:
        return int(self.record.headers[DUE_HEADER])

    @property
    def coordinates(self) -> bytes:
        return self.record.headers[SCHEDULE_HEADER]


def collect(
    client: Client, topic: str, partitions: int, want: int, timeout: float, clock_offset_ms: int = 0
) -> list[Arrival]:
    """Read ``topic`` from its start until ``want`` records arrived or ``timeout`` seconds passed; each
    record with the (offset-adjusted) wall-clock time it reached this reader."""
    out: list[Arrival] = []
    deadline = time.monotonic() + timeout
    with client.fetcher({(topic, p): 0 for p in range(partitions)}, max_wait_ms=50) as fetcher:
        while len(out) < want and time.monotonic() < deadline:
            records = fetcher.fetch()
            now = time.time_ns() // 1_000_000 + clock_offset_ms
            out += (Arrival(r, now) for r in records)
    return out
