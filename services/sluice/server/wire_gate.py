"""The connection limits of a wire listener (docs/limits.md, "Connections"): who is let in (the
total and per-address caps) and who is put out (no hello in time, a frame begun too long ago,
idle), with the metrics of both.

Deadlines are checked by one patrol per listener, a walk over its connections a few times per
shortest deadline, not by a timer per connection or per frame: the hot path pays one clock read
per socket read (``WireConnection.buffer_updated``) and nothing else. What is overdue is the
connection's to say (``overdue``), since only it knows whether it has work in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Generic, Protocol, TypeVar

from sluice.errors import BrokerNotAvailable, SluiceError
from sluice.server.config import ConnectionSettings
from sluice.server.limits import listener_metrics

__all__ = ["ConnectionGate", "Policed"]


class Policed(Protocol):
    """What the gate needs of a connection."""

    host: str

    def overdue(self, now: float, limits: ConnectionSettings) -> str | None: ...

    def drop(self, reason: str) -> None: ...


C = TypeVar("C", bound=Policed)


class ConnectionGate(Generic[C]):
    """One listener's connections, counted in and out, and the patrol of their deadlines."""

    def __init__(self, service: str, limits: ConnectionSettings) -> None:
        self.service = service
        self.limits = limits
        #: Every accepted connection (before its hello too), and how many per client host.
        self.connections: set[C] = set()
        self.per_host: dict[str, int] = {}
        self.metrics = listener_metrics(service, "wire")
        self._patrol_task: asyncio.Task[None] | None = None

    def admit(self, conn: C) -> SluiceError | None:
        """Count a new connection in, or say why it is refused (a limit is reached): retriable,
        as Kafka's client retries a connection the broker closed at its limit."""
        limits = self.limits
        if len(self.connections) >= limits.max_connections:
            return BrokerNotAvailable(
                f"{self.service}: too many connections ({limits.max_connections}, max_connections)"
            )
        count = self.per_host.get(conn.host, 0)
        if count >= limits.max_connections_per_address:
            return BrokerNotAvailable(
                f"{self.service}: too many connections from {conn.host} "
                f"({limits.max_connections_per_address}, max_connections_per_address)"
            )
        self.per_host[conn.host] = count + 1
        self.connections.add(conn)
        self.metrics.open.inc()
        return None

    def release(self, conn: C) -> None:
        """A connection counted in by ``admit`` is gone."""
        self.connections.discard(conn)
        self.metrics.open.dec()
        left = self.per_host.get(conn.host, 1) - 1
        if left > 0:
            self.per_host[conn.host] = left
        else:
            self.per_host.pop(conn.host, None)

    def patrol_interval(self) -> float:
        """How often deadlines are checked: a quarter of the shortest, between 50 ms and 1 s (so a
        deadline is enforced at most a quarter late)."""
        limits = self.limits
        shortest = min(limits.hello_timeout, limits.frame_timeout, limits.connections_max_idle)
        return min(1.0, max(0.05, shortest.total_seconds() / 4))

    def start(self) -> None:
        self._patrol_task = asyncio.get_running_loop().create_task(
            self._patrol(), name=f"{self.service}-wire-limits"
        )

    async def stop(self) -> None:
        task, self._patrol_task = self._patrol_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def patrol_once(self, now: float) -> None:
        limits = self.limits
        for conn in list(self.connections):
            reason = conn.overdue(now, limits)
            if reason is not None:
                conn.drop(reason)

    async def _patrol(self) -> None:
        interval = self.patrol_interval()
        while True:
            await asyncio.sleep(interval)
            self.patrol_once(time.monotonic())
