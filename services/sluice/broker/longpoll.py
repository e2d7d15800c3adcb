"""The one parked-read mechanism: a fetch waiting for appends, for long-poll and follow alike.

Each served partition log has one append listener, installed by the service, that calls
:meth:`AppendWaiters.notify`. A :class:`ParkedRead` watches the partitions its read could still
add to. An append wakes it *synchronously*, inside the producer's own callback: it reads only
the new bytes of that partition (``FetchRead`` accumulates) and, once the read is ready, calls
its ``on_ready`` callback. ``max_wait_ms`` is one event-loop timer, re-armed only when it fires
early, never per round. No task, no ``asyncio.Event``, no sleep loop.

Its two users are the core's two fetch shapes (``sluice.broker.service``):

- a long-poll fetch (``BrokerService.fetch``, either transport) parks once: ``on_ready``
  resolves the future the request awaits; appends until the request's task runs again keep
  being read into the answer (as they were when the task itself read on wake-up); then the
  request closes it;
- a continuous fetch (``sluice.broker.follow``, wire protocol) parks round after round with the
  same ``ParkedRead``: its watch registration and timer are kept across rounds, and
  ``on_ready`` answers inside the callback, so a followed record costs no task switch.

Everything here runs on the event loop thread: appends happen there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable
from typing import Protocol

from sluice.broker.fetch import FetchRead, TopicPartitionKey

__all__ = ["AppendWaiters", "ParkedRead", "Watcher"]


class Watcher(Protocol):
    """What :class:`AppendWaiters` wakes (a :class:`ParkedRead`)."""

    keys: tuple[TopicPartitionKey, ...]

    def wake(self, key: TopicPartitionKey | None) -> None:
        """``key`` was appended to (or stopped being served here); None: the broker stops."""


class Gauge(Protocol):
    """The parked-fetches gauge (``sluice_broker_fetch_parked``)."""

    def inc(self) -> None: ...
    def dec(self) -> None: ...


class AppendWaiters:
    """Partition -> parked reads. Caller: parked reads (watch/unwatch) and append listeners."""

    def __init__(self) -> None:
        self._by_key: dict[TopicPartitionKey, set[Watcher]] = {}
        self._all: set[Watcher] = set()

    def __len__(self) -> int:
        return len(self._all)

    def watch(self, waiter: Watcher, keys: Iterable[TopicPartitionKey]) -> None:
        """(Re)register ``waiter`` for exactly ``keys``."""
        self.unwatch(waiter)
        waiter.keys = tuple(keys)
        for key in waiter.keys:
            self._by_key.setdefault(key, set()).add(waiter)
        self._all.add(waiter)

    def unwatch(self, waiter: Watcher) -> None:
        for key in waiter.keys:
            waiters = self._by_key.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._by_key[key]
        waiter.keys = ()
        self._all.discard(waiter)

    def notify(self, key: TopicPartitionKey) -> None:
        """An append (or a serving change) happened on ``key``: wake whoever watches it."""
        waiters = self._by_key.get(key)
        if waiters:
            for waiter in tuple(waiters):
                waiter.wake(key)

    def wake_all(self) -> None:
        """Wake every parked read (shutdown): each answers with what it has."""
        for waiter in tuple(self._all):
            waiter.wake(None)


class ParkedRead:
    """Parks a :class:`FetchRead` until it is ready or its wait is over. Event-loop thread only.

    Created by the service (``BrokerService.parked_read``), which supplies the waiters, the
    re-read (it also fails a partition that stopped being served here) and the gauge.
    """

    __slots__ = (
        "_deadline",
        "_gauge",
        "_loop",
        "_on_ready",
        "_read",
        "_read_again",
        "_released",
        "_timer",
        "_waiters",
        "keys",
    )

    def __init__(
        self,
        waiters: AppendWaiters,
        read_again: Callable[[FetchRead, Collection[TopicPartitionKey]], None],
        gauge: Gauge,
        on_ready: Callable[[], None],
    ) -> None:
        self._waiters = waiters
        self._read_again = read_again
        self._gauge = gauge
        self._on_ready = on_ready
        self._loop = asyncio.get_running_loop()
        #: The partitions watched; kept across parks (a follow's rounds), changed only when
        #: the read's waiting partitions change.
        self.keys: tuple[TopicPartitionKey, ...] = ()
        #: The parked read, until its owner takes it.
        self._read: FetchRead | None = None
        #: on_ready was called for the current read (it no longer counts as parked).
        self._released = False
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def park(self, read: FetchRead, max_wait_ms: int) -> None:
        """Wait for appends to make ``read`` ready, or ``max_wait_ms``; then ``on_ready()``, once."""
        self._read = read
        self._released = False
        self._gauge.inc()
        self._watch(read)
        self._deadline = self._loop.time() + max_wait_ms / 1000
        if self._timer is None:
            self._timer = self._loop.call_at(self._deadline, self._on_timer)

    def take(self) -> None:
        """The owner answers with the read now: stop adding to it (the watch stays for a next park)."""
        if self._read is not None and not self._released:
            self._gauge.dec()
        self._read = None
        self._released = False

    def close(self) -> None:
        """Done for good: unwatch and cancel the timer. Idempotent."""
        self.take()
        self._waiters.unwatch(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ---- callbacks ----------------------------------------------------------------------

    def wake(self, key: TopicPartitionKey | None) -> None:
        read = self._read
        if read is None:
            return  # between a follow's rounds: its next round reads from the log anyway
        if key is not None:
            self._read_again(read, (key,))
            if self._released:
                return  # ready already; the owner takes what has come in by the time it runs
            if not read.ready():
                self._watch(read)
                return
        self._release()

    def _watch(self, read: FetchRead) -> None:
        keys = tuple(read.waiting_keys())
        if keys != self.keys:
            self._waiters.watch(self, keys)

    def _on_timer(self) -> None:
        self._timer = None
        if self._read is None or self._released:
            return  # the next park arms it again
        if self._loop.time() >= self._deadline:
            self._release()
        else:
            self._timer = self._loop.call_at(self._deadline, self._on_timer)

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._gauge.dec()
            self._on_ready()
