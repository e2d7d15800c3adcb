"""One thread per ``Client`` that does the fetch work of every group consumer made on it.

A consumer's :class:`~sluice.client.consumer.prefetch.Prefetcher` has no thread of its own:
it asks this driver for a *step* whenever something may let it make progress (an answer
arrived on its lane, ``poll()`` freed buffer space, a seek or an assignment changed what it
fetches), and the driver runs the steps one after another. A step never waits for the
network: it takes the answers that arrived, sends what can be sent (``Fetcher.poll_raw``),
decodes and hands the records to the consumer's buffer. A step that ends in a backoff (a
broker unreachable, a partition without a leader) asks to be stepped again at its end: the
driver keeps those in a deadline heap.

So a consumer's fetching costs what it did with a thread of its own (one wake-up and one
step per answer; the decode is the same), and the thousandth consumer costs no thread
(docs/consumer.md, "Many consumers on one Client"). Steps of different consumers run one
at a time, as their threads did under the GIL anyway. A sync ``poll()`` waiting alone on its
connection runs its consumer's steps itself meanwhile, and this driver skips them
(``prefetch.py``, "poll() drives": no wake-up of this thread per answer).

Caller: the Client (one per Client), the Prefetcher (``wake``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from typing import Protocol

__all__ = ["FetchDriver", "Steppable"]

log = logging.getLogger("sluice.consumer.fetch_driver")


class Steppable(Protocol):
    """What the driver runs: a prefetcher."""

    #: True while a step is queued (so a burst of wake-ups queues one step). The driver
    #: clears it before the step, so a wake-up during the step queues another.
    queued: bool

    def step(self) -> float | None:
        """Make what progress can be made now, without waiting; returns the seconds after
        which to step again at the latest (None: only when woken)."""
        ...


class FetchDriver:
    """A thread that steps prefetchers when woken or when their backoff ends. Thread-safe."""

    def __init__(self, name: str = "sluice-consumer-fetch") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Steppable | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        # The driver thread's own: (when, tie-breaker, prefetcher) to step at ``when``.
        self._timers: list[tuple[float, int, Steppable]] = []
        self._seq = itertools.count()

    def wake(self, p: Steppable) -> None:
        """Step ``p`` soon (any thread, never blocks)."""
        if p.queued:
            return
        p.queued = True
        self._queue.put(p)
        if self._thread is None:
            self._start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (its consumers are closed before). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        self._queue.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        timers = self._timers
        get = self._queue.get
        while True:
            timeout = max(timers[0][0] - time.monotonic(), 0.0) if timers else None
            try:
                p = get(timeout=timeout)
            except queue.Empty:
                p = None
            else:
                if p is None:
                    return  # closed
            if p is not None:
                self._step(p)
            now = time.monotonic()
            while timers and timers[0][0] <= now:
                self._step(heapq.heappop(timers)[2])

    def _step(self, p: Steppable) -> None:
        p.queued = False
        try:
            again = p.step()
        except Exception:  # a step reports its own errors; this is a bug: keep serving the others
            log.exception("a consumer's fetch step failed")
            return
        if again is not None:
            heapq.heappush(self._timers, (time.monotonic() + again, next(self._seq), p))
