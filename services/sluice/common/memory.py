"""Give the C allocator's free memory back to the system, now and then (glibc ``malloc_trim``).

Why: Python hands every object over 512 bytes (read buffers, dict tables, deque blocks, the
batches a dispatcher cuts for its consumers) to ``malloc``. After a burst, glibc keeps the freed
memory in its heap and returns only what lies at the very top, so a process that once held a lot
keeps that RSS although nothing uses it. Measured on the dispatcher (``bench/push_consumers_memory.py``,
200 subscriptions that each took a 1,000-record backlog): 68 KB per subscription was such free
memory, a third of what the subscriptions seemed to cost (``docs/dispatcher.md``, "What a
subscription costs"). ``malloc_trim(0)`` releases every free page of the heap (``madvise``), not
only the top.

It runs in a worker thread (``ctypes`` releases the GIL), so the event loop is not held while it
walks the heap: a few milliseconds per 100 MB. Where the C library is not glibc it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = ["TRIM_INTERVAL", "trim_free_memory", "trim_loop"]

#: Seconds between trims: long enough that the cost (a walk of the heap) is negligible, short enough
#: that memory a burst freed goes back soon after.
TRIM_INTERVAL = 10.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn: Callable[[int], int] = ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):
        return None  # not glibc: nothing to call
    return fn


_TRIM = _malloc_trim()


def trim_free_memory() -> bool:
    """Return the heap's free pages to the system; False where there is no ``malloc_trim``."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


async def trim_loop(interval: float = TRIM_INTERVAL) -> None:
    """Trim every ``interval`` seconds until cancelled (a service's background task)."""
    if _TRIM is None:
        log.debug("no malloc_trim in this C library: free heap memory is not returned early")
        return
    while True:
        await asyncio.sleep(interval)
        await asyncio.to_thread(trim_free_memory)
