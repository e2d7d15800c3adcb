"""Exponential nack backoff, held on the client.

The dispatcher redelivers a nacked message after ``nack_delay``. With
``nack_backoff=True`` the SDK holds the n-th nack of a message for
``min(nack_delay * 2**n, nack_backoff_max) - nack_delay`` before sending it, so the
message comes back after ``nack_delay * 2**n`` in all (Pulsar's client-side
``NegativeAckRedeliveryBackoff``). Until the nack is sent the message stays unacked
on the dispatcher; if the stream breaks meanwhile the dispatcher redelivers it anyway.

One timer thread per consumer, started on first use, waiting on a Condition for the
earliest deadline (no polling).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

__all__ = ["NackScheduler", "backoff_hold"]


def backoff_hold(base: float, cap: float, redelivery_count: int) -> float:
    """Seconds the SDK holds a nack of a message delivered ``redelivery_count`` times before."""
    total = min(base * float(2 ** min(redelivery_count, 30)), max(cap, base))
    return max(total - base, 0.0)


class NackScheduler:
    """Runs ``send()`` callables at their due time. Thread-safe; ``close()`` drops the rest."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._closed = False
        self._thread: threading.Thread | None = None

    def schedule(self, delay: float, send: Callable[[], None]) -> None:
        with self._cond:
            if self._closed:
                return
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), send))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="sluice-push-nacks")
                self._thread.start()
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._heap)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                if self._closed:
                    return
                _, _, send = heapq.heappop(self._heap)
            send()
