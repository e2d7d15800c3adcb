"""A real offset-store process on a private Redis, driven over gRPC.

The group ownership keys and the topics' id keys are seeded in Redis
directly, exactly as the coordinator writes them (docs/redis-schema.md), so
these tests exercise the offset store's fencing without depending on the
coordinator. The topics the tests write to exist (``TOPICS``), each with the
id ``topic_id_of(name)``; a write to any other topic is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
import redis

from sluice.v1 import offset_store_pb2_grpc
from tests.harness import RedisServer, ServiceProcess, run_redis, start_service

#: Topics that exist in every stack (their id keys are set), as if the coordinator had created them.
TOPICS = ("t", "orders", "lag", "zombie", "standby", "empty", "default")


def topic_id_of(topic: str) -> str:
    return f"id-{topic}"


@dataclass
class Stack:
    redis_server: RedisServer
    service: ServiceProcess
    redis: redis.Redis
    channel: grpc.Channel
    stub: offset_store_pb2_grpc.OffsetStoreStub

    def seed_topic(self, *topics: str) -> None:
        """Make ``topics`` exist, as the coordinator's CreateTopic does (their id keys)."""
        for topic in topics:
            self.redis.set(f"sluice:topic:{{{topic}}}:id", topic_id_of(topic))

    def seed_group(
        self, group: str, members: dict[str, int], owners: dict[str, str], live: int = 1, track: str = ""
    ) -> None:
        """Write the group ownership keys as the coordinator would (``track``: a split track's owners)."""
        r = self.redis
        owners_key = f"sluice:grp:{{{group}}}:owners" + (f":{track}" if track else "")
        with r.pipeline(transaction=True) as pipe:
            pipe.delete(f"sluice:grp:{{{group}}}:members", owners_key)
            if members:
                pipe.hset(f"sluice:grp:{{{group}}}:members", mapping=members)  # type: ignore[arg-type]
            if owners:
                pipe.hset(owners_key, mapping=owners)  # type: ignore[arg-type]
            pipe.set(f"sluice:grp:{{{group}}}:live", live)
            pipe.execute()


def start_stack(redis_server: RedisServer) -> Stack:
    service = start_service(
        "offset-store", "--port", "0", "--metrics-port", "0", "--redis-url", redis_server.url
    )
    channel = grpc.insecure_channel(service.address)
    stack = Stack(
        redis_server,
        service,
        redis.Redis.from_url(redis_server.url),
        channel,
        offset_store_pb2_grpc.OffsetStoreStub(channel),
    )
    stack.seed_topic(*TOPICS)
    return stack


def stop_stack(stack: Stack) -> None:
    stack.channel.close()
    stack.redis.close()
    code = stack.service.terminate()
    assert code == 0, stack.service.log()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with run_redis() as redis_server:
        s = start_stack(redis_server)
        try:
            yield s
        finally:
            stop_stack(s)
