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

Arenas (:func:`limit_arenas`): glibc gives each thread that meets contention an arena of its own, up
to 8 per core, and memory freed in one arena serves only that arena. gRPC's threads, the trim thread
and ``to_thread`` work each can pin an arena's high-water mark. ``MALLOC_ARENA_MAX=2`` (set by
``sluice up`` and the chart for every service) caps them; a service started some other way calls
``mallopt(M_ARENA_MAX)`` itself at start-up, before its threads exist (``docs/memory.md``).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = ["ARENA_MAX", "TRIM_INTERVAL", "limit_arenas", "trim_free_memory", "trim_loop"]

#: Arenas a service process uses unless ``MALLOC_ARENA_MAX`` says otherwise.
ARENA_MAX = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)

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


def limit_arenas(default: int = ARENA_MAX) -> int:
    """Cap glibc's malloc arenas (``MALLOC_ARENA_MAX`` when set, else ``default``); returns the cap in
    force, or 0 where there is no glibc. Call before starting threads: arenas made earlier stay."""
    raw = os.environ.get("MALLOC_ARENA_MAX", "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw)  # glibc read it at start-up already
    try:
        mallopt: Callable[[int, int], int] = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return 0
    return default if mallopt(_M_ARENA_MAX, default) == 1 else 0


async def trim_loop(interval: float = TRIM_INTERVAL) -> None:
    """Trim every ``interval`` seconds until cancelled (a service's background task)."""
    if _TRIM is None:
        log.debug("no malloc_trim in this C library: free heap memory is not returned early")
        return
    while True:
        await asyncio.sleep(interval)
        await asyncio.to_thread(trim_free_memory)
