"""Acknowledgements in flight for the asyncio clients (NATS JetStream, RabbitMQ): the producer keeps
sending while up to ``limit`` records wait for their acks, and waits for the oldest only beyond that,
so a paced run is never held behind a round trip and a full-speed run keeps its window full."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from typing import Any

from compare.workload import Feed


class AckWindow:
    def __init__(self, feed: Feed, limit: int) -> None:
        self.feed = feed
        self.limit = limit
        self.pending: deque[tuple[asyncio.Future[Any], float, int]] = deque()
        self.in_flight = 0

    async def add(self, acked: Awaitable[Any], sent: float, count: int = 1) -> None:
        """``acked`` resolves once the ``count`` records sent at ``sent`` are acknowledged."""
        future = asyncio.ensure_future(acked)

        # The ack's latency is taken when it arrives, not when the producer next looks at it.
        def arrived(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                self.feed.acked(sent, count)

        future.add_done_callback(arrived)
        self.pending.append((future, sent, count))
        self.in_flight += count
        while self.in_flight > self.limit:
            await self._oldest()

    async def drain(self) -> None:
        while self.pending:
            await self._oldest()

    async def _oldest(self) -> None:
        future, _sent, count = self.pending.popleft()
        await future  # a refused publish raises here, and fails the run
        self.in_flight -= count
