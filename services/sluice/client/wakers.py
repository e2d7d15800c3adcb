"""A ``threading.Condition`` that also wakes callbacks: how asyncio code waits on a thread-based part.

The group consumer's prefetcher, group member and commits signal "something to do" by notifying one
condition (records buffered, a rebalance event, an error). Threads wait on it; ``sluice.aio`` cannot
(a blocked event loop), so it registers a waker, a callable run at every notification, that resolves
an asyncio future through ``loop.call_soon_threadsafe``. The waker is registered under the
condition's lock in the same critical section that found nothing to take, and every notification is
made under that lock, so no wake-up is lost between the check and the wait (docs/asyncio.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["WakeableCondition"]


class WakeableCondition(threading.Condition):
    """``notify``/``notify_all`` also call every registered waker (under the lock: keep them short)."""

    def __init__(self, lock: Any = None) -> None:
        super().__init__(lock)
        self._wakers: list[Callable[[], None]] = []

    def notify(self, n: int = 1) -> None:
        super().notify(n)
        for wake in self._wakers:
            wake()

    def notify_all(self) -> None:
        # Through notify() (not Condition.notify_all, which calls notify itself): one waker call each.
        self.notify(len(self._waiters))  # type: ignore[attr-defined]

    def add_waker(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` at every notification until removed (the caller holds the lock)."""
        self._wakers.append(wake)

    def remove_waker(self, wake: Callable[[], None]) -> None:
        """Stop calling ``wake`` (the caller holds the lock); unknown wakers are ignored."""
        if wake in self._wakers:
            self._wakers.remove(wake)
