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

A fetch session and a follow each keep one :class:`StandingWatch` for as long as they live:
registered once for all their partitions, it marks the partitions appended to as dirty and
wakes the parked read of the moment. Their requests and rounds read only dirty partitions, so
an idle long-poll costs one timer and an empty answer, whatever the number of partitions
(``docs/fetch.md``, "Idle long-polls").

Everything here runs on the event loop thread: appends happen there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable
from typing import Protocol

from sluice.broker.fetch import FetchRead, TopicPartitionKey
from sluice.broker.sessions import FetchContext

__all__ = ["AppendWaiters", "ParkedRead", "SessionWatches", "StandingWatch", "Watcher"]


class Watcher(Protocol):
    """What :class:`AppendWaiters` wakes (a :class:`ParkedRead` or a :class:`StandingWatch`)."""

    def wake(self, key: TopicPartitionKey | None) -> None:
        """``key`` was appended to (or stopped being served here); None: the broker stops."""


class Gauge(Protocol):
    """The parked-fetches gauge (``sluice_broker_fetch_parked``)."""

    def inc(self) -> None: ...
    def dec(self) -> None: ...


class AppendWaiters:
    """Partition -> watchers. Caller: parked reads and standing watches (watch/unwatch) and
    append listeners (notify)."""

    def __init__(self) -> None:
        self._by_key: dict[TopicPartitionKey, set[Watcher]] = {}
        #: Every watcher and the partitions it watches.
        self._all: dict[Watcher, set[TopicPartitionKey]] = {}
        #: Partition registrations made and dropped so far: work that must not happen per idle
        #: fetch (the smoke test counts it).
        self.key_changes = 0

    def __len__(self) -> int:
        return len(self._all)

    def watch(self, waiter: Watcher, keys: Iterable[TopicPartitionKey]) -> None:
        """(Re)register ``waiter`` for exactly ``keys``."""
        self.unwatch(waiter)
        self.add(waiter, keys)

    def add(self, waiter: Watcher, keys: Iterable[TopicPartitionKey]) -> None:
        """Watch ``keys`` too (registers ``waiter`` if it is new)."""
        mine = self._all.setdefault(waiter, set())
        for key in keys:
            if key not in mine:
                mine.add(key)
                self._by_key.setdefault(key, set()).add(waiter)
                self.key_changes += 1

    def remove(self, waiter: Watcher, keys: Iterable[TopicPartitionKey]) -> None:
        """Stop watching ``keys`` (``waiter`` stays registered)."""
        mine = self._all.get(waiter)
        if mine is None:
            return
        for key in keys:
            if key in mine:
                mine.discard(key)
                self._drop(waiter, key)

    def unwatch(self, waiter: Watcher) -> None:
        for key in self._all.pop(waiter, ()):
            self._drop(waiter, key)

    def _drop(self, waiter: Watcher, key: TopicPartitionKey) -> None:
        self.key_changes += 1
        waiters = self._by_key.get(key)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._by_key[key]

    def notify(self, key: TopicPartitionKey) -> None:
        """An append (or a serving change) happened on ``key``: wake whoever watches it."""
        waiters = self._by_key.get(key)
        if waiters:
            for waiter in tuple(waiters):
                waiter.wake(key)

    def wake_all(self) -> None:
        """Wake every watcher (shutdown): each parked read answers with what it has."""
        for waiter in tuple(self._all):
            waiter.wake(None)


class StandingWatch:
    """The append watch of a fetch session or a follow, for as long as it lives. Event-loop thread only.

    Registered once for the partitions it covers (then changed only as partitions are added or
    forgotten), never per request or round. An append marks its partition in ``dirty`` (the
    owner's set of partitions that may have something new) and wakes the parked reads
    currently waiting on it. So an idle request or round reads, watches and answers only the
    dirty partitions, not every partition of the session.
    """

    __slots__ = ("_parked", "_waiters", "dirty")

    def __init__(self, waiters: AppendWaiters, dirty: set[TopicPartitionKey]) -> None:
        self._waiters = waiters
        #: The owner's set, shared (mutated, never replaced).
        self.dirty = dirty
        self._parked: list[ParkedRead] = []

    def add(self, keys: Iterable[TopicPartitionKey]) -> None:
        self._waiters.add(self, keys)

    def remove(self, keys: Iterable[TopicPartitionKey]) -> None:
        self._waiters.remove(self, keys)

    def close(self) -> None:
        """The session or follow is over. Idempotent. A read still parked on it (a request of a
        session replaced or evicted meanwhile) answers now with what it has: nothing would wake
        it any more, not even the broker's shutdown."""
        self._waiters.unwatch(self)
        for parked in tuple(self._parked):
            parked.wake(None)

    def attach(self, parked: ParkedRead) -> None:
        if parked not in self._parked:
            self._parked.append(parked)

    def detach(self, parked: ParkedRead) -> None:
        if parked in self._parked:
            self._parked.remove(parked)

    def wake(self, key: TopicPartitionKey | None) -> None:
        if key is not None:
            self.dirty.add(key)
        for parked in tuple(self._parked):
            parked.wake(key)


class SessionWatches:
    """Each fetch session's standing watch, by session id. Caller: the service."""

    def __init__(self, waiters: AppendWaiters) -> None:
        self._waiters = waiters
        self._by_id: dict[int, StandingWatch] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def of(self, context: FetchContext) -> StandingWatch | None:
        """The request's session's watch, created with the session and kept in step with its
        partitions (None without a session)."""
        session = context.session
        if session is None:
            return None
        watch = self._by_id.get(session.id)
        if watch is None:
            watch = self._by_id[session.id] = StandingWatch(self._waiters, session.dirty)
        watch.add(context.added)
        watch.remove(context.forgotten)
        return watch

    def dropped(self, session_id: int) -> None:
        """The session ended (closed, replaced, evicted or expired)."""
        watch = self._by_id.pop(session_id, None)
        if watch is not None:
            watch.close()


class ParkedRead:
    """Parks a :class:`FetchRead` until it is ready or its wait is over. Event-loop thread only.

    Created by the service (``BrokerService.parked_read``), which supplies the waiters, the
    re-read (it also fails a partition that stopped being served here, and adds a partition
    a standing watch woke it for) and the gauge. Without a ``standing`` watch it watches the
    partitions its read could still add to, per park (a sessionless long-poll: the request
    named them all anyway); with one, it waits on that watch and registers nothing itself.
    """

    __slots__ = (
        "_deadline",
        "_gauge",
        "_loop",
        "_on_ready",
        "_read",
        "_read_again",
        "_released",
        "_standing",
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
        standing: StandingWatch | None = None,
    ) -> None:
        self._waiters = waiters
        self._standing = standing
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
        read.parked = True
        self._released = False
        self._gauge.inc()
        if self._standing is not None:
            self._standing.attach(self)
        else:
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
        if self._standing is not None:
            self._standing.detach(self)
        else:
            self._waiters.unwatch(self)
            self.keys = ()
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
                if self._standing is None:
                    self._watch(read)
                return
        self._release()

    def _watch(self, read: FetchRead) -> None:
        keys = tuple(read.waiting_keys())
        if keys != self.keys:
            self._waiters.watch(self, keys)
            self.keys = keys

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
