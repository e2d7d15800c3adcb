"""The broker's memory budgets, in bytes (``docs/memory.md``, "Broker").

Two pools, each a :class:`ByteBudget`:

- ``produce``: produce bytes received and not yet answered, Kafka's ``queued.max.request.bytes``.
  On the wire port a connection reserves a frame's whole size as soon as its length prefix has
  arrived and the rest is still to come (Kafka's ``MemoryPool`` allocates a request's size the
  same way); when the pool cannot grant it the connection stops reading its socket until bytes
  are released. A reservation is all-or-nothing per frame, so a granted frame can always
  complete and nothing deadlocks on half-read frames. On gRPC, a handler takes its request's
  record bytes before appending and gives them back with its answer.
- ``fetch``: the bytes of fetch answers assembled and not yet handed to the socket. A fetch
  reserves its ``max_bytes`` before reading (and then keeps only what it read); a follow
  starts a round only while the pool has room.

Neither pool ever refuses: a request waits (FIFO) until it fits. One larger than the whole
budget is granted when the pool is empty, so it is served alone rather than never (the
largest is bounded anyway by the message size limit, beyond which it is refused with a typed
error before it reaches a pool). Nothing acknowledged is ever dropped: the pools only delay.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

from prometheus_client import Counter, Gauge

from sluice.common.memory import TRIM_INTERVAL, trim_free_memory

__all__ = ["BrokerMemory", "ByteBudget", "Reservation"]

#: After this many bytes passed through a pool, the next time it is empty the heap's free pages go
#: back to the system (``malloc_trim``, in a worker thread, at most every ``TRIM_INTERVAL`` s): glibc
#: keeps a burst's freed memory as RSS otherwise, and a budget is about what the process holds
#: *after* the burst too ("RSS after churn", docs/memory.md). Idle pools cost nothing.
TRIM_AFTER_BYTES = 16 * 1024 * 1024


_USED = Gauge("sluice_broker_memory_used_bytes", "Bytes held against a memory budget now", ["pool"])
_LIMIT = Gauge("sluice_broker_memory_limit_bytes", "A memory budget's size (0: unlimited)", ["pool"])
_PEAK = Gauge("sluice_broker_memory_peak_bytes", "The most ever held against a memory budget", ["pool"])
_PAUSED = Counter(
    "sluice_broker_memory_paused_total",
    "Times a request or connection had to wait for a memory budget (reading paused)",
    ["pool"],
)


class Reservation:
    """Bytes a waiter asked for; ``granted`` is called once when the pool grants them."""

    __slots__ = ("bytes", "granted")

    def __init__(self, nbytes: int, granted: Callable[[], None]) -> None:
        self.bytes = nbytes
        self.granted: Callable[[], None] | None = granted


class ByteBudget:
    """A byte semaphore for one event loop: ``take`` now or wait, ``release`` when freed.

    ``limit`` 0 is unlimited (everything is granted at once, only counted).
    """

    def __init__(self, pool: str, limit: int) -> None:
        self.pool = pool
        self.limit = limit
        self.used = 0
        #: The most ever held at once (tests and ``docs/memory.md`` figures read it).
        self.peak = 0
        self.paused = 0
        #: Bytes taken since the last trim (see TRIM_AFTER_BYTES).
        self._passed = 0
        self._trim_at: asyncio.TimerHandle | None = None
        self._last_trim = -TRIM_INTERVAL
        self._waiters: collections.deque[Reservation] = collections.deque()
        #: Called whenever bytes are released and nobody waits (paused follows resume on it).
        self.room_listeners: set[Callable[[], None]] = set()
        self._paused_counter = _PAUSED.labels(pool)
        # Read at scrape time: the request path pays nothing for the gauges.
        _USED.labels(pool).set_function(lambda: self.used)
        _PEAK.labels(pool).set_function(lambda: self.peak)
        _LIMIT.labels(pool).set(limit)

    def _fits(self, nbytes: int) -> bool:
        # Empty: anything fits, so one request over the whole budget is served alone.
        return self.limit <= 0 or self.used == 0 or self.used + nbytes <= self.limit

    @property
    def has_room(self) -> bool:
        return self.limit <= 0 or (self.used < self.limit and not self._waiters)

    def try_take(self, nbytes: int) -> bool:
        """Take ``nbytes`` if they fit now and nobody waits ahead (FIFO), else False."""
        if self._waiters or not self._fits(nbytes):
            return False
        self.force(nbytes)
        return True

    def force(self, nbytes: int) -> None:
        """Count bytes already allocated (they exist whether or not they fit)."""
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        self._passed += nbytes

    def wait(self, nbytes: int, granted: Callable[[], None]) -> Reservation:
        """Queue for ``nbytes`` (after a failed ``try_take``); ``granted`` runs once they are taken."""
        self.paused += 1
        self._paused_counter.inc()
        waiter = Reservation(nbytes, granted)
        self._waiters.append(waiter)
        return waiter

    def cancel(self, waiter: Reservation) -> None:
        """Give up waiting (the connection closed): nothing was taken."""
        if waiter.granted is not None:
            waiter.granted = None
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            self._grant()

    def release(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        self.used -= nbytes
        if self._waiters or self.room_listeners:
            self._grant()
        if self.used == 0 and self._passed >= TRIM_AFTER_BYTES and self._trim_at is None:
            self._schedule_trim()

    def _schedule_trim(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        delay = max(0.0, self._last_trim + TRIM_INTERVAL - loop.time())
        self._trim_at = loop.call_later(delay, self._trim, loop)

    def _trim(self, loop: asyncio.AbstractEventLoop) -> None:
        self._trim_at = None
        self._passed = 0
        self._last_trim = loop.time()
        loop.run_in_executor(None, trim_free_memory)

    def _grant(self) -> None:
        waiters = self._waiters
        while waiters and self._fits(waiters[0].bytes):
            waiter = waiters.popleft()
            granted, waiter.granted = waiter.granted, None
            if granted is not None:
                self.force(waiter.bytes)
                granted()
        if not waiters and self.room_listeners and self.has_room:
            for listener in list(self.room_listeners):
                listener()

    async def take(self, nbytes: int) -> None:
        """Take ``nbytes``, waiting (FIFO) until they fit. Cancellation takes nothing."""
        if self.try_take(nbytes):
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def granted() -> None:
            if not done.done():
                done.set_result(None)

        waiter = self.wait(nbytes, granted)
        try:
            await done
        except BaseException:
            if waiter.granted is None and done.done() and not done.cancelled():
                self.release(nbytes)  # granted in the same turn as the cancellation
            else:
                self.cancel(waiter)
            raise


class BrokerMemory:
    """The broker's two budgets (``BrokerConfig.produce_memory_bytes`` / ``fetch_memory_bytes``)."""

    def __init__(self, produce_limit: int, fetch_limit: int) -> None:
        self.produce = ByteBudget("produce", produce_limit)
        self.fetch = ByteBudget("fetch", fetch_limit)
