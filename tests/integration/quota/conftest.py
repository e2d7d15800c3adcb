"""A coordinator and a broker (with its wire port) as real processes over a private Redis."""

from __future__ import annotations

import re
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice import Client
from sluice.quotas.model import Limits, QuotaKey
from tests.harness import ServiceProcess, run_redis, start_service
from tests.wire_client import wire_address


@dataclass
class QuotaCluster:
    coordinator: ServiceProcess
    broker: ServiceProcess
    client: Client

    @property
    def wire(self) -> str:
        return wire_address(self.broker.output)

    def metric(self, pattern: str) -> float:
        """The sum of the broker's samples whose line matches ``pattern`` (0 when none)."""
        text = urllib.request.urlopen(f"http://{self.broker.metrics}/metrics", timeout=10).read().decode()
        return sum(float(m.group(1)) for m in re.finditer(rf"^{pattern} (\S+)$", text, re.MULTILINE))

    def sample(self, name: str, **labels: str) -> float:
        """The sum of the broker's ``name`` samples carrying ``labels`` (in any order; 0 when none)."""
        text = urllib.request.urlopen(f"http://{self.broker.metrics}/metrics", timeout=10).read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def metrics(self, prefix: str) -> str:
        """The broker's metric lines starting with ``prefix`` (for an assertion's message)."""
        text = urllib.request.urlopen(f"http://{self.broker.metrics}/metrics", timeout=10).read().decode()
        return "\n".join(line for line in text.splitlines() if line.startswith(prefix))

    def set_quotas(self, quotas: dict[QuotaKey, Limits]) -> None:
        """Set them and wait (bounded) until the broker enforces that version."""
        version = self.client.admin.alter_quotas(quotas)
        deadline = time.monotonic() + 30
        while self.metric("sluice_quota_version") < version:
            assert time.monotonic() < deadline, "the broker never got the quotas"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster() -> Iterator[QuotaCluster]:
    with run_redis() as redis, tempfile.TemporaryDirectory(prefix="sluice-quota-") as d:
        coordinator = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url
        )
        try:
            broker = start_service(
                "broker",
                *("--port", "0", "--metrics-port", "0", "--data-dir", str(Path(d) / "broker")),
                *("--broker-id", "1", "--coordinator", coordinator.address),
            )
            try:
                with Client(coordinator.address, client_id="quota-admin") as client:
                    yield QuotaCluster(coordinator, broker, client)
            finally:
                broker.terminate()
        finally:
            coordinator.terminate()
