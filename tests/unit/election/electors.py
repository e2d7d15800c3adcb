"""Helpers to run real electors in one event loop: each records its terms and signals changes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from redis.asyncio import Redis

from sluice.coordinator.election.loop import ElectionLoop
from sluice.coordinator.election.machine import ElectionTiming

#: Fast but realistic proportions: a standby takes over within about a second.
FAST = ElectionTiming(lease_duration=1.0, renew_deadline=0.6, retry_period=0.1)


@dataclass
class Running:
    """A running elector and what its callbacks saw."""

    elector: ElectionLoop
    task: asyncio.Task[None] | None = None
    epochs: list[int] = field(default_factory=list)
    lost: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_elected(self, epoch: int) -> None:
        self.epochs.append(epoch)
        self.changed.set()

    async def on_lost(self) -> None:
        self.lost += 1
        self.changed.set()

    def start(self) -> Running:
        self.task = asyncio.get_running_loop().create_task(self.elector.run(self.on_elected, self.on_lost))
        return self

    async def crash(self) -> None:
        """Stop without releasing anything, as kill -9 would."""
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def wait_for(self, predicate: str, within: float = 5.0) -> float:
        """Wait until ``predicate`` ("leader", "follower", or "lost:N") holds; returns the seconds taken."""
        start = time.monotonic()
        async with asyncio.timeout(within):
            while not self._holds(predicate):
                self.changed.clear()
                # Leadership shows in is_leader() right after on_elected returns: re-check soon after.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 0.05)
        return time.monotonic() - start

    def _holds(self, predicate: str) -> bool:
        if predicate == "leader":
            return self.elector.is_leader()
        if predicate == "follower":
            leader = self.elector.leader()
            return leader is not None and leader.identity != self.elector.identity
        kind, _, n = predicate.partition(":")
        assert kind == "lost"
        return self.lost >= int(n)


@contextlib.asynccontextmanager
async def redis_client(url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        yield client
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def unreachable_redis() -> AsyncIterator[Redis]:
    """A client for a port nothing listens on: every command fails fast (never a shared Redis)."""
    from tests.harness import free_port

    async with redis_client(f"redis://127.0.0.1:{free_port()}/0") as client:
        yield client


async def stop_all(*running: Running) -> None:
    for r in running:
        if r.task is not None and not r.task.done():
            await r.elector.resign()
            await r.task
