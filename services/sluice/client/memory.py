"""A Client's ``memory_limit``: the bytes every consumer of the Client may hold prefetched.

Pulsar's PIP-74 idea (``docs/memory.md``, "SDK"): one budget for the whole Client rather than
one per consumer, so a process with many consumers is bounded by what it configured once. Each
group consumer's prefetch buffer (``consumer/prefetch.py``) and each push consumer's receive
queue (``push/sessions.py``) count what they hold here. While the Client holds ``limit`` bytes,
group consumers send no new fetch and push consumers grant no new permits; as soon as the
application takes messages and the total falls below the limit, every consumer that stopped is
woken. What is already on its way when the limit is reached (a fetch answer in flight, permits
granted before) still lands: the limit can be passed by at most that much, never dropped.

Thread-safe: consumers count from their own threads, under their own locks. So wake-ups run
on a thread of this object's own (started with the first), never on the releasing thread: a
consumer releasing under its lock must not wait for another consumer's lock.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["NEAR_LIMIT", "ClientMemory"]

#: The share of ``memory_limit`` from which receive windows shrink (Pulsar's PIP-74 uses 75 %).
NEAR_LIMIT = 0.75

log = logging.getLogger(__name__)


class ClientMemory:
    """Bytes held by a Client's consumers against ``limit`` (0: unlimited, only counted)."""

    def __init__(self, limit: int = 0) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"memory_limit must be a byte count >= 0, got {limit!r}")
        self.limit = limit
        self.used = 0
        #: The most ever held at once (tests and docs/memory.md read it).
        self.peak = 0
        #: Times a consumer found the limit reached and stopped.
        self.stops = 0
        self._lock = threading.Lock()
        self._waiting: dict[object, Callable[[], None]] = {}
        self._wakeups: queue.SimpleQueue[list[Callable[[], None]]] = queue.SimpleQueue()
        self._waker: threading.Thread | None = None

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.used += nbytes
            self.peak = max(self.peak, self.used)

    def release(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._lock:
            was_full = self.limit > 0 and self.used >= self.limit
            self.used -= nbytes
            if not was_full or self.used >= self.limit or not self._waiting:
                return
            wake, self._waiting = list(self._waiting.values()), {}
            if self._waker is None:
                self._waker = threading.Thread(target=self._wake, name="sluice-memory-waker", daemon=True)
                self._waker.start()
        self._wakeups.put(wake)

    def _wake(self) -> None:
        while True:
            for callback in self._wakeups.get():
                try:
                    callback()
                except Exception:  # a closed consumer's wake-up: nothing to resume
                    log.debug("memory_limit wake-up failed", exc_info=True)

    def near_limit(self) -> bool:
        """Whether the Client holds at least ``NEAR_LIMIT`` of its limit: push consumers' windows
        stop growing and shrink (``push/flow.py``). A read without the lock: a hint, not a count."""
        return self.limit > 0 and self.used >= NEAR_LIMIT * self.limit

    def full(self, who: object, wake: Callable[[], None]) -> bool:
        """Whether the limit is reached; if so ``wake`` is called once it no longer is."""
        if self.limit <= 0:
            return False
        with self._lock:
            if self.used < self.limit:
                return False
            if who not in self._waiting:
                self.stops += 1
            self._waiting[who] = wake
            return True

    def forget(self, who: object) -> None:
        """A consumer closed: it waits for nothing any more."""
        with self._lock:
            self._waiting.pop(who, None)
