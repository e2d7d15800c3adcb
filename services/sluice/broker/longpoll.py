"""Parking fetch requests until an append gives them something to read (no sleep loops).

Each served partition log has one append listener, installed by the service, that calls
:meth:`AppendWaiters.notify`. A parked fetch is a :class:`Waiter` watching the partitions it
could still read from; ``notify`` records which partition moved and sets the waiter's event,
so the fetch wakes at once and reads only those partitions.

Everything here runs on the event loop thread: appends happen there, so the listener can set
an ``asyncio.Event`` directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from sluice.broker.fetch import TopicPartitionKey


class Watcher(Protocol):
    """What watches partitions: a parked fetch's :class:`Waiter`, or a continuous fetch
    (``sluice.broker.follow``), which reads and answers inside ``wake`` itself."""

    keys: tuple[TopicPartitionKey, ...]

    def wake(self, key: TopicPartitionKey | None) -> None:
        """``key`` was appended to (or stopped being served here); None: the broker stops."""


class Waiter:
    """One parked fetch request."""

    __slots__ = ("dirty", "event", "keys")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        #: Partitions appended to (or otherwise changed) since the waiter last looked.
        self.dirty: set[TopicPartitionKey] = set()
        self.keys: tuple[TopicPartitionKey, ...] = ()

    def wake(self, key: TopicPartitionKey | None) -> None:
        if key is not None:
            self.dirty.add(key)
        self.event.set()

    def take_dirty(self) -> set[TopicPartitionKey]:
        dirty, self.dirty = self.dirty, set()
        self.event.clear()
        return dirty


class AppendWaiters:
    """Partition -> parked fetches. Caller: the service (watch/unwatch) and append listeners."""

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
        """Wake every parked fetch (shutdown): each answers with what it has."""
        for waiter in tuple(self._all):
            waiter.wake(None)
