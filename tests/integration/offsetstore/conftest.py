"""A real offset-store process on a private Redis, driven over gRPC.

The group ownership keys are seeded in Redis directly, exactly as the
coordinator writes them (docs/redis-schema.md), so these tests exercise the
offset store's fencing without depending on the coordinator.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
import redis

from sluice.v1 import offset_store_pb2_grpc
from tests.harness import RedisServer, ServiceProcess, run_redis, start_service


@dataclass
class Stack:
    redis_server: RedisServer
    service: ServiceProcess
    redis: redis.Redis
    channel: grpc.Channel
    stub: offset_store_pb2_grpc.OffsetStoreStub

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
    return Stack(
        redis_server,
        service,
        redis.Redis.from_url(redis_server.url),
        channel,
        offset_store_pb2_grpc.OffsetStoreStub(channel),
    )


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
