"""Deliberately broken adapters: the harness must report their runs FAILED, never as figures.

In a module of their own (not the test file) so the harness's spawned producer processes can import them.
"""

from __future__ import annotations

from dataclasses import dataclass

from compare.adapters.base import Endpoint
from compare.adapters.redis_streams import RedisStreams
from compare.workload import Feed, index_of

#: The record each broken producer mistreats.
VICTIM = 7


@dataclass
class DroppingRedis(RedisStreams):
    """Redis Streams whose producer never sends record VICTIM (a lost record)."""

    def produce(self, endpoint: Endpoint, dest: str, feed: Feed) -> None:
        batch = feed.batch

        def dropping(limit: int) -> list[tuple[bytes, bytes]]:
            return [r for r in batch(limit) if index_of(r[0]) != VICTIM]

        feed.batch = dropping  # type: ignore[method-assign]
        super().produce(endpoint, dest, feed)


@dataclass
class DuplicatingRedis(RedisStreams):
    """Redis Streams whose producer sends record VICTIM twice (a duplicate)."""

    def produce(self, endpoint: Endpoint, dest: str, feed: Feed) -> None:
        batch = feed.batch

        def duplicating(limit: int) -> list[tuple[bytes, bytes]]:
            records = batch(limit)
            return records + [r for r in records if index_of(r[0]) == VICTIM]

        feed.batch = duplicating  # type: ignore[method-assign]
        super().produce(endpoint, dest, feed)
