"""Helpers of the topic-identity tests: a private push cluster, the Redis inventory, old consumers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
import redis

from sluice import Client
from sluice.client.consumer import Consumer
from tests.integration.push.conftest import PushCluster, run_push_cluster
from tests.integration.push.helpers import drain

FAST = {"session_timeout": "5s", "fetch_max_wait": "100ms", "enable_auto_commit": False}


@pytest.fixture(scope="module")
def own() -> Iterator[PushCluster]:
    with run_push_cluster() as c:
        yield c


@pytest.fixture
def rds(own: PushCluster) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(own.redis.url)
    yield r
    r.close()


def inventory(r: redis.Redis) -> set[str]:
    """Every key, and every field of a hash and member of a set: what a deleted topic could leak
    (group offsets live in hash fields, broadcasting members in index sets)."""
    out: set[str] = set()
    for raw in r.scan_iter(count=1000):
        key = raw.decode()
        out.add(key)
        kind = r.type(raw).decode()
        if kind == "hash":
            out |= {f"{key} #{f.decode()}" for f in r.hkeys(raw)}
        elif kind == "set":
            out |= {f"{key} @{m.decode()}" for m in r.smembers(raw)}
        elif kind != "string":
            raise AssertionError(f"{key}: a {kind} key; teach inventory() to count inside it")
    return out


def poll_values(consumer: Consumer, n: int, timeout: float = 15.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {got} of {n} records arrived"
        got += [r.value or b"" for r in consumer.poll(0.2)]
    return got


def consume_as_old_group(client: Client, topic: str, group: str, n: int) -> list[bytes]:
    """Join ``group`` (earliest when nothing is committed), read ``n`` records, commit, leave."""
    c = client.consumer(group, [topic], auto_offset_reset="earliest", **FAST)
    try:
        values = poll_values(c, n)
        c.commit()
    finally:
        c.close()
    return values


def consume_as_old_subscription(client: Client, topic: str, subscription: str, n: int) -> list[bytes]:
    """Read and ack ``n`` messages of a durable subscription (earliest when it has no cursor yet)."""
    pc = client.push_consumer(topic, subscription, "exclusive", initial_position="earliest")
    try:
        return [m.value or b"" for m in drain(pc, n)]
    finally:
        pc.close()


def not_loaded(own: PushCluster, client: Client, topic: str, subscription: str) -> bool:
    try:
        own.describe(client, topic, subscription)
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.NOT_FOUND
    return False
