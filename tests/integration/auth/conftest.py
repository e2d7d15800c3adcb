"""A private Redis and a coordinator with a cluster token, short sessions and a low per-user limit."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice import Client
from sluice.security.session_tokens import SessionTokens
from tests.harness import RedisServer, ServiceProcess, free_port, run_redis, start_service

#: Sessions last this long here, so a refresh happens within a test.
TTL_S = 3.0
PER_USER = 5


@dataclass
class Coordinator:
    redis: RedisServer
    process: ServiceProcess
    token_file: Path

    @property
    def address(self) -> str:
        return self.process.address

    def tokens(self) -> SessionTokens:
        return SessionTokens.from_cluster_token_file(self.token_file)


def coordinator_args(redis: RedisServer, *extra: str) -> list[str]:
    return ["--redis-url", redis.url, "--port", str(free_port()), "--metrics-port", "0", *extra]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with run_redis() as server:
        yield server


@pytest.fixture(scope="module")
def coordinator(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    token_file = tmp_path_factory.mktemp("auth") / "cluster-token"
    token_file.write_text("a-cluster-token-for-tests\n")
    process = start_service(
        "coordinator",
        *coordinator_args(
            redis_server,
            "--cluster-token-file",
            str(token_file),
            "--session-token-ttl",
            f"{TTL_S:g}s",
            "--login-failures-per-user",
            str(PER_USER),
            "--login-failures-per-address",
            "100000",
        ),
    )
    try:
        yield Coordinator(redis_server, process, token_file)
    finally:
        process.terminate()


@pytest.fixture(scope="module")
def client(coordinator: Coordinator) -> Iterator[Client]:
    c = Client(coordinator.address, request_timeout=10)
    try:
        yield c
    finally:
        c.close()
